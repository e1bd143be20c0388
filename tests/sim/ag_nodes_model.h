// The multi-node AllGather+GEMM plans (kernels/ag_gemm_nodes_plan.h) as simulator actions, the way
// the runner (runtime/ops/ag_gemm_nodes_op.cpp) and the kernel (kernels/ag_gemm_nodes.cu) run them:
//
//   main     flag[0, c] = e for every chunk (the own shard is position 0)
//   copy     per pull, per chunk: the mate's position 0 ─NVLink─► my position ─► my flag
//   send     first: every rail peer's rail_freed[me] = e - 1 (they may put into me); then per chunk
//            (on channel c % channels), per send: wait my rail_freed[peer] >= e - 1 ─► my position 0
//            ─NIC─► the rail peer's position ─► its flag
//   forward  block 0 first: every node-mate's mate_freed[me] = e - 1; then per chunk, per forward
//            (item i on block i % forward_blocks): wait my flag[src_pos, c] and my mate_freed[target]
//            >= e - 1 ─► every target mate's position (NVLink) ─► their flags
//   compute  per position, per chunk (dealt over `compute_blocks` streams as the persistent
//            scheduler deals tiles): wait flag[pos, c] ─► the GEMM reads it ─► C rows of that shard
//
// Checked on top of the simulator's own checks: each position holds the shard the plan's order
// says, written in this run (exactly once: a second write is an error), every rank's C has every
// shard's rows of every run, NVLink moves stay inside a node and NIC moves join rail peers.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/ag_gemm_nodes_plan.h"
#include "tests/sim/dataflow_sim.h"

namespace weft::sim {

struct AgNodesSimOptions {
  int chunks = 2;                          // per shard
  int runs = 2;                            // back-to-back runs (flags carry the run's epoch)
  int compute_blocks = 1;                  // 1: tiles strictly in order (the strictest for deadlocks)
  int channels = 1;                        // inter_send threads: chunk c on channel c % channels
  int forward_blocks = 1;                  // intra_comm blocks: item i (chunk-major) on block i % blocks
  int64_t shard_bytes = int64_t(1) << 20;  // one rank's rows of A
  bool barrier = true;                     // the harness's all-reduce before each run
  bool freed = true;                       // puts and forwards wait for their peer's "freed" (false: the
                                           //   kernel before the freed round, to show the race it had)
};

// node_of, local_of: per rank of the job, for the link checks. plans[r] is rank r's plan.
Result simulate_ag_nodes(const std::vector<kernels::AgNodesPlan>& plans, const std::vector<int>& node_of,
                         const std::vector<int>& local_of, const AgNodesSimOptions& opt);

}  // namespace weft::sim
