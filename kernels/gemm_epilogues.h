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

}  // namespace weft::kernels
