// 16-byte copies by every thread of a block, for the kernels that move data with SMs (the
// AllGather+GEMM movers, GEMM+RS/AR's piece push). .cu files only.
#pragma once

#include <cstdint>

namespace weft::kernels::vec {

// Through the non-coherent path: only for data no kernel writes while this one runs.
__device__ __forceinline__ uint4 ld_nc(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
// Through L2 only: for data another running kernel wrote (and released) before it is read.
__device__ __forceinline__ uint4 ld_cg(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ void st(uint4* p, const uint4& v) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}

// dst[i] = src[i] for i < n, thread t of kThreads taking t, t + kThreads, ...: kUnroll loads in
// flight per thread before their stores. No barrier: the caller orders the stores before a flag.
template <int kThreads, int kUnroll, bool kCoherent>
__device__ __forceinline__ void block_copy(const uint4* src, uint4* dst, int64_t n) {
  for (int64_t base = threadIdx.x; base < n; base += int64_t(kThreads) * kUnroll) {
    uint4 r[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint4* p = src + base + u * kThreads;
      if (base + u * kThreads < n) r[u] = kCoherent ? ld_cg(p) : ld_nc(p);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (base + u * kThreads < n) st(dst + base + u * kThreads, r[u]);
  }
}

}  // namespace weft::kernels::vec
