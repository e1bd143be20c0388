// Eight bf16 values in one 16-byte word (int4), summed in fp32: the MoE kernels' weighted row sums.
// .cu files only.
#pragma once

#include <cuda_bf16.h>

namespace weft::kernels {

// acc[0..8) += w * the eight bf16 values of v.
__device__ __forceinline__ void add_scaled(float* acc, const int4& v, float w) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    acc[2 * i] += w * f.x;
    acc[2 * i + 1] += w * f.y;
  }
}

// acc[0..8) rounded to bf16, in one 16-byte word.
__device__ __forceinline__ int4 to_bf16x8(const float* acc) {
  int4 out;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
  return out;
}

}  // namespace weft::kernels
