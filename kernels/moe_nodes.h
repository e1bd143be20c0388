// Host API of the MoE layer's data movement across nodes (the route of kernels/moe_nodes_plan.h, the
// regions of MoeNodesHeap): a token crosses the NIC once per destination node, to the home's rail
// peer there (the relay), which forwards it over NVLink to the node's ranks that own its experts; the
// combine comes back the same way, the relay summing its node's rows first.
//
//   home h = (n, l)                   relay r = (m, l)                    owner d on node m
//   dispatch_local: d on n ─NVLink─► recv_d[h][t] (as on one node)
//                   node m: compact slot c in rail_out[m], route[t] = c
//   rail push: put rail_out[m] (route + count slots) + signal ──NIC──► rail_in[n], rail_flags[n]
//              (in one piece per proxy channel, each with its own flag word)
//                                     wait rail_flags, forward: header (and row where d owns one of
//                                     t's experts) ─NVLink─► recv_d[h][t] for every d on m; signal
//                                     dispatch flag h on every d
//   ... arrange, grouped FFN on every owner (kernels/moe_exchange.h) ...
//   combine: d's pre-sum of t ─NVLink─► comb_h[d][t] (h on d's node) or node_comb_r[n][local d][t];
//            signal combine flag d on every rank of d's node
//                                     wait the node's combine flags; sum node_comb over the node's
//                                     owners of t in local order ─► comb_out[n][c]; put + signal
//   home: wait the node's combine flags and every relay's ◄──NIC── comb_in[m][c], rail_flags[N + m]
//   out[t] = Σ in node order: the own node's rows in local order, a remote node's summed row (the
//   relay rounds it to bf16 before it travels, so the result is not the one-node op's bits)
//
// Every home sends every other node a block each call (count 0 when no token goes there) and every
// relay answers, so no wait depends on the routing. Reuse across calls needs no extra round: a home
// dispatches call e + 1 only after its combine waits of call e, which each relay answers after its
// last read of rail_in and node_comb of call e (the ordering argument of moe_exchange.h, one hop
// longer). Flags carry the call's epoch (a device word), so a captured call replays; pushes name the
// peer and status of a failed push in a host-mapped word. Sums run in fixed orders: a call repeats bit
// for bit.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"
#include "kernels/frame.h"
#include "kernels/moe_exchange.h"
#include "transport/device_fifo.h"

namespace weft::kernels {

struct MoeNodesArgs {
  static constexpr int kMaxRanks = MoeExchangeArgs::kMaxRanks;
  // The one-node arguments, this rank's view: recv, comb and flags are set for the ranks of its node
  // (NVLink-mapped) and nullptr for the others.
  MoeExchangeArgs ex;
  int32_t nodes = 2, per_node = 1, node = 0, local = 0;
  int32_t rank_at[kMaxRanks] = {};  // node * per_node + local -> rank
  int32_t node_of[kMaxRanks] = {}, local_of[kMaxRanks] = {};
  __nv_bfloat16* node_comb[kMaxRanks] = {};  // node-mates' node_comb regions (mapped), nullptr elsewhere
  // This rank's regions (local pointers) and their heap offsets (the transport addresses the heap).
  uint8_t *rail_out = nullptr, *rail_in = nullptr;
  __nv_bfloat16 *comb_out = nullptr, *comb_in = nullptr;
  uint64_t* rail_flags = nullptr;
  uint64_t rail_out_off = 0, rail_in_off = 0, comb_out_off = 0, comb_in_off = 0, rail_flags_off = 0;
  int64_t route_bytes = 0, block_bytes = 0;
  static constexpr int kMaxChannels = 8;
  transport::DeviceFifo fifo[kMaxChannels];  // a block moves in `channels` pieces, one per proxy channel
  int32_t channels = 1;
  int32_t* rail_counts = nullptr;            // local scratch: compact slots per destination node, zeroed per call
  unsigned long long* push_error = nullptr;  // host-mapped: the first failed push, peer << 32 | status
};

// Phase launches, in call order on one stream (launch_moe_begin of moe_exchange.h first; then these
// around launch_moe_arrange and the grouped FFN).
// dispatch: the node's ranks directly, the other nodes' relays through the proxy; then, as a relay,
// waits (bounded) for every other node's block and forwards it to the node's ranks.
Status launch_moe_nodes_dispatch(const MoeNodesArgs& a, const FrameParams& frame, cudaStream_t stream);
// combine: the pre-sums to homes on the node and to the relays of remote homes; as a relay the node's
// sums back through the proxy; as a home the wait for them and the reduction into ex.out.
Status launch_moe_nodes_combine(const MoeNodesArgs& a, const FrameParams& frame, cudaStream_t stream);

// Flag indexes in frame records of the rail waits: kMoeRailFlag + i, i in [0, 2 N C) as in rail_flags.
constexpr int32_t kMoeRailFlag = 1 << 24;

}  // namespace weft::kernels
