// tune_plans(): one op per candidate on one heap, one validation call each, then interleaved rounds
// (AllGather+GEMM, GEMM+RS, GEMM+AR, MoE).
#include "runtime/exec/tune.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "base/log.h"
#include "base/params.h"
#include "bootstrap/group_bootstrap.h"
#include "runtime/exec/ag_gemm.h"
#include "runtime/exec/context.h"
#include "runtime/exec/cuda_check.h"
#include "runtime/exec/device_data.h"
#include "runtime/exec/gemm_reduce.h"
#include "runtime/exec/moe.h"
#include "runtime/exec/reference_gemm.h"
#include "runtime/exec/reference_moe.h"
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

// The candidates as ops on one heap, checked and then timed the same way whatever the op: `call(i)`
// enqueues one call of candidate i on s, `check(i)` one checked call (sets *bad), `unstick` raises
// every op's words after a device failure.
struct Measured {
  std::function<Status(size_t)> call;
  std::function<Status(size_t, bool*)> check;
  std::function<void()> unstick;
};

Status measure(bootstrap::Bootstrap& boot, size_t count, const Measured& m, const RunSpec& run, cudaStream_t s,
               const std::function<void(int, int)>& progress, TuneResult* out) {
  double timeout = 10;
  WEFT_CHECK(get_param("WEFT_DEVICE_TIMEOUT", &timeout));
  const int rank = boot.info().rank;
  // One checked call per candidate; a candidate that fails on any rank is left out of the rounds.
  std::vector<double> bad(count, 0);
  for (size_t i = 0; i < count; ++i) {
    bool b = false;
    WEFT_CHECK(m.check(i, &b));  // a device failure leaves the context poisoned
    bad[i] = b ? 1 : 0;
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
      WEFT_CHECK(m.call(i));
      WEFT_CUDA_CHECK(cudaEventRecord(ev[2 * i + 1], s));
    }
    WEFT_CHECK(sync_bounded(s, timeout * double(count) + 1, "tune round", m.unstick));
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
  return Status::kOk;
}

// Calls of op i on s, a checked call (output poisoned first, compared with `want`, rel err below 1e-2,
// every element written) and the unstick of every op: what measure() needs, for either op type.
template <class OpT>
Measured measured_ops(std::vector<std::unique_ptr<OpT>>& ops, const bf16* a, const bf16* b, bf16* c, const bf16* want,
                      int64_t elems, double timeout, cudaStream_t s) {
  Measured me;
  me.call = [&ops, a, b, c, s](size_t i) { return ops[i]->run(a, b, c, s); };
  me.unstick = [&ops] {
    for (auto& o : ops) o->unstick();
  };
  me.check = [&ops, a, b, c, want, elems, timeout, s](size_t i, bool* bad) -> Status {
    WEFT_CHECK(poison_bf16(c, elems, s));
    Status st = ops[i]->run(a, b, c, s);
    OpT* raw = ops[i].get();
    if (st == Status::kOk) st = sync_bounded(s, timeout + 1, "tune validation call", [raw] { raw->unstick(); });
    WEFT_CHECK(st);
    Comparison cmp;
    WEFT_CHECK(compare_bf16(c, want, elems, s, &cmp));
    *bad = cmp.non_finite > 0 || !(cmp.rel_err < 1e-2);
    return Status::kOk;
  };
  return me;
}

// AllGather+GEMM: every rank's shard from its own seed; the reference gathers them all.
Status tune_ag_gemm(Context& ctx, const std::vector<Plan>& candidates, const RunSpec& run,
                    const std::function<void(int, int)>& progress, TuneResult* out) {
  const size_t count = candidates.size();
  const Plan& p0 = candidates[0];
  const int rank = ctx.rank(), W = ctx.size();
  const int64_t m = p0.gemm.m, n = p0.gemm.n / W, k = p0.gemm.k, m_loc = m / W;
  DeviceBuffers buf;
  bf16 *a = nullptr, *b = nullptr, *c = nullptr, *a_ref = nullptr, *c_ref = nullptr;
  WEFT_CHECK(buf.alloc(m_loc * k, &a));
  WEFT_CHECK(buf.alloc(n * k, &b));
  WEFT_CHECK(buf.alloc(m * n, &c));
  WEFT_CHECK(buf.alloc(m * k, &a_ref));
  WEFT_CHECK(buf.alloc(m * n, &c_ref));
  cudaStream_t s = nullptr;
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::unique_ptr<CUstream_st, void (*)(cudaStream_t)> stream_guard(s, [](cudaStream_t x) { cudaStreamDestroy(x); });
  // The ops last: on an early return they go first, waiting for (and releasing) their streams before
  // the buffers and the stream they used are freed.
  std::vector<std::unique_ptr<AgGemmOp>> ops(count);
  for (size_t i = 0; i < count; ++i) WEFT_CHECK(AgGemmOp::create(ctx, candidates[i], &ops[i]));
  const uint64_t seed = 0x7E57ull + uint64_t(m * 31 + k);  // the same on every rank; shards differ by rank
  WEFT_CHECK(fill_random_bf16(a, m_loc * k, seed, rank, 1.0f, s));
  WEFT_CHECK(fill_random_bf16(b, n * k, seed + 1, rank, 1.0f, s));
  for (int q = 0; q < W; ++q) WEFT_CHECK(fill_random_bf16(a_ref + q * m_loc * k, m_loc * k, seed, q, 1.0f, s));
  WEFT_CHECK(reference_gemm_tn(m, n, k, a_ref, k, b, k, c_ref, n, s));
  double timeout = 10;
  WEFT_CHECK(get_param("WEFT_DEVICE_TIMEOUT", &timeout));
  const Measured me = measured_ops(ops, a, b, c, c_ref, m * n, timeout, s);
  WEFT_CHECK(measure(ctx.boot(), count, me, run, s, progress, out));
  ops.clear();
  return Status::kOk;
}

// GEMM+RS / GEMM+AR: every rank's A_r and B_r from its own seed; the reference is one GEMM over all
// of K with every rank's slices (as run_plan validates).
Status tune_gemm_reduce(Context& ctx, const std::vector<Plan>& candidates, const RunSpec& run,
                        const std::function<void(int, int)>& progress, TuneResult* out) {
  const size_t count = candidates.size();
  const Plan& p0 = candidates[0];
  const int rank = ctx.rank(), W = ctx.size();
  const bool ar = p0.op == Op::kGemmAr;
  const int64_t m = p0.gemm.m, n = p0.gemm.n, k = p0.gemm.k, k_loc = k / W, m_loc = m / W, rows = ar ? m : m_loc;
  DeviceBuffers buf;
  bf16 *a = nullptr, *b = nullptr, *c = nullptr, *c_ref = nullptr;
  WEFT_CHECK(buf.alloc(m * k_loc, &a));
  WEFT_CHECK(buf.alloc(n * k_loc, &b));
  WEFT_CHECK(buf.alloc(rows * n, &c));
  cudaStream_t s = nullptr;
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::unique_ptr<CUstream_st, void (*)(cudaStream_t)> stream_guard(s, [](cudaStream_t x) { cudaStreamDestroy(x); });
  // The ops last: on an early return they go first, waiting for (and releasing) their streams before
  // the buffers and the stream they used are freed.
  std::vector<std::unique_ptr<GemmReduceOp>> ops(count);
  for (size_t i = 0; i < count; ++i) WEFT_CHECK(GemmReduceOp::create(ctx, candidates[i], &ops[i]));
  const uint64_t seed = 0x7E58ull + uint64_t(m * 31 + k);  // the same on every rank; slices differ by rank
  WEFT_CHECK(fill_random_bf16(a, m * k_loc, seed, rank, 1.0f, s));
  WEFT_CHECK(fill_random_bf16(b, n * k_loc, seed + 1, rank, 1.0f, s));
  WEFT_CHECK(reference_gemm_reduce(m, n, k, W, seed, &buf, &c_ref, s));
  const bf16* want = ar ? c_ref : c_ref + int64_t(rank) * m_loc * n;
  double timeout = 10;
  WEFT_CHECK(get_param("WEFT_DEVICE_TIMEOUT", &timeout));
  const Measured me = measured_ops(ops, a, b, c, want, rows * n, timeout, s);
  WEFT_CHECK(measure(ctx.boot(), count, me, run, s, progress, out));
  ops.clear();
  return Status::kOk;
}

// MoE: every rank's tokens from its own seed, the router weight shared, each expert's weights from
// (seed, expert); a candidate is checked as `weftrun run` checks the op (up to 64 sampled tokens per
// rank against reference_moe_expert with the call's own routing) and must drop no row.
Status tune_moe(Context& ctx, const std::vector<Plan>& candidates, const RunSpec& run,
                const std::function<void(int, int)>& progress, TuneResult* out) {
  const size_t count = candidates.size();
  const Plan& p0 = candidates[0];
  const int rank = ctx.rank(), W = ctx.size();
  const int64_t T = p0.moe.tokens / W, H = p0.moe.hidden, F = p0.moe.ffn, E = p0.moe.experts, L = E / W;
  const int64_t K = p0.moe.topk;
  DeviceBuffers buf;
  bf16* y = nullptr;
  WEFT_CHECK(buf.alloc(T * H, &y));
  cudaStream_t s = nullptr;
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::unique_ptr<CUstream_st, void (*)(cudaStream_t)> stream_guard(s, [](cudaStream_t v) { cudaStreamDestroy(v); });
  const uint64_t seed = 0x7E59ull + uint64_t(T * 31 + H);  // the same on every rank; tokens differ by rank
  MoeInputs in;
  WEFT_CHECK(make_moe_inputs(&buf, seed, rank, T, H, F, E, L, s, &in));
  bf16 *const router = in.router, *const gate = in.gate, *const up = in.up, *const down = in.down, *const x = in.x;
  WEFT_CUDA_CHECK(cudaStreamSynchronize(s));
  // The ops last: on an early return they go first, waiting for their last calls.
  std::vector<std::unique_ptr<MoeOp>> ops(count);
  for (size_t i = 0; i < count; ++i)
    WEFT_CHECK(MoeOp::create(ctx, candidates[i], MoeWeights{router, gate, up, down}, &ops[i]));
  double timeout = 10;
  WEFT_CHECK(get_param("WEFT_DEVICE_TIMEOUT", &timeout));
  Measured me;
  me.unstick = [&ops] {
    for (auto& o : ops)
      if (o) o->unstick();
  };
  me.call = [&ops, x, y, s](size_t i) { return ops[i]->run(x, y, s); };
  me.check = [&, timeout](size_t i, bool* bad) -> Status {
    WEFT_CHECK(poison_bf16(y, T * H, s));
    WEFT_CHECK(ops[i]->run(x, y, s));
    WEFT_CHECK(sync_bounded(s, 2 * timeout, "tune: a checked moe call", me.unstick));
    int64_t dropped = 0;
    WEFT_CHECK(ops[i]->dropped(&dropped));
    Comparison cmp;
    WEFT_CHECK(check_moe_sampled(ops[i]->topk_ids(), ops[i]->topk_weights(), seed, x, y, T, H, F, E, K,
                                 int32_t(std::min<int64_t>(T, 64)), s, &cmp));
    *bad = dropped != 0 || cmp.non_finite > 0 || !(cmp.rel_err < 1e-2);
    return Status::kOk;
  };
  WEFT_CHECK(measure(ctx.boot(), count, me, run, s, progress, out));
  ops.clear();
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
  const Plan& p0 = candidates[0];
  const bool gemm_reduce = p0.op == Op::kGemmRs || p0.op == Op::kGemmAr, moe = p0.op == Op::kMoe;
  for (const auto& p : candidates)
    if ((p0.op != Op::kAgGemm && !gemm_reduce && !moe) || p.op != p0.op || p.gemm.m != p0.gemm.m ||
        p.gemm.n != p0.gemm.n || p.gemm.k != p0.gemm.k || p.moe.tokens != p0.moe.tokens ||
        p.moe.hidden != p0.moe.hidden || p.moe.ffn != p0.moe.ffn || p.moe.experts != p0.moe.experts ||
        p.moe.topk != p0.moe.topk) {
      WEFT_WARN(kTune, "rank %d: tune measures AllGather+GEMM, GEMM+RS, GEMM+AR or MoE candidates of one op and shape",
                boot.info().rank);
      return Status::kUnsupported;
    }
  uint64_t heap = 0;
  for (const auto& p : candidates) heap += (p.heap_bytes + 4095) / 4096 * 4096;
  std::unique_ptr<Context> ctx;
  WEFT_CHECK(Context::create(boot, heap, &ctx));
  if (moe)
    WEFT_CHECK(tune_moe(*ctx, candidates, run, progress, out));
  else if (gemm_reduce)
    WEFT_CHECK(tune_gemm_reduce(*ctx, candidates, run, progress, out));
  else
    WEFT_CHECK(tune_ag_gemm(*ctx, candidates, run, progress, out));
  WEFT_CHECK(boot.barrier("weft.tune.done"));
  return Status::kOk;
}

}  // namespace weft::runtime
