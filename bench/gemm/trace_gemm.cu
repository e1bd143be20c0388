// Where a GEMM's time goes, from one launch of the persistent GEMM built with the timing hooks of
// kernels/gemm_sm90.cuh: clock64() stamps of every k-block of two compute blocks (consumer MMA
// issue, producer TMA issue), and of every work unit's events (taken, first MMA, MMAs done, split
// fixup, epilogue issued), plus a %globaltimer timeline of every block's units. Variants: the
// 1-CTA kernel with static tiles and no split tail, with claimed tiles and the tail in K-slices,
// as launch_gemm runs it (claimed tiles, the planner's tail: chunks where they pay), and the 2-CTA
// multicast kernel with the planner's tail. Prints, per variant, the
// k-block gaps inside tiles and at tile boundaries, each traced unit's phases in cycles, and when
// the blocks finished against the launch's end (the idle share of the last wave).
//
//   trace_gemm [M N K [SMS]]   (default 8192 7168 8192, all SMs)
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

// The units of blocks 0 and 1 in cycles: waiting for the claim, claim to first MMA issue, MMAs,
// split fixup, epilogue (to the next loop top).
void analyse_units(const std::vector<unsigned long long>& tr) {
  using namespace gemm_detail;
  for (int b = 0; b < kTraceBlocks; ++b) {
    const unsigned long long* e = &tr[kTraceClockAt + size_t(b) * kTraceUnits * kTraceEvents];
    printf("  block %d units (cycles): wait-claim / to-first-MMA / MMAs / fixup / epilogue [split.slice]\n   ", b);
    for (int n = 0; n + 1 < kTraceUnits && e[(n + 1) * kTraceEvents + kUnitTop]; ++n) {
      const unsigned long long* u = e + n * kTraceEvents;
      if (!u[kUnitTaken]) continue;  // an empty chunk piece
      const unsigned long long fixed = u[kUnitFixed] ? u[kUnitFixed] : u[kUnitMmaDone];
      const unsigned long long next_top = e[(n + 1) * kTraceEvents + kUnitTop];
      printf(" %llu/%llu/%llu/%llu/%lld[%llu.%llu]", u[kUnitTaken] - u[kUnitTop], u[kUnitFirstMma] - u[kUnitTaken],
             u[kUnitMmaDone] - u[kUnitFirstMma], fixed - u[kUnitMmaDone],
             next_top ? (long long)(next_top - fixed) : -1ll, u[kUnitShape] >> 8, u[kUnitShape] & 0xff);
    }
    printf("\n");
  }
}

// Every block's timeline (%globaltimer, ns): when it started its first unit and finished its last,
// against the launch's span; the idle share is what the blocks that finished early left unused.
void analyse_timeline(const std::vector<unsigned long long>& tr, int blocks) {
  using namespace gemm_detail;
  blocks = std::min(blocks, kTraceTimelineBlocks);
  std::vector<long long> starts, ends;
  std::vector<double> whole, slice, final_slice;
  for (int b = 0; b < blocks; ++b) {
    const unsigned long long* e = &tr[kTraceTimelineAt + size_t(b) * kTraceUnits * kTraceEvents];
    int n = 0;
    for (; n + 1 < kTraceUnits && e[(n + 1) * kTraceEvents + kUnitTop]; ++n) {
      const unsigned long long* u = e + n * kTraceEvents;
      if (!u[kUnitTaken]) continue;  // an empty chunk piece
      const double ns = double(e[(n + 1) * kTraceEvents + kUnitTop] - u[kUnitTaken]);
      const unsigned long long split = u[kUnitShape] >> 8, sl = u[kUnitShape] & 0xff;
      (split <= 1 ? whole : sl + 1 == split ? final_slice : slice).push_back(ns);
    }
    if (n == 0) continue;
    starts.push_back((long long)e[kUnitTop]);
    ends.push_back((long long)e[n * kTraceEvents + kUnitTop]);
  }
  if (starts.empty()) return;
  const long long t0 = *std::min_element(starts.begin(), starts.end());
  const long long t1 = *std::max_element(ends.begin(), ends.end());
  std::vector<long long> end_rel, idle;
  double idle_sum = 0;
  for (long long e : ends) end_rel.push_back(e - t0), idle.push_back(t1 - e), idle_sum += double(t1 - e);
  auto med = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  printf(
      "  timeline of %zu blocks (us): starts spread %.2f; span %.2f; blocks finished at min %.2f, median %.2f, "
      "max %.2f; idle share after a block's last unit %.1f%%\n",
      starts.size(), double(*std::max_element(starts.begin(), starts.end()) - t0) * 1e-3, double(t1 - t0) * 1e-3,
      pct(end_rel, 0.0) * 1e-3, pct(end_rel, 0.5) * 1e-3, pct(end_rel, 1.0) * 1e-3,
      100.0 * idle_sum / (double(t1 - t0) * double(starts.size())));
  printf(
      "  unit times (us, claim to next loop top): whole tiles %zu, median %.2f; non-final slices %zu, median %.2f; "
      "final slices %zu, median %.2f\n",
      whole.size(), med(whole) * 1e-3, slice.size(), med(slice) * 1e-3, final_slice.size(), med(final_slice) * 1e-3);
}

}  // namespace

int main(int argc, char** argv) {
  int m = 8192, n = 7168, k = 8192;
  if (argc >= 4) m = atoi(argv[1]), n = atoi(argv[2]), k = atoi(argv[3]);
  int sms = hopper_sm_count_or_explain();
  if (sms == 0) return 77;
  if (argc >= 5) sms = std::min(sms, atoi(argv[4]));
  __nv_bfloat16 *a, *b, *c;
  WEFT_CUDA_OK(cudaMalloc(&a, size_t(m) * k * 2));
  WEFT_CUDA_OK(cudaMalloc(&b, size_t(n) * k * 2));
  WEFT_CUDA_OK(cudaMalloc(&c, size_t(m) * n * 2));
  std::mt19937_64 rng(std::random_device{}());
  random_bf16(a, int64_t(m) * k, rng());
  random_bf16(b, int64_t(n) * k, rng());
  constexpr size_t kWords = gemm_detail::kTraceWords;
  unsigned long long* buf = nullptr;
  WEFT_CUDA_OK(cudaMalloc(&buf, kWords * 8));
  WEFT_CUDA_OK(cudaMemcpyToSymbol(weft_gemm_trace_buf, &buf, sizeof(buf)));
  FrameHost frame;
  if (frame.create(0) != weft::Status::kOk) return 1;
  weft::RoleCounts roles;
  roles.compute = sms;
  const int k_iters = (k + GemmConfig::kTileK - 1) / GemmConfig::kTileK;
  struct Variant {
    int cluster;
    bool split_and_claims;
    bool chunked;
  };
  for (const Variant v :
       {Variant{1, false, false}, Variant{1, true, false}, Variant{1, true, true}, Variant{2, true, true}}) {
    GemmArgs args;
    args.m = m, args.n = n, args.k = k, args.a = a, args.b = b, args.cluster_m = v.cluster;
    GemmKernelParams<EpiStoreBf16> p;
    if (make_gemm_params(args, &p.gemm) != weft::Status::kOk) return 1;
    if (frame.params(roles, &p.frame) != weft::Status::kOk) return 1;
    p.epi.c = c, p.epi.ldc = n;
    if (enable_tma_store(p.epi, &p.gemm) != weft::Status::kOk) return 1;
    if (v.split_and_claims) {
      if (enable_tail_split(sms, 0, &p.gemm, v.chunked) != weft::Status::kOk) return 1;
      if (enable_dynamic_tiles(0, &p.gemm) != weft::Status::kOk) return 1;
    }
    float ms = 0;
    for (int rep = 0; rep < 6; ++rep) {
      WEFT_CUDA_OK(cudaMemset(buf, 0, kWords * 8));
      ms = v.cluster == 1 ? launch<1>(p, sms) : launch<2>(p, sms);
    }
    if (frame.check("trace gemm") != weft::Status::kOk) return 1;
    std::vector<unsigned long long> tr(kWords);
    WEFT_CUDA_OK(cudaMemcpy(tr.data(), buf, kWords * 8, cudaMemcpyDeviceToHost));
    char name[128];
    snprintf(name, sizeof(name), "%dx%dx%d %d-CTA on %d SMs, %s (%.3f ms, %.0f TF/s)", m, n, k, v.cluster, sms,
             !v.split_and_claims       ? "static, no split"
             : p.gemm.sched.chunks > 0 ? (p.gemm.claims ? "chunked tail + claims" : "chunked tail")
                                       : (p.gemm.claims ? "K-sliced tail + claims" : "K-sliced tail"),
             ms, 2.0 * m * n * double(k) / ms * 1e-9);
    analyse(name, tr, k_iters, 0);
    analyse_units(tr);
    analyse_timeline(tr, sms);
  }
  return 0;
}
