// The MoE layer's expert FFN, combine and home reduction in one persistent launch on one node (the
// plan's moe variant "ffn_combine"): the grouped gate/up and down units of launch_grouped_ffn, then,
// claimed from the same counter in this order, the combine units and the home's reduction units.
//
//   tickets  up (row tile, column block) → down (row tile, column block)
//            → combine (home h, chunk c, quarter: receive slots [h][128 c + 32 quarter, +32))
//            → reduce (token tile i of this rank)
//   combine  a warp per slot: waits until every down unit of each row tile holding one of the
//            slot's rows has stored (down_done[m], a counter per row tile raised by each consumer
//            warp of each down unit), sums weight × Y over the slot's local experts in expert
//            order (fp32, rounded once), stores the row into h's combine rows [this rank][t]; then
//            each warp adds one to h's comb_done[this rank][c]
//   reduce   waits until comb_done[q][i] of this rank counts every warp of owner q's four combine
//            units of (this rank, i) in this call, for every q, then sums its tokens' rows in rank order
//   A block holds one tail unit at a time (its producer claims the next once the consumers are done),
//   so the blocks that finish their GEMM units first do not queue the tail's units among a few.
//
// What the separate combine launch did in two launches and a one-block wait now starts on a row of
// the chunk as soon as that row's tiles are done, beside the GEMM units still running, and the home's
// reduction of a token tile starts as soon as every owner has finished that tile's chunk.
//
// comb_done counts up across calls (8 warps x 4 units per chunk per call): call e (the epoch, a device word the
// call's first kernel raised) waits for 32 e, so nothing is reset between calls and a graph replay is a
// new call. Reuse is safe as for the staged op (kernels/moe_exchange.h): an owner's combine of call
// e + 1 for home h follows its arrange of e + 1, which waits for h's dispatch of e + 1, which h makes
// after this launch of call e ended (its reduction included); h's slots at the owner are rewritten
// only after h's reduction saw every owner's combine of h's chunks (their last read of the slots).
//
// A call whose routed rows exceed the reserved grouped rows (counts first) runs this launch to its end
// over the rows that fit (the others dropped and counted) and records the capacity error after it
// (MoeExchangeArgs::capacity_after), so the peers' reductions get every combine count and end; the
// call fails all the same.
//
// No deadlock: a unit waits only for units of earlier tickets (down on up; combine on down; reduce on
// peers' combines, which wait on their own down units only), and a block finishes its units in the
// order it claimed them, so every awaited unit was claimed by a running block that completes it even
// when not every block is resident. Ranks that share a GPU are refused: one rank's blocks waiting in
// reduce could hold every SM from the peer whose combine they wait for (the staged op serves them).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "base/roles.h"  // WEFT_HD
#include "base/status.h"
#include "kernels/frame.h"
#include "kernels/grouped_gemm.h"
#include "kernels/moe_exchange.h"

namespace weft::kernels {

struct MoeFfnCombineArgs {
  // The exchange's buffers (recv, comb, slot_pos, grouped_y, topk_ids, out, epoch, world, rank, tokens,
  // hidden, topk, local_experts).
  const MoeExchangeArgs* ex = nullptr;
  // Every rank's comb_done words (mapped; q == rank is local): world x chunks counters each, word
  // [owner q][chunk c] at q * chunks + c; zero when the op was created.
  uint64_t* comb_done[MoeExchangeArgs::kMaxRanks] = {};
};

// The token tiles of one rank (combine chunks per home, reduce units): ceil(tokens / 128).
inline int32_t moe_ffn_combine_chunks(int32_t tokens) { return (tokens + 127) / 128; }

// Launches the FFN, combine and reduction on frame.roles.compute blocks (at most the SMs). work:
// 2 up.capacity_tiles + 1 device words (the up and down counters per row tile and the claim counter),
// zeroed on the stream by this call. up and down as for launch_grouped_ffn.
Status launch_moe_ffn_combine(const GroupedGemmParams& up, const GroupedGemmParams& down, const MoeFfnCombineArgs& a,
                              uint64_t* work, const FrameParams& frame, cudaStream_t stream);

// Flag index of comb_done word (owner q, chunk c) in a device error record (after the exchange's 2 W
// flags, kernels/moe_exchange.h), and the sentence describe_moe_wait gives for it.
WEFT_HD inline int32_t moe_comb_done_flag(int32_t world, int32_t chunks, int32_t owner, int32_t chunk) {
  return 2 * world + owner * chunks + chunk;
}

}  // namespace weft::kernels
