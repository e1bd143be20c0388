// The MoE layer as one persistent launch on one node (design: docs/moe.md, "The fused persistent
// launch"), CUDA-free and shared by host and device: the tickets of one call, what each unit waits
// for, and the words it counts on. The data-flow model in tests/sim (moe_fused_model) runs a call's
// units from these functions; the kernel will take its tickets from them.
//
// One block per SM takes tickets from one counter, in order, and finishes each unit before the next.
// A call's tickets, per rank r (R token tiles of 128 tokens, W ranks, L local experts, C slot chunks
// per source):
//
//   route    R      token tile i: router GEMM, softmax, top-k, per-destination counts   → routed += 1
//   dispatch R      token tile i: each token's row once per destination q
//                   waits routed == R, freed[q] >= epoch - 1 of every q
//                   (tile 0 first writes this rank's count table into every q, in the call's parity
//                   slot → counts_in += 1 there)                            → sent[r] += 1 at q
//   arrange  W C    (source s, chunk c): slots → X in (expert, source, slot) order, each slot's
//                   header kept beside X for the combine
//                   waits sent[s] == R, counts_in == W          → rows[g] += n per tile g, arranged += 1
//   release  1      waits counts_in == W (every source's call has begun: its adds of the last call
//                   are all in), then arranged == the chunks the counts make: zeroes the next
//                   call's set of words (MoeFusedWords), then freed[r] = epoch at every source
//   up       G Bu   (grouped tile g, column block b)      waits rows[g] == the rows counted into g
//                                                         → up_done[g] += 1
//   down     G Bd   (g, b)                                waits up_done[g] == Bu → down_done[g] += 1
//   combine  W C    (home h, chunk c): one pre-summed row per (token, r) into h's combine rows
//                   waits arranged == the chunks (the slot headers are in: they say which tiles),
//                   then down_done[g] == Bd for every tile g holding a row of the chunk
//                   → combined[r] += 1 at h
//   reduce   R      token tile i at home r: the rows from every owner, summed in rank order
//                   waits combined[q] == chunks of r's slots at q, every q
//
// Across calls (one call in flight per context: a rank's next launch starts once its last has
// ended). The count tables come in two slots, call e writing slot e % 2: up and combine read them
// after freed has let the sources go on, and a source's call e + 2 (the next writer of the slot)
// waits for freed >= e + 1, which comes after this rank's call e has ended. freed is an epoch:
// waited for with >=, as an owner may move it on before a source's later dispatch tile looks. The
// counters come in two sets, call e using set e % 2: the release of call e zeroes set (e + 1) % 2,
// which this rank's call e - 1 was done with (its launch ended) and to which every source has added
// all of its call e - 1 (counts_in == W: each has begun call e); no one adds to it again before freed
// (sources' sent and counts_in) or before this rank's next call (the combined words, added to by
// owners' combines for this rank, which follow this rank's next dispatch). The home's combine rows
// need no wait: an owner's combine for h in call e + 1 waits for tiles holding h's rows, so for h's
// dispatch of call e + 1, which comes after h's call e, reduce included. The simulator runs all of
// it, the sets' zeroing included (tests/sim/test_moe_fused_dataflow.cpp: each wait left out is
// caught, but for the release's counts_in, whose need no interleaving it tried has shown).
//
// G counts grouped tiles over the worst case (moe_worst_grouped_rows): a ticket past the tiles the
// counts make is empty, and so is a chunk past a source's slots. Every wait is on a unit of an
// earlier phase (or of the previous call): no cycle, so no deadlock while the grid is resident
// (the argument in docs/moe.md).
#pragma once

#include <cstdint>

#include "base/roles.h"  // WEFT_HD
#include "kernels/moe_plan.h"

namespace weft::kernels {

enum class MoePhase : int32_t { kRoute = 0, kDispatch, kArrange, kRelease, kUp, kDown, kCombine, kReduce, kEnd };
constexpr int32_t kMoePhases = int32_t(MoePhase::kEnd);

struct MoeFusedShape {
  int32_t world = 1, rank = 0;
  int32_t tokens = 0;   // per rank
  int32_t experts = 0;  // in all ranks
  int32_t topk = 1;
  int32_t up_cols = 1;           // column blocks of the gate/up GEMM (2 ffn wide)
  int32_t down_cols = 1;         // column blocks of the down GEMM (hidden wide)
  int32_t chunk = kMoeTileRows;  // receive slots per arrange and combine unit

  WEFT_HD int32_t local_experts() const { return world > 0 ? experts / world : 0; }
  WEFT_HD int32_t token_tiles() const { return (tokens + kMoeTileRows - 1) / kMoeTileRows; }
  // Chunks of one source's receive slots, worst case (every token of the source comes).
  WEFT_HD int32_t slot_chunks() const { return (tokens + chunk - 1) / chunk; }
  // Grouped tiles of X, worst case (moe_worst_grouped_rows: min(k, L) rows per received token).
  WEFT_HD int32_t worst_tiles() const {
    const int64_t l = local_experts(), recv = int64_t(world) * tokens;
    const int64_t pairs = recv * (topk < l ? topk : l);
    const int64_t padded = moe_pad_rows(pairs + l * (kMoeTileRows - 1), kMoeTileRows);
    const int64_t cap = l * moe_pad_rows(recv, kMoeTileRows);
    return int32_t((padded < cap ? padded : cap) / kMoeTileRows);
  }
  // Why the shape cannot be planned, or nullptr.
  const char* invalid() const {
    if (world < 1 || world > 8) return "the fused MoE launch runs on 1 to 8 GPUs of one node";
    if (rank < 0 || rank >= world) return "rank outside the world";
    if (tokens <= 0 || experts <= 0 || topk <= 0) return "tokens, experts and topk must be positive";
    if (topk > experts || topk > kMoeMaxTopk) return "topk must not exceed experts, nor 8";
    if (experts > kMoeMaxExperts) return "more than 1024 experts";
    if (experts % world != 0) return "experts must split evenly over the ranks";
    if (up_cols <= 0 || down_cols <= 0 || chunk <= 0) return "column blocks and the chunk must be positive";
    return nullptr;
  }
};

// Units of a phase in one call (the worst case for arrange, up, down and combine).
WEFT_HD inline int64_t moe_fused_units(const MoeFusedShape& s, MoePhase p) {
  const int64_t R = s.token_tiles(), WC = int64_t(s.world) * s.slot_chunks(), G = s.worst_tiles();
  switch (p) {
    case MoePhase::kRoute:
    case MoePhase::kDispatch:
    case MoePhase::kReduce:
      return R;
    case MoePhase::kRelease:
      return 1;
    case MoePhase::kArrange:
    case MoePhase::kCombine:
      return WC;
    case MoePhase::kUp:
      return G * s.up_cols;
    case MoePhase::kDown:
      return G * s.down_cols;
    default:
      return 0;
  }
}

// The first ticket of phase p; moe_fused_first(s, MoePhase::kEnd) is the call's ticket count.
WEFT_HD inline int64_t moe_fused_first(const MoeFusedShape& s, MoePhase p) {
  int64_t t = 0;
  for (int32_t q = 0; q < int32_t(p); ++q) t += moe_fused_units(s, MoePhase(q));
  return t;
}

// One unit: route, dispatch, reduce: a = token tile; arrange: a = source, b = chunk; combine: a = home,
// b = chunk; up, down: a = grouped tile, b = column block.
struct MoeUnit {
  MoePhase phase = MoePhase::kEnd;
  int32_t a = 0, b = 0;
};

WEFT_HD inline MoeUnit moe_fused_unit(const MoeFusedShape& s, int64_t ticket) {
  MoeUnit u;
  for (int32_t q = 0; q < kMoePhases; ++q) {
    const int64_t n = moe_fused_units(s, MoePhase(q));
    if (ticket < n) {
      u.phase = MoePhase(q);
      const int64_t per = q == int32_t(MoePhase::kArrange) || q == int32_t(MoePhase::kCombine) ? s.slot_chunks()
                          : q == int32_t(MoePhase::kUp)                                        ? s.up_cols
                          : q == int32_t(MoePhase::kDown)                                      ? s.down_cols
                                                                                               : 1;
      u.a = int32_t(ticket / per);
      u.b = int32_t(ticket % per);
      return u;
    }
    ticket -= n;
  }
  return u;  // past the call's tickets: kEnd
}

// ---- once the counts are in (the owner's view) ----
// counts[s * L + l]: the rows source s sends for local expert l (each of its tokens that chose l).
// X holds them in (expert, source, slot) order, every expert's rows padded to the tile: offsets from
// moe_expert_offsets over the per-expert totals.

// Row of X for the n-th (0-based, in slot order) of source s's rows for local expert l.
WEFT_HD inline int32_t moe_fused_row(const int32_t* offsets, const int32_t* counts, int32_t L, int32_t s, int32_t l,
                                     int32_t nth) {
  int32_t at = offsets[l];
  for (int32_t q = 0; q < s; ++q) at += counts[q * L + l];
  return at + nth;
}

// Rows the counts put in grouped tile g (what up waits for in rows[g]): totals[l] = the rows of local
// expert l from every source; 0 for a tile past them.
WEFT_HD inline int32_t moe_fused_tile_rows(const int32_t* offsets, const int32_t* totals, int32_t L, int32_t g) {
  const int32_t row = g * kMoeTileRows;
  if (row >= offsets[L]) return 0;
  const int32_t e = moe_expert_of_tile(offsets, L, kMoeTileRows, g);
  const int32_t left = totals[e] - (row - offsets[e]);
  return left < kMoeTileRows ? left : kMoeTileRows;
}

// Slot chunks of source s at an owner that receives n slots from it (arrange's and the home's
// combine count: the units past them are empty).
WEFT_HD inline int32_t moe_fused_chunks(const MoeFusedShape& s, int32_t n) { return (n + s.chunk - 1) / s.chunk; }

// ---- the words (uint64, in the op's arena) ----
// Two sets of counters (call e uses set e % 2), then the epoch words. Indices in words.
struct MoeFusedWords {
  int64_t ticket = 0, routed = 0, counts_in = 0, arranged = 0;
  int64_t sent = 0;                              // [W]: dispatch tiles from each source
  int64_t combined = 0;                          // [W]: combine chunks from each owner
  int64_t rows = 0, up_done = 0, down_done = 0;  // [G] each: per grouped tile
  int64_t per_set = 0;                           // words in one set
  int64_t freed = 0;  // [W], after both sets: the call whose arranges owner q finished (epoch)
  int64_t total = 0;  // words in all
  WEFT_HD int64_t in_set(int64_t word, uint64_t epoch) const { return int64_t(epoch % 2) * per_set + word; }
};

WEFT_HD inline MoeFusedWords moe_fused_words(const MoeFusedShape& s) {
  MoeFusedWords w;
  int64_t at = 0;
  w.ticket = at++;
  w.routed = at++;
  w.counts_in = at++;
  w.arranged = at++;
  w.sent = at, at += s.world;
  w.combined = at, at += s.world;
  const int64_t G = s.worst_tiles();
  w.rows = at, at += G;
  w.up_done = at, at += G;
  w.down_done = at, at += G;
  w.per_set = at;
  w.freed = 2 * at;
  w.total = w.freed + s.world;
  return w;
}

}  // namespace weft::kernels
