// Host API of the MoE layer's data movement on one node: dispatch (each token once per destination
// rank, with its expert ids and weights), the owner's scatter into per-expert row tiles, the
// combine (one pre-reduced row per (token, home rank)) and the home's reduction, plus the flag
// rounds between ranks. The expert FFN between scatter and combine is the grouped GEMM.
//
//   home rank s (tokens t)                     owner rank d (local experts)
//   x[t] ──dispatch──► recv_d[s][t] = {row, MoeDispatchMeta}      (a header for every t; the row
//        signal dispatch[s] on d ─────────►   only where d owns one of t's experts)
//                                  wait dispatch[q] >= e for every q
//                                  count per local expert -> offsets (padded to 128 rows)
//                                  scatter rows to X[offsets[e] + i], slot_pos[slot][j] = row
//                                  grouped GEMM: H = SiLU(X Wg) * (X Wu), Y = H Wd
//   comb_s[d][t] ◄──combine────── Σ over t's local experts, in expert order, weight_j * Y[slot_pos]
//   wait combine[q] >= e ◄──────── signal combine[d] on s
//   out[t] = Σ over t's destination ranks q, in rank order, comb_s[q][t]
//
// Every rank signals every rank in both rounds (a slot with no pairs carries pairs = 0), so a
// call's waits never depend on the routing. Reuse of the receive slots by the next call is safe
// without a third round: a home dispatches call e + 1 only after its combine wait of call e, which
// each owner signals after its last read of the slots of call e. Both waits are one-block kernels
// so ranks that share a GPU never hold its SMs while they wait. Flags carry the call's epoch, a
// device word that launch_moe_begin raises by one per call, so a captured call replays. Sums run in fixed orders, so a
// call repeats bit for bit.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "base/status.h"
#include "kernels/frame.h"
#include "kernels/moe_plan.h"

namespace weft::kernels {

struct MoeExchangeArgs {
  static constexpr int kMaxRanks = 8;
  int32_t world = 1, rank = 0;
  int32_t tokens = 0;  // per rank (T): the slots of one source in a receive buffer
  int32_t hidden = 0, topk = 0, local_experts = 0;
  // This rank's tokens and their routing (router outputs).
  const __nv_bfloat16* x = nullptr;  // T x hidden
  const int32_t* topk_ids = nullptr;
  const float* topk_weights = nullptr;
  // Symmetric heap, per rank q (mapped; q == rank is local): receive slots (world x T slots of
  // moe_slot_bytes(hidden)), combine rows (world x T rows of hidden bf16) and flag words
  // (dispatch [0, W), combine [W, 2W)).
  uint8_t* recv[kMaxRanks] = {};
  __nv_bfloat16* comb[kMaxRanks] = {};
  uint64_t* flags[kMaxRanks] = {};
  // Owner scratch (local).
  int32_t* counts = nullptr;           // local_experts
  int32_t* offsets = nullptr;          // local_experts + 1
  int32_t* cursor = nullptr;           // local_experts
  int32_t* slot_pos = nullptr;         // world x T x topk: row of X of (slot, pair j), -1 when the pair is not here
  int32_t* dropped = nullptr;          // rows beyond capacity_rows (never expected: asserted 0 by the tests)
  __nv_bfloat16* grouped_x = nullptr;  // capacity_rows x hidden
  const __nv_bfloat16* grouped_y = nullptr;  // capacity_rows x hidden (the down projection)
  int64_t capacity_rows = 0;
  __nv_bfloat16* out = nullptr;  // T x hidden
  uint64_t* epoch = nullptr;     // device word (local): the calls so far; launch_moe_begin raises it
  // The routed rows checked against capacity_rows after the expert FFN (launch_moe_capacity) instead
  // of inside launch_moe_arrange: the FFN + combine launch (moe_ffn_combine.h) must run to its end on an
  // overflow, or its peers would wait for combine rows it never sends, and so must a relay across nodes
  // (moe_nodes.h: a recorded error ends the call's later waits at once, and it would sum rows its
  // node-mates have not written yet); the call fails all the same.
  bool capacity_after = false;
};

// Phase launches, in call order on one stream. Each checks its arguments once per call (cheap).
// begin: this call's epoch (one thread adds one to *epoch), first in every call.
Status launch_moe_begin(const MoeExchangeArgs& a, cudaStream_t stream);
// dispatch: every (token, rank) pair of this rank into the ranks' receive slots; then signals.
Status launch_moe_dispatch(const MoeExchangeArgs& a, cudaStream_t stream);
// Waits (one block, bounded: the frame's record names the flag) until every rank's dispatch flag
// reached the epoch, then counts, offsets and scatters the arrivals into grouped_x.
Status launch_moe_arrange(const MoeExchangeArgs& a, const FrameParams& frame, cudaStream_t stream);
// With capacity_after: records the capacity error (the call then fails) where the routed rows exceed
// capacity_rows; launched after the FFN + combine launch.
Status launch_moe_capacity(const MoeExchangeArgs& a, const FrameParams& frame, cudaStream_t stream);
// Pre-reduces and sends the combine rows, signals, waits for every owner's rows and reduces them.
Status launch_moe_combine(const MoeExchangeArgs& a, const FrameParams& frame, cudaStream_t stream);

// Flag words of the exchange (index in the flag array, for error messages).
WEFT_HD inline int32_t moe_dispatch_flag(int32_t src) { return src; }
WEFT_HD inline int32_t moe_combine_flag(int32_t world, int32_t src) { return world + src; }

// One sentence naming what a timed-out exchange wait of this rank awaited (or, for a kCapacity
// record, the grouped rows the routed tokens needed and the rows reserved), from the frame's record
// (filled by the waits of launch_moe_arrange / launch_moe_combine: flag_index = the awaited word):
// "rank 0 waited 3.0 s for rank 1's dispatched tokens (flag 1: saw 4, expected 5)". Empty when the
// record is not one of those waits.
std::string describe_moe_wait(const DeviceError& e, int32_t world);

}  // namespace weft::kernels
