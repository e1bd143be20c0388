// The runtime's AllGather+GEMM op (runtime/exec/ag_gemm.h, what `weftrun run` executes) timed six
// ways on every rank of a `weftrun exec -n W` job, to find where its time goes next to the
// benchmark runner's fused variant (`weftrun bench`):
//   back-to-back     calls one after another, no barrier (as weftrun run times them);
//   isolated         every rank synchronized and past a job barrier before each call (the host's
//                    enqueue inside the events);
//   lined up         a stream barrier of the ranks before each call, enqueued ahead (as the runner's
//                    rows are lined up, without the host's enqueue);
//                    `--idle-us US`: the GPU idle for US microseconds after each lined-up call
//                    (outside the events), to time it at a duty like the runner rows' in the rounds;
//                    `--skew-us US`: after the barrier rank r waits r/(W-1) of US before its start
//                    event, as ranks leave a barrier kernel at different times (the rank's own view,
//                    as an NCCL barrier's rows are timed); `--nccl-line-up`: the barrier is a
//                    one-word NCCL all-reduce on the stream, as `weftrun bench`'s rounds line their
//                    rows up (builds with NCCL only);
//   heap input       each of those with A already in the heap (a = shard(): no copy of the own shard).
// The modes take turns in rounds, so the GPU's clock steps fall on all of them. CUDA events around
// each call; rank 0 prints each mode's median over all rounds, slowest rank.
// Usage: weftrun plan --json WORKLOAD.yaml > plan.json
//        weftrun exec -n W -- bench_ag_gemm_op plan.json [--iters N] [--rounds R] [--normal] [--idle-us US]
//        [--skew-us US] [--nccl-line-up]
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
#include "runtime/exec/ag_gemm.h"
#include "runtime/exec/context.h"
#include "runtime/exec/device_data.h"
#include "runtime/exec/run_plan.h"
#include "runtime/exec/stream_ops.h"
#include "runtime/plan.h"
#if WEFT_HAVE_OPS
#include <nccl.h>

#include "runtime/ops/op_harness.h"
#endif

namespace runtime = weft::runtime;
namespace bootstrap = weft::bootstrap;
using weft::Status;
using bf16 = __nv_bfloat16;

int main(int argc, char** argv) {
  int iters = 20, rounds = 3, idle_us = 0, skew_us = 0;
  bool normal = false, nccl_line_up = false;
  std::string plan_file;
  bool bad_args = false;
  using weft::bench::flag_int;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc)
      bad_args |= !flag_int(argv[++i], 1, 1000, &iters);
    else if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc)
      bad_args |= !flag_int(argv[++i], 1, 100, &rounds);
    else if (!std::strcmp(argv[i], "--idle-us") && i + 1 < argc)
      bad_args |= !flag_int(argv[++i], 0, 100000, &idle_us);  // after each lined-up call
    else if (!std::strcmp(argv[i], "--skew-us") && i + 1 < argc)
      bad_args |= !flag_int(argv[++i], 0, 100000, &skew_us);  // rank r starts r/(W-1) of it late
    else if (!std::strcmp(argv[i], "--nccl-line-up"))
      nccl_line_up = true;  // lined up by a one-word NCCL all-reduce, as weftrun bench's rounds are
    else if (!std::strcmp(argv[i], "--normal"))
      normal = true;  // weftrun run's inputs (normal, scale 1) instead of uniform in [-0.5, 0.5)
    else if (plan_file.empty() && argv[i][0] != '-')
      plan_file = argv[i];
    else
      plan_file.clear(), i = argc;
  }
  if (plan_file.empty() || bad_args || !bootstrap::started_under_pmix()) {
    fprintf(stderr,
            "usage: weftrun exec -n W -- bench_ag_gemm_op PLAN.json [--iters N (1..1000)] [--rounds R (1..100)] "
            "[--normal] [--idle-us US (0..100000)] [--skew-us US (0..100000)] [--nccl-line-up]\n");
    return 2;
  }
  runtime::Plan plan;
  std::string err;
  if (runtime::read_plan_file(plan_file, &plan, &err) != Status::kOk) {
    fprintf(stderr, "bench_ag_gemm_op: %s\n", err.c_str());
    return 2;
  }
  std::unique_ptr<bootstrap::PmixBootstrap> boot = weft::bench::join_job();
  if (!boot) return 1;
  const int rank = boot->info().rank, W = boot->info().size;
  const int64_t m = plan.gemm.m, n = plan.gemm.n / W, k = plan.gemm.k;
  std::unique_ptr<runtime::Context> ctx;
  if (runtime::Context::create(*boot, uint64_t(m * k) * 2 + (uint64_t(64) << 20), &ctx) != Status::kOk) return 1;
  std::unique_ptr<runtime::AgGemmOp> op;
  if (runtime::AgGemmOp::create(*ctx, plan, &op) != Status::kOk) return 1;
  bf16 *a = nullptr, *b = nullptr, *c = nullptr;
  BENCH_CUDA(cudaMalloc(&a, size_t(m / W * k) * 2));
  BENCH_CUDA(cudaMalloc(&b, size_t(n * k) * 2));
  BENCH_CUDA(cudaMalloc(&c, size_t(m * n) * 2));
  if (normal) {
    if (runtime::fill_random_bf16(a, m / W * k, 17, rank, 1.0f, nullptr) != Status::kOk ||
        runtime::fill_random_bf16(b, n * k, 91, rank, 1.0f, nullptr) != Status::kOk)
      return 1;
  } else {
    weft::bench::fill_hash<<<1024, 256>>>(a, m / W * k, 17u + uint32_t(rank));
    weft::bench::fill_hash<<<1024, 256>>>(b, n * k, 91u + uint32_t(rank));
  }
  BENCH_CUDA(cudaMemcpy(op->shard(), a, size_t(m / W * k) * 2, cudaMemcpyDeviceToDevice));
  cudaStream_t s;
  BENCH_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  BENCH_CUDA(cudaDeviceSynchronize());

  // Modes: the caller's shard or the heap's (shard()), each back to back, isolated (host synchronised
  // and a job barrier before each call: the host's enqueue is timed too) and lined up (a stream
  // barrier before each call, enqueued ahead: how weftrun bench's runner rows are timed).
  constexpr int kModes = 6;
  const char* names[kModes] = {"back-to-back (as weftrun run)",
                               "isolated (barrier before each call)",
                               "lined up (a stream barrier before each call)",
                               "heap input, back-to-back",
                               "heap input, isolated",
                               "heap input, lined up"};
  if (nccl_line_up)
    names[2] = "lined up (an NCCL all-reduce before each call)", names[5] = "heap input, lined up (NCCL)";
  weft::bench::StreamLineUp line_up;
  if (!line_up.create(*ctx, *boot)) return 1;
#if WEFT_HAVE_OPS
  ncclComm_t comm = nullptr;
  int* word = nullptr;
  if (nccl_line_up) {
    if (runtime::ops::create_nccl_comm(*boot, &comm) != Status::kOk) return 1;
    BENCH_CUDA(cudaMalloc(&word, sizeof(int)));
    BENCH_CUDA(cudaMemset(word, 0, sizeof(int)));
  }
  auto barrier_on = [&](cudaStream_t st) {
    if (!nccl_line_up) return line_up.enqueue(st);
    return ncclAllReduce(word, word, 1, ncclInt32, ncclSum, comm, st) == ncclSuccess ? Status::kOk : Status::kInternal;
  };
#else
  if (nccl_line_up) {
    fprintf(stderr, "bench_ag_gemm_op: --nccl-line-up needs a build with NCCL\n");
    return 2;
  }
  auto barrier_on = [&](cudaStream_t st) { return line_up.enqueue(st); };
#endif
  std::vector<std::vector<float>> ms(kModes), host_us(kModes);  // host_us: the host's time inside run()
  std::vector<cudaEvent_t> ev(size_t(2 * iters));
  for (auto& e : ev) BENCH_CUDA(cudaEventCreate(&e));
  int barrier_no = 0;
  for (int round = 0; round < rounds; ++round)
    for (int mode = 0; mode < kModes; ++mode) {
      const bool isolated = mode % 3 == 1, lined = mode % 3 == 2;
      if (lined && !line_up.available()) continue;  // across nodes: no stream barrier (peers unmapped)
      const bf16* src = mode >= 3 ? op->shard() : a;
      for (int i = -5; i < iters; ++i) {
        if (isolated) {
          BENCH_CUDA(cudaStreamSynchronize(s));
          if (boot->barrier("bench.ag." + std::to_string(barrier_no++)) != Status::kOk) return 1;
        }
        if (lined && barrier_on(s) != Status::kOk) return 1;
        if (lined) weft::bench::idle_on(s, W > 1 ? skew_us * rank / (W - 1) : 0);
        if (i >= 0) BENCH_CUDA(cudaEventRecord(ev[size_t(2 * i)], s));
        const auto t0 = std::chrono::steady_clock::now();
        if (op->run(src, b, c, s) != Status::kOk) return 1;
        if (i >= 0)
          host_us[size_t(mode)].push_back(
              float(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count()));
        if (i >= 0) BENCH_CUDA(cudaEventRecord(ev[size_t(2 * i + 1)], s));
        if (lined) weft::bench::idle_on(s, idle_us);
      }
      // Bounded: a rank that stopped leaves the others' stream barrier unsatisfied.
      if (runtime::sync_bounded(s, 60, names[mode], nullptr) != Status::kOk) {
        fprintf(stderr, "bench_ag_gemm_op: rank %d: %s did not finish within 60 s\n", rank, names[mode]);
        return 1;
      }
      for (int i = 0; i < iters; ++i) {
        float x = 0;
        BENCH_CUDA(cudaEventElapsedTime(&x, ev[size_t(2 * i)], ev[size_t(2 * i + 1)]));
        ms[size_t(mode)].push_back(x);
      }
      if (boot->barrier("bench.ag.mode." + std::to_string(round * kModes + mode)) != Status::kOk) return 1;
    }
  if (rank == 0)
    printf(
        "# runtime ag_gemm op, m %lld n %lld (per rank) k %lld, %d ranks, variant %s, %d compute SMs; "
        "%s inputs; median of %d calls x %d rounds, slowest rank; the host's time inside run()%s\n| mode | ms | host "
        "enqueue us |\n|---|---|---|\n",
        (long long)m, (long long)n, (long long)k, W, plan.exec.variant.c_str(), plan.roles.compute,
        normal ? "normal" : "uniform", iters, rounds,
        (std::string(nccl_line_up ? "; lined up by a one-word NCCL all-reduce" : "") +
         (idle_us ? "; lined up: " + std::to_string(idle_us) + " us idle after each call" : "") +
         (skew_us ? "; lined up: rank r starts " + std::to_string(skew_us) + " r/(W-1) us after the barrier" : ""))
            .c_str());
  for (int mode = 0; mode < kModes; ++mode) {
    if (mode % 3 == 2 && !line_up.available()) {
      if (rank == 0) printf("| %s | n/a (ranks on other nodes) | |\n", names[mode]);
      continue;
    }
    const double worst =
        weft::bench::allgather_max(*boot, "bench.ag.ms." + std::to_string(mode), weft::bench::median(ms[size_t(mode)]));
    const double host = weft::bench::allgather_max(*boot, "bench.ag.host." + std::to_string(mode),
                                                   weft::bench::median(host_us[size_t(mode)]));
    if (rank == 0) printf("| %s | %.3f | %.0f |\n", names[mode], worst, host);
  }
  // The same plan through weftrun run's own harness (run_plan: its Context, inputs and timing loop),
  // in this process, with this op and its heap still alive.
  runtime::RunSpec spec;
  spec.warmup = 5, spec.iters = iters, spec.validate = false;
  for (int rep = 0; rep < 2; ++rep) {
    runtime::RunReport report;
    if (runtime::run_plan(*boot, plan, spec, 0, &report) != Status::kOk) return 1;
    const double worst =
        weft::bench::allgather_max(*boot, "bench.ag.run_plan." + std::to_string(rep), report.ms_median);
    if (rank == 0) printf("| run_plan (weftrun run's harness), %d | %.3f | |\n", rep + 1, worst);
  }
  fflush(stdout);
  for (auto& e : ev) cudaEventDestroy(e);
  op.reset();
  cudaFree(a), cudaFree(b), cudaFree(c);
#if WEFT_HAVE_OPS
  if (comm) ncclCommDestroy(comm);
  if (word) cudaFree(word);
#endif
  return 0;
}
