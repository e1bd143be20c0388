// A 32 x 32 shared-memory tiled GEMM: each thread computes one element of C, k in ascending order.
#include <algorithm>

#include "runtime/exec/cuda_check.h"
#include "runtime/exec/device_data.h"
#include "runtime/exec/reference_gemm.h"

namespace weft::runtime {
namespace {

constexpr int kTile = 32;

__global__ void reference_gemm_tn_kernel(int64_t m, int64_t n, int64_t k, const __nv_bfloat16* a, int64_t lda,
                                         const __nv_bfloat16* b, int64_t ldb, __nv_bfloat16* c, int64_t ldc) {
  __shared__ float as[kTile][kTile + 1];
  __shared__ float bs[kTile][kTile + 1];
  const int64_t row = int64_t(blockIdx.y) * kTile + threadIdx.y;  // of C and A
  const int64_t col = int64_t(blockIdx.x) * kTile + threadIdx.x;  // of C, row of B
  const int64_t b_row = int64_t(blockIdx.x) * kTile + threadIdx.y;
  float acc = 0.f;
  for (int64_t k0 = 0; k0 < k; k0 += kTile) {
    const int64_t kk = k0 + threadIdx.x;
    as[threadIdx.y][threadIdx.x] = row < m && kk < k ? __bfloat162float(a[row * lda + kk]) : 0.f;
    bs[threadIdx.y][threadIdx.x] = b_row < n && kk < k ? __bfloat162float(b[b_row * ldb + kk]) : 0.f;
    __syncthreads();
#pragma unroll 8
    for (int i = 0; i < kTile; ++i) acc += as[threadIdx.y][i] * bs[threadIdx.x][i];
    __syncthreads();
  }
  if (row < m && col < n) c[row * ldc + col] = __float2bfloat16(acc);
}

}  // namespace

Status reference_gemm_tn(int64_t m, int64_t n, int64_t k, const __nv_bfloat16* a, int64_t lda, const __nv_bfloat16* b,
                         int64_t ldb, __nv_bfloat16* c, int64_t ldc, cudaStream_t s) {
  if (m <= 0 || n <= 0 || k <= 0 || (m + kTile - 1) / kTile > 65535) {
    WEFT_WARN(kKernel, "reference gemm: %lld x %lld x %lld is outside what it handles", (long long)m, (long long)n,
              (long long)k);
    return Status::kInvalidArgument;
  }
  const dim3 grid(unsigned((n + kTile - 1) / kTile), unsigned((m + kTile - 1) / kTile));
  reference_gemm_tn_kernel<<<grid, dim3(kTile, kTile), 0, s>>>(m, n, k, a, lda, b, ldb, c, ldc);
  WEFT_CUDA_CHECK(cudaGetLastError());
  return Status::kOk;
}

Status reference_gemm_reduce(int64_t m, int64_t n, int64_t k, int world, uint64_t seed, DeviceBuffers* buf,
                             __nv_bfloat16** c_ref, cudaStream_t s) {
  const int64_t k_loc = k / world;
  __nv_bfloat16 *a_full = nullptr, *b_full = nullptr, *part = nullptr;
  WEFT_CHECK(buf->alloc(m * k, &a_full));
  WEFT_CHECK(buf->alloc(n * k, &b_full));
  WEFT_CHECK(buf->alloc(std::max(m, n) * k_loc, &part));
  WEFT_CHECK(buf->alloc(m * n, c_ref));
  for (int q = 0; q < world; ++q) {
    WEFT_CHECK(fill_random_bf16(part, m * k_loc, seed, q, 1.0f, s));
    WEFT_CUDA_CHECK(cudaMemcpy2DAsync(a_full + q * k_loc, size_t(k) * 2, part, size_t(k_loc) * 2, size_t(k_loc) * 2,
                                      size_t(m), cudaMemcpyDeviceToDevice, s));
    WEFT_CHECK(fill_random_bf16(part, n * k_loc, seed + 1, q, 1.0f, s));
    WEFT_CUDA_CHECK(cudaMemcpy2DAsync(b_full + q * k_loc, size_t(k) * 2, part, size_t(k_loc) * 2, size_t(k_loc) * 2,
                                      size_t(n), cudaMemcpyDeviceToDevice, s));
  }
  return reference_gemm_tn(m, n, k, a_full, k, b_full, k, *c_ref, n, s);
}

}  // namespace weft::runtime
