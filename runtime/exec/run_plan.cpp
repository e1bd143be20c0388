// run_plan(): context, op, inputs, the calls, the reference, the executed plan.
#include "runtime/exec/run_plan.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include "base/log.h"
#include "base/params.h"
#include "runtime/exec/ag_gemm.h"
#include "runtime/exec/context.h"
#include "runtime/exec/cuda_check.h"
#include "runtime/exec/device_data.h"
#include "runtime/exec/gemm_reduce.h"
#include "runtime/exec/reference_gemm.h"
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

struct DeviceBuffers {
  std::vector<void*> ptrs;
  ~DeviceBuffers() {
    for (void* p : ptrs) cudaFree(p);
  }
  template <class T>
  Status alloc(int64_t count, T** out) {
    void* p = nullptr;
    WEFT_CUDA_CHECK(cudaMalloc(&p, size_t(count) * sizeof(T)));
    ptrs.push_back(p);
    *out = static_cast<T*>(p);
    return Status::kOk;
  }
};

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
  return op.executed_plan(&out->executed);
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
    Comparison gathered;
    WEFT_CHECK(compare_bf16(op->gathered(), a_ref, m * k, s, &gathered));
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
    bf16 *a_full = nullptr, *b_full = nullptr, *part = nullptr, *c_ref = nullptr;
    WEFT_CHECK(buf.alloc(m * k, &a_full));
    WEFT_CHECK(buf.alloc(n * k, &b_full));
    WEFT_CHECK(buf.alloc(std::max(m, n) * k_loc, &part));
    WEFT_CHECK(buf.alloc(m * n, &c_ref));
    for (int q = 0; q < W; ++q) {
      WEFT_CHECK(fill_random_bf16(part, m * k_loc, seed, q, 1.0f, s));
      WEFT_CUDA_CHECK(cudaMemcpy2DAsync(a_full + q * k_loc, size_t(k) * 2, part, size_t(k_loc) * 2, size_t(k_loc) * 2,
                                        size_t(m), cudaMemcpyDeviceToDevice, s));
      WEFT_CHECK(fill_random_bf16(part, n * k_loc, seed + 1, q, 1.0f, s));
      WEFT_CUDA_CHECK(cudaMemcpy2DAsync(b_full + q * k_loc, size_t(k) * 2, part, size_t(k_loc) * 2, size_t(k_loc) * 2,
                                        size_t(n), cudaMemcpyDeviceToDevice, s));
    }
    WEFT_CHECK(reference_gemm_tn(m, n, k, a_full, k, b_full, k, c_ref, n, s));
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
  std::unique_ptr<Context> ctx;
  WEFT_CHECK(Context::create(boot, heap_bytes, &ctx));
  Status st = Status::kUnsupported;
  if (plan.op == Op::kAgGemm) st = run_ag_gemm(*ctx, plan, run, out);
  if (plan.op == Op::kGemmRs || plan.op == Op::kGemmAr) st = run_gemm_reduce(*ctx, plan, run, out);
  if (st == Status::kOk) WEFT_CHECK(boot.barrier("weft.run.done"));  // nobody frees a heap a peer still reads
  return st;
}

}  // namespace weft::runtime
