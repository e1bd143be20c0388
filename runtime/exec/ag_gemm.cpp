// AllGather+GEMM op: heap layout from the allocator, tokens between ranks, copy-engine and SM-mover runs.
#include "runtime/exec/ag_gemm.h"

#include <cstring>
#include <memory>
#include <string>

#include "base/log.h"
#include "base/params.h"
#include "kernels/ag_gemm_fused.h"
#include "kernels/gemm.h"
#include "runtime/call_clock.h"
#include "runtime/exec/cuda_check.h"
#include "runtime/exec/gemm_options.h"
#include "runtime/exec/stream_ops.h"
#include "transport/heap.h"

namespace weft::runtime {
namespace {

using bf16 = __nv_bfloat16;
constexpr int64_t kRows = kernels::GemmConfig::kTileM, kCols = kernels::GemmConfig::kTileN;

Status refuse(int rank, const std::string& what) {
  WEFT_WARN(kKernel, "rank %d: ag_gemm: %s", rank, what.c_str());
  return Status::kInvalidArgument;
}

}  // namespace

Status AgGemmOp::create(Context& ctx, const Plan& plan, std::unique_ptr<AgGemmOp>* out) {
  const int rank = ctx.rank();
  WEFT_CHECK(ctx.check_usable("ag_gemm create"));
  if (plan.op != Op::kAgGemm) return refuse(rank, std::string("the plan is for ") + to_string(plan.op));
  if (!plan.exec.executable) return refuse(rank, "the plan cannot run: " + plan.exec.not_executable);
  if (plan.nodes > 1) {
    std::unique_ptr<AgGemmOp> op(new AgGemmOp());
    op->plan_ = plan;
    WEFT_CHECK(AgGemmNodesOp::create(ctx, plan, &op->nodes_));
    *out = std::move(op);
    return Status::kOk;
  }
  if (plan.world_size != ctx.size() || plan.nodes != 1)
    return refuse(rank, "the plan is for " + std::to_string(plan.nodes) + " x " + std::to_string(plan.gpus_per_node) +
                            " ranks, the job has " + std::to_string(ctx.size()) + " (one node)");
  if (plan.roles.total() > ctx.sm_count() || plan.roles.compute < 1)
    return refuse(rank, "the plan's roles use " + std::to_string(plan.roles.total()) + " SMs (" +
                            std::to_string(plan.roles.compute) + " compute), this GPU has " +
                            std::to_string(ctx.sm_count()));
  const bool sm = plan.exec.variant == "sm_movers";
  if (!sm && plan.exec.variant != "copy_engine") return refuse(rank, "unknown variant '" + plan.exec.variant + "'");
  kernels::AgMover mover;
  if (sm && !kernels::parse_ag_mover(plan.exec.sm_mover.c_str(), &mover))
    return refuse(rank, "unknown SM mover '" + plan.exec.sm_mover + "'");
  if (sm && (plan.roles.intra_comm < 1 || ctx.size() > kernels::AgMoveParams::kMaxRanks))
    return refuse(rank, "SM movers need intra_comm >= 1 and at most 8 ranks");
  const bool pairs = plan.exec.cluster == 2 && !sm && plan.roles.compute % 2 == 0 && plan.roles.total() % 2 == 0 &&
                     (plan.gemm.m / ctx.size()) % (2 * kernels::GemmConfig::kTileM) == 0;
  if ((plan.exec.cluster != 1 && !pairs) || plan.exec.copy_chunks != 1)
    return refuse(rank,
                  "this build runs 1-CTA clusters, or 2-CTA ones for the copy engines' GEMM on an even number "
                  "of compute SMs and of SMs in all with 256-row shards, with one copy per shard (the plan asks "
                  "for cluster " +
                      std::to_string(plan.exec.cluster) + ", " + std::to_string(plan.exec.copy_chunks) + " copies)");

  if (!sm && ctx.shares_gpu() && plan.roles.compute >= ctx.sm_count())
    return refuse(rank,
                  "ranks share this GPU, so the copies between them run on it and may need SMs; a plan with "
                  "every SM computing would wait for them forever (plan with --oversubscribe, which leaves "
                  "SMs for them)");
  std::unique_ptr<AgGemmOp> op(new AgGemmOp());
  op->ctx_ = &ctx;
  op->plan_ = plan;
  op->rank_ = rank;
  op->world_ = ctx.size();
  op->m_ = plan.gemm.m;
  op->n_ = plan.gemm.n / op->world_;
  op->k_ = plan.gemm.k;
  if (op->m_ % (op->world_ * kRows) != 0 || op->k_ % 8 != 0 || op->n_ < 1)
    return refuse(rank, "m / ranks must be a multiple of 128 rows and k of 8");

  // The layout, from the allocator (the plan's own copy is checked against it by executed_plan()).
  transport::HeapAllocator alloc(UINT64_MAX / 2);
  auto region = [&](const char* name, uint64_t bytes) -> Status {
    uint64_t off = 0;
    WEFT_CHECK(alloc.allocate(bytes, 256, name, &off));
    op->regions_.push_back({name, off, bytes});
    return Status::kOk;
  };
  const int64_t W = op->world_;
  WEFT_CHECK(region("ag_gemm.a", uint64_t(op->m_ * op->k_) * sizeof(bf16)));
  if (!sm)
    WEFT_CHECK(region("ag_gemm.gate", uint64_t(W) * 8));
  else
    WEFT_CHECK(region("ag_gemm.flags", uint64_t((op->m_ / kRows) * ((op->n_ + kCols - 1) / kCols) + W) * 8));
  if (sm) WEFT_CHECK(region("ag_gemm.ready", uint64_t(W) * 8));
  WEFT_CHECK(region("ag_gemm.consumed", uint64_t(W) * 8));
  op->arena_bytes_ = (alloc.used() + 4095) / 4096 * 4096;
  WEFT_CHECK(ctx.reserve(op->arena_bytes_, "ag_gemm", &op->arena_));
  for (int r = 0; r < W; ++r) {
    op->a_.push_back(static_cast<bf16*>(op->resolve("ag_gemm.a", r)));
    op->gate_.push_back(static_cast<uint64_t*>(op->resolve("ag_gemm.gate", r)));
    op->flags_.push_back(static_cast<uint64_t*>(op->resolve("ag_gemm.flags", r)));
    op->ready_.push_back(static_cast<uint64_t*>(op->resolve("ag_gemm.ready", r)));
    op->consumed_.push_back(static_cast<uint64_t*>(op->resolve("ag_gemm.consumed", r)));
  }

  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&op->copy_, cudaStreamNonBlocking));
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&op->side_, cudaStreamNonBlocking));
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&op->clock_, cudaStreamNonBlocking));
  WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&op->fork_, cudaEventDisableTiming));
  WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&op->join_, cudaEventDisableTiming));
  WEFT_CHECK(op->record_.create());
  WEFT_CHECK(op->frame_.create(rank));
  WEFT_CHECK(op->frame_.params(plan.roles, &op->frame_params_));
  op->frame_params_.launch = op->record_.device();

  // Fresh words (the arena may have held another op's), the own shard's gates always open; then
  // nobody may write into a peer before every rank has cleared its words.
  WEFT_CUDA_CHECK(cudaMemset(ctx.local(op->arena_), 0, op->arena_bytes_));
  // consumed[q] = 1: no peer holds an earlier shard of this rank, so the first call need not wait.
  const std::vector<uint64_t> ones(size_t(W), 1);
  WEFT_CUDA_CHECK(cudaMemcpy(op->consumed_[size_t(rank)], ones.data(), size_t(W) * 8, cudaMemcpyHostToDevice));
  if (!sm) {
    WEFT_CUDA_CHECK(cudaMemset(op->gate_[size_t(rank)] + rank, 0xFF, 8));
  } else {
    const int64_t own_blocks = op->m_ / W / kRows, cols = (op->n_ + kCols - 1) / kCols;
    WEFT_CUDA_CHECK(
        cudaMemset(op->flags_[size_t(rank)] + rank * own_blocks * cols, 0xFF, size_t(own_blocks * cols) * 8));
  }
  WEFT_CUDA_CHECK(cudaDeviceSynchronize());
  WEFT_CHECK(ctx.boot().barrier("weft.ag_gemm.create." + std::to_string(op->arena_)));
  AgGemmOp* raw = op.get();
  WEFT_CUDA_CHECK(cudaHostAlloc(&op->progress_host_, 2 * sizeof(uint64_t), cudaHostAllocMapped));
  op->progress_host_[0] = op->progress_host_[1] = 0;
  WEFT_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&op->progress_dev_), op->progress_host_, 0));
  auto clock = std::make_shared<CallClock>(param_double_or_default("WEFT_DEVICE_TIMEOUT"));
  op->watch_ = ctx.watch(
      [raw, clock](std::string* why) {
        // Host-mapped: the device writes it while the op runs.
        if (*reinterpret_cast<const volatile int32_t*>(&raw->frame_.record().status) == 0)
          return raw->watch_stalled(clock.get(), why);
        raw->frame_.check("ag_gemm");  // logs rank, role, block, tile and the awaited flag
        *why = "ag_gemm: a device wait timed out on rank " + std::to_string(raw->rank_);
        return true;
      },
      [raw] { raw->unstick(); });
  *out = std::move(op);
  return Status::kOk;
}

AgGemmOp::~AgGemmOp() {
  // The last call's work, bounded: its stream waits are released past WEFT_DEVICE_TIMEOUT (a peer
  // that never came), while the watchdog still knows this op.
  if (join_)
    event_wait_bounded(join_, param_double_or_default("WEFT_DEVICE_TIMEOUT") + 1, "ag_gemm's last call",
                       [this] { unstick(); });
  if (ctx_ && watch_ >= 0) ctx_->unwatch(watch_);
  if (copy_) {
    sync_bounded(copy_, 10, "ag_gemm's copy stream", [this] { unstick(); });
    cudaStreamDestroy(copy_);
  }
  const bool clock_done = retire_clock_stream(clock_, "ag_gemm's clock stream");  // before its word goes
  if (side_) cudaStreamDestroy(side_);
  if (fork_) cudaEventDestroy(fork_);
  if (join_) cudaEventDestroy(join_);
  if (progress_host_ && clock_done) cudaFreeHost(progress_host_);
  if (ctx_ && arena_bytes_) ctx_->release(arena_);
}

// The call's clock (watch_stalled): started as the call starts (copy engines: from a stream of its
// own that waits only for the call's start, beside the GEMM's launch and the pushes) or, SM movers, right before the
// kernel's launch once the stream's waits for the peers' words are behind it (a late peer is the
// kernel's device waits' to time out), and finished before the call's end is recorded (the destructor waits for that
// record, and for the clock stream, so both writes are done before the words are freed). Not during a capture.
Status AgGemmOp::clock_write(cudaStream_t s, bool finished) {
  if (!clocked_) return Status::kOk;
  if (!finished) ++calls_;
  return stream_write_u64(s, progress_dev_ + (finished ? 1 : 0), calls_);
}

bool AgGemmOp::watch_stalled(CallClock* clock, std::string* why) const {
  const auto* p = reinterpret_cast<const volatile uint64_t*>(progress_host_);
  if (!p || !clock->stalled(p[0], p[1], CallClock::Clock::now())) return false;
  *why = "ag_gemm: rank " + std::to_string(rank_) + "'s call " + std::to_string(clock->call()) + " has not finished " +
         std::to_string(clock->timeout_s()) +
         " s after it started (WEFT_DEVICE_TIMEOUT), with no device wait timed out: the kernel could not start "
         "(its blocks must be resident at once, and another kernel on this GPU may hold the SMs they need), or a "
         "peer never said it was done with this rank's last shard (its consumed token), or its shard never came";
  return true;
}

void* AgGemmOp::resolve(const std::string& name, int rank) const {
  for (const auto& r : regions_)
    if (r.name == name) return rank == rank_ ? ctx_->local(arena_ + r.offset) : ctx_->peer(rank, arena_ + r.offset);
  return nullptr;
}

bf16* AgGemmOp::shard() const {
  return nodes_ ? nodes_->shard() : a_[size_t(rank_)] + int64_t(rank_) * (m_ / world_) * k_;
}

const bf16* AgGemmOp::gathered() const { return nodes_ ? nodes_->position(0) : a_[size_t(rank_)]; }

int AgGemmOp::shard_at(int position) const { return nodes_ ? nodes_->shard_at(position) : position; }

Status AgGemmOp::make_gemm(const bf16* b) {
  if (b == b_) return Status::kOk;
  kernels::GemmArgs args;
  args.m = m_;
  args.n = n_;
  args.k = k_;
  args.a = gathered();
  args.lda = k_;
  args.b = b;
  args.ldb = k_;
  args.num_shards = world_;
  args.first_shard = rank_;
  args.cluster_m = plan_.exec.cluster;
  args.group_m = plan_.exec.group_m;
  WEFT_CHECK(kernels::make_gemm_params(args, &gemm_));
  b_ = b;
  return Status::kOk;
}

Status AgGemmOp::run(const bf16* a, const bf16* b, bf16* c, cudaStream_t s) {
  if (nodes_) return nodes_->run(a, b, c, s);
  WEFT_CHECK(ctx_->check_usable("ag_gemm run"));
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  WEFT_CUDA_CHECK(cudaStreamIsCapturing(s, &capture));
  if (capture != cudaStreamCaptureStatusNone && !plan_.exec.capturable) {
    WEFT_WARN(kKernel, "rank %d: ag_gemm: this plan's variant (%s) is not capturable in a CUDA graph", rank_,
              plan_.exec.variant.c_str());
    return Status::kUnsupported;
  }
  if (!a || !b || !c) return refuse(rank_, "run() needs a, b and c");
  WEFT_CHECK(make_gemm(b));
  clocked_ = capture == cudaStreamCaptureStatusNone;  // a graph would replay constant numbers
  ++epoch_;  // the SM movers' per-tile flags count launches; every other word is a token (set, then reset)
  const size_t shard_bytes = size_t(m_ / world_ * k_) * sizeof(bf16);
  Status st = Status::kOk;
  if (plan_.exec.variant == "sm_movers") {
    // The movers pull my shard from my heap: every peer has taken my previous one before it is
    // overwritten (consumed[q] is 1), and the token goes back to 0 before anyone can see this call's
    // ready (peers set it again only after that). The copy engines push from this rank's own stream
    // instead, which has finished the previous call's pushes.
    std::vector<StreamMemOp> ops;
    for (int q = 0; q < world_; ++q)
      if (q != rank_) ops.push_back({StreamMemOp::kWaitGeq, consumed_[size_t(rank_)] + q, 1});
    for (int q = 0; q < world_; ++q)
      if (q != rank_) ops.push_back({StreamMemOp::kWrite, consumed_[size_t(rank_)] + q, 0});
    st = stream_mem_ops(s, ops);
  }
  if (st == Status::kOk && a != shard())
    st = cudaMemcpyAsync(shard(), a, shard_bytes, cudaMemcpyDeviceToDevice, s) == cudaSuccess ? Status::kOk
                                                                                              : Status::kCudaError;
  if (st == Status::kOk) st = plan_.exec.variant == "sm_movers" ? run_sm_movers(b, c, s) : run_copy_engines(b, c, s);
  if (st != Status::kOk) ctx_->poison("ag_gemm run failed on rank " + std::to_string(rank_) + ": " + to_string(st));
  return st;
}

// This rank's shard is in place (S got here): every peer may pull it from now (SM movers).
Status AgGemmOp::announce_shard(cudaStream_t s) {
  std::vector<StreamMemOp> ops;
  for (int q = 0; q < world_; ++q)
    if (q != rank_) ops.push_back({StreamMemOp::kWrite, ready_[size_t(q)] + rank_, 1});
  return stream_mem_ops(s, ops);
}

// The copy engines push this rank's shard into every peer's gathered A, in the order the peers' GEMMs
// need it (r-1 takes it right after its own shard), each once that peer's GEMM of the previous call
// is done with those rows. No wait depends on a peer's current call, so the pushes start with the
// call. Every value a stream writes or waits for is a constant (the tokens 0 and 1), so a captured
// call replays correctly: the plan marks this variant capturable.
Status AgGemmOp::run_copy_engines(const bf16*, bf16* c, cudaStream_t s) {
  WEFT_CUDA_CHECK(cudaEventRecord(fork_, s));
  // The GEMM first: its launch reaches the GPU before the host has enqueued the pushes, and should
  // two streams share a hardware queue it does not sit behind a wait of the copy stream's.
  const kernels::FlagGate gate{gate_[size_t(rank_)], kernels::kFlagPerShard, 1};
  WEFT_CHECK(kernels::launch_gemm(gemm_, frame_params_, kernels::EpiStoreBf16{c, n_, n_ % 2 == 0}, gate,
                                  kernels::TileSignal{}, s, gemm_options(plan_.exec.gemm)));
  const Status st = push_and_join(s);
  // A failure past the launch still marks its end, so the destructor's bounded wait covers that GEMM.
  if (st != Status::kOk) cudaEventRecord(join_, s);
  return st;
}

// The pushes, each peer's gate write going out with the next peer's waits (one driver call fewer per
// peer; keeping them apart made no difference to back-to-back calls, results of 2026-11-27, call S).
// Then S, behind the GEMM: gates closed, the peers told they may push again, the copy stream joined.
Status AgGemmOp::push_and_join(cudaStream_t s) {
  const int64_t shard_elems = m_ / world_ * k_;
  WEFT_CUDA_CHECK(cudaStreamWaitEvent(copy_, fork_));
  // The start mark from a stream of its own: its fenced write would hold the first push back.
  if (clocked_) WEFT_CUDA_CHECK(cudaStreamWaitEvent(clock_, fork_));
  WEFT_CHECK(clock_write(clock_, false));
  std::vector<StreamMemOp> ops;
  for (int i = 1; i < world_; ++i) {
    const int q = (rank_ - i + world_) % world_;
    ops.push_back({StreamMemOp::kWaitGeq, consumed_[size_t(rank_)] + q, 1});
    ops.push_back({StreamMemOp::kWrite, consumed_[size_t(rank_)] + q, 0});
    WEFT_CHECK(stream_mem_ops(copy_, ops));
    ops.clear();
    WEFT_CUDA_CHECK(cudaMemcpyAsync(a_[size_t(q)] + rank_ * shard_elems, shard(), size_t(shard_elems) * sizeof(bf16),
                                    cudaMemcpyDeviceToDevice, copy_));
    ops.push_back({StreamMemOp::kWrite, gate_[size_t(q)] + rank_, 1});
  }
  WEFT_CHECK(stream_mem_ops(copy_, ops));
  std::vector<StreamMemOp> after;
  for (int q = 0; q < world_; ++q)
    if (q != rank_) after.push_back({StreamMemOp::kWrite, gate_[size_t(rank_)] + q, 0});
  for (int q = 0; q < world_; ++q)
    if (q != rank_) after.push_back({StreamMemOp::kWrite, consumed_[size_t(q)] + rank_, 1});
  WEFT_CHECK(stream_mem_ops(s, after));
  WEFT_CUDA_CHECK(cudaEventRecord(join_, copy_));  // this rank's shard has left: the caller may overwrite it
  WEFT_CUDA_CHECK(cudaStreamWaitEvent(s, join_));
  WEFT_CHECK(clock_write(s, true));
  return record_done(join_, s);
}

Status AgGemmOp::run_sm_movers(const bf16*, bf16* c, cudaStream_t s) {
  const uint64_t e = epoch_;
  WEFT_CHECK(announce_shard(s));
  // The movers read (or write) the peers' buffers from the start: every shard is in place first.
  std::vector<StreamMemOp> ops;
  for (int q = 0; q < world_; ++q)
    if (q != rank_) ops.push_back({StreamMemOp::kWaitGeq, ready_[size_t(rank_)] + q, 1});
  for (int q = 0; q < world_; ++q)
    if (q != rank_) ops.push_back({StreamMemOp::kWrite, ready_[size_t(rank_)] + q, 0});
  WEFT_CHECK(stream_mem_ops(s, ops));
  kernels::GemmParams g = gemm_;
  const kernels::EpiStoreBf16 epi{c, n_, n_ % 2 == 0};
  if (plan_.exec.gemm.tma_store) WEFT_CHECK(kernels::enable_tma_store(epi, &g));
  kernels::AgMoveParams mv;
  for (int r = 0; r < world_; ++r) {
    mv.a[r] = a_[size_t(r)];
    mv.flags[r] = flags_[size_t(r)];
  }
  mv.rank = rank_;
  mv.world = world_;
  mv.shard_rows = int32_t(m_ / world_);
  mv.k = int32_t(k_);
  mv.m_blocks = int32_t(m_ / kRows);
  mv.flag_cols = g.n_blocks;
  mv.epoch = e;
  kernels::parse_ag_mover(plan_.exec.sm_mover.c_str(), &mv.mover);
  const kernels::FlagGate gate{flags_[size_t(rank_)], kernels::kFlagPerTile, e * uint64_t(plan_.roles.intra_comm)};
  WEFT_CHECK(clock_write(s, false));
  WEFT_CHECK(kernels::launch_ag_gemm_fused(g, frame_params_, epi, gate, mv, s, gemm_options(plan_.exec.gemm)));
  ops.clear();
  for (int q = 0; q < world_; ++q)
    if (q != rank_) ops.push_back({StreamMemOp::kWrite, consumed_[size_t(q)] + rank_, 1});
  WEFT_CHECK(stream_mem_ops(s, ops));
  WEFT_CHECK(clock_write(s, true));
  WEFT_CHECK(record_done(join_, s));
  return Status::kOk;
}

void AgGemmOp::unstick() {
  if (nodes_) return nodes_->unstick();
  // Every word this op's streams wait on, raised past any epoch, from a stream of its own.
  for (const char* name : {"ag_gemm.ready", "ag_gemm.consumed", "ag_gemm.gate", "ag_gemm.flags"})
    for (const auto& r : regions_)
      if (r.name == name) cudaMemsetAsync(ctx_->local(arena_ + r.offset), 0x7F, r.bytes, side_);
}

Status AgGemmOp::clear_launch_record() { return nodes_ ? nodes_->clear_launch_record() : record_.clear(); }

Status AgGemmOp::executed_plan(Plan* out) const {
  if (nodes_) return nodes_->executed_plan(out);
  return record_.executed(
      plan_, regions_, arena_bytes_, rank_, "ag_gemm",
      [](int32_t kernel) -> std::string {
        return kernel == int32_t(kernels::KernelKind::kAgGemmFused) ? "sm_movers"
               : kernel == int32_t(kernels::KernelKind::kGemm)      ? "copy_engine"
                                                                    : "unknown";
      },
      out);
}

}  // namespace weft::runtime
