// GemmReduceOp: heap layout from the allocator, the GEMM into the heap, the peer reduction kernel.
#include "runtime/exec/gemm_reduce.h"

#include <memory>

#include "base/log.h"
#include "base/params.h"
#include "kernels/gemm.h"
#include "kernels/reduce_slots.h"
#include "runtime/call_clock.h"
#include "runtime/exec/cuda_check.h"
#include "runtime/exec/gemm_options.h"
#include "runtime/exec/stream_ops.h"
#include "transport/heap.h"

namespace weft::runtime {
namespace {

using bf16 = __nv_bfloat16;

Status refuse(int rank, const std::string& what) {
  WEFT_WARN(kKernel, "rank %d: gemm_reduce: %s", rank, what.c_str());
  return Status::kInvalidArgument;
}

}  // namespace

Status GemmReduceOp::create(Context& ctx, const Plan& plan, std::unique_ptr<GemmReduceOp>* out) {
  const int rank = ctx.rank(), W = ctx.size();
  WEFT_CHECK(ctx.check_usable("gemm_reduce create"));
  if (plan.op != Op::kGemmRs && plan.op != Op::kGemmAr)
    return refuse(rank, std::string("the plan is for ") + to_string(plan.op));
  if (!plan.exec.executable) return refuse(rank, "the plan cannot run: " + plan.exec.not_executable);
  if (plan.nodes > 1) {
    std::unique_ptr<GemmReduceOp> op(new GemmReduceOp());
    WEFT_CHECK(GemmReduceNodesOp::create(ctx, plan, &op->nodes_));
    op->all_reduce_ = op->nodes_->all_reduce();
    *out = std::move(op);
    return Status::kOk;
  }
  const bool overlap = plan.exec.variant == "overlap";
  if (!overlap && plan.exec.variant != "peer") return refuse(rank, "unknown variant '" + plan.exec.variant + "'");
  if (plan.world_size != W || plan.nodes != 1 || W > kernels::SmallReducePlan::kMaxRanks)
    return refuse(rank, "the plan is for " + std::to_string(plan.world_size) + " ranks on " +
                            std::to_string(plan.nodes) + " node(s), the job has " + std::to_string(W));
  if (plan.roles.compute < 1 || plan.roles.total() > ctx.sm_count() || (!overlap && plan.exec.reduce_blocks < 1) ||
      (!overlap && plan.exec.reduce_blocks > ctx.sm_count()) ||
      (overlap && (plan.roles.inter_send != 0 || plan.roles.inter_reduce != 0)))
    return refuse(rank, "the plan's SM counts do not fit this GPU");
  std::unique_ptr<GemmReduceOp> op(new GemmReduceOp());
  op->ctx_ = &ctx;
  op->plan_ = plan;
  op->all_reduce_ = plan.op == Op::kGemmAr;
  op->rank_ = rank;
  op->world_ = W;
  op->m_ = plan.gemm.m;
  op->n_ = plan.gemm.n;
  op->k_loc_ = plan.gemm.k / W;
  op->m_loc_ = op->m_ / W;
  transport::HeapAllocator alloc(UINT64_MAX / 2);
  auto add = [&](const char* name, uint64_t bytes) -> Status {
    uint64_t off = 0;
    WEFT_CHECK(alloc.allocate(bytes, 256, name, &off));
    op->regions_.push_back({name, off, bytes});
    return Status::kOk;
  };
  const uint64_t mn_bytes = uint64_t(op->m_ * op->n_) * 2;
  if (overlap) {  // the plan's order (plan_exec.cpp, plan_gemm_reduce_overlap)
    const uint64_t flags = uint64_t(W) * uint64_t(plan.exec.pieces) * 8;
    WEFT_CHECK(add("gemm_reduce.partial", mn_bytes));
    WEFT_CHECK(add("gemm_reduce.staging", mn_bytes));
    if (op->all_reduce_) WEFT_CHECK(add("gemm_reduce.c", mn_bytes));
    for (const char* name :
         {"gemm_reduce.arrived", "gemm_reduce.landed", "gemm_reduce.moved", "gemm_reduce.tiles", "gemm_reduce.gate"})
      WEFT_CHECK(add(name, flags));
    for (const char* name : {"gemm_reduce.freed", "gemm_reduce.gathered", "gemm_reduce.bcast"})
      WEFT_CHECK(add(name, uint64_t(W) * 8));
  } else {                                                 // the plan's order (plan_exec.cpp, plan_gemm_reduce)
    WEFT_CHECK(add("gemm_reduce.partial", 2 * mn_bytes));  // two copies: the call's parity
    if (op->all_reduce_) WEFT_CHECK(add("gemm_reduce.c", mn_bytes));
    WEFT_CHECK(add("gemm_reduce.flags", uint64_t(kernels::SmallReducePlan::words(W)) * 8));
    const char* why = nullptr;
    if (!kernels::SmallReducePlan::make(
            op->all_reduce_ ? kernels::SmallReduceMode::kAllReduceTwoShot : kernels::SmallReduceMode::kReduceScatter, W,
            rank, op->m_loc_ * op->n_, plan.exec.reduce_blocks, &op->small_, &why))
      return refuse(rank, std::string("the peer reduction cannot run this shape: ") + why);
  }
  op->arena_bytes_ = (alloc.used() + 4095) / 4096 * 4096;
  WEFT_CHECK(ctx.reserve(op->arena_bytes_, "gemm_reduce", &op->arena_));
  for (int r = 0; r < W && !overlap; ++r) {
    op->partial_.push_back(static_cast<bf16*>(op->resolve("gemm_reduce.partial", r)));
    if (op->all_reduce_) op->full_.push_back(static_cast<bf16*>(op->resolve("gemm_reduce.c", r)));
    op->flags_.push_back(static_cast<uint64_t*>(op->resolve("gemm_reduce.flags", r)));
  }
  WEFT_CUDA_CHECK(cudaMemset(ctx.local(op->arena_), 0, op->arena_bytes_));
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&op->side_, cudaStreamNonBlocking));
  WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&op->done_, cudaEventDisableTiming));
  WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&op->started_, cudaEventDisableTiming));
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&op->clock_, cudaStreamNonBlocking));
  WEFT_CHECK(op->record_.create());
  if (!overlap) WEFT_CHECK(op->reduce_record_.create());
  WEFT_CHECK(op->frame_.create(rank));
  RoleCounts gemm_roles = plan.roles;
  if (overlap) gemm_roles = RoleCounts{plan.roles.compute, 0, 0, 0};  // the movers are a kernel of their own
  WEFT_CHECK(op->frame_.params(gemm_roles, &op->frame_params_));
  op->frame_params_.launch = op->record_.device();
  WEFT_CUDA_CHECK(cudaDeviceSynchronize());  // the arena's zeros before the overlap's gate words
  if (overlap) WEFT_CHECK(op->create_overlap());
  WEFT_CUDA_CHECK(cudaDeviceSynchronize());
  WEFT_CHECK(ctx.boot().barrier("weft.gemm_reduce.create." + std::to_string(op->arena_)));
  GemmReduceOp* raw = op.get();
  const double timeout = param_double_or_default("WEFT_DEVICE_TIMEOUT");
  // The overlap variant's stream waits on peers' words (freed, gathered, bcast, arrivals) are not
  // bounded on the device: a call that started on the device and has not finished within
  // WEFT_DEVICE_TIMEOUT counts as a timed-out wait too (watch_stalled; the watchdog thread only).
  auto clock = std::make_shared<CallClock>(timeout);
  op->watch_ = ctx.watch(
      [raw, clock](std::string* why) {
        if (*reinterpret_cast<const volatile int32_t*>(&raw->frame_.record().status) != 0) {
          raw->frame_.check("gemm_reduce");
          *why = "gemm_reduce: a device wait timed out on rank " + std::to_string(raw->rank_);
          return true;
        }
        return raw->overlap_ && raw->watch_stalled(clock.get(), why);
      },
      [raw] { raw->unstick(); });
  *out = std::move(op);
  return Status::kOk;
}

GemmReduceOp::~GemmReduceOp() {
  if (done_) {
    event_wait_bounded(done_, param_double_or_default("WEFT_DEVICE_TIMEOUT") + 1, "gemm_reduce's last call",
                       [this] { unstick(); });
    cudaEventDestroy(done_);
  }
  if (ctx_ && watch_ >= 0) ctx_->unwatch(watch_);
  const bool clock_done = retire_clock_stream(clock_, "gemm_reduce's clock stream");  // before its word goes
  overlap_.reset();  // its streams are done (done_ above) before the words they wait on go
  if (progress_host_ && clock_done) cudaFreeHost(progress_host_);
  if (side_) cudaStreamDestroy(side_);
  if (started_) cudaEventDestroy(started_);
  if (ctx_ && arena_bytes_) ctx_->release(arena_);
}

bool GemmReduceOp::watch_stalled(CallClock* clock, std::string* why) const {
  if (!clock->stalled(progress_[0], progress_[1], CallClock::Clock::now())) return false;
  *why = "gemm_reduce (overlap): rank " + std::to_string(rank_) + "'s call " + std::to_string(clock->call()) +
         " has not finished " + std::to_string(clock->timeout_s()) +
         " s after it started (WEFT_DEVICE_TIMEOUT): a stream waits for a peer's word (freed, arrived or landed, "
         "gathered or bcast) that the peer never wrote";
  return true;
}

Status GemmReduceOp::create_overlap() {
  const int W = world_;
  auto view = [&](const char* name) {
    SymView v;
    for (int r = 0; r < W; ++r) v.peers.push_back(resolve(name, r));
    v.local = v.peers[size_t(rank_)];
    return v;
  };
  OverlapBuffers b;
  b.partial = view("gemm_reduce.partial");
  b.staging = view("gemm_reduce.staging");
  if (all_reduce_) {
    b.c_full = view("gemm_reduce.c");
    for (int r = 0; r < W; ++r) full_.push_back(static_cast<bf16*>(b.c_full.peers[size_t(r)]));
  }
  b.arrived = view("gemm_reduce.arrived");
  b.landed = view("gemm_reduce.landed");
  b.moved = view("gemm_reduce.moved");
  b.freed = view("gemm_reduce.freed");
  b.gathered = view("gemm_reduce.gathered");
  b.bcast = view("gemm_reduce.bcast");
  b.tiles = static_cast<uint64_t*>(resolve("gemm_reduce.tiles", rank_));
  b.gate = static_cast<uint64_t*>(resolve("gemm_reduce.gate", rank_));
  OverlapConfig c;
  c.all_reduce = all_reduce_;
  c.rank = rank_;
  c.world = W;
  c.m = m_;
  c.n = n_;
  c.k_loc = k_loc_;
  c.pieces = plan_.exec.pieces;
  c.lag = plan_.exec.lag;
  c.sm_send = plan_.exec.send == "sm";
  c.sm_gather = plan_.exec.gather == "sm";
  c.movers = plan_.roles.intra_comm;
  c.cluster = plan_.exec.cluster;
  c.group_m = plan_.exec.group_m;
  c.gemm = gemm_options(plan_.exec.gemm);
  if ((plan_.exec.send != "copy" && plan_.exec.send != "sm") ||
      (all_reduce_ ? plan_.exec.gather != "push" && plan_.exec.gather != "sm" : !plan_.exec.gather.empty()))
    return refuse(rank_, "the overlap plan's send '" + plan_.exec.send + "' or gather '" + plan_.exec.gather +
                             "' is not one this build runs (send: copy or sm; gather, AllReduce only: push or sm)");
  kernels::FrameParams movers = frame_params_;
  movers.roles = RoleCounts{0, c.movers, 0, 0};
  movers.launch = nullptr;
  if (c.movers > 0) {
    WEFT_CHECK(mover_record_.create());
    movers.launch = mover_record_.device();
  }
  WEFT_CUDA_CHECK(cudaHostAlloc(&progress_host_, 2 * sizeof(uint64_t), cudaHostAllocMapped));
  progress_host_[0] = progress_host_[1] = 0;
  progress_ = progress_host_;
  WEFT_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&progress_dev_), progress_host_, 0));
  overlap_.reset(new ReduceOverlap());
  return overlap_->create(c, b, frame_params_, movers, side_);
}

void* GemmReduceOp::resolve(const std::string& name, int rank) const {
  for (const auto& r : regions_)
    if (r.name == name) return rank == rank_ ? ctx_->local(arena_ + r.offset) : ctx_->peer(rank, arena_ + r.offset);
  return nullptr;
}

Status GemmReduceOp::run(const bf16* a, const bf16* b, bf16* c, cudaStream_t s) {
  if (nodes_) return nodes_->run(a, b, c, s);
  WEFT_CHECK(ctx_->check_usable("gemm_reduce run"));
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  WEFT_CUDA_CHECK(cudaStreamIsCapturing(s, &capture));
  if (capture != cudaStreamCaptureStatusNone) {
    WEFT_WARN(kKernel, "rank %d: gemm_reduce: this plan's variant (%s) is not capturable in a CUDA graph", rank_,
              plan_.exec.variant.c_str());
    return Status::kUnsupported;
  }
  if (!a || !b || !c) return refuse(rank_, "run() needs a, b and c");
  // One call at a time: a call on another stream than the last starts after it (the partials, the
  // slots and the heap's C are reused).
  WEFT_CUDA_CHECK(cudaStreamWaitEvent(s, done_));
  if (overlap_) {
    const uint64_t call = ++overlap_calls_;
    // Started on the device (watch_stalled): written beside s by a stream of its own (not side_,
    // which must stay free for unstick), so no launch waits for the write's fence.
    Status st = cudaEventRecord(started_, s) == cudaSuccess && cudaStreamWaitEvent(clock_, started_) == cudaSuccess
                    ? stream_write_u64(clock_, progress_dev_, call)
                    : Status::kCudaError;
    if (st == Status::kOk) st = overlap_->enqueue(a, b, all_reduce_ ? nullptr : c, s);
    if (st == Status::kOk && all_reduce_ && c != heap_c())  // C was gathered in the heap, where the peers write it
      st = cudaMemcpyAsync(c, full_[size_t(rank_)], size_t(m_ * n_) * 2, cudaMemcpyDeviceToDevice, s) == cudaSuccess
               ? Status::kOk
               : Status::kCudaError;
    if (st == Status::kOk) st = stream_write_u64(s, progress_dev_ + 1, call);  // finished
    if (st == Status::kOk) st = record_done(done_, s);
    if (st != Status::kOk) {
      unstick();  // waits already enqueued on the side streams would otherwise never be satisfied
      ctx_->poison("gemm_reduce run failed on rank " + std::to_string(rank_));
    }
    return st;
  }
  if (a != a_ || b != b_) {
    kernels::GemmArgs args;
    args.m = m_;
    args.n = n_;
    args.k = k_loc_;
    args.a = a;
    args.lda = k_loc_;
    args.b = b;
    args.ldb = k_loc_;
    args.cluster_m = plan_.exec.cluster;
    args.group_m = plan_.exec.group_m;
    WEFT_CHECK(kernels::make_gemm_params(args, &gemm_));
    a_ = a, b_ = b;
  }
  const uint64_t e = ++epoch_;
  const int64_t copy = kernels::SmallReducePlan::parity(e) * m_ * n_;  // this call's copy of the partials
  Status st =
      kernels::launch_gemm(gemm_, frame_params_, kernels::EpiStoreBf16{partial_[size_t(rank_)] + copy, n_, n_ % 2 == 0},
                           kernels::FlagGate{}, kernels::TileSignal{}, s, gemm_options(plan_.exec.gemm));
  kernels::SmallReduceArgs args;
  args.plan = small_;
  args.epoch = e;
  bf16* full = all_reduce_ ? full_[size_t(rank_)] : nullptr;
  for (int q = 0; q < world_; ++q) {
    args.src[q] = partial_[size_t(q)] + copy;
    args.words_out[q] = flags_[size_t(q)];
    if (all_reduce_) args.push[q] = full_[size_t(q)] + small_.region;
  }
  args.words_in = flags_[size_t(rank_)];
  if (all_reduce_) {
    gathered_ = small_.gathered_after(gathered_);
    args.gathered = gathered_;
  }
  args.out = all_reduce_ ? full + small_.region : c;
  kernels::FrameParams rf = frame_params_;
  rf.launch = reduce_record_.device();  // its own: the GEMM's record keeps the plan's grid and roles
  if (st == Status::kOk) st = kernels::launch_small_reduce(args, rf, true, s);
  if (st == Status::kOk && all_reduce_ && c != full)
    st = cudaMemcpyAsync(c, full, size_t(m_ * n_) * 2, cudaMemcpyDeviceToDevice, s) == cudaSuccess ? Status::kOk
                                                                                                   : Status::kCudaError;
  if (st == Status::kOk) st = record_done(done_, s);
  if (st != Status::kOk) ctx_->poison("gemm_reduce run failed on rank " + std::to_string(rank_));
  return st;
}

void GemmReduceOp::unstick() {
  if (nodes_) return nodes_->unstick();
  if (overlap_) {  // the stream waits are not bounded on the device: raise every word they wait on
    overlap_->unstick(side_);
    return;
  }
  // The reduction kernel's waits are bounded on the device; raising this rank's own flag words (the
  // ready and gathered words its blocks wait on) lets them leave at once. Peers leave by their own
  // device timeout or their own unstick.
  for (const auto& r : regions_)
    if (r.name == "gemm_reduce.flags") cudaMemsetAsync(ctx_->local(arena_ + r.offset), 0x7F, r.bytes, side_);
}

Status GemmReduceOp::clear_launch_record() {
  if (nodes_) return nodes_->clear_launch_record();
  if (mover_record_.device()) WEFT_CHECK(mover_record_.clear());
  if (reduce_record_.device()) WEFT_CHECK(reduce_record_.clear());
  return record_.clear();
}

Status GemmReduceOp::executed_plan(Plan* out) const {
  if (nodes_) return nodes_->executed_plan(out);
  // The variant as launched: the GEMM with the reducing epilogue is the overlap variant; a GEMM that
  // stored plain partials followed by the peer reduction kernel (its own record) is the peer variant.
  WEFT_CHECK(record_.executed(
      plan_, regions_, arena_bytes_, rank_, "gemm_reduce",
      [](int32_t kernel) -> std::string {
        return kernel == int32_t(kernels::KernelKind::kGemmReduceSlots) ? "overlap"
               : kernel == int32_t(kernels::KernelKind::kGemm)          ? "gemm"
                                                                        : "unknown";
      },
      out));
  if (out->exec.variant == "gemm") {
    kernels::LaunchRecord rec{};
    if (reduce_record_.device()) WEFT_CHECK(reduce_record_.read(&rec));
    if (rec.launches < 1 || rec.kernel != int32_t(kernels::KernelKind::kPeerReduce)) {
      WEFT_WARN(kKernel, "rank %d: gemm_reduce: the GEMM stored plain partials but no peer reduction was recorded",
                rank_);
      return Status::kNotFound;
    }
    if (rec.grid < 1 || rec.grid > plan_.exec.reduce_blocks) {  // the plan's reduce_blocks is a maximum
      WEFT_WARN(kKernel, "rank %d: gemm_reduce: the peer reduction ran %d blocks, the plan allows 1 to %d", rank_,
                rec.grid, plan_.exec.reduce_blocks);
      return Status::kNotFound;
    }
    out->exec.variant = "peer";
  }
  if (out->exec.variant == "overlap") {  // pieces, lag, send and gather as the GEMM walked and stored them
    kernels::LaunchRecord gemm{};
    WEFT_CHECK(record_.read(&gemm));
    std::string why;
    if (!apply_reduce_schedule(gemm, out, &why)) {
      WEFT_WARN(kKernel, "rank %d: gemm_reduce: %s", rank_, why.c_str());
      return Status::kNotFound;
    }
  }
  if (!mover_record_.device()) return Status::kOk;
  kernels::LaunchRecord rec{};
  WEFT_CHECK(mover_record_.read(&rec));
  if (rec.launches < 1 || rec.kernel != int32_t(kernels::KernelKind::kPiecePush)) {
    WEFT_WARN(kKernel, "rank %d: gemm_reduce: the mover SMs' record shows no launch", rank_);
    return Status::kNotFound;
  }
  out->roles.intra_comm = rec.blocks[int(Role::kIntraComm)] / rec.launches;
  return Status::kOk;
}

}  // namespace weft::runtime
