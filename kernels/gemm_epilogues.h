// Epilogues of the GEMM main loop: where each finished pair of fp32 results goes (host + device).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace weft::kernels {

// ---- epilogues: one finished pair of columns (col, col+1) of one row ----------------------------
// Each epilogue gets (row, col, v0, v1, two): v1 belongs to col+1 and is valid only when `two`.
// Rows/cols are already bounds-checked. Members are plain pointers: local, or a peer's heap
// mapped through CUDA IPC (stores and reductions then travel over NVLink).

// Stores bf16 C (row-major, ldc elements). `paired` = ldc and c allow 4-byte stores.
struct EpiStoreBf16 {
  __nv_bfloat16* c = nullptr;
  int64_t ldc = 0;
  bool paired = true;
#if defined(__CUDACC__)
  __device__ __forceinline__ void pair(int32_t row, int32_t col, float v0, float v1, bool two) const {
    __nv_bfloat16* p = c + int64_t(row) * ldc + col;
    if (two && paired) {
      *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(v0, v1);
    } else {
      p[0] = __float2bfloat16_rn(v0);
      if (two) p[1] = __float2bfloat16_rn(v1);
    }
  }
#endif
};

// Adds into fp32 C with atomic reductions (partial sums from several ranks).
struct EpiAddF32 {
  float* c = nullptr;
  int64_t ldc = 0;
#if defined(__CUDACC__)
  __device__ __forceinline__ void pair(int32_t row, int32_t col, float v0, float v1, bool two) const {
    float* p = c + int64_t(row) * ldc + col;
    atomicAdd(p, v0);
    if (two) atomicAdd(p + 1, v1);
  }
#endif
};

// Adds into bf16 C with bf16x2 atomic reductions (half the bytes of fp32; bf16 rounding per add).
struct EpiAddBf16 {
  __nv_bfloat16* c = nullptr;
  int64_t ldc = 0;
  bool paired = true;
#if defined(__CUDACC__)
  __device__ __forceinline__ void pair(int32_t row, int32_t col, float v0, float v1, bool two) const {
    __nv_bfloat16* p = c + int64_t(row) * ldc + col;
    if (two && paired) {
      atomicAdd(reinterpret_cast<__nv_bfloat162*>(p), __floats2bfloat162_rn(v0, v1));
    } else {
      atomicAdd(p, __float2bfloat16_rn(v0));
      if (two) atomicAdd(p + 1, __float2bfloat16_rn(v1));
    }
  }
#endif
};

// Scatters rows of C to their owners (GEMM+ReduceScatter / AllReduce): row `row` belongs to owner
// o = row / rows_per_owner and is stored as bf16 at dst[o] + (row - o * rows_per_owner) * ldc + col.
// dst[o] is this rank's slot in owner o's staging buffer, a peer pointer mapped through CUDA IPC
// (or local for o == this rank), so partial tiles travel over NVLink as soon as they are produced.
struct EpiScatterBf16 {
  static constexpr int kMaxOwners = 8;
  __nv_bfloat16* dst[kMaxOwners] = {};
  int64_t rows_per_owner = 0;
  int64_t ldc = 0;
  bool paired = true;
#if defined(__CUDACC__)
  __device__ __forceinline__ void pair(int32_t row, int32_t col, float v0, float v1, bool two) const {
    const int32_t o = int32_t(row / rows_per_owner);
    __nv_bfloat16* p = dst[o] + (int64_t(row) - int64_t(o) * rows_per_owner) * ldc + col;
    if (two && paired) {
      *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(v0, v1);
    } else {
      p[0] = __float2bfloat16_rn(v0);
      if (two) p[1] = __float2bfloat16_rn(v1);
    }
  }
#endif
};

}  // namespace weft::kernels
