// One-kernel reduction of every rank's partial rows over NVLink (GEMM+RS / AR when M is small).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"
#include "kernels/frame.h"
#include "kernels/small_reduce_plan.h"

namespace weft::kernels {

// Rank r's part of a reduce-scatter (or all-reduce) of W partial C's that every rank holds in a
// CUDA-IPC-mapped buffer. One launch after the GEMM on the same stream; every transfer is a load
// from a peer (NVLink), every store is local, and each phase ends with one system-scope release by
// the last block to finish (a system fence per block was measured to serialise across the GPU):
//
//   block 0: ready[r] = e on every rank ("my partial is complete")
//   every block: wait (bounded) ready[q] >= e for all q; sum its share of rank r's rows of all W
//     partials in rank order 0, 1, ... (fp32, rounded once: the same bits every run) into `out`
//   AllReduce: the last block: reduced[r] = e on every rank; every block waits reduced[q] >= e and
//     copies rank q's reduced rows from q's C into the local C
//   the last block: done[r] = e on every rank, then waits (bounded) done[q] >= e for all q: every
//     rank has finished reading this rank's buffers, which may be overwritten next
struct PeerReduceArgs {
  static constexpr int kMaxRanks = 8;
  int32_t ranks = 0, rank = 0;
  const __nv_bfloat16* src[kMaxRanks] = {};         // rank q's partial rows of this rank's block (mapped)
  int64_t elems = 0;                                // of one block; a multiple of 8 takes the 16-byte path
  __nv_bfloat16* out = nullptr;                     // this rank's reduced block (local)
  bool all_gather = false;                          // AllReduce: also gather every rank's reduced block
  const __nv_bfloat16* gather_src[kMaxRanks] = {};  // rank q's reduced block in q's memory (mapped)
  __nv_bfloat16* gather_dst[kMaxRanks] = {};        // where it goes here (local)
  uint64_t* flags_out[kMaxRanks] = {};              // rank q's flag array (mapped): ready [0, W), reduced [W, 2W),
                                                    // done [2W, 3W); this rank writes entry `rank` of each
  const uint64_t* flags_in = nullptr;               // this rank's flag array (3 W entries)
  uint64_t* arrive = nullptr;                       // local, 2 block counters (reduce and gather phases)
  uint64_t epoch = 0;                               // rises by one per launch
};

// `blocks` x 256 threads, all resident at once (blocks wait for each other's phases); the same
// `blocks` on every launch of one set of counters. A timeout fills the frame's error record (check
// it with FrameHost::check).
Status launch_peer_reduce(const PeerReduceArgs& args, const FrameParams& frame, int blocks, cudaStream_t stream);

// The small-shape reduction (plan and phases in small_reduce_plan.h): one flag round before the
// data, and for the two-shot AllReduce one after it; 16-byte loads of all W partials in flight at
// once, pushes straight from registers.
struct SmallReduceArgs {
  SmallReducePlan plan;
  const __nv_bfloat16* src[SmallReducePlan::kMaxRanks] = {};  // rank q's partial of this epoch (mapped), at
                                                              // element 0 of C (the plan's region is added)
  __nv_bfloat16* out = nullptr;                          // local: element `plan.region` of the result goes to out[0]
  __nv_bfloat16* push[SmallReducePlan::kMaxRanks] = {};  // two-shot: where rank q keeps this rank's
                                                         // reduced block (mapped); [rank] unused
  uint64_t* words_out[SmallReducePlan::kMaxRanks] = {};  // rank q's flag words (mapped)
  const uint64_t* words_in = nullptr;                    // this rank's flag words (local)
  uint64_t epoch = 0;                                    // rises by one per launch, from 1
  uint64_t gathered = 0;  // two-shot: plan.gathered_after(the value after the previous launches)
  uint32_t skip = 0;      // kSmallReduceSkip* (diagnostics)
  // Ready from the GEMMs' tile counts instead of the ready round: rank q's count (mapped), and the
  // value every count reaches with this run. Null: the ready round.
  const uint64_t* tiles[SmallReducePlan::kMaxRanks] = {};
  uint64_t tiles_target = 0;
};

// `plan.blocks` x SmallReducePlan::kThreads. With `after_previous` the launch may start while the
// kernel before it on the stream drains (programmatic dependent launch); the kernel waits for that
// kernel's completion before it touches memory. A timed-out wait fills the frame's error record:
// role intra_comm, flag_index = the awaited word (ready[q] = q, gathered[q] = W + q, tiles 2 W),
// tile_n = q.
Status launch_small_reduce(const SmallReduceArgs& args, const FrameParams& frame, bool after_previous,
                           cudaStream_t stream);
// One line naming rank, peer and the awaited flag for a record filled by launch_small_reduce
// (nothing when the record is empty or not this kernel's).
void describe_small_reduce_error(const DeviceError& e, const SmallReducePlan& plan, const char* what);

}  // namespace weft::kernels
