// tune_plans(): one op per candidate on one heap, one validation call each, then interleaved rounds.
#include "runtime/exec/tune.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "base/log.h"
#include "base/params.h"
#include "bootstrap/group_bootstrap.h"
#include "runtime/exec/ag_gemm.h"
#include "runtime/exec/context.h"
#include "runtime/exec/cuda_check.h"
#include "runtime/exec/device_data.h"
#include "runtime/exec/reference_gemm.h"
#include "runtime/exec/stream_ops.h"

namespace weft::runtime {
namespace {

using bf16 = __nv_bfloat16;

Status max_over_ranks(bootstrap::Bootstrap& boot, const std::string& key, std::vector<double>* v) {
  bootstrap::Blob mine(v->size() * sizeof(double));
  memcpy(mine.data(), v->data(), mine.size());
  std::vector<bootstrap::Blob> all;
  WEFT_CHECK(boot.allgather(key, mine, &all));
  for (const auto& b : all) {
    if (b.size() != mine.size()) return Status::kProtocolError;
    for (size_t i = 0; i < v->size(); ++i) {
      double x = 0;
      memcpy(&x, b.data() + i * sizeof(double), sizeof x);
      (*v)[i] = std::max((*v)[i], x);
    }
  }
  return Status::kOk;
}

}  // namespace

Status tune_plans(bootstrap::Bootstrap& job, const std::vector<Plan>& candidates, const RunSpec& run,
                  const std::function<void(int, int)>& progress, TuneResult* out) {
  const size_t count = candidates.size();
  if (count == 0) return Status::kInvalidArgument;
  // A grouped plan is measured in every group at once, each on its group's bootstrap and heap (as
  // run_plan runs it); the maxima below are over the group's ranks.
  std::unique_ptr<bootstrap::GroupBootstrap> group;
  if (candidates[0].grouped()) {
    std::string why;
    if (bootstrap::GroupBootstrap::create(&job, candidates[0].group_shape(), &group, &why) != Status::kOk) {
      WEFT_WARN(kTune, "%s", why.c_str());
      return Status::kInvalidArgument;
    }
  }
  bootstrap::Bootstrap& boot = group ? static_cast<bootstrap::Bootstrap&>(*group) : job;
  for (const auto& p : candidates)
    if (p.op != Op::kAgGemm || p.gemm.m != candidates[0].gemm.m || p.gemm.n != candidates[0].gemm.n ||
        p.gemm.k != candidates[0].gemm.k) {
      WEFT_WARN(kTune, "rank %d: tune measures AllGather+GEMM candidates of one shape", boot.info().rank);
      return Status::kUnsupported;
    }
  uint64_t heap = 0;
  for (const auto& p : candidates) heap += (p.heap_bytes + 4095) / 4096 * 4096;
  std::unique_ptr<Context> ctx;
  WEFT_CHECK(Context::create(boot, heap, &ctx));
  std::vector<std::unique_ptr<AgGemmOp>> ops(count);
  for (size_t i = 0; i < count; ++i) WEFT_CHECK(AgGemmOp::create(*ctx, candidates[i], &ops[i]));

  const Plan& p0 = candidates[0];
  const int rank = ctx->rank(), W = ctx->size();
  const int64_t m = p0.gemm.m, n = p0.gemm.n / W, k = p0.gemm.k, m_loc = m / W;
  bf16 *a = nullptr, *b = nullptr, *c = nullptr, *a_ref = nullptr, *c_ref = nullptr;
  WEFT_CUDA_CHECK(cudaMalloc(&a, size_t(m_loc * k) * 2));
  WEFT_CUDA_CHECK(cudaMalloc(&b, size_t(n * k) * 2));
  WEFT_CUDA_CHECK(cudaMalloc(&c, size_t(m * n) * 2));
  WEFT_CUDA_CHECK(cudaMalloc(&a_ref, size_t(m * k) * 2));
  WEFT_CUDA_CHECK(cudaMalloc(&c_ref, size_t(m * n) * 2));
  cudaStream_t s = nullptr;
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const uint64_t seed = 0x7E57ull + uint64_t(m * 31 + k);  // the same on every rank; shards differ by rank
  WEFT_CHECK(fill_random_bf16(a, m_loc * k, seed, rank, 1.0f, s));
  WEFT_CHECK(fill_random_bf16(b, n * k, seed + 1, rank, 1.0f, s));
  for (int q = 0; q < W; ++q) WEFT_CHECK(fill_random_bf16(a_ref + q * m_loc * k, m_loc * k, seed, q, 1.0f, s));
  WEFT_CHECK(reference_gemm_tn(m, n, k, a_ref, k, b, k, c_ref, n, s));
  double timeout = 10;
  WEFT_CHECK(get_param("WEFT_DEVICE_TIMEOUT", &timeout));

  // One checked call per candidate; a candidate that fails on any rank is left out of the rounds.
  std::vector<double> bad(count, 0);
  for (size_t i = 0; i < count; ++i) {
    WEFT_CHECK(poison_bf16(c, m * n, s));
    Status st = ops[i]->run(a, b, c, s);
    AgGemmOp* raw = ops[i].get();
    if (st == Status::kOk) st = sync_bounded(s, timeout + 1, "tune validation call", [raw] { raw->unstick(); });
    if (st != Status::kOk) return st;  // a device failure leaves the context poisoned
    Comparison cmp;
    WEFT_CHECK(compare_bf16(c, c_ref, m * n, s, &cmp));
    bad[i] = cmp.non_finite > 0 || !(cmp.rel_err < 1e-2) ? 1 : 0;
  }
  WEFT_CHECK(max_over_ranks(boot, "weft.tune.valid", &bad));

  const int rounds = run.warmup + run.iters;
  std::vector<std::vector<float>> times(count);
  std::vector<cudaEvent_t> ev(2 * count);
  for (auto& e : ev) WEFT_CUDA_CHECK(cudaEventCreate(&e));
  for (int r = 0; r < rounds; ++r) {
    for (size_t j = 0; j < count; ++j) {
      const size_t i = (j + size_t(r)) % count;  // each round starts at another candidate
      if (bad[i] > 0) continue;
      WEFT_CUDA_CHECK(cudaEventRecord(ev[2 * i], s));
      WEFT_CHECK(ops[i]->run(a, b, c, s));
      WEFT_CUDA_CHECK(cudaEventRecord(ev[2 * i + 1], s));
    }
    WEFT_CHECK(sync_bounded(s, timeout * double(count) + 1, "tune round", [&ops] {
      for (auto& o : ops) o->unstick();
    }));
    if (r >= run.warmup)
      for (size_t i = 0; i < count; ++i) {
        if (bad[i] > 0) continue;
        float x = 0;
        WEFT_CUDA_CHECK(cudaEventElapsedTime(&x, ev[2 * i], ev[2 * i + 1]));
        times[i].push_back(x);
      }
    if (rank == 0 && progress && ((r + 1) % 10 == 0 || r + 1 == rounds)) progress(r + 1, rounds);
  }
  for (auto& e : ev) cudaEventDestroy(e);
  std::vector<double> ms(count, 0);
  for (size_t i = 0; i < count; ++i) {
    if (bad[i] > 0 || times[i].empty()) continue;
    std::sort(times[i].begin(), times[i].end());
    ms[i] = times[i][times[i].size() / 2];
  }
  WEFT_CHECK(max_over_ranks(boot, "weft.tune.ms", &ms));
  out->valid.assign(count, false);
  out->ms = ms;
  out->best = -1;
  for (size_t i = 0; i < count; ++i) {
    out->valid[i] = bad[i] == 0;
    if (out->valid[i] && (out->best < 0 || ms[i] < ms[size_t(out->best)])) out->best = int(i);
  }
  ops.clear();
  cudaStreamDestroy(s);
  for (void* p : {(void*)a, (void*)b, (void*)c, (void*)a_ref, (void*)c_ref}) cudaFree(p);
  WEFT_CHECK(boot.barrier("weft.tune.done"));
  return Status::kOk;
}

}  // namespace weft::runtime
