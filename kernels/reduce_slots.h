// One-kernel reduction of every rank's partial rows over NVLink (GEMM+RS / AR when M is small).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/frame.h"
#include "runtime/status.h"

namespace weft::kernels {

// Rank r's part of a reduce-scatter (or all-reduce) of W partial C's that every rank holds in a
// CUDA-IPC-mapped buffer: r sums its own row block of all W partials (reading the peers' over
// NVLink) and writes the sum to every destination. One launch, after the GEMM on the same stream:
//
//   block 0: ready_out[q] = epoch on every rank q ("my partial is complete")
//   every block: wait (bounded) ready_in[q] >= epoch for all q; sum its share in rank order
//     0, 1, ... (fp32, rounded once: the same bits every run); write it to each dst; then
//     done_out[q] += 1 on every rank q
//   block 0: wait (bounded) done_in[q] >= epoch * blocks for all q: every rank has read this
//     rank's partial (it may be overwritten next) and written its rows here (AllReduce)
struct PeerReduceArgs {
  static constexpr int kMaxRanks = 8;
  int32_t ranks = 0;
  const __nv_bfloat16* src[kMaxRanks] = {};  // rank q's partial rows of this rank's block (peer pointers)
  int64_t elems = 0;                         // of the block; a multiple of 8 takes the 16-byte path
  __nv_bfloat16* dst[kMaxRanks] = {};        // RS: this rank's output; AR: this block's rows of every C
  int32_t ndst = 0;
  uint64_t* ready_out[kMaxRanks] = {};       // &ready[this rank] on rank q
  const uint64_t* ready_in = nullptr;        // local ready[q]
  uint64_t* done_out[kMaxRanks] = {};        // &done[this rank] on rank q
  const uint64_t* done_in = nullptr;         // local done[q]
  uint64_t epoch = 0;                        // rises by one per launch
};

// `blocks` x 256 threads; the same `blocks` on every launch of one set of flags (done counts
// blocks). A timeout fills the frame's error record (check it with FrameHost::check).
Status launch_peer_reduce(const PeerReduceArgs& args, const FrameParams& frame, int blocks, cudaStream_t stream);

}  // namespace weft::kernels
