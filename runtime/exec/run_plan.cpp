// run_plan(): context, op, inputs, the calls, the reference, the executed plan.
#include "runtime/exec/run_plan.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "base/log.h"
#include "base/params.h"
#include "bootstrap/group_bootstrap.h"
#include "bootstrap/placement.h"
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

// Rank 0's clock, shared: every run draws new inputs.
Status shared_seed(bootstrap::Bootstrap& boot, uint64_t* out) {
  uint64_t mine = uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
  bootstrap::Blob blob(sizeof mine);
  memcpy(blob.data(), &mine, sizeof mine);
  std::vector<bootstrap::Blob> all;
  WEFT_CHECK(boot.allgather("weft.run.seed", blob, &all));
  if (all.empty() || all[0].size() != sizeof mine) return Status::kProtocolError;
  memcpy(out, all[0].data(), sizeof mine);
  return Status::kOk;
}

// The calls of `run` (warm-up, then timed with events around each call), bounded, then one more
// call with a fresh launch record for the plan as executed. Outputs poisoned before that call.
template <class Op>
Status call_and_time(Context& ctx, Op& op, const char* what, const RunSpec& run, const bf16* a, const bf16* b, bf16* c,
                     int64_t c_elems, cudaStream_t s, RunReport* out) {
  double timeout = 10;
  WEFT_CHECK(get_param("WEFT_DEVICE_TIMEOUT", &timeout));
  const int calls = run.warmup + run.iters;
  std::vector<cudaEvent_t> ev(size_t(2 * run.iters), nullptr);
  for (auto& e : ev) WEFT_CUDA_CHECK(cudaEventCreate(&e));
  Status st = Status::kOk;
  for (int i = 0; i < calls && st == Status::kOk; ++i) {
    const int t = i - run.warmup;
    if (t >= 0) WEFT_CUDA_CHECK(cudaEventRecord(ev[size_t(2 * t)], s));
    st = op.run(a, b, c, s);
    if (t >= 0) WEFT_CUDA_CHECK(cudaEventRecord(ev[size_t(2 * t + 1)], s));
  }
  Op* raw = &op;
  if (st == Status::kOk)
    st = sync_bounded(s, timeout * (calls + 1), (std::string(what) + " calls").c_str(), [raw] { raw->unstick(); });
  if (st != Status::kOk) {
    ctx.abort(std::string(what) + " failed: " + to_string(st));
    return st;
  }
  std::vector<double> ms;
  for (int t = 0; t < run.iters; ++t) {
    float x = 0;
    WEFT_CUDA_CHECK(cudaEventElapsedTime(&x, ev[size_t(2 * t)], ev[size_t(2 * t + 1)]));
    ms.push_back(x);
  }
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(ms.begin(), ms.end());
  out->ms_median = ms.empty() ? 0 : ms[ms.size() / 2];
  WEFT_CHECK(op.clear_launch_record());
  WEFT_CHECK(poison_bf16(c, c_elems, s));
  WEFT_CHECK(op.run(a, b, c, s));
  WEFT_CHECK(
      sync_bounded(s, timeout + 1, (std::string(what) + " executed-plan call").c_str(), [raw] { raw->unstick(); }));
  WEFT_CHECK(op.executed_plan(&out->executed));
  // WEFT_DETERMINISTIC=1: weft's reductions run in a fixed order, so a second call on the same inputs
  // must give the same bits; checked here (the output poisoned in between).
  bool deterministic = false;
  WEFT_CHECK(get_param("WEFT_DETERMINISTIC", &deterministic));
  if (!deterministic) return Status::kOk;
  DeviceBuffers buf;
  bf16* first = nullptr;
  WEFT_CHECK(buf.alloc(c_elems, &first));
  WEFT_CUDA_CHECK(cudaMemcpyAsync(first, c, size_t(c_elems) * 2, cudaMemcpyDeviceToDevice, s));
  WEFT_CHECK(poison_bf16(c, c_elems, s));
  WEFT_CHECK(op.run(a, b, c, s));
  WEFT_CHECK(sync_bounded(s, timeout + 1, (std::string(what) + " repeated call").c_str(), [raw] { raw->unstick(); }));
  Comparison cmp;
  WEFT_CHECK(compare_bf16(c, first, c_elems, s, &cmp));
  out->repeat_mismatch = cmp.mismatched;
  return Status::kOk;
}

Status run_ag_gemm(Context& ctx, const Plan& plan, const RunSpec& run, RunReport* out) {
  std::unique_ptr<AgGemmOp> op;
  WEFT_CHECK(AgGemmOp::create(ctx, plan, &op));
  const int rank = ctx.rank(), W = ctx.size();
  const int64_t m = plan.gemm.m, n = plan.gemm.n / W, k = plan.gemm.k, m_loc = m / W;
  DeviceBuffers buf;
  bf16 *a = nullptr, *b = nullptr, *c = nullptr;
  WEFT_CHECK(buf.alloc(m_loc * k, &a));
  WEFT_CHECK(buf.alloc(n * k, &b));
  WEFT_CHECK(buf.alloc(m * n, &c));
  cudaStream_t s = nullptr;
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::unique_ptr<CUstream_st, void (*)(cudaStream_t)> stream_guard(s, [](cudaStream_t x) { cudaStreamDestroy(x); });
  uint64_t seed = 0;
  WEFT_CHECK(shared_seed(ctx.boot(), &seed));
  WEFT_CHECK(fill_random_bf16(a, m_loc * k, seed, rank, 1.0f, s));
  WEFT_CHECK(fill_random_bf16(b, n * k, seed + 1, rank, 1.0f, s));
  WEFT_CHECK(poison_bf16(c, m * n, s));

  WEFT_CHECK(call_and_time(ctx, *op, "ag_gemm", run, a, b, c, m * n, s, out));

  if (run.validate) {
    // Every shard regenerated from its source rank's seed: a shard from the wrong rank differs.
    bf16 *a_ref = nullptr, *c_ref = nullptr;
    WEFT_CHECK(buf.alloc(m * k, &a_ref));
    WEFT_CHECK(buf.alloc(m * n, &c_ref));
    for (int q = 0; q < W; ++q) WEFT_CHECK(fill_random_bf16(a_ref + q * m_loc * k, m_loc * k, seed, q, 1.0f, s));
    // Position by position: across nodes the gathered A is in the rank's own order (shard_at).
    Comparison gathered;
    for (int pos = 0; pos < W; ++pos) {
      Comparison one;
      WEFT_CHECK(
          compare_bf16(op->gathered() + pos * m_loc * k, a_ref + op->shard_at(pos) * m_loc * k, m_loc * k, s, &one));
      gathered.mismatched += one.mismatched;
    }
    WEFT_CHECK(reference_gemm_tn(m, n, k, a_ref, k, b, k, c_ref, n, s));
    Comparison cc;
    WEFT_CHECK(compare_bf16(c, c_ref, m * n, s, &cc));
    WEFT_CUDA_CHECK(cudaStreamSynchronize(s));
    out->validated = true;
    out->gather_mismatch = gathered.mismatched;
    out->rel_err = cc.rel_err;
    out->unwritten = cc.non_finite;
  }
  op.reset();
  return Status::kOk;
}

// GEMM+RS / GEMM+AR: every rank's A_r and B_r are its own random data; the reference is one GEMM over
// all of K, [A_0 | A_1 | ...] · [B_0 | B_1 | ...]ᵀ, regenerated from every rank's seed.
Status run_gemm_reduce(Context& ctx, const Plan& plan, const RunSpec& run, RunReport* out) {
  std::unique_ptr<GemmReduceOp> op;
  WEFT_CHECK(GemmReduceOp::create(ctx, plan, &op));
  const int rank = ctx.rank(), W = ctx.size();
  const int64_t m = plan.gemm.m, n = plan.gemm.n, k = plan.gemm.k, k_loc = k / W, m_loc = m / W;
  const bool ar = op->all_reduce();
  const int64_t c_rows = ar ? m : m_loc;
  DeviceBuffers buf;
  bf16 *a = nullptr, *b = nullptr, *c = nullptr;
  WEFT_CHECK(buf.alloc(m * k_loc, &a));
  WEFT_CHECK(buf.alloc(n * k_loc, &b));
  WEFT_CHECK(buf.alloc(c_rows * n, &c));
  cudaStream_t s = nullptr;
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::unique_ptr<CUstream_st, void (*)(cudaStream_t)> stream_guard(s, [](cudaStream_t x) { cudaStreamDestroy(x); });
  uint64_t seed = 0;
  WEFT_CHECK(shared_seed(ctx.boot(), &seed));
  WEFT_CHECK(fill_random_bf16(a, m * k_loc, seed, rank, 1.0f, s));
  WEFT_CHECK(fill_random_bf16(b, n * k_loc, seed + 1, rank, 1.0f, s));
  WEFT_CHECK(poison_bf16(c, c_rows * n, s));
  WEFT_CHECK(call_and_time(ctx, *op, "gemm_reduce", run, a, b, c, c_rows * n, s, out));
  if (run.validate) {
    bf16* c_ref = nullptr;
    WEFT_CHECK(reference_gemm_reduce(m, n, k, W, seed, &buf, &c_ref, s));
    Comparison cc;
    WEFT_CHECK(compare_bf16(c, ar ? c_ref : c_ref + int64_t(rank) * m_loc * n, c_rows * n, s, &cc));
    WEFT_CUDA_CHECK(cudaStreamSynchronize(s));
    out->validated = true;
    out->rel_err = cc.rel_err;
    out->unwritten = cc.non_finite;
  }
  op.reset();
  return Status::kOk;
}

// The MoE op as call_and_time calls an op: run(a, b, c) with a = the tokens and c = the output.
struct MoeCalls {
  MoeOp& op;
  Status run(const bf16* x, const bf16*, bf16* y, cudaStream_t s) { return op.run(x, y, s); }
  void unstick() { op.unstick(); }
  Status clear_launch_record() { return op.clear_launch_record(); }
  Status executed_plan(Plan* p) const { return op.executed_plan(p); }
};

// MoE: every rank's tokens its own random data, the router weight shared, each expert's weights
// from (seed, expert). Validated on up to 64 sampled tokens per rank against reference_moe_expert,
// expert by expert, with the op's own routing of the last call; dropped rows must be 0.
Status run_moe(Context& ctx, const Plan& plan, const RunSpec& run, RunReport* out) {
  const int rank = ctx.rank(), W = ctx.size();
  const int64_t T = plan.moe.tokens / W, H = plan.moe.hidden, F = plan.moe.ffn, E = plan.moe.experts, L = E / W;
  const int64_t K = plan.moe.topk;
  DeviceBuffers buf;
  bf16* y = nullptr;
  WEFT_CHECK(buf.alloc(T * H, &y));
  cudaStream_t s = nullptr;
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::unique_ptr<CUstream_st, void (*)(cudaStream_t)> stream_guard(s, [](cudaStream_t v) { cudaStreamDestroy(v); });
  uint64_t seed = 0;
  WEFT_CHECK(shared_seed(ctx.boot(), &seed));
  MoeInputs in;
  WEFT_CHECK(make_moe_inputs(&buf, seed, rank, T, H, F, E, L, s, &in));
  bf16 *const router = in.router, *const gate = in.gate, *const up = in.up, *const down = in.down, *const x = in.x;
  WEFT_CHECK(poison_bf16(y, T * H, s));
  WEFT_CUDA_CHECK(cudaStreamSynchronize(s));
  std::unique_ptr<MoeOp> op;
  WEFT_CHECK(MoeOp::create(ctx, plan, MoeWeights{router, gate, up, down}, &op));
  MoeCalls calls{*op};
  WEFT_CHECK(call_and_time(ctx, calls, "moe", run, x, nullptr, y, T * H, s, out));
  int64_t dropped = 0;
  WEFT_CHECK(op->dropped(&dropped));
  if (dropped != 0) {
    WEFT_WARN(kKernel, "rank %d: moe: %lld rows dropped (never expected)", rank, (long long)dropped);
    return Status::kInternal;
  }
  if (run.validate) {
    Comparison cc;
    WEFT_CHECK(check_moe_sampled(op->topk_ids(), op->topk_weights(), seed, x, y, T, H, F, E, K,
                                 int32_t(std::min<int64_t>(T, 64)), s, &cc));
    out->validated = true;
    out->rel_err = cc.rel_err;
    out->unwritten = cc.non_finite;
  }
  op.reset();
  return Status::kOk;
}

}  // namespace

Status run_plan(bootstrap::Bootstrap& boot, const Plan& plan, const RunSpec& run, uint64_t heap_bytes, RunReport* out) {
  if (!plan.exec.executable) {
    WEFT_WARN(kKernel, "rank %d: the plan cannot run: %s", boot.info().rank, plan.exec.not_executable.c_str());
    return Status::kInvalidArgument;
  }
  if (heap_bytes == 0) heap_bytes = plan.heap_bytes;
  if (heap_bytes < plan.heap_bytes) {
    WEFT_WARN(kKernel, "rank %d: WEFT_HEAP_BYTES is %llu, the plan needs %llu bytes of symmetric heap per rank",
              boot.info().rank, (unsigned long long)heap_bytes, (unsigned long long)plan.heap_bytes);
    return Status::kInvalidArgument;
  }
  // Fused ops address peers as (rank / G, rank % G): a launcher's uneven or cyclic placement is
  // refused here, before any work, by every rank alike. A grouped plan names the G of its job.
  const bootstrap::GroupShape shape = plan.group_shape();
  std::string why;
  if (bootstrap::require_block_placement(boot, plan.grouped() ? shape.gpus_per_node : 0, to_string(plan.op), &why) !=
      Status::kOk) {
    WEFT_WARN(kKernel, "rank %d: %s", boot.info().rank, why.c_str());
    return Status::kInvalidArgument;
  }
  // A grouped plan runs on every group at once: the op's bootstrap is its group's, so the heap (with
  // the op's flags in it) and every exchange of the op are the group's own.
  std::unique_ptr<bootstrap::GroupBootstrap> group;
  if (plan.grouped()) {
    if (bootstrap::GroupBootstrap::create(&boot, shape, &group, &why) != Status::kOk) {
      WEFT_WARN(kKernel, "%s", why.c_str());
      return Status::kInvalidArgument;
    }
  }
  bootstrap::Bootstrap& op_boot = group ? static_cast<bootstrap::Bootstrap&>(*group) : boot;
  std::unique_ptr<Context> ctx;
  WEFT_CHECK(Context::create(op_boot, heap_bytes, &ctx));
  Status st = Status::kUnsupported;
  if (plan.op == Op::kAgGemm) st = run_ag_gemm(*ctx, plan, run, out);
  if (plan.op == Op::kGemmRs || plan.op == Op::kGemmAr) st = run_gemm_reduce(*ctx, plan, run, out);
  if (plan.op == Op::kMoe) st = run_moe(*ctx, plan, run, out);
  if (st == Status::kOk) WEFT_CHECK(op_boot.barrier("weft.run.done"));  // nobody frees a heap a peer still reads
  ctx.reset();                                                          // the group's heap goes before its bootstrap
  return st;
}

}  // namespace weft::runtime
