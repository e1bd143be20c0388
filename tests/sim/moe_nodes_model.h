// The expert-parallel MoE routes across nodes (kernels/moe_nodes_plan.h) as simulator actions,
// one run, with a given routing (the destination ranks of every token):
//
//   dispatch  per rail peer: my tokens touching its node ─NIC─► its relay buffer ─► flag; per
//             mate (and myself): my tokens for it ─NVLink─► its receive slots ─► flag
//   forward   wait every rail peer's message ─► per mate (and myself): the relayed tokens for it
//             ─NVLink─► its receive slots ─► flag
//   expert    wait every mate's direct and forwarded messages ─► one pre-summed row per received
//             token (this rank's experts of it)
//   combine   per mate (and myself): rows of tokens whose home is that mate, and rows of tokens
//             that mate relayed ─NVLink─► it ─► flag
//   relay     wait every mate's combine message ─► per rail peer: its tokens' rows from this node,
//             summed in local-index order ─NIC─► it ─► flag
//   home      wait every mate's and rail peer's message ─► out[t] = the sum over t's destinations
//
// Checked: every token reaches every destination rank once (no more, no less), every home's
// output holds each destination's row exactly once, and the simulator's deadlock checks (and race
// checks, when on).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/moe_nodes_plan.h"
#include "tests/sim/dataflow_sim.h"

namespace weft::sim {

// Destination ranks (sorted, distinct) of token t of home h at [h * tokens + t]: topk distinct
// experts of `experts` drawn from a seeded generator, expert e on rank e / (experts / world).
std::vector<std::vector<int>> moe_routing(int world, int tokens, int topk, int experts, uint64_t seed);

Result simulate_moe_nodes(const std::vector<kernels::MoeNodesPlan>& plans, const kernels::MoeNodesPlacement& pl,
                          const std::vector<std::vector<int>>& dests, int tokens, int64_t row_bytes, bool races);

}  // namespace weft::sim
