// Kernel behind reduce_slots.h.
#include "kernels/reduce_slots.h"

#include "kernels/frame.cuh"
#include "runtime/log.h"

namespace weft::kernels {
namespace {

// Thread 0 waits for every flag; the block learns the outcome through shared memory.
__device__ bool wait_all(const FrameParams& f, const uint64_t* flags, int32_t count, uint64_t expected) {
  __shared__ int ok;
  if (threadIdx.x == 0) {
    ok = 1;
    for (int32_t s = 0; s < count && ok; ++s)
      if (!frame_wait_flag(f, flags + s, expected, Role::kIntraComm, -1, -1, s)) ok = 0;
  }
  __syncthreads();
  return ok != 0;
}

__global__ void peer_reduce_kernel(const PeerReduceArgs a, const FrameParams f) {
  // The GEMM before this kernel on the stream has completed: its partial is in memory.
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    __threadfence_system();
    for (int32_t q = 0; q < a.ranks; ++q) flag_store_release(a.ready_out[q], a.epoch);
  }
  if (!wait_all(f, a.ready_in, a.ranks, a.epoch)) return;
  const int64_t vecs = a.elems % 8 == 0 ? a.elems / 8 : 0;
  for (int64_t v = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; v < vecs; v += int64_t(gridDim.x) * blockDim.x) {
    uint4 raw[PeerReduceArgs::kMaxRanks];
#pragma unroll
    for (int32_t q = 0; q < PeerReduceArgs::kMaxRanks; ++q)
      if (q < a.ranks) raw[q] = reinterpret_cast<const uint4*>(a.src[q])[v];  // all loads in flight at once
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
    for (int32_t q = 0; q < PeerReduceArgs::kMaxRanks; ++q) {
      if (q >= a.ranks) break;
      const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw[q]);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 x = __bfloat1622float2(h[j]);
        acc[2 * j] += x.x;
        acc[2 * j + 1] += x.y;
      }
    }
    uint4 out;
    __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
    for (int j = 0; j < 4; ++j) o[j] = __floats2bfloat162_rn(acc[2 * j], acc[2 * j + 1]);
    for (int32_t d = 0; d < a.ndst; ++d) reinterpret_cast<uint4*>(a.dst[d])[v] = out;
  }
  for (int64_t i = vecs * 8 + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < a.elems;
       i += int64_t(gridDim.x) * blockDim.x) {
    float acc = 0;
    for (int32_t q = 0; q < a.ranks; ++q) acc += __bfloat162float(a.src[q][i]);
    for (int32_t d = 0; d < a.ndst; ++d) a.dst[d][i] = __float2bfloat16_rn(acc);
  }
  // Every thread's reads and writes of this block happen before the counts below.
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    for (int32_t q = 0; q < a.ranks; ++q) flag_add_release(a.done_out[q], 1);
  }
  if (blockIdx.x == 0) wait_all(f, a.done_in, a.ranks, a.epoch * gridDim.x);
}

}  // namespace

Status launch_peer_reduce(const PeerReduceArgs& args, const FrameParams& frame, int blocks, cudaStream_t stream) {
  if (args.ranks <= 0 || args.ranks > PeerReduceArgs::kMaxRanks || args.ndst <= 0 ||
      args.ndst > PeerReduceArgs::kMaxRanks || !args.ready_in || !args.done_in || blocks <= 0) {
    WEFT_WARN(kKernel, "peer_reduce: bad arguments (%d ranks, %d destinations, %d blocks)", args.ranks, args.ndst,
              blocks);
    return Status::kInvalidArgument;
  }
  peer_reduce_kernel<<<blocks, 256, 0, stream>>>(args, frame);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    WEFT_WARN(kKernel, "peer_reduce launch failed: %s", cudaGetErrorString(e));
    return Status::kCudaError;
  }
  return Status::kOk;
}

}  // namespace weft::kernels
