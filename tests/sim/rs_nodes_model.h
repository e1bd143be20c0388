// The multi-node GEMM+ReduceScatter / GEMM+AllReduce plans (kernels/gemm_reduce_nodes_plan.h) as
// simulator actions, the way the runner (runtime/ops/gemm_reduce_nodes_run.cpp) and the kernel
// (kernels/gemm_reduce_nodes.cu) run them:
//
//   compute     per (position, piece), dealt over `compute_blocks` streams: [gated: wait gate]
//               ─► below lo: my partial ─► `partial`; from lo: my partial + every slot (the
//               epilogue sums them all; an untouched slot is zero) ─► `out` ─► tiles[pos, piece]
//   inter_send  rail_freed(me) = e-1 at every rail peer; then per message (channel m % channels):
//               wait tiles (and, into a slot, the peer's rail_freed) ─► out ─NIC─► the peer's slot
//               (AllReduce: my reduced rows ─NIC─► every rail peer's C) ─► the peer's flag
//   copy        wait every target's mate_freed(target) >= e-1 ─► per copy, per piece: wait tiles
//               ─► partial / out ─NVLink─► the target's slot ─► its arrived flag
//   gates       per gated (position, piece): [rail_freed(owner) >= e-1] and every gate slot's
//               arrived flag ─► gate = e
//   ag, fwd     AllReduce: my reduced rows ─► my C and every mate's C; every rail peer's rows that
//               arrived ─► every mate's C
//   main        after the kernel: mate_freed(me) = e at every mate; AllReduce: wait every owner's rows
//
// Checked on top of the simulator's own checks: each owner's reduced rows hold every rank's
// partial exactly once (and AllReduce: every rank's C holds every owner's reduced rows), every
// summed slot holds this run's partials of the right rows, NVLink moves stay inside a node and
// NIC moves join rail peers.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/gemm_reduce_nodes_plan.h"
#include "tests/sim/dataflow_sim.h"

namespace weft::sim {

struct RsNodesSimOptions {
  bool all_reduce = false;
  int pieces = 2;                          // per owner's row block
  int runs = 2;                            // back-to-back runs: slots are reused, guarded by the "freed" flags
  int compute_blocks = 1;                  // 1: tiles strictly in order (the strictest for deadlocks)
  int channels = 1;                        // proxy channels
  int64_t block_bytes = int64_t(1) << 20;  // one owner's rows of C
  bool barrier = true;                     // the harness's all-reduce before each run
};

Result simulate_rs_nodes(const std::vector<kernels::RsNodesPlan>& plans, const std::vector<int>& node_of,
                         const std::vector<int>& local_of, const RsNodesSimOptions& opt);

}  // namespace weft::sim
