// Benchmark: weft's persistent sm_90a GEMM against cuBLAS, same layout and data, in one run.
//
// C (M x N, bf16) = A (M x K, bf16, row-major) * B (N x K, bf16, row-major)^T, fp32 accumulate.
// cuBLAS gets the identical "TN" problem through cublasGemmEx (column-major view: C^T = B * A^T,
// opA = T on B, opB = N on A). Each configuration: 5 warm-ups, then >= 20 launches timed one by
// one with CUDA events, median reported; fresh random data (never zeros); several input sets
// rotated when one set would sit in L2. "SMs" is the compute-block count: with 8 or 16 SMs lent
// to other roles, weft's frame leaves those blocks idle and cuBLAS is told the same SM budget
// (cublasSetSmCountTarget).
//
//   bench_gemm [--iters N] [--group M_TILES] [--quick] [--shape I] [--markdown FILE]
//              [--profile weft|weft2|cublas]
// (--shape I: only the I-th shape of the list below, e.g. to watch clocks and power over a long run;
//  --profile V: only variant V on all SMs, 6 launches inside cudaProfilerStart/Stop, no timing: for
//  `ncu --profile-from-start off --launch-skip 5 --launch-count 1`)
#include <cublas_v2.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/gemm/bench_timing.h"
#include "kernels/gemm.h"
#include "tests/kernels/gemm_testing.cuh"

using namespace weft::kernels;
using namespace weft::kernels::testing;
using weft::bench::time_ms;

namespace {

#define CUBLAS_OK(call)                                                              \
  do {                                                                               \
    cublasStatus_t s_ = (call);                                                      \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                               \
      fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #call, int(s_)); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

struct Shape {
  int m, n, k;
  const char* what;
};

struct InputSet {
  __nv_bfloat16* a = nullptr;
  __nv_bfloat16* b = nullptr;
  GemmParams params;   // single CTA per tile (the default)
  GemmParams params2;  // 2-CTA clusters, B multicast (opt-in, see docs/gemm.md)
};

}  // namespace

int main(int argc, char** argv) {
  int iters = 30;
  int group_m = weft::kernels::GemmArgs{}.group_m;
  bool quick = false;
  int only_shape = -1;
  const char* md_path = nullptr;
  std::string profile;
  weft::kernels::GemmOptions opt;  // the defaults; the --no-* flags turn one off for comparisons
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--iters") && i + 1 < argc)
      iters = std::max(20, atoi(argv[++i]));
    else if (!strcmp(argv[i], "--quick"))
      quick = true;
    else if (!strcmp(argv[i], "--group") && i + 1 < argc)
      group_m = std::max(1, atoi(argv[++i]));
    else if (!strcmp(argv[i], "--shape") && i + 1 < argc)
      only_shape = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--markdown") && i + 1 < argc)
      md_path = argv[++i];
    else if (!strcmp(argv[i], "--profile") && i + 1 < argc)
      profile = argv[++i];
    else if (!strcmp(argv[i], "--no-split-tail"))
      opt.split_tail = false;
    else if (!strcmp(argv[i], "--no-chunked-tail"))
      opt.chunked_tail = false;
    else if (!strcmp(argv[i], "--no-dynamic-tiles"))
      opt.dynamic_tiles = false;
    else if (!strcmp(argv[i], "--no-tma-store"))
      opt.tma_store = false;
    else {
      fprintf(stderr,
              "usage: bench_gemm [--iters N (>= 20)] [--group M_TILES] [--quick] [--shape I] [--markdown FILE] "
              "[--profile weft|weft2|cublas] [--no-split-tail] [--no-chunked-tail] [--no-dynamic-tiles] "
              "[--no-tma-store]\n");
      return 2;
    }
  }
  const int sms = hopper_sm_count_or_explain();
  if (sms == 0) return 77;
  cudaDeviceProp prop{};
  WEFT_CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  printf("device: %s, %d SMs, L2 %d MB, weft tile %dx%dx%d, %d stages\n", prop.name, sms, prop.l2CacheSize >> 20,
         GemmConfig::kTileM, GemmConfig::kTileN, GemmConfig::kTileK, GemmConfig::kStages);

  // M x N x K. N of the AllGather+GEMM rows is one rank's block of the weight (BASELINES.md).
  std::vector<Shape> shapes = {
      {8192, 7168, 8192, "AG+GEMM (N/rank)"}, {2048, 7168, 8192, "AG+GEMM"}, {16384, 2048, 8192, "AG+GEMM"},
      {8192, 8192, 1792, "GEMM+RS (K/4)"},    {4096, 4096, 4096, "square"},  {8192, 8192, 8192, "square"},
  };
  if (quick) shapes = {{4096, 4096, 4096, "square"}};
  if (only_shape >= 0 && only_shape < int(shapes.size())) shapes = {shapes[size_t(only_shape)]};

  cublasHandle_t handle;
  CUBLAS_OK(cublasCreate(&handle));
  FrameHost frame;
  if (frame.create(0) != weft::Status::kOk) return 1;
  std::mt19937_64 rng(std::random_device{}());

  struct Row {
    Shape s;
    int compute;
    double weft_tf, weft2_tf, cublas_tf, cublas_all_tf, rel_err;
  };
  std::vector<Row> rows;
  for (const Shape& s : shapes) {
    const int64_t a_elems = int64_t(s.m) * s.k, b_elems = int64_t(s.n) * s.k, c_elems = int64_t(s.m) * s.n;
    const double set_bytes = double(a_elems + b_elems) * 2;
    const int sets = std::min(4, std::max(1, int(2.0 * prop.l2CacheSize / set_bytes + 0.999)));
    std::vector<InputSet> in(static_cast<size_t>(sets));
    for (auto& x : in) {
      WEFT_CUDA_OK(cudaMalloc(&x.a, size_t(a_elems) * 2));
      WEFT_CUDA_OK(cudaMalloc(&x.b, size_t(b_elems) * 2));
      random_bf16(x.a, a_elems, rng());
      random_bf16(x.b, b_elems, rng());
      GemmArgs args;
      args.m = s.m, args.n = s.n, args.k = s.k, args.a = x.a, args.b = x.b;
      args.group_m = group_m;
      args.cluster_m = 1;
      if (make_gemm_params(args, &x.params) != weft::Status::kOk) return 1;
      args.cluster_m = 2;
      if (make_gemm_params(args, &x.params2) != weft::Status::kOk) return 1;
    }
    __nv_bfloat16 *c_weft = nullptr, *c_blas = nullptr;
    WEFT_CUDA_OK(cudaMalloc(&c_weft, size_t(c_elems) * 2));
    WEFT_CUDA_OK(cudaMalloc(&c_blas, size_t(c_elems) * 2));
    const double flops = 2.0 * s.m * s.n * double(s.k);
    double cublas_all = 0;
    for (int lent : {0, 8, 16}) {
      if (!profile.empty() && lent) break;
      weft::RoleCounts roles;
      roles.compute = sms - lent;
      roles.intra_comm = lent;
      FrameParams fp;
      if (frame.params(roles, &fp) != weft::Status::kOk) return 1;
      EpiStoreBf16 epi;
      epi.c = c_weft, epi.ldc = s.n;
      auto run_weft = [&](int i) {
        if (launch_gemm(in[size_t(i)].params, fp, epi, FlagGate{}, TileSignal{}, nullptr, opt) != weft::Status::kOk)
          std::exit(1);
      };
      auto run_weft2 = [&](int i) {
        if (launch_gemm(in[size_t(i)].params2, fp, epi, FlagGate{}, TileSignal{}, nullptr, opt) != weft::Status::kOk)
          std::exit(1);
      };
      const float alpha = 1.f, beta = 0.f;
      CUBLAS_OK(cublasSetSmCountTarget(handle, lent ? sms - lent : 0));
      auto run_blas = [&](int i) {
        CUBLAS_OK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, s.n, s.m, s.k, &alpha, in[size_t(i)].b, CUDA_R_16BF,
                               s.k, in[size_t(i)].a, CUDA_R_16BF, s.k, &beta, c_blas, CUDA_R_16BF, s.n,
                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      };
      if (!profile.empty()) {
        WEFT_CUDA_OK(cudaDeviceSynchronize());
        WEFT_CUDA_OK(cudaProfilerStart());
        for (int i = 0; i < 6; ++i) {
          if (profile == "weft")
            run_weft(i % sets);
          else if (profile == "weft2")
            run_weft2(i % sets);
          else
            run_blas(i % sets);
        }
        WEFT_CUDA_OK(cudaDeviceSynchronize());
        WEFT_CUDA_OK(cudaProfilerStop());
        printf("profiled %s on %d x %d x %d\n", profile.c_str(), s.m, s.n, s.k);
        continue;
      }
      const double weft_ms = time_ms(iters, sets, run_weft);
      const double weft2_ms = time_ms(iters, sets, run_weft2);
      if (frame.check("bench gemm") != weft::Status::kOk) return 1;
      const double blas_ms = time_ms(iters, sets, run_blas);
      // Same inputs through both, then compare the bf16 outputs (poisoned first).
      poison_bf16(c_weft, c_elems);
      run_weft(0);
      run_blas(0);
      WEFT_CUDA_OK(cudaDeviceSynchronize());
      const Compared cmp = compare(c_weft, c_blas, c_elems);
      poison_bf16(c_weft, c_elems);
      run_weft2(0);
      WEFT_CUDA_OK(cudaDeviceSynchronize());
      const Compared cmp2 = compare(c_weft, c_blas, c_elems);
      const double rel = (cmp.bad || cmp2.bad) ? 1e30 : std::max(cmp.rel_err, cmp2.rel_err);
      Row r{s, sms - lent, flops / weft_ms * 1e-9, flops / weft2_ms * 1e-9, flops / blas_ms * 1e-9, 0, rel};
      if (lent == 0) cublas_all = r.cublas_tf;
      r.cublas_all_tf = cublas_all;
      rows.push_back(r);
      printf(
          "%6d x %6d x %6d  SMs %3d  weft %7.3f ms %6.1f TF/s (2-CTA %7.3f ms %6.1f)  cuBLAS %7.3f ms %6.1f "
          "TF/s  ratio %.3f  rel err vs cuBLAS %.2e  (%d input sets)\n",
          s.m, s.n, s.k, sms - lent, weft_ms, r.weft_tf, weft2_ms, r.weft2_tf, blas_ms, r.cublas_tf,
          r.weft_tf / r.cublas_tf, rel, sets);
      fflush(stdout);
    }
    for (auto& x : in) {
      cudaFree(x.a);
      cudaFree(x.b);
    }
    cudaFree(c_weft);
    cudaFree(c_blas);
  }
  CUBLAS_OK(cublasSetSmCountTarget(handle, 0));
  cublasDestroy(handle);

  // The table (last, so it is what a log tail shows).
  FILE* md = md_path ? fopen(md_path, "w") : nullptr;
  const char* head =
      "| M x N x K | op | SMs | weft TFLOP/s | cuBLAS TFLOP/s | weft / cuBLAS | weft / (cuBLAS all SMs x SMs/%d) | "
      "weft 2-CTA multicast TFLOP/s | rel err vs cuBLAS |\n"
      "|---|---|---|---|---|---|---|---|---|\n";
  printf("\n%s: bf16 GEMM, TN layout, median of %d, raster group %d\n", prop.name, iters, group_m);
  printf(head, sms);
  if (md) fprintf(md, head, sms);
  bool ok = true;
  for (const Row& r : rows) {
    const double share = r.cublas_all_tf * r.compute / sms;
    char line[512];
    snprintf(line, sizeof(line), "| %d x %d x %d | %s | %d | %.1f | %.1f | %.3f | %.3f | %.1f | %.1e |\n", r.s.m, r.s.n,
             r.s.k, r.s.what, r.compute, r.weft_tf, r.cublas_tf, r.weft_tf / r.cublas_tf, r.weft_tf / share, r.weft2_tf,
             r.rel_err);
    fputs(line, stdout);
    if (md) fputs(line, md);
    if (!(r.rel_err < 1e-2)) ok = false;
  }
  if (md) fclose(md);
  if (!ok) {
    printf("FAILED: weft and cuBLAS outputs differ beyond bf16 rounding\n");
    return 1;
  }
  return 0;
}
