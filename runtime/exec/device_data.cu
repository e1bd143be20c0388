// Kernels behind device_data.h.
#include <string>

#include "base/log.h"
#include "base/params.h"
#include "runtime/exec/cuda_check.h"
#include "runtime/exec/device_data.h"

namespace weft::runtime {
namespace {

__device__ __forceinline__ uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

__global__ void fill_kernel(__nv_bfloat16* p, int64_t n, uint64_t seed, float scale, bool normal) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t h = mix64(seed + uint64_t(i) * 0x9E3779B97F4A7C15ull);
    float x;
    if (normal) {  // Box-Muller on two 24-bit uniforms: u1 in (0, 1], u2 in [0, 1)
      const float u1 = (float(h >> 40) + 1.0f) * (1.0f / 16777216.0f);
      const float u2 = float((h >> 16) & 0xFFFFFFu) * (1.0f / 16777216.0f);
      x = sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
    } else {
      x = float(h >> 40) * (1.0f / 8388608.0f) - 1.0f;
    }
    p[i] = __float2bfloat16_rn(x * scale);
  }
}

struct Sums {
  double diff2;
  double ref2;
  unsigned long long non_finite;
  unsigned long long mismatched;
  unsigned long long first;  // index + 1 of the lowest mismatch (atomicMin), 0 = none
};

__global__ void compare_kernel(const __nv_bfloat16* got, const __nv_bfloat16* ref, int64_t n, Sums* sums) {
  double d2 = 0, r2 = 0;
  unsigned long long bad = 0, mism = 0, first = ~0ull;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = __bfloat162float(got[i]);
    const float r = __bfloat162float(ref[i]);
    const unsigned short gb = __bfloat16_as_ushort(got[i]), rb = __bfloat16_as_ushort(ref[i]);
    if (gb != rb) {
      ++mism;
      if (uint64_t(i) < first) first = uint64_t(i);
    }
    if (!isfinite(g)) {
      ++bad;
      continue;
    }
    d2 += double(g - r) * double(g - r);
    r2 += double(r) * double(r);
  }
  for (int o = 16; o > 0; o /= 2) {
    d2 += __shfl_down_sync(0xffffffffu, d2, o);
    r2 += __shfl_down_sync(0xffffffffu, r2, o);
    bad += __shfl_down_sync(0xffffffffu, bad, o);
    mism += __shfl_down_sync(0xffffffffu, mism, o);
    first = min(first, __shfl_down_sync(0xffffffffu, first, o));
  }
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(&sums->diff2, d2);
    atomicAdd(&sums->ref2, r2);
    atomicAdd(&sums->non_finite, bad);
    atomicAdd(&sums->mismatched, mism);
    if (first != ~0ull) atomicMin(&sums->first, first + 1);
  }
}

uint64_t mix64_host(uint64_t seed, int rank) {
  uint64_t x = seed ^ (uint64_t(rank) + 1) * 0xD1B54A32D192ED03ull;
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  return x ^ (x >> 29);
}

}  // namespace

Status fill_random_bf16(__nv_bfloat16* p, int64_t n, uint64_t seed, int rank, float scale, cudaStream_t s) {
  std::string dist;
  WEFT_CHECK(get_param("WEFT_OPS_INPUT", &dist));
  if (dist != "normal" && dist != "uniform") {
    WEFT_WARN(kKernel, "rank %d: WEFT_OPS_INPUT is '%s': use normal or uniform", rank, dist.c_str());
    return Status::kInvalidArgument;
  }
  fill_kernel<<<1024, 256, 0, s>>>(p, n, mix64_host(seed, rank), scale, dist == "normal");
  WEFT_CUDA_CHECK(cudaGetLastError());
  return Status::kOk;
}

Status poison_bf16(__nv_bfloat16* p, int64_t n, cudaStream_t s) {
  WEFT_CUDA_CHECK(cudaMemsetAsync(p, 0xFF, size_t(n) * sizeof(__nv_bfloat16), s));
  return Status::kOk;
}

Status compare_bf16(const __nv_bfloat16* got, const __nv_bfloat16* ref, int64_t n, cudaStream_t s, Comparison* out) {
  Sums* d = nullptr;
  WEFT_CUDA_CHECK(cudaMallocAsync(&d, sizeof(Sums), s));
  WEFT_CUDA_CHECK(cudaMemsetAsync(d, 0, sizeof(Sums), s));
  compare_kernel<<<1024, 256, 0, s>>>(got, ref, n, d);
  WEFT_CUDA_CHECK(cudaGetLastError());
  Sums h{};
  WEFT_CUDA_CHECK(cudaMemcpyAsync(&h, d, sizeof h, cudaMemcpyDeviceToHost, s));
  WEFT_CUDA_CHECK(cudaFreeAsync(d, s));
  WEFT_CUDA_CHECK(cudaStreamSynchronize(s));
  out->rel_err = h.ref2 > 0 ? sqrt(h.diff2 / h.ref2) : (h.diff2 > 0 ? 1.0 : 0.0);
  out->non_finite = int64_t(h.non_finite);
  out->mismatched = int64_t(h.mismatched);
  out->first_mismatch = int64_t(h.first) - 1;
  return Status::kOk;
}

}  // namespace weft::runtime
