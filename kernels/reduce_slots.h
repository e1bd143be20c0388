// Reduction of per-rank partial-sum slots after a bounded wait for their arrival (GEMM+RS / AR).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/frame.h"
#include "runtime/status.h"

namespace weft::kernels {

struct ReduceSlotsArgs {
  static constexpr int kMaxDsts = 8;
  const uint64_t* arrived = nullptr;  // arrived[s] >= expected once slot s is complete (local flags)
  int32_t slots = 0;                  // number of slots (ranks), summed in slot order 0, 1, ...
  uint64_t expected = 0;
  const __nv_bfloat16* base = nullptr;  // slot s at base + s * elems
  int64_t elems = 0;                    // per slot; a multiple of 8 takes the 16-byte path
  __nv_bfloat16* dst[kMaxDsts] = {};    // the sum is written to each (local and peer pointers)
  int32_t ndst = 1;
};

// Every block first waits (bounded, frame timeout) for all slots, then sums its share with fp32
// accumulation in a fixed slot order, so the result is the same bits on every run. `blocks` blocks
// of 256 threads; a timeout fills the frame's error record (check it with FrameHost::check).
Status launch_reduce_slots(const ReduceSlotsArgs& args, const FrameParams& frame, int blocks, cudaStream_t stream);

// One block waits (bounded) until flags[i] >= expected for every i < count: the end of an op whose
// output other ranks write (GEMM+AllReduce's gathered blocks).
Status launch_wait_flags(const uint64_t* flags, int32_t count, uint64_t expected, const FrameParams& frame,
                         cudaStream_t stream);

// One thread stores `value` (release, system scope, after a system fence) to every address: tells
// peers that everything this stream wrote to them before is there. Addresses may be peer pointers.
struct FlagTargets {
  static constexpr int kMax = 8;
  uint64_t* addr[kMax] = {};
  int32_t count = 0;
};
Status launch_store_flags(const FlagTargets& targets, uint64_t value, cudaStream_t stream);

}  // namespace weft::kernels
