// Host API of the SM-driven AllGather+GEMM kernel (intra_comm blocks move A's shards over NVLink while
// compute blocks run the gated GEMM core) and of the split-K tail that trims the GEMM's last wave.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"
#include "kernels/frame.h"
#include "kernels/gemm_epilogues.h"
#include "kernels/gemm_types.h"

namespace weft::kernels {

// How intra_comm blocks move a 128-row chunk of a shard between two GPUs of the node.
enum class AgMover : int32_t {
  kPullVec = 0,   // the receiver's SMs read the peer's rows with 16-byte loads and store them locally
  kPushVec = 1,   // the owner's SMs read their rows locally and store them into the peer with 16-byte stores
  kPullBulk = 2,  // receiver: cp.async.bulk peer global -> shared -> local global (TMA, one thread issues)
  kPushBulk = 3,  // owner: cp.async.bulk local global -> shared -> peer global
};
const char* to_string(AgMover m);  // "pull_vec", "push_vec", "pull_bulk", "push_bulk"
// false for an unknown name.
bool parse_ag_mover(const char* name, AgMover* out);

// Who sends what to whom, and where the readiness flags are (one struct for host and device).
//
// Every rank holds the gathered A (m x k, row-major, lda = k) in a buffer the others map; rank s's
// own rows are [s * shard_rows, (s + 1) * shard_rows). A chunk is 128 rows (one GEMM tile row) of a
// shard. Each rank's flag array holds, per 128-row block mb of the gathered A, `flag_cols` words
// (flags[mb * flag_cols + nb]: the GEMM's per-tile gate, kFlagPerTile over the gated GemmParams'
// n_blocks), then `world` clear-to-send words (push movers: cts[q] = epoch once rank q's kernel of
// that epoch has started, i.e. its previous GEMM no longer reads the buffer).
//
// Every intra_comm block moves its 1/intra_comm slice of every chunk and then adds 1 to each of the
// chunk's flags (release, system scope), so a chunk is complete at flag == epoch * intra_comm. The
// rows a rank owns are never moved into it: the host sets their flags to ~0 once.
struct AgMoveParams {
  static constexpr int kMaxRanks = 8;
  __nv_bfloat16* a[kMaxRanks] = {};  // each rank's gathered A ([rank]: local, others: peer-mapped)
  uint64_t* flags[kMaxRanks] = {};   // each rank's flag array (same layout everywhere)
  int32_t rank = 0;
  int32_t world = 1;
  int32_t shard_rows = 0;  // a multiple of 128
  int32_t k = 0;           // a multiple of 8
  int32_t m_blocks = 0;    // 128-row blocks of the gathered A (world * shard_rows / 128)
  int32_t flag_cols = 0;   // flags per 128-row block
  uint64_t epoch = 0;      // this launch's epoch (>= 1, rising by one per launch)
  AgMover mover = AgMover::kPullVec;

  WEFT_HD int64_t cts_offset() const { return int64_t(m_blocks) * flag_cols; }
  WEFT_HD int64_t flag_words() const { return cts_offset() + world; }
};

// Launches the fused kernel on `stream`: grid = frame.roles.total() blocks of GemmConfig::kThreads.
// Blocks [0, roles.compute) run the GEMM (g.cluster_m must be 1; g's schedule: num_shards = world,
// first_shard = rank) gated on `gate` (kFlagPerTile on move.flags[rank], expected
// epoch * roles.intra_comm); blocks of roles.intra_comm move the shards. roles.compute may be 0: the
// launch then only gathers (what the movers alone cost). Needs roles.intra_comm >= 1. `opt`: the
// split tail and tile claims as launch_gemm sets them up (the caller encodes C for TMA stores).
Status launch_ag_gemm_fused(const GemmParams& g, const FrameParams& frame, const EpiStoreBf16& epi,
                            const FlagGate& gate, const AgMoveParams& move, cudaStream_t stream,
                            const GemmOptions& opt = GemmOptions{});

// The split-K tail: the tiles of the GEMM's last, partly filled wave computed in two K halves by
// two halves of the grid at once, fp32 partial sums added into `acc` (m x n, zero before the
// launch). `half0` / `half1` describe the same m x n output over K columns [0, k/2) and [k/2, k).
Status launch_split_k_pair(const GemmParams& half0, const GemmParams& half1, const FrameParams& frame, float* acc,
                           cudaStream_t stream);

// c[i][j] = bf16(acc[i][j]) for an m x n block (c row stride ldc elements), and acc is zeroed for
// the next launch.
Status launch_acc_to_bf16(float* acc, int64_t m, int64_t n, __nv_bfloat16* c, int64_t ldc, cudaStream_t stream);

}  // namespace weft::kernels
