// What the runtime-op benchmarks (bench_ag_gemm_op, bench_gemm_reduce_op) share: a CUDA call that
// ends the program with the call named, joining the job on this rank's GPU, a cheap deterministic fill.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "bootstrap/pmix_bootstrap.h"

#define BENCH_CUDA(x)                                                                     \
  do {                                                                                    \
    cudaError_t e_ = (x);                                                                 \
    if (e_ != cudaSuccess) {                                                              \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

namespace weft::bench {

// Uniform in [-0.5, 0.5) from a hash of the index and the seed.
__global__ inline void fill_hash(__nv_bfloat16* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    p[i] = __float2bfloat16(float(h & 0xFFFF) / 65536.f - 0.5f);
  }
}

// Joins the job (PMIx) and selects the GPU of this rank's local index; null if the job cannot be joined.
inline std::unique_ptr<bootstrap::PmixBootstrap> join_job() {
  std::unique_ptr<bootstrap::PmixBootstrap> boot;
  if (bootstrap::PmixBootstrap::connect(&boot) != Status::kOk) return nullptr;
  int gpus = 0;
  BENCH_CUDA(cudaGetDeviceCount(&gpus));
  BENCH_CUDA(cudaSetDevice(boot->info().local_rank % gpus));
  return boot;
}

}  // namespace weft::bench
