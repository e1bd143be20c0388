// Kernel behind reduce_slots.h.
#include "kernels/reduce_slots.h"

#include "kernels/frame.cuh"
#include "runtime/log.h"

namespace weft::kernels {
namespace {

// Thread 0 waits for every flag; the block learns the outcome through shared memory.
__device__ bool wait_all(const FrameParams& f, const uint64_t* flags, int32_t count, uint64_t expected) {
  __shared__ int ok;
  __syncthreads();  // `ok` may still be read from the previous call
  if (threadIdx.x == 0) {
    ok = 1;
    for (int32_t s = 0; s < count && ok; ++s)
      if (!frame_wait_flag(f, flags + s, expected, Role::kIntraComm, -1, -1, s)) ok = 0;
  }
  __syncthreads();
  return ok != 0;
}

// Counts this block at GPU scope once all its threads are done; true in every thread of the block
// that completes the count of this launch (the last one).
__device__ bool last_block(uint64_t* counter, uint64_t epoch) {
  __shared__ int last;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint64_t before;
    asm volatile("atom.acq_rel.gpu.global.add.u64 %0, [%1], 1;" : "=l"(before) : "l"(counter) : "memory");
    last = before + 1 == epoch * gridDim.x;
  }
  __syncthreads();
  return last != 0;
}

// The last block publishes `epoch` at entry `rank` of every rank's flag array section `section`.
__device__ void publish(const PeerReduceArgs& a, int32_t section) {
  if (threadIdx.x != 0) return;
  __threadfence_system();
  for (int32_t q = 0; q < a.ranks; ++q) flag_store_release(a.flags_out[q] + section * a.ranks + a.rank, a.epoch);
}

__device__ __forceinline__ void add8(const uint4& raw, float (&acc)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 x = __bfloat1622float2(h[j]);
    acc[2 * j] += x.x;
    acc[2 * j + 1] += x.y;
  }
}

__global__ void peer_reduce_kernel(const PeerReduceArgs a, const FrameParams f) {
  // The GEMM before this kernel on the stream has completed: its partial is in memory.
  if (blockIdx.x == 0) publish(a, 0);
  if (!wait_all(f, a.flags_in, a.ranks, a.epoch)) return;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t vecs = a.elems % 8 == 0 ? a.elems / 8 : 0;
  for (int64_t v = first; v < vecs; v += stride) {
    uint4 raw[PeerReduceArgs::kMaxRanks];
#pragma unroll
    for (int32_t q = 0; q < PeerReduceArgs::kMaxRanks; ++q)
      if (q < a.ranks) raw[q] = reinterpret_cast<const uint4*>(a.src[q])[v];  // all loads in flight at once
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
    for (int32_t q = 0; q < PeerReduceArgs::kMaxRanks; ++q)
      if (q < a.ranks) add8(raw[q], acc);
    uint4 out;
    __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
    for (int j = 0; j < 4; ++j) o[j] = __floats2bfloat162_rn(acc[2 * j], acc[2 * j + 1]);
    reinterpret_cast<uint4*>(a.out)[v] = out;
  }
  for (int64_t i = vecs * 8 + first; i < a.elems; i += stride) {
    float acc = 0;
    for (int32_t q = 0; q < a.ranks; ++q) acc += __bfloat162float(a.src[q][i]);
    a.out[i] = __float2bfloat16_rn(acc);
  }
  bool last = last_block(a.arrive, a.epoch);
  if (a.all_gather) {
    if (last) publish(a, 1);
    if (!wait_all(f, a.flags_in + a.ranks, a.ranks, a.epoch)) return;
    for (int32_t q = 0; q < a.ranks; ++q) {
      if (q == a.rank) continue;
      const uint4* s = reinterpret_cast<const uint4*>(a.gather_src[q]);
      uint4* d = reinterpret_cast<uint4*>(a.gather_dst[q]);
      for (int64_t v = first; v < vecs; v += stride) d[v] = s[v];
      for (int64_t i = vecs * 8 + first; i < a.elems; i += stride) a.gather_dst[q][i] = a.gather_src[q][i];
    }
    last = last_block(a.arrive + 1, a.epoch);
  }
  if (!last) return;
  publish(a, 2);
  wait_all(f, a.flags_in + 2 * a.ranks, a.ranks, a.epoch);
}

}  // namespace

Status launch_peer_reduce(const PeerReduceArgs& args, const FrameParams& frame, int blocks, cudaStream_t stream) {
  if (args.ranks <= 0 || args.ranks > PeerReduceArgs::kMaxRanks || args.rank < 0 || args.rank >= args.ranks ||
      !args.out || !args.flags_in || !args.arrive || blocks <= 0) {
    WEFT_WARN(kKernel, "peer_reduce: bad arguments (rank %d of %d, %d blocks)", args.rank, args.ranks, blocks);
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
