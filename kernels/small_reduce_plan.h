// Plan of the small-shape reduction kernel (GEMM+RS / GEMM+AR peer path): which 16-byte vectors
// each thread reduces, the flag words and the values awaited. CUDA-free: host tests check it.
//
// Every rank holds its partial C (m × n bf16) in a buffer all ranks map, in two copies chosen by
// the epoch's parity, so the next run's GEMM writes the other copy while slow peers may still read
// this one. One launch per run, after the GEMM on the same stream:
//
//   ready:  block 0 stores ready[r] = e into every rank's flag words; every block waits (bounded)
//           for ready[q] >= e from all q: every partial of epoch e is complete
//           (or, "tiles": the GEMM counts its finished tiles at system scope in its own flag words
//           and every block reads every peer's count over NVLink: no store round after the GEMM)
//   data:   ReduceScatter and two-shot AllReduce: this rank's row block, every vector loaded from
//           all W partials (NVLink) at once, summed in fp32 in rank order 0, 1, ..., rounded once
//           (the same bits on every run and on every rank); two-shot also pushes the sum into
//           every peer's C with 16-byte stores, straight from registers
//           one-shot AllReduce: all m rows the same way, nothing pushed
//   gathered (two-shot only): every block, after its pushes, adds 1 to gathered[r] in every peer
//           (system-scope release); the op is complete on this rank once gathered[q] has counted
//           every block of every two-shot launch so far (the host keeps that total: all ranks run
//           the same launches with the same block counts) for every peer q
//
// Why two copies suffice: rank q's GEMM of epoch e+2 overwrites the copy read in epoch e only after
// q's kernel of epoch e+1 has seen ready[e+1] from every rank, and each rank raises that only after
// its kernel of epoch e (and with it every read of epoch e) has completed.
#pragma once

#include <cstdint>

#include "base/roles.h"  // WEFT_HD

namespace weft::kernels {

enum class SmallReduceMode : int32_t {
  kReduceScatter = 0,     // this rank's row block of the sum
  kAllReduceTwoShot = 1,  // own block reduced (pulled), then pushed to every peer
  kAllReduceOneShot = 2,  // every rank pulls every partial and reduces all rows itself
};

// Diagnostic switches (timing the phases apart); 0 for the real op.
constexpr uint32_t kSmallReduceSkipData = 1;  // flag rounds only: no loads, no stores
constexpr uint32_t kSmallReduceSkipPush = 2;  // two-shot: reduce, but push nothing (gathered round kept)

struct SmallReducePlan {
  static constexpr int32_t kMaxRanks = 8;
  static constexpr int32_t kThreads = 512;
  static constexpr int32_t kUnroll = 2;  // vectors per thread per pass, all their loads in flight at once
  SmallReduceMode mode = SmallReduceMode::kReduceScatter;
  int32_t ranks = 0, rank = 0;
  int32_t blocks = 0;
  int64_t block_elems = 0;  // elements of one rank's row block (m / W rows × n)
  int64_t region = 0;       // first element (of the partials and of C) this rank reduces
  int64_t vecs = 0;         // 16-byte vectors it reduces

  // Builds the plan; false (and *why set) when the shape does not fit. `max_blocks`: at most this
  // many blocks (the SM count: one block per SM); fewer when there is less work than one vector
  // per thread.
  static bool make(SmallReduceMode mode, int32_t ranks, int32_t rank, int64_t block_elems, int32_t max_blocks,
                   SmallReducePlan* out, const char** why) {
    if (ranks <= 0 || ranks > kMaxRanks || rank < 0 || rank >= ranks) {
      *why = "ranks must be in [1, 8] and rank in [0, ranks)";
      return false;
    }
    if (block_elems <= 0 || block_elems % 8 != 0) {
      *why = "a rank's row block must be a positive multiple of 8 elements (16-byte vectors)";
      return false;
    }
    if (max_blocks <= 0) {
      *why = "max_blocks must be positive";
      return false;
    }
    out->mode = mode;
    out->ranks = ranks;
    out->rank = rank;
    out->block_elems = block_elems;
    const bool all_rows = mode == SmallReduceMode::kAllReduceOneShot;
    out->region = all_rows ? 0 : int64_t(rank) * block_elems;
    out->vecs = (all_rows ? int64_t(ranks) * block_elems : block_elems) / 8;
    // One vector per thread before a second slot: more SMs issuing loads beat more loads per SM.
    const int64_t want = (out->vecs + kThreads - 1) / kThreads;
    out->blocks = int32_t(want < max_blocks ? want : max_blocks);
    return true;
  }

  WEFT_HD bool pushes() const { return mode == SmallReduceMode::kAllReduceTwoShot; }
  // Vectors covered by one pass of the whole grid; pass p, slot u (< kUnroll) of thread t in block b
  // reduces vector p · pass_vecs() + u · blocks · kThreads + b · kThreads + t (each slot coalesced).
  WEFT_HD int64_t pass_vecs() const { return int64_t(blocks) * kThreads * kUnroll; }
  WEFT_HD int64_t vec_at(int64_t pass, int32_t u, int32_t block, int32_t thread) const {
    return pass * pass_vecs() + (int64_t(u) * blocks + block) * kThreads + thread;
  }
  WEFT_HD int64_t passes() const { return (vecs + pass_vecs() - 1) / pass_vecs(); }

  // Flag words of one rank: ready[q] at q, gathered[q] at W + q (written by rank q), and the count
  // of this rank's finished GEMM tiles at 2 W (its GEMM's TileSignal; peers read it over NVLink).
  WEFT_HD static int32_t words(int32_t ranks) { return 2 * ranks + 1; }
  WEFT_HD int32_t tiles_word() const { return 2 * ranks; }
  WEFT_HD int32_t ready_word(int32_t q) const { return q; }
  WEFT_HD int32_t gathered_word(int32_t q) const { return ranks + q; }
  // gathered[q] after this launch, given its value after the launches before (`before`): rank q's
  // blocks of every two-shot launch; other launches leave it.
  WEFT_HD uint64_t gathered_after(uint64_t before) const { return pushes() ? before + uint64_t(blocks) : before; }
  // Which copy of the partial epoch e uses.
  WEFT_HD static int32_t parity(uint64_t epoch) { return int32_t(epoch & 1); }
};

}  // namespace weft::kernels
