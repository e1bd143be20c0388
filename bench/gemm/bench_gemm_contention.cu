// Benchmark: what a copy beside the GEMM costs it, on one GPU.
//
// In AllGather+GEMM the shards a rank receives are written into its memory while its GEMM runs; on
// 4x H200 that costs the GEMM 0.1-0.5 ms per ms of copying, and a copy of the same bytes within
// one GPU costs it as much or more (docs/ops.md). This times, for the AllGather+GEMM shapes, each
// GEMM alone and started together with a copy-engine copy of the bytes a rank of `--ranks` receives
// (cudaMemcpyAsync device to device on a second stream), side by side in one process:
//   weft       the persistent 1-CTA kernel (128 x 256 tiles, 48 KiB per k-block from L2)
//   weft 2-CTA clusters of two sharing their B tile by multicast (32 KiB per CTA and k-block)
//   cuBLAS     cublasGemmEx on the same TN problem
// each weft kernel twice: its ragged last wave cut into equal K-slices, and into one chunk of
// k-blocks per block ("chunked", TileSchedule::chunks) where the planner finds that pays,
// and the copy alone, all interleaved launch by launch (the GPU's clock steps under its power cap
// would otherwise favour whichever ran first). Each round allocates fresh inputs (normal, like torch.randn), so a
// figure that depends on where the buffers landed shows up as a difference between rounds.
//
//   bench_gemm_contention [--iters N] [--rounds R] [--ranks W] [--shape I]
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "bench/gemm/bench_timing.h"
#include "kernels/gemm.h"
#include "runtime/exec/device_data.h"
#include "tests/kernels/gemm_testing.cuh"

using namespace weft::kernels;
using namespace weft::kernels::testing;
using weft::bench::time_ms;

namespace {

struct Shape {
  int m, n, k;
};

constexpr int kVariants = 5, kCublas = 4;
struct Result {
  double alone[kVariants], beside[kVariants], copy_ms, copy_gbs;
};
const char* const kNames[kVariants] = {"weft", "weft chunked", "weft 2-CTA", "weft 2-CTA chunked", "cuBLAS"};

bool ok(weft::Status s) { return s == weft::Status::kOk; }

}  // namespace

int main(int argc, char** argv) {
  int iters = 30, rounds = 3, ranks = 4, only_shape = -1;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--iters") && i + 1 < argc)
      iters = std::max(20, atoi(argv[++i]));
    else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
      rounds = std::max(1, atoi(argv[++i]));
    else if (!strcmp(argv[i], "--ranks") && i + 1 < argc)
      ranks = std::max(2, atoi(argv[++i]));
    else if (!strcmp(argv[i], "--shape") && i + 1 < argc)
      only_shape = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: bench_gemm_contention [--iters N (>= 20)] [--rounds R] [--ranks W] [--shape I]\n");
      return 2;
    }
  }
  const int sms = hopper_sm_count_or_explain();
  if (sms == 0) return 77;
  cudaDeviceProp prop{};
  WEFT_CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  std::vector<Shape> shapes = {{8192, 7168, 8192}, {2048, 7168, 8192}, {16384, 2048, 8192}};
  if (only_shape >= 0 && only_shape < int(shapes.size())) shapes = {shapes[size_t(only_shape)]};
  printf("device: %s, %d SMs; copy beside each GEMM: the (%d-1)/%d of A a rank receives\n", prop.name, sms, ranks,
         ranks);

  cublasHandle_t handle;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) return 1;
  FrameHost frame;
  if (!ok(frame.create(0))) return 1;
  weft::RoleCounts roles;
  roles.compute = sms;
  FrameParams fp;
  if (!ok(frame.params(roles, &fp))) return 1;
  cudaStream_t copy_stream;
  WEFT_CUDA_OK(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking));
  std::mt19937_64 rng(std::random_device{}());

  std::vector<std::vector<Result>> results(shapes.size());
  for (int round = 0; round < rounds; ++round) {
    for (size_t si = 0; si < shapes.size(); ++si) {
      const Shape& s = shapes[si];
      const int64_t a_elems = int64_t(s.m) * s.k, b_elems = int64_t(s.n) * s.k, c_elems = int64_t(s.m) * s.n;
      const size_t copy_bytes = size_t(a_elems / ranks * (ranks - 1)) * 2;
      __nv_bfloat16 *a, *b, *c_weft, *c_blas;
      void *src, *dst;
      WEFT_CUDA_OK(cudaMalloc(&a, size_t(a_elems) * 2));
      WEFT_CUDA_OK(cudaMalloc(&b, size_t(b_elems) * 2));
      WEFT_CUDA_OK(cudaMalloc(&c_weft, size_t(c_elems) * 2));
      WEFT_CUDA_OK(cudaMalloc(&c_blas, size_t(c_elems) * 2));
      WEFT_CUDA_OK(cudaMalloc(&src, copy_bytes));
      WEFT_CUDA_OK(cudaMalloc(&dst, copy_bytes));
      if (!ok(weft::runtime::fill_random_bf16(a, a_elems, rng(), 0, 1.f, nullptr)) ||
          !ok(weft::runtime::fill_random_bf16(b, b_elems, rng(), 0, 1.f, nullptr)) ||
          !ok(weft::runtime::fill_random_bf16(static_cast<__nv_bfloat16*>(src), int64_t(copy_bytes / 2), rng(), 0, 1.f,
                                              nullptr)))
        return 1;
      GemmParams params[2];
      for (int v = 0; v < 2; ++v) {
        GemmArgs args;
        args.m = s.m, args.n = s.n, args.k = s.k, args.a = a, args.b = b;
        args.cluster_m = v + 1;
        if (!ok(make_gemm_params(args, &params[v]))) return 1;
      }
      EpiStoreBf16 epi;
      epi.c = c_weft, epi.ldc = s.n;
      const float alpha = 1.f, beta = 0.f;
      auto launch = [&](int v) {
        if (v < kCublas) {  // planned on every launch, as launch_gemm does: the workspace may move
          GemmParams planned = params[v / 2];
          if (!ok(enable_tail_split(sms, nullptr, &planned, v % 2 == 1)) ||
              !ok(launch_gemm(planned, fp, epi, FlagGate{}, TileSignal{}, nullptr)))
            std::exit(1);
        } else if (cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, s.n, s.m, s.k, &alpha, b, CUDA_R_16BF, s.k, a,
                                CUDA_R_16BF, s.k, &beta, c_blas, CUDA_R_16BF, s.n, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
          std::exit(1);
        }
      };
      auto start_copy = [&](cudaEvent_t start) {
        WEFT_CUDA_OK(cudaStreamWaitEvent(copy_stream, start, 0));
        WEFT_CUDA_OK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, copy_stream));
      };
      Result r{};
      // All interleaved (bench_timing.h): each variant alone and beside the copy, the copy alone.
      std::vector<std::function<void(cudaEvent_t)>> runs;
      for (int v = 0; v < kVariants; ++v) {
        runs.push_back([&, v](cudaEvent_t) { launch(v); });
        runs.push_back([&, v](cudaEvent_t start) {
          start_copy(start);
          launch(v);
        });
      }
      runs.push_back(
          [&](cudaEvent_t) { WEFT_CUDA_OK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, nullptr)); });
      const std::vector<double> ms = weft::bench::time_interleaved(iters, nullptr, runs);
      for (int v = 0; v < kVariants; ++v) r.alone[v] = ms[size_t(2 * v)], r.beside[v] = ms[size_t(2 * v + 1)];
      r.copy_ms = ms[2 * kVariants];
      r.copy_gbs = double(copy_bytes) / (r.copy_ms * 1e6);
      if (!ok(frame.check("gemm contention bench"))) return 1;
      // weft's kernels against cuBLAS on the same inputs (poisoned first).
      for (int v = 0; v < kCublas; ++v) {
        poison_bf16(c_weft, c_elems);
        launch(v);
        launch(kCublas);
        WEFT_CUDA_OK(cudaDeviceSynchronize());
        const Compared cmp = compare(c_weft, c_blas, c_elems);
        if (cmp.bad || !(cmp.rel_err < 1e-2)) {
          printf("FAILED: %s differs from cuBLAS on %d x %d x %d (rel err %.2e, %lld bad)\n", kNames[v], s.m, s.n, s.k,
                 cmp.rel_err, static_cast<long long>(cmp.bad));
          return 1;
        }
      }
      printf(
          "round %d  %5d x %5d x %5d  alone / beside copy (ms): weft %.3f / %.3f  chunked %.3f / %.3f  2-CTA %.3f / "
          "%.3f  2-CTA chunked %.3f / %.3f  cuBLAS %.3f / %.3f  copy %.3f ms (%.0f GB/s)\n",
          round, s.m, s.n, s.k, r.alone[0], r.beside[0], r.alone[1], r.beside[1], r.alone[2], r.beside[2], r.alone[3],
          r.beside[3], r.alone[4], r.beside[4], r.copy_ms, r.copy_gbs);
      fflush(stdout);
      results[si].push_back(r);
      for (void* p : {static_cast<void*>(a), static_cast<void*>(b), static_cast<void*>(c_weft),
                      static_cast<void*>(c_blas), src, dst})
        cudaFree(p);
    }
  }
  cublasDestroy(handle);
  cudaStreamDestroy(copy_stream);

  printf("\n%s, %d SMs: GEMM alone and beside a copy of (%d-1)/%d of A, ms (median of %d; one entry per round)\n",
         prop.name, sms, ranks, ranks, iters);
  printf("| M x N x K | copy ms | variant | alone | beside copy | cost per ms of copy |\n|---|---|---|---|---|---|\n");
  for (size_t si = 0; si < shapes.size(); ++si) {
    for (int v = 0; v < kVariants; ++v) {
      printf("| %d x %d x %d | ", shapes[si].m, shapes[si].n, shapes[si].k);
      for (const Result& r : results[si]) printf("%.3f ", r.copy_ms);
      printf("| %s | ", kNames[v]);
      for (const Result& r : results[si]) printf("%.3f ", r.alone[v]);
      printf("| ");
      for (const Result& r : results[si]) printf("%.3f ", r.beside[v]);
      printf("| ");
      for (const Result& r : results[si]) printf("%.2f ", (r.beside[v] - r.alone[v]) / r.copy_ms);
      printf("|\n");
    }
  }
  return 0;
}
