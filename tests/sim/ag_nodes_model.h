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
// With copy_in (a runtime op's calls, below): main copies the caller's shard into position 0 first,
// and with kFreedAtEnd the freed words move from the start of a run to after its last GEMM tile.
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
  // A runtime op's calls (not the runner's fixed input): each run copies the caller's new shard into
  // position 0 on the main stream before its own flags, and node-mates' pulls wait for the mate's own
  // flag of the run. What the copy-in waits for:
  //   kNone:      nothing but this rank's previous run (stream order) — races the readers of run e-1
  //   kFreed:     every node-mate's mate_freed and every rail peer's rail_freed >= e - 1, with freed
  //               raised at the start of a run as the kernel does now — a wait cycle
  //   kFreedAtEnd: the same words, raised by each rank once its kernel of run e-1 is done (after its
  //               last compute and intra_comm block), which covers every read of its position 0:
  //               the mates' pulls and the rail peers' arrivals (so it does not rely on the
  //               model's join of a rank's proxy streams with its run, which the real proxy lacks)
  enum class CopyIn { kFixedInput, kNone, kFreed, kFreedAtEnd };
  CopyIn copy_in = CopyIn::kFixedInput;
};

// node_of, local_of: per rank of the job, for the link checks. plans[r] is rank r's plan.
Result simulate_ag_nodes(const std::vector<kernels::AgNodesPlan>& plans, const std::vector<int>& node_of,
                         const std::vector<int>& local_of, const AgNodesSimOptions& opt);

}  // namespace weft::sim
