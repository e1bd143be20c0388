// Where a GEMM tile's time goes: clock64() stamps of every k-block of two compute blocks (consumer
// MMA issue, producer TMA issue), from one launch of the persistent GEMM built with the timing
// hooks of kernels/gemm_sm90.cuh, for the 1-CTA and the 2-CTA multicast kernel. Prints, per block,
// the k-block issue gaps inside tiles and at tile boundaries, and how far the producer ran ahead.
//
//   trace_gemm [M N K]   (default 8192 7168 8192)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

__device__ unsigned long long* weft_gemm_trace_buf;
#define WEFT_GEMM_TRACE weft_gemm_trace_buf

#include "kernels/gemm.h"
#include "kernels/gemm_sm90.cuh"
#include "tests/kernels/gemm_testing.cuh"

using namespace weft::kernels;
using namespace weft::kernels::testing;

namespace {

template <int kCluster>
__global__ void __launch_bounds__(GemmConfig::kThreads, 1)
    traced_gemm(const __grid_constant__ GemmKernelParams<EpiStoreBf16> p) {
  extern __shared__ uint8_t smem[];
  gemm_compute_block<kCluster>(p.gemm, p.frame, p.epi, p.gate, p.signal, int32_t(blockIdx.x), p.frame.roles.compute,
                               smem);
}

template <int kCluster>
float launch(const GemmKernelParams<EpiStoreBf16>& p, int blocks) {
  auto kernel = traced_gemm<kCluster>;
  const int smem = int(gemm_smem_bytes());
  WEFT_CUDA_OK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  cfg.gridDim = dim3(unsigned(blocks));
  cfg.blockDim = dim3(GemmConfig::kThreads);
  cfg.dynamicSmemBytes = size_t(smem);
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kCluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  cudaEvent_t t0, t1;
  WEFT_CUDA_OK(cudaEventCreate(&t0));
  WEFT_CUDA_OK(cudaEventCreate(&t1));
  WEFT_CUDA_OK(cudaEventRecord(t0));
  WEFT_CUDA_OK(cudaLaunchKernelEx(&cfg, kernel, p));
  WEFT_CUDA_OK(cudaEventRecord(t1));
  WEFT_CUDA_OK(cudaEventSynchronize(t1));
  float ms = 0;
  WEFT_CUDA_OK(cudaEventElapsedTime(&ms, t0, t1));
  return ms;
}

double pct(std::vector<long long> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return double(v[size_t(q * double(v.size() - 1))]);
}

void analyse(const char* name, const std::vector<unsigned long long>& tr, int k_iters, int tiles_of_block0) {
  constexpr int kIters = gemm_detail::kTraceIters;
  for (int b = 0; b < gemm_detail::kTraceBlocks; ++b) {
    const unsigned long long* c = &tr[size_t(b * 2 + 0) * kIters];
    const unsigned long long* pr = &tr[size_t(b * 2 + 1) * kIters];
    int n = 0;
    while (n < kIters && c[n]) ++n;
    std::vector<long long> inner, boundary, first4, lead;
    for (int i = 1; i < n; ++i) {
      const long long gap = (long long)(c[i] - c[i - 1]);
      if (i % k_iters == 0)
        boundary.push_back(gap);
      else if (i % k_iters < 5)
        first4.push_back(gap);
      else
        inner.push_back(gap);
      if (pr[i]) lead.push_back((long long)(c[i] - pr[i]));
    }
    double inner_sum = 0;
    for (long long g : inner) inner_sum += double(g);
    printf(
        "%s block %d: %d k-blocks (%d tiles); k-block issue gap (cycles) inside tiles: median %.0f, p90 %.0f, max "
        "%.0f, mean %.0f; k-blocks 1-4 of a tile: median %.0f, mean of %zu %.0f; tile boundary: median %.0f, max "
        "%.0f; producer lead (TMA issue -> MMA issue): p10 %.0f, median %.0f; total %llu cycles\n",
        name, b, n, n / k_iters, pct(inner, 0.5), pct(inner, 0.9), pct(inner, 1.0),
        inner.empty() ? 0.0 : inner_sum / double(inner.size()), pct(first4, 0.5), first4.size(),
        [&] {
          double s = 0;
          for (long long g : first4) s += double(g);
          return first4.empty() ? 0.0 : s / double(first4.size());
        }(),
        pct(boundary, 0.5), pct(boundary, 1.0), pct(lead, 0.1), pct(lead, 0.5), n ? c[n - 1] - c[0] : 0ull);
    // Per tile: cycles from its first k-block to the next tile's first, against inner-median * k_iters.
    printf("  per tile (cycles):");
    for (int t = 0; t + 1 < n / k_iters + (n % k_iters ? 1 : 0) && (t + 1) * k_iters < n; ++t)
      printf(" %llu", c[(t + 1) * k_iters] - c[t * k_iters]);
    printf("   (ideal at the inner median: %.0f)\n", pct(inner, 0.5) * k_iters);
  }
  (void)tiles_of_block0;
}

}  // namespace

int main(int argc, char** argv) {
  int m = 8192, n = 7168, k = 8192;
  if (argc == 4) m = atoi(argv[1]), n = atoi(argv[2]), k = atoi(argv[3]);
  const int sms = hopper_sm_count_or_explain();
  if (sms == 0) return 77;
  __nv_bfloat16 *a, *b, *c;
  WEFT_CUDA_OK(cudaMalloc(&a, size_t(m) * k * 2));
  WEFT_CUDA_OK(cudaMalloc(&b, size_t(n) * k * 2));
  WEFT_CUDA_OK(cudaMalloc(&c, size_t(m) * n * 2));
  std::mt19937_64 rng(std::random_device{}());
  random_bf16(a, int64_t(m) * k, rng());
  random_bf16(b, int64_t(n) * k, rng());
  constexpr size_t kWords = size_t(gemm_detail::kTraceBlocks) * 2 * gemm_detail::kTraceIters;
  unsigned long long* buf = nullptr;
  WEFT_CUDA_OK(cudaMalloc(&buf, kWords * 8));
  WEFT_CUDA_OK(cudaMemcpyToSymbol(weft_gemm_trace_buf, &buf, sizeof(buf)));
  FrameHost frame;
  if (frame.create(0) != weft::Status::kOk) return 1;
  weft::RoleCounts roles;
  roles.compute = sms;
  const int k_iters = (k + GemmConfig::kTileK - 1) / GemmConfig::kTileK;
  for (int variant = 0; variant < 4; ++variant) {
    const int cluster = 1 + variant % 2;
    const bool tma = variant >= 2;
    GemmArgs args;
    args.m = m, args.n = n, args.k = k, args.a = a, args.b = b, args.cluster_m = cluster;
    GemmKernelParams<EpiStoreBf16> p;
    if (make_gemm_params(args, &p.gemm) != weft::Status::kOk) return 1;
    if (frame.params(roles, &p.frame) != weft::Status::kOk) return 1;
    p.epi.c = c, p.epi.ldc = n;
    if (tma && enable_tma_store(p.epi, &p.gemm) != weft::Status::kOk) return 1;
    float ms = 0;
    for (int rep = 0; rep < 6; ++rep) {
      WEFT_CUDA_OK(cudaMemset(buf, 0, kWords * 8));
      ms = cluster == 1 ? launch<1>(p, sms) : launch<2>(p, sms);
    }
    if (frame.check("trace gemm") != weft::Status::kOk) return 1;
    std::vector<unsigned long long> tr(kWords);
    WEFT_CUDA_OK(cudaMemcpy(tr.data(), buf, kWords * 8, cudaMemcpyDeviceToHost));
    char name[64];
    snprintf(name, sizeof(name), "%dx%dx%d %d-CTA %s stores (%.3f ms, %.0f TF/s)", m, n, k, cluster,
             p.gemm.store_tma ? "TMA" : "register", ms, 2.0 * m * n * double(k) / ms * 1e-9);
    analyse(name, tr, k_iters, 0);
  }
  return 0;
}
