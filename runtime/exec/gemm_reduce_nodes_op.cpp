// GEMM+RS / GEMM+AR across nodes as a runtime op: RsNodes on a context's arena and transport.
#include "runtime/exec/gemm_reduce_nodes_op.h"

#include <string>
#include <vector>

#include "base/log.h"
#include "base/params.h"
#include "runtime/exec/cuda_check.h"
#include "runtime/exec/stream_ops.h"
#include "transport/cuda_transport.h"

namespace weft::runtime {
namespace {

using bf16 = __nv_bfloat16;

Status refuse(int rank, const std::string& what) {
  WEFT_WARN(kKernel, "rank %d: gemm_reduce across nodes: %s", rank, what.c_str());
  return Status::kInvalidArgument;
}

}  // namespace

Status GemmReduceNodesOp::create(Context& ctx, const Plan& plan, std::unique_ptr<GemmReduceNodesOp>* out) {
  const int rank = ctx.rank(), W = ctx.size();
  WEFT_CHECK(ctx.check_usable("gemm_reduce create"));
  if ((plan.op != Op::kGemmRs && plan.op != Op::kGemmAr) || plan.exec.variant != "hierarchical")
    return refuse(rank, std::string("the plan is for ") + to_string(plan.op) + " (" + plan.exec.variant + ")");
  if (!plan.exec.executable) return refuse(rank, "the plan cannot run: " + plan.exec.not_executable);
  if (plan.world_size != W || ctx.boot().info().num_nodes != plan.nodes)
    return refuse(rank, "the plan is for " + std::to_string(plan.nodes) + " x " + std::to_string(plan.gpus_per_node) +
                            " ranks, the context has " + std::to_string(W) + " on " +
                            std::to_string(ctx.boot().info().num_nodes) + " nodes");
  if (plan.roles.compute < 1 || plan.roles.inter_send < 1 || plan.roles.total() > ctx.sm_count())
    return refuse(rank, "the plan's roles (" + std::to_string(plan.roles.compute) + " compute, " +
                            std::to_string(plan.roles.inter_send) + " inter_send) do not fit this GPU (" +
                            std::to_string(ctx.sm_count()) + " SMs)");
  std::unique_ptr<GemmReduceNodesOp> op(new GemmReduceNodesOp());
  op->ctx_ = &ctx;
  op->plan_ = plan;
  RsNodes& r = op->core_;
  r.all_reduce = plan.op == Op::kGemmAr;
  r.rank = rank;
  r.world = W;
  r.m = plan.gemm.m;
  r.n = plan.gemm.n;
  r.k_loc = plan.gemm.k / W;
  r.m_loc = r.m / W;
  if (r.m % (int64_t(W) * 128) != 0 || r.k_loc % 8 != 0 || plan.gemm.k % W != 0 || r.m >= (int64_t(1) << 31))
    return refuse(rank, "m / ranks must be whole 128-row tiles (m below 2^31) and k / ranks a multiple of 8");
  WEFT_CHECK(r.place(ctx.boot()));
  uint64_t end = 0;
  WEFT_CHECK(r.size(plan.exec.pieces, plan.exec.channels, 0, &end));  // the sizes, for the arena
  if (r.pieces != plan.exec.pieces) return refuse(rank, "the plan's pieces do not cut this rank's rows");
  op->arena_bytes_ = (end + 4095) / 4096 * 4096;
  WEFT_CHECK(ctx.reserve(op->arena_bytes_, "gemm_reduce across nodes", &op->arena_));
  WEFT_CHECK(r.size(plan.exec.pieces, plan.exec.channels, op->arena_, &end));

  transport::Transport* tp = nullptr;
  WEFT_CHECK(ctx.transport(plan.exec.channels, plan.inter_backend, plan.exec.signal_mode, &tp));
  std::vector<transport::DeviceFifo> rings;
  for (int ch = 0; ch < plan.exec.channels; ++ch) rings.push_back(ctx.fifo(ch));
  std::vector<char*> peers;
  for (int q = 0; q < W; ++q) peers.push_back(static_cast<char*>(ctx.peer(q, 0)));
  r.attach(static_cast<char*>(ctx.local(0)), peers, tp, rings);
  WEFT_CHECK(op->record_.create());
  WEFT_CHECK(r.prepare(plan.roles, plan.exec.group_m, op->record_.device()));
  WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&op->done_, cudaEventDisableTiming));
  // Fresh words and zero slot regions (the arena may have held another op's); every rank's before
  // anyone writes into a peer.
  WEFT_CUDA_CHECK(cudaMemset(ctx.local(op->arena_), 0, op->arena_bytes_));
  WEFT_CUDA_CHECK(cudaDeviceSynchronize());
  WEFT_CHECK(ctx.boot().barrier("weft.gemm_reduce_nodes.create." + std::to_string(op->arena_)));
  GemmReduceNodesOp* raw = op.get();
  op->watch_ = ctx.watch(
      [raw](std::string* why) {
        // Host-mapped: the device writes it while the op runs.
        // Host-mapped words only: a CUDA call here could queue behind the very waits it is to release.
        if (*reinterpret_cast<const volatile int32_t*>(&raw->core_.frame.record().status) != 0) {
          raw->core_.frame.check("gemm_reduce_nodes");  // logs rank, role, block and the awaited flag
          *why = "gemm_reduce across nodes: a device wait timed out on rank " + std::to_string(raw->core_.rank);
          return true;
        }
        const int32_t push = *reinterpret_cast<const volatile int32_t*>(raw->core_.push_err_host);
        if (push != 0) {
          *why = "gemm_reduce across nodes: rank " + std::to_string(raw->core_.rank) + "'s FIFO push for rank " +
                 std::to_string(raw->core_.push_err_host[1]) + " failed (" + to_string(static_cast<Status>(push)) +
                 "): the proxy did not drain within WEFT_PROXY_TIMEOUT; " + raw->core_.tp->error_message();
          return true;
        }
        if (raw->core_.tp->status() != Status::kOk) {
          *why = "gemm_reduce across nodes: rank " + std::to_string(raw->core_.rank) +
                 "'s transport failed: " + raw->core_.tp->error_message();
          return true;
        }
        return false;
      },
      [raw] { raw->unstick(); });
  *out = std::move(op);
  return Status::kOk;
}

GemmReduceNodesOp::~GemmReduceNodesOp() {
  if (done_) {
    event_wait_bounded(done_, 2 * param_double_or_default("WEFT_DEVICE_TIMEOUT") + 1,
                       "gemm_reduce across nodes' last call", [this] { unstick(); });
    cudaEventDestroy(done_);
  }
  if (ctx_ && watch_ >= 0) ctx_->unwatch(watch_);
  if (ctx_ && arena_bytes_) ctx_->release(arena_);
}

Status GemmReduceNodesOp::run(const bf16* a, const bf16* b, bf16* c, cudaStream_t s) {
  WEFT_CHECK(ctx_->check_usable("gemm_reduce run"));
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  WEFT_CUDA_CHECK(cudaStreamIsCapturing(s, &capture));
  if (capture != cudaStreamCaptureStatusNone) {
    WEFT_WARN(kKernel, "rank %d: gemm_reduce across nodes: this plan's variant (%s) is not capturable in a CUDA graph",
              core_.rank, plan_.exec.variant.c_str());
    return Status::kUnsupported;
  }
  if (!a || !b || !c) return refuse(core_.rank, "run() needs a, b and c");
  // A call on another stream than the last starts after it (every reuse below assumes it).
  Status st = cudaStreamWaitEvent(s, done_) == cudaSuccess ? Status::kOk : Status::kCudaError;
  if (st == Status::kOk) st = core_.enqueue(a, b, s, true);
  bf16* result = core_.result();
  if (st == Status::kOk && c != result)
    st = cudaMemcpyAsync(c, result, size_t(core_.result_elems()) * sizeof(bf16), cudaMemcpyDeviceToDevice, s) ==
                 cudaSuccess
             ? Status::kOk
             : Status::kCudaError;
  if (st == Status::kOk) st = record_done(done_, s);
  if (st != Status::kOk)
    ctx_->poison("gemm_reduce across nodes: run failed on rank " + std::to_string(core_.rank) + ": " + to_string(st));
  return st;
}

Status GemmReduceNodesOp::executed_plan(Plan* out) const {
  // The regions as the op laid them out, offsets from its arena.
  std::vector<HeapRegion> regions = core_.regions;
  return record_.executed(
      plan_, regions, arena_bytes_, core_.rank, "gemm_reduce across nodes",
      [](int32_t kernel) -> std::string {
        return kernel == int32_t(kernels::KernelKind::kGemmReduceNodes) ? "hierarchical" : "unknown";
      },
      out);
}

}  // namespace weft::runtime
