// GEMM test utilities shared by the GPU tests and the benchmark: random bf16 fill, poison, an fp32
// reference kernel, and the relative-error / unwritten-element check.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace weft::kernels::testing {

#define WEFT_CUDA_OK(call)                                                                          \
  do {                                                                                              \
    cudaError_t e_ = (call);                                                                        \
    if (e_ != cudaSuccess) {                                                                        \
      fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::abort();                                                                                 \
    }                                                                                               \
  } while (0)

__device__ __forceinline__ uint32_t hash32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return uint32_t(x);
}

// Uniform in [-1, 1) scaled by `scale`; never all zeros.
__global__ void fill_random_bf16(__nv_bfloat16* p, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float u = float(hash32(seed * 0x9E3779B97F4A7C15ull + uint64_t(i)) >> 8) * (1.0f / 8388608.0f) - 1.0f;
    p[i] = __float2bfloat16_rn(u * scale);
  }
}
__global__ void fill_random_f32(float* p, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float u = float(hash32(seed * 0x9E3779B97F4A7C15ull + uint64_t(i)) >> 8) * (1.0f / 8388608.0f) - 1.0f;
    p[i] = u * scale;
  }
}

inline void random_bf16(__nv_bfloat16* p, int64_t n, uint64_t seed, float scale = 1.0f) {
  fill_random_bf16<<<1024, 256>>>(p, n, seed, scale);
  WEFT_CUDA_OK(cudaGetLastError());
}
inline void random_f32(float* p, int64_t n, uint64_t seed, float scale = 1.0f) {
  fill_random_f32<<<1024, 256>>>(p, n, seed, scale);
  WEFT_CUDA_OK(cudaGetLastError());
}
// 0xFFFF is a bf16 NaN: an element the GEMM fails to write stays NaN and fails the check.
inline void poison_bf16(__nv_bfloat16* p, int64_t n) { WEFT_CUDA_OK(cudaMemset(p, 0xFF, size_t(n) * 2)); }

// ref[i][j] = init[i][j] (if given) + sum_k A[i][k] * B[j][k], fp32, 16x16 smem tiles.
__global__ void reference_gemm_f32(const __nv_bfloat16* a, const __nv_bfloat16* b, const float* init, float* ref, int m,
                                   int n, int k) {
  __shared__ float as[16][17];
  __shared__ float bs[16][17];
  const int row = blockIdx.y * 16 + threadIdx.y;
  const int col = blockIdx.x * 16 + threadIdx.x;
  float acc = 0.f;
  for (int k0 = 0; k0 < k; k0 += 16) {
    const int ar = blockIdx.y * 16 + threadIdx.y, ak = k0 + threadIdx.x;
    as[threadIdx.y][threadIdx.x] = (ar < m && ak < k) ? __bfloat162float(a[int64_t(ar) * k + ak]) : 0.f;
    const int br = blockIdx.x * 16 + threadIdx.y;
    bs[threadIdx.y][threadIdx.x] = (br < n && ak < k) ? __bfloat162float(b[int64_t(br) * k + ak]) : 0.f;
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < 16; ++kk) acc += as[threadIdx.y][kk] * bs[threadIdx.x][kk];
    __syncthreads();
  }
  if (row < m && col < n) ref[int64_t(row) * n + col] = acc + (init ? init[int64_t(row) * n + col] : 0.f);
}

inline void reference(const __nv_bfloat16* a, const __nv_bfloat16* b, const float* init, float* ref, int m, int n,
                      int k) {
  dim3 grid((n + 15) / 16, (m + 15) / 16);
  reference_gemm_f32<<<grid, dim3(16, 16)>>>(a, b, init, ref, m, n, k);
  WEFT_CUDA_OK(cudaGetLastError());
}

struct ErrorSums {
  double diff2;            // sum (out - ref)^2
  double ref2;             // sum ref^2
  unsigned long long bad;  // NaN / Inf (unwritten poison) elements
};

template <class T>
__device__ __forceinline__ float to_f32(T v);
template <>
__device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <>
__device__ __forceinline__ float to_f32<float>(float v) {
  return v;
}

template <class T, class R>
__global__ void error_sums(const T* out, const R* ref, int64_t n, ErrorSums* sums) {
  double d2 = 0, r2 = 0;
  unsigned long long bad = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float o = to_f32(out[i]);
    const float r = to_f32(ref[i]);
    if (!isfinite(o)) {
      ++bad;
      continue;
    }
    d2 += double(o - r) * double(o - r);
    r2 += double(r) * double(r);
  }
  for (int off = 16; off > 0; off /= 2) {
    d2 += __shfl_down_sync(0xffffffffu, d2, off);
    r2 += __shfl_down_sync(0xffffffffu, r2, off);
    bad += __shfl_down_sync(0xffffffffu, bad, off);
  }
  if (threadIdx.x % 32 == 0) {
    atomicAdd(&sums->diff2, d2);
    atomicAdd(&sums->ref2, r2);
    atomicAdd(&sums->bad, bad);
  }
}

struct Compared {
  double rel_err;          // ||out - ref|| / ||ref|| over the finite elements
  unsigned long long bad;  // elements left NaN/Inf (never written)
};

template <class T, class R>
inline Compared compare(const T* out, const R* ref, int64_t n) {
  ErrorSums* d = nullptr;
  WEFT_CUDA_OK(cudaMalloc(&d, sizeof(ErrorSums)));
  WEFT_CUDA_OK(cudaMemset(d, 0, sizeof(ErrorSums)));
  error_sums<<<512, 256>>>(out, ref, n, d);
  WEFT_CUDA_OK(cudaGetLastError());
  ErrorSums h{};
  WEFT_CUDA_OK(cudaMemcpy(&h, d, sizeof(h), cudaMemcpyDeviceToHost));
  WEFT_CUDA_OK(cudaFree(d));
  return Compared{h.ref2 > 0 ? std::sqrt(h.diff2 / h.ref2) : (h.diff2 > 0 ? 1e30 : 0.0), h.bad};
}

// A device array copied to the host.
template <class T>
std::vector<T> to_host(const T* p, int64_t n) {
  std::vector<T> h(static_cast<size_t>(n));
  WEFT_CUDA_OK(cudaMemcpy(h.data(), p, size_t(n) * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

// 0 when no GPU of compute capability 9.0 is visible (after printing why), else the SM count.
inline int hopper_sm_count_or_explain() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    printf("SKIPPED: no CUDA device visible\n");
    return 0;
  }
  cudaDeviceProp prop{};
  WEFT_CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  if (prop.major != 9) {
    printf("SKIPPED: needs a compute capability 9.0 GPU (Hopper), found %s (%d.%d)\n", prop.name, prop.major,
           prop.minor);
    return 0;
  }
  return prop.multiProcessorCount;
}

// The tests' GPU gate: the SM count of a Hopper GPU, or exit 77 (CTest's "skipped") after saying why.
inline int require_hopper() {
  static int sms = -1;
  if (sms < 0) sms = hopper_sm_count_or_explain();
  if (sms == 0) std::exit(77);
  return sms;
}

// A seed drawn fresh on every call: inputs differ on every run.
inline uint64_t fresh_seed() {
  static std::random_device rd;
  return (uint64_t(rd()) << 32) | rd();
}

// A device allocation of n elements, freed with its scope.
template <class T>
struct DevBuf {
  T* p = nullptr;
  explicit DevBuf(int64_t n) { WEFT_CUDA_OK(cudaMalloc(&p, size_t(n) * sizeof(T))); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() { cudaFree(p); }
};

}  // namespace weft::kernels::testing
