// The runtime's GEMM+ReduceScatter / GEMM+AllReduce op (runtime/exec/gemm_reduce.h, what `weftrun
// run` and the API execute) for several plans of one problem, timed side by side on every rank of a
// `weftrun exec -n W` job: typically the peer variant and the overlap variant's ways of moving the
// pieces, next to `weftrun bench`'s runner rows of the same workload.
//   - every op is created on one heap, called once and its output compared with the first plan's
//     (the same inputs: a variant that misroutes or skips a piece differs);
//   - then rounds: each op in turn (the first op of a round rotates), `--iters` calls after 5 warm-up
//     calls, CUDA events around each call, two ways: back to back (what a program calling the op in
//     a loop sees), and lined up (a stream barrier of the ranks before each call, outside the events:
//     how `weftrun bench` times its runners); AllReduce ops also with C left in the heap (no copy
//     out); `--idle-us US` leaves the GPU idle for US microseconds after each lined-up call (outside
//     the events), to time the op at a duty like the runner rows' in `weftrun bench`'s rounds. Rank 0 prints each one's
//     median over all rounds, slowest rank, and the host's time to enqueue one call (median, slowest rank).
// Usage: weftrun plan --json A.yaml > a.json; weftrun plan --json B.yaml > b.json
//        weftrun exec -n W -- bench_gemm_reduce_op a.json b.json ... [--iters N] [--rounds R] [--idle-us US]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_ranks.h"
#include "bench/gemm/bench_timing.h"
#include "bench/runtime/op_bench.cuh"
#include "bootstrap/pmix_bootstrap.h"
#include "runtime/exec/context.h"
#include "runtime/exec/gemm_reduce.h"
#include "runtime/exec/run_plan.h"
#include "runtime/plan.h"

namespace runtime = weft::runtime;
namespace bootstrap = weft::bootstrap;
using weft::Status;
using bf16 = __nv_bfloat16;

namespace {

__global__ void poison(bf16* p, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = __ushort_as_bfloat16(0x7FC1);  // NaN
}

// Elements of x that differ from y by more than the summation order explains (or are not finite).
__global__ void count_off(const bf16* x, const bf16* y, int64_t n, unsigned long long* off) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float a = __bfloat162float(x[i]), b = __bfloat162float(y[i]);
    if (!(fabsf(a - b) <= 2e-2f * (1.f + fabsf(b)))) atomicAdd(off, 1ull);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 20, rounds = 3, idle_us = 0;
  std::vector<std::string> files;
  bool bad_args = false;
  using weft::bench::flag_int;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc)
      bad_args |= !flag_int(argv[++i], 1, 1000, &iters);
    else if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc)
      bad_args |= !flag_int(argv[++i], 1, 100, &rounds);
    else if (!std::strcmp(argv[i], "--idle-us") && i + 1 < argc)
      bad_args |= !flag_int(argv[++i], 0, 100000, &idle_us);
    else if (argv[i][0] != '-' && files.size() < 8)
      files.push_back(argv[i]);
    else
      bad_args = true;
  }
  if (files.empty() || bad_args || !bootstrap::started_under_pmix()) {
    fprintf(stderr,
            "usage: weftrun exec -n W -- bench_gemm_reduce_op PLAN.json [PLAN.json ...] (at most 8, one problem) "
            "[--iters N (1..1000)] [--rounds R (1..100)] [--idle-us US (0..100000)]\n");
    return 2;
  }
  std::vector<runtime::Plan> plans(files.size());
  for (size_t i = 0; i < files.size(); ++i) {
    std::string err;
    if (runtime::read_plan_file(files[i], &plans[i], &err) != Status::kOk) {
      fprintf(stderr, "bench_gemm_reduce_op: %s\n", err.c_str());
      return 2;
    }
    const runtime::Plan& p = plans[i];
    if ((p.op != runtime::Op::kGemmRs && p.op != runtime::Op::kGemmAr) || p.op != plans[0].op ||
        p.gemm.m != plans[0].gemm.m || p.gemm.n != plans[0].gemm.n || p.gemm.k != plans[0].gemm.k) {
      fprintf(stderr, "bench_gemm_reduce_op: %s: every plan must be gemm_rs or gemm_ar of one shape\n",
              files[i].c_str());
      return 2;
    }
  }
  std::unique_ptr<bootstrap::PmixBootstrap> boot = weft::bench::join_job();
  if (!boot) return 1;
  const int rank = boot->info().rank, W = boot->info().size;
  const bool ar = plans[0].op == runtime::Op::kGemmAr;
  const int64_t m = plans[0].gemm.m, n = plans[0].gemm.n, kl = plans[0].gemm.k / W, rows = ar ? m : m / W;
  uint64_t heap = 64ull << 20;
  for (const auto& p : plans) heap += (p.heap_bytes + (2ull << 20) - 1) / (2ull << 20) * (2ull << 20);
  std::unique_ptr<runtime::Context> ctx;
  if (runtime::Context::create(*boot, heap, &ctx) != Status::kOk) return 1;
  std::vector<std::unique_ptr<runtime::GemmReduceOp>> ops(plans.size());
  for (size_t i = 0; i < plans.size(); ++i)
    if (runtime::GemmReduceOp::create(*ctx, plans[i], &ops[i]) != Status::kOk) return 1;
  bf16 *a = nullptr, *b = nullptr, *c = nullptr, *first = nullptr;
  unsigned long long* off = nullptr;
  BENCH_CUDA(cudaMalloc(&a, size_t(m * kl) * 2));
  BENCH_CUDA(cudaMalloc(&b, size_t(n * kl) * 2));
  BENCH_CUDA(cudaMalloc(&c, size_t(rows * n) * 2));
  BENCH_CUDA(cudaMalloc(&first, size_t(rows * n) * 2));
  BENCH_CUDA(cudaMallocManaged(&off, 8));
  weft::bench::fill_hash<<<1024, 256>>>(a, m * kl, 17u + uint32_t(rank));
  weft::bench::fill_hash<<<1024, 256>>>(b, n * kl, 91u + uint32_t(rank));
  cudaStream_t s;
  BENCH_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  BENCH_CUDA(cudaDeviceSynchronize());

  // One checked call each, against the first plan's output.
  std::vector<std::string> names(plans.size());
  for (size_t i = 0; i < plans.size(); ++i) {
    runtime::Plan executed;
    const runtime::Plan& p = plans[i];
    names[i] = p.exec.variant;
    if (p.exec.variant == "overlap")
      names[i] += " " + std::to_string(p.exec.pieces) + "p lag " + std::to_string(p.exec.lag) + " send " + p.exec.send +
                  (p.exec.gather.empty() ? "" : " gather " + p.exec.gather) +
                  (p.roles.intra_comm ? " movers " + std::to_string(p.roles.intra_comm) : "");
    poison<<<1024, 256, 0, s>>>(c, rows * n);
    BENCH_CUDA(cudaStreamSynchronize(s));
    if (boot->barrier("bench.gr.check." + std::to_string(i)) != Status::kOk) return 1;
    if (ops[i]->run(a, b, c, s) != Status::kOk) return 1;
    if (weft::runtime::sync_bounded(s, 60, "the checked call", nullptr) != Status::kOk) return 1;
    *off = 0;
    if (i == 0) BENCH_CUDA(cudaMemcpy(first, c, size_t(rows * n) * 2, cudaMemcpyDeviceToDevice));
    count_off<<<1024, 256>>>(c, first, rows * n, off);
    BENCH_CUDA(cudaDeviceSynchronize());
    const double worst = weft::bench::allgather_max(*boot, "bench.gr.off." + std::to_string(i), double(*off));
    if (rank == 0)
      printf("# %s: %s\n", names[i].c_str(),
             worst == 0
                 ? "output matches the first plan's"
                 : ("DIFFERS from the first plan's in " + std::to_string((long long)worst) + " elements").c_str());
    if (worst != 0) return 1;
  }

  // What is timed: each plan with C copied out to the caller's buffer; AllReduce also with C left in
  // the heap (c = heap_c(): no copy out).
  struct Entry {
    size_t plan;
    bool heap_c;
  };
  std::vector<Entry> entries;
  for (size_t i = 0; i < plans.size(); ++i) {
    entries.push_back({i, false});
    if (ar) entries.push_back({i, true});
  }
  weft::bench::StreamLineUp line_up;  // the lined-up calls' stream barrier
  if (!line_up.create(*ctx, *boot)) return 1;
  std::vector<std::vector<float>> ms(entries.size()), ms_lined(entries.size());
  std::vector<std::vector<float>> host_us(entries.size());
  std::vector<cudaEvent_t> ev(size_t(2 * iters));
  for (auto& e : ev) BENCH_CUDA(cudaEventCreate(&e));
  for (int round = 0; round < rounds; ++round)
    for (size_t j = 0; j < entries.size(); ++j)
      for (int lined : {0, 1}) {
        const size_t x = (j + size_t(round)) % entries.size();
        runtime::GemmReduceOp& op = *ops[entries[x].plan];
        bf16* out = entries[x].heap_c ? op.heap_c() : c;
        if (boot->barrier("bench.gr." + std::to_string(round) + "." + std::to_string(j) + "." +
                          std::to_string(lined)) != Status::kOk)
          return 1;
        for (int it = -5; it < iters; ++it) {
          if (lined && line_up.enqueue(s) != Status::kOk) return 1;
          if (it >= 0) BENCH_CUDA(cudaEventRecord(ev[size_t(2 * it)], s));
          const auto t0 = std::chrono::steady_clock::now();
          if (op.run(a, b, out, s) != Status::kOk) return 1;
          const auto t1 = std::chrono::steady_clock::now();
          if (it >= 0 && !lined)
            host_us[x].push_back(float(std::chrono::duration<double, std::micro>(t1 - t0).count()));
          if (it >= 0) BENCH_CUDA(cudaEventRecord(ev[size_t(2 * it + 1)], s));
          if (lined) weft::bench::idle_on(s, idle_us);
        }
        // Bounded: a rank that stopped leaves the others' stream barrier or the op's waits unsatisfied.
        if (weft::runtime::sync_bounded(s, 60, lined ? "lined-up calls" : "back-to-back calls", nullptr) !=
            Status::kOk) {
          fprintf(stderr, "bench_gemm_reduce_op: rank %d: %s's calls did not finish within 60 s\n", rank,
                  names[entries[x].plan].c_str());
          return 1;
        }
        for (int it = 0; it < iters; ++it) {
          float t = 0;
          BENCH_CUDA(cudaEventElapsedTime(&t, ev[size_t(2 * it)], ev[size_t(2 * it + 1)]));
          (lined ? ms_lined : ms)[x].push_back(t);
        }
      }
  if (rank == 0)
    printf(
        "# runtime %s op, m %lld n %lld k %lld, %d ranks; median of %d calls x %d rounds, slowest rank: back to back, "
        "lined up (a stream barrier before each call%s), the host's enqueue\n| plan | back to back ms | lined up ms | "
        "host enqueue us |\n|---|---|---|---|\n",
        ar ? "gemm_ar" : "gemm_rs", (long long)m, (long long)n, (long long)(kl * W), W, iters, rounds,
        idle_us ? (", " + std::to_string(idle_us) + " us idle after it").c_str() : "");
  for (size_t x = 0; x < entries.size(); ++x) {
    const std::string key = std::to_string(x);
    const double worst = weft::bench::allgather_max(*boot, "bench.gr.ms." + key, weft::bench::median(ms[x]));
    const double lined = weft::bench::allgather_max(*boot, "bench.gr.lined." + key, weft::bench::median(ms_lined[x]));
    const double host = weft::bench::allgather_max(*boot, "bench.gr.host." + key, weft::bench::median(host_us[x]));
    const size_t i = entries[x].plan;
    if (rank == 0)
      printf("| %s%s (%s) | %.3f | %.3f | %.0f |\n", names[i].c_str(), entries[x].heap_c ? ", C left in the heap" : "",
             files[i].c_str(), worst, lined, host);
  }
  fflush(stdout);
  for (auto& e : ev) cudaEventDestroy(e);
  ops.clear();
  cudaFree(a), cudaFree(b), cudaFree(c), cudaFree(first), cudaFree(off);
  return 0;
}
