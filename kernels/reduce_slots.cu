// Kernels behind reduce_slots.h.
#include "kernels/reduce_slots.h"

#include "kernels/frame.cuh"
#include "runtime/log.h"

namespace weft::kernels {
namespace {

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

__global__ void reduce_slots_kernel(const ReduceSlotsArgs a, const FrameParams f) {
  if (!wait_all(f, a.arrived, a.slots, a.expected)) return;
  const int64_t vecs = a.elems % 8 == 0 ? a.elems / 8 : 0;
  for (int64_t v = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; v < vecs; v += int64_t(gridDim.x) * blockDim.x) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int32_t s = 0; s < a.slots; ++s) {
      const uint4 raw = reinterpret_cast<const uint4*>(a.base + s * a.elems)[v];
      const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
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
    for (int32_t s = 0; s < a.slots; ++s) acc += __bfloat162float(a.base[s * a.elems + i]);
    for (int32_t d = 0; d < a.ndst; ++d) a.dst[d][i] = __float2bfloat16_rn(acc);
  }
}

__global__ void wait_flags_kernel(const uint64_t* flags, int32_t count, uint64_t expected, const FrameParams f) {
  wait_all(f, flags, count, expected);
}

__global__ void store_flags_kernel(const FlagTargets t, uint64_t value) {
  __threadfence_system();
  for (int32_t i = 0; i < t.count; ++i) flag_store_release(t.addr[i], value);
}

Status launched(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    WEFT_WARN(kKernel, "%s launch failed: %s", what, cudaGetErrorString(e));
    return Status::kCudaError;
  }
  return Status::kOk;
}

}  // namespace

Status launch_reduce_slots(const ReduceSlotsArgs& args, const FrameParams& frame, int blocks, cudaStream_t stream) {
  if (args.slots <= 0 || args.ndst <= 0 || args.ndst > ReduceSlotsArgs::kMaxDsts || !args.base || !args.arrived) {
    WEFT_WARN(kKernel, "reduce_slots: bad arguments (%d slots, %d destinations)", args.slots, args.ndst);
    return Status::kInvalidArgument;
  }
  reduce_slots_kernel<<<blocks, 256, 0, stream>>>(args, frame);
  return launched("reduce_slots");
}

Status launch_wait_flags(const uint64_t* flags, int32_t count, uint64_t expected, const FrameParams& frame,
                         cudaStream_t stream) {
  wait_flags_kernel<<<1, 32, 0, stream>>>(flags, count, expected, frame);
  return launched("wait_flags");
}

Status launch_store_flags(const FlagTargets& targets, uint64_t value, cudaStream_t stream) {
  if (targets.count < 0 || targets.count > FlagTargets::kMax) return Status::kInvalidArgument;
  store_flags_kernel<<<1, 1, 0, stream>>>(targets, value);
  return launched("store_flags");
}

}  // namespace weft::kernels
