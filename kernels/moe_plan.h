// MoE data-flow math, CUDA-free and shared by host and device: per-expert counts -> tile-padded
// row offsets, tiles per expert, the worst-case slot reservation against a heap budget, and the
// dispatch layout (each token travels once per destination rank with its expert ids and weights).
//
// One rank of W holds T tokens and L = E / W experts (experts [r L, (r+1) L) on rank r):
//
//   home rank s                               owner rank r (experts e0 .. e0 + L - 1)
//   tokens[T][hidden] ──router──► topk ids/weights
//        │ once per destination rank r that owns >= 1 of the token's k experts
//        └──► recv slab [s][slot] = { row, src token, k x (local expert | -1, weight) }
//                            │ scatter by expert, in (source rank, token) order
//                            ▼
//             X[offsets[e] .. offsets[e] + count[e])   offsets padded to the GEMM tile (128 rows):
//             ┌ e0: count 300 ─┬ pad ┐┌ e1: 0 ┐┌ e2: 128 ┐   a tile never holds two experts' rows,
//             │ tiles 0..2     │     ││       ││ tile 3  │   so the grouped GEMM walks tiles with
//             └────────────────┴─────┘└───────┘└─────────┘   one B (W_e) per tile
//
// Worst case at an owner: every source sends all T tokens (W T rows in the receive slabs) and
// every received token picks min(k, L) local experts, so the grouped rows are at most
// W T min(k, L) + L (tile - 1) (the padding), and never more than L pad(W T). When the buffers for
// that worst case do not fit the heap budget the op exchanges counts first and sizes by them
// (MoeSlotPlan::kCountsFirst); a realised count that still overflows is refused with a message.
#pragma once

#include <cstdint>

#include "base/roles.h"  // WEFT_HD

namespace weft::kernels {

constexpr int32_t kMoeTileRows = 128;  // GemmConfig::kTileM: the grouped GEMM's row tile
constexpr int32_t kMoeMaxTopk = 8;     // the record below has room for this many (expert, weight) pairs
constexpr int32_t kMoeMaxExperts = 1024;

WEFT_HD inline int64_t moe_pad_rows(int64_t count, int32_t tile) { return (count + tile - 1) / tile * tile; }

// offsets[e] = sum over e' < e of pad(counts[e']); offsets[experts] = padded rows in all. O(E):
// the device calls it from one thread (E <= 1024 adds), the host tests it directly.
WEFT_HD inline void moe_expert_offsets(const int32_t* counts, int32_t experts, int32_t tile, int32_t* offsets) {
  int32_t at = 0;
  for (int32_t e = 0; e < experts; ++e) {
    offsets[e] = at;
    at += int32_t(moe_pad_rows(counts[e], tile));
  }
  offsets[experts] = at;
}

WEFT_HD inline int32_t moe_expert_tiles(const int32_t* offsets, int32_t e, int32_t tile) {
  return (offsets[e + 1] - offsets[e]) / tile;
}

// The expert whose rows hold row tile m_tile (m_tile < offsets[experts] / tile): the last e with
// offsets[e] <= row, which is never an empty expert (its offsets[e + 1] would equal offsets[e]).
// Binary search: 8 steps for 256 experts, from L1 on the device.
WEFT_HD inline int32_t moe_expert_of_tile(const int32_t* offsets, int32_t experts, int32_t tile, int32_t m_tile) {
  const int32_t row = m_tile * tile;
  int32_t lo = 0, hi = experts;  // answer in [lo, hi)
  while (hi - lo > 1) {
    const int32_t mid = (lo + hi) / 2;
    if (offsets[mid] <= row)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

// Tile order of the grouped GEMM: unit u of m_tiles x n_blocks units (m_tiles read on the device
// from offsets[experts]) -> (m_tile, n_block). Groups of group_m row tiles, n-major inside a group:
// the blocks running at once share a few row tiles (X stays in L2) and read each weight tile once
// per group instead of once per row tile. A group may span two experts; each tile has one.
WEFT_HD inline void moe_grouped_tile_at(int64_t u, int32_t m_tiles, int32_t n_blocks, int32_t group_m, int32_t* m_tile,
                                        int32_t* n_block) {
  const int64_t per_group = int64_t(group_m) * n_blocks;
  const int32_t g = int32_t(u / per_group);
  const int32_t r = int32_t(u % per_group);
  const int32_t rows = m_tiles - g * group_m < group_m ? m_tiles - g * group_m : group_m;
  *n_block = r / rows;
  *m_tile = g * group_m + r % rows;
}

// Parts per (row tile, column block) of the expert FFN's down phase (kernels/grouped_ring.cuh), split
// over K: the most parts p (2 to kMoeMaxSplit) whose units all fit one wave of the blocks (tiles p <=
// blocks), with at least kMoeMinSplitIters of the k_iters k-blocks a part and tiles p within the
// workspace's slots; 1 where no p of 2 or more fits. 64 pairs on 132 blocks: 2 (one wave of half-K
// units for one of full K); 80: 1. Where the parts take more than one wave (80 pairs in 3 parts: two
// waves of third-K units), the parts' fp32 sums through L2 cost what the waves save: on H100 and
// H200 no forced p beat the unsplit launch at 80 and 96 pairs, while 2 parts of 64 pairs were 10%
// faster on an H200 (docs/moe.md). max_parts: the plan's cap (Execution::split_k; 1: never split).
constexpr int32_t kMoeMaxSplit = 4, kMoeMinSplitIters = 4;
WEFT_HD inline int32_t moe_split_parts(int64_t tiles, int32_t k_iters, int32_t blocks, int32_t slots,
                                       int32_t max_parts = kMoeMaxSplit) {
  if (tiles <= 0 || blocks <= 0) return 1;
  int32_t best = 1;
  for (int32_t p = 2; p <= kMoeMaxSplit && p <= max_parts; ++p) {
    if (k_iters < p * kMoeMinSplitIters || tiles * p > slots || tiles * p > blocks) break;
    best = p;
  }
  return best;
}

// The expert FFN's gate/up units whose last, partial wave is split over K (kernels/grouped_ring.cuh).
// Units are claimed in order, so where every row tile is in one raster group (m_tiles <= group_m:
// decode counts) each tile's gate/up ends in the phase's last wave and no down unit can start beside
// it: units % blocks units run while the other blocks wait (Mixtral-8x7B at 256 tokens on 4 ranks: 560
// units on 132 blocks, 32 of them in a fifth wave). Those units are split by moe_split_parts' rule
// (their parts in one wave: 32 in 4 parts); with more groups, down units of the finished groups fill
// the last wave, and nothing is split. Returns the parts (1: none) and sets *first to the first unit
// split (units when none is).
WEFT_HD inline int32_t moe_up_tail_parts(int64_t units, int32_t m_tiles, int32_t group_m, int32_t k_iters,
                                         int32_t blocks, int32_t slots, int32_t max_parts, int64_t* first) {
  *first = units;
  if (units <= 0 || blocks <= 0 || m_tiles > group_m) return 1;
  const int64_t rem = units % blocks;
  const int32_t p = moe_split_parts(rem, k_iters, blocks, slots, max_parts);
  if (p > 1) *first = units - rem;
  return p;
}

// The MoE layer's sizes (workload keys tokens, hidden, ffn, experts, topk; tokens per rank).
struct MoeShape {
  int32_t tokens = 0;  // per rank
  int32_t hidden = 0;
  int32_t ffn = 0;
  int32_t experts = 0;  // in all ranks
  int32_t topk = 0;
  int32_t world = 1;
  int32_t local_experts() const { return world > 0 ? experts / world : 0; }

  // Why the shape cannot run, or nullptr.
  const char* invalid() const {
    if (tokens <= 0 || hidden <= 0 || ffn <= 0 || experts <= 0 || topk <= 0 || world <= 0)
      return "tokens, hidden, ffn, experts, topk and world must be positive";
    if (topk > experts) return "topk must not exceed experts";
    if (topk > kMoeMaxTopk) return "topk above 8: the dispatch record has room for 8 (expert, weight) pairs";
    if (experts > kMoeMaxExperts) return "more than 1024 experts";
    if (experts % world != 0) return "experts must split evenly over the ranks";
    if (hidden % 8 != 0 || ffn % 128 != 0)
      return "hidden must be a multiple of 8 (16-byte rows) and ffn of 128 (the fused SwiGLU tile halves)";
    return nullptr;
  }
};

// One dispatched token: the header that travels beside its row (16 bytes + k pairs, padded to 16).
// local expert -1 marks a pair that belongs to another rank (the pair keeps its place so that the
// combine can weight in the home's top-k order).
struct MoeDispatchMeta {
  int32_t src_rank;
  int32_t src_token;
  int32_t pairs;  // how many of the k pairs belong to this destination (>= 1)
  int32_t pad;
  int32_t local_expert[kMoeMaxTopk];
  float weight[kMoeMaxTopk];
};
static_assert(sizeof(MoeDispatchMeta) == 16 + 8 * kMoeMaxTopk, "the dispatch header travels as 16-byte vectors");

// Bytes of one receive slot: the bf16 row, then its header (16-byte aligned both).
WEFT_HD inline int64_t moe_slot_bytes(int32_t hidden) {
  return (int64_t(hidden) * 2 + 15) / 16 * 16 + int64_t(sizeof(MoeDispatchMeta));
}

// Destination ranks of one token: bit r set when rank r owns one of its k experts.
WEFT_HD inline uint32_t moe_dest_mask(const int32_t* ids, int32_t topk, int32_t local_experts) {
  uint32_t mask = 0;
  for (int32_t j = 0; j < topk; ++j) mask |= 1u << (ids[j] / local_experts);
  return mask;
}

// The header of token t's copy for rank dst: its pairs in top-k order, foreign ones as -1.
WEFT_HD inline MoeDispatchMeta moe_dispatch_meta(int32_t src_rank, int32_t t, const int32_t* ids, const float* weights,
                                                 int32_t topk, int32_t local_experts, int32_t dst) {
  MoeDispatchMeta m{};
  m.src_rank = src_rank;
  m.src_token = t;
  for (int32_t j = 0; j < kMoeMaxTopk; ++j) {
    const bool mine = j < topk && ids[j] / local_experts == dst;
    m.local_expert[j] = mine ? ids[j] - dst * local_experts : -1;
    m.weight[j] = mine ? weights[j] : 0.f;
    m.pairs += mine ? 1 : 0;
  }
  return m;
}

// How the owner's buffers are sized.
enum class MoeSlotMode : int32_t {
  kWorstCase = 0,    // every buffer sized for the worst case: no count exchange before dispatch
  kCountsFirst = 1,  // counts exchanged first; buffers sized for `capacity_rows` realised rows
};

// Heap bytes of one rank (the symmetric heap: the same on every rank).
struct MoeSlotPlan {
  MoeSlotMode mode = MoeSlotMode::kWorstCase;
  int64_t recv_slots = 0;     // dispatch receive slots: W slabs of T (a sender's token index is its slot)
  int64_t grouped_rows = 0;   // rows of X / H / Y reserved (worst case, or what the budget leaves)
  int64_t recv_bytes = 0;     // recv_slots x moe_slot_bytes
  int64_t grouped_bytes = 0;  // grouped_rows x (hidden X + ffn H + hidden Y) x 2
  int64_t combine_bytes = 0;  // W T rows of hidden bf16: one row per (token, rank) back home
  int64_t counts_bytes = 0;   // W x L int32 counts (kCountsFirst exchange) + flags
  int64_t total_bytes() const { return recv_bytes + grouped_bytes + combine_bytes + counts_bytes; }
};

// Grouped rows an owner can be sent in the worst case (see the diagram).
inline int64_t moe_worst_grouped_rows(const MoeShape& s, int32_t tile = kMoeTileRows) {
  const int64_t l = s.local_experts(), recv = int64_t(s.world) * s.tokens;
  const int64_t pairs = recv * (s.topk < l ? s.topk : l);
  const int64_t padded = moe_pad_rows(pairs + l * (tile - 1), tile);
  const int64_t cap = l * moe_pad_rows(recv, tile);
  return padded < cap ? padded : cap;
}

// Plans the reservation within `budget` bytes per rank: the worst case if it fits, else counts
// first with as many grouped rows as the budget leaves (at least one tile per local expert); false
// with *why when not even that fits.
inline bool moe_plan_slots(const MoeShape& s, int64_t budget, MoeSlotPlan* out, const char** why) {
  if ((*why = s.invalid())) return false;
  MoeSlotPlan p;
  const int64_t l = s.local_experts();
  const int64_t row_bytes = (2 * int64_t(s.hidden) + s.ffn) * 2;
  p.recv_slots = int64_t(s.world) * s.tokens;
  p.recv_bytes = p.recv_slots * moe_slot_bytes(s.hidden);
  p.combine_bytes = int64_t(s.world) * s.tokens * s.hidden * 2;
  p.counts_bytes = (int64_t(s.world) * l + 64) * 8;
  p.grouped_rows = moe_worst_grouped_rows(s);
  p.grouped_bytes = p.grouped_rows * row_bytes;
  if (p.total_bytes() <= budget) {
    *out = p;
    return true;
  }
  p.mode = MoeSlotMode::kCountsFirst;
  const int64_t fixed = p.recv_bytes + p.combine_bytes + p.counts_bytes;
  const int64_t min_rows = l * kMoeTileRows;
  if (fixed + min_rows * row_bytes > budget) {
    *why =
        "heap budget too small: the receive slabs, the combine rows and one tile per local expert do not fit "
        "(raise WEFT_HEAP_BYTES or use more ranks)";
    return false;
  }
  p.grouped_rows = (budget - fixed) / row_bytes / kMoeTileRows * kMoeTileRows;
  p.grouped_bytes = p.grouped_rows * row_bytes;
  *out = p;
  return true;
}

// Counts-first path: whether the realised per-local-expert counts fit the reserved rows; false
// with *why (the message names the padded rows needed and reserved) when they do not. The op then
// refuses the call instead of dropping tokens.
inline bool moe_counts_fit(const MoeSlotPlan& p, const int32_t* counts, int32_t local_experts, int64_t* need_rows,
                           const char** why) {
  int64_t need = 0;
  for (int32_t e = 0; e < local_experts; ++e) {
    if (counts[e] < 0) {
      *why = "a negative expert count";
      return false;
    }
    need += moe_pad_rows(counts[e], kMoeTileRows);
  }
  *need_rows = need;
  if (need > p.grouped_rows) {
    *why = "the routed tokens need more grouped rows than the heap budget reserved (counts-first overflow)";
    return false;
  }
  return true;
}

// The op's symmetric-heap layout on every rank (offsets from its arena, 256-byte aligned): the
// dispatch receive slots (W slabs of T slots), the combine rows (one per (source rank, token)), the
// flag words (dispatch [0, W), combine [W, 2W)), then the grouped rows X (hidden), H (ffn) and
// Y (hidden) of this rank's experts. `weftrun plan` prints it; MoeOp allocates it.
//
// budget 0, or one the worst case fits: the grouped rows hold the worst case (moe_worst_grouped_rows)
// and no routing can overflow them. A smaller budget: counts first, the grouped rows are what the
// budget leaves (whole 128-row tiles, at least one per local expert); a call whose routed rows need
// more is refused by the op (an error naming the rows needed and reserved), never truncated.
// Feeding total_bytes back as the budget gives the same layout (the op recomputes it from the plan).
struct MoeHeapLayout {
  MoeSlotMode mode = MoeSlotMode::kWorstCase;
  int64_t recv_offset = 0, recv_bytes = 0;
  int64_t combine_offset = 0, combine_bytes = 0;
  int64_t flags_offset = 0, flags_bytes = 0;
  int64_t grouped_rows = 0;  // capacity of X, H and Y
  int64_t worst_rows = 0;    // what the worst case would need
  int64_t x_offset = 0, h_offset = 0, y_offset = 0;
  int64_t total_bytes = 0;  // rounded up to 4 KiB (the heap's arena granularity)
};
// False with *why when even one tile per local expert does not fit the budget.
inline bool moe_heap_layout(const MoeShape& s, int64_t budget, MoeHeapLayout* out, const char** why) {
  auto up = [](int64_t v, int64_t a) { return (v + a - 1) / a * a; };
  if ((*why = s.invalid())) return false;
  MoeHeapLayout h;
  const int64_t slots = int64_t(s.world) * s.tokens;
  h.recv_bytes = slots * moe_slot_bytes(s.hidden);
  h.combine_offset = up(h.recv_bytes, 256);
  h.combine_bytes = slots * s.hidden * 2;
  h.flags_offset = up(h.combine_offset + h.combine_bytes, 256);
  // dispatch [0, W) and combine [W, 2W) flags, then the fused launch's comb_done counters: W owners x
  // the rank's token tiles (kernels/moe_ffn_combine.h)
  h.flags_bytes = (2 * int64_t(s.world) + int64_t(s.world) * ((s.tokens + kMoeTileRows - 1) / kMoeTileRows)) * 8;
  h.x_offset = up(h.flags_offset + h.flags_bytes, 256);
  const int64_t row_bytes = (2 * int64_t(s.hidden) + s.ffn) * 2;  // a 128-row tile of each is 256-aligned
  h.worst_rows = moe_worst_grouped_rows(s);
  h.grouped_rows = h.worst_rows;
  if (budget > 0 && up(h.x_offset + h.worst_rows * row_bytes, 4096) > budget) {
    h.mode = MoeSlotMode::kCountsFirst;
    const int64_t rows = budget > h.x_offset ? (budget - h.x_offset) / row_bytes / kMoeTileRows * kMoeTileRows : 0;
    if (rows < int64_t(s.local_experts()) * kMoeTileRows) {
      *why =
          "heap budget too small: the receive slots, the combine rows and one 128-row tile per local expert do "
          "not fit (raise WEFT_HEAP_BYTES or use more ranks)";
      return false;
    }
    h.grouped_rows = rows;
  }
  h.h_offset = h.x_offset + h.grouped_rows * s.hidden * 2;
  h.y_offset = h.h_offset + h.grouped_rows * s.ffn * 2;
  h.total_bytes = up(h.y_offset + h.grouped_rows * s.hidden * 2, 4096);
  *out = h;
  return true;
}

}  // namespace weft::kernels
