// AllGather+GEMM across nodes: placement, heap layout, the context's transport, and one call's steps.
#include "runtime/exec/ag_gemm_nodes.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "base/log.h"
#include "base/params.h"
#include "bootstrap/placement.h"
#include "kernels/gemm.h"
#include "runtime/exec/cuda_check.h"
#include "runtime/exec/stream_ops.h"
#include "transport/cuda_transport.h"
#include "transport/heap.h"

namespace weft::runtime {
namespace {

using bf16 = __nv_bfloat16;
constexpr int64_t kRows = kernels::GemmConfig::kTileM;

Status refuse(int rank, const std::string& what) {
  WEFT_WARN(kKernel, "rank %d: ag_gemm across nodes: %s", rank, what.c_str());
  return Status::kInvalidArgument;
}

}  // namespace

Status AgGemmNodesOp::create(Context& ctx, const Plan& plan, std::unique_ptr<AgGemmNodesOp>* out) {
  const int rank = ctx.rank();
  WEFT_CHECK(ctx.check_usable("ag_gemm create"));
  if (plan.op != Op::kAgGemm || plan.exec.variant != "hierarchical")
    return refuse(rank, std::string("the plan is for ") + to_string(plan.op) + " (" + plan.exec.variant + ")");
  if (!plan.exec.executable) return refuse(rank, "the plan cannot run: " + plan.exec.not_executable);
  if (plan.world_size != ctx.size() || ctx.boot().info().num_nodes != plan.nodes)
    return refuse(rank, "the plan is for " + std::to_string(plan.nodes) + " x " + std::to_string(plan.gpus_per_node) +
                            " ranks, the context has " + std::to_string(ctx.size()) + " on " +
                            std::to_string(ctx.boot().info().num_nodes) + " nodes");
  if (plan.roles.total() > ctx.sm_count() || plan.roles.compute < 1)
    return refuse(rank, "the plan's roles use " + std::to_string(plan.roles.total()) + " SMs (" +
                            std::to_string(plan.roles.compute) + " compute), this GPU has " +
                            std::to_string(ctx.sm_count()));
  // A kernel loaded lazily (CUDA's default) at its first launch while a call is in flight waits for
  // the device to go idle, and the proxy's staging copies wait behind that load: a deadlock that the
  // device timeout ends (4 H100s: a program's check kernels, first launched behind the first call).
  // weftrun sets EAGER for its ranks; under srun or mpirun the user must.
  const char* loading = getenv("CUDA_MODULE_LOADING");
  if (rank == 0 && (!loading || strcmp(loading, "EAGER") != 0))
    WEFT_WARN(kKernel,
              "ag_gemm across nodes with CUDA_MODULE_LOADING=%s: a kernel of this program launched for the first "
              "time while a call is in flight can deadlock with the proxy (CUDA loads it lazily and waits for the "
              "device to go idle); set CUDA_MODULE_LOADING=EAGER, or launch each of your kernels once before the "
              "first call",
              loading ? loading : "(unset: lazy)");
  std::unique_ptr<AgGemmNodesOp> op(new AgGemmNodesOp());
  op->ctx_ = &ctx;
  op->plan_ = plan;
  op->rank_ = rank;
  op->world_ = ctx.size();
  op->chunks_ = plan.exec.copy_chunks;
  op->m_ = plan.gemm.m;
  op->n_ = plan.gemm.n / op->world_;
  op->k_ = plan.gemm.k;
  op->m_loc_ = op->m_ / op->world_;
  const int64_t W = op->world_;
  if (op->m_loc_ % kRows != 0 || op->k_ % 8 != 0 || op->n_ < 1 || op->chunks_ < 1 ||
      (op->m_loc_ / kRows) % op->chunks_ != 0)
    return refuse(rank,
                  "m / ranks must be whole 128-row tiles, split evenly into the plan's chunks, and k a "
                  "multiple of 8");
  std::vector<int> node_of, local_of;
  WEFT_CHECK(bootstrap::gather_node_placement(ctx.boot(), &node_of, &local_of));
  std::string why;
  if (!kernels::make_ag_nodes_plan(node_of, local_of, rank, &op->moves_, &why)) return refuse(rank, why);
  using Moves = kernels::AgNodesDeviceMoves;
  if (W > kernels::EpiScatterBf16::kMaxOwners || int(op->moves_.sends.size()) > Moves::kMaxSends ||
      int(op->moves_.forwards.size()) > Moves::kMaxForwards || op->moves_.per_node - 1 > Moves::kMaxTargets ||
      plan.exec.channels < 1 || plan.exec.channels > Moves::kMaxChannels)
    return refuse(rank,
                  "the layout or the plan's channels exceed this build's kernel (at most 32 ranks, 8 sends, "
                  "forwards, node-mates and channels)");
  if ((!op->moves_.sends.empty() && plan.roles.inter_send < 1) ||
      (!op->moves_.forwards.empty() && plan.roles.intra_comm < 1))
    return refuse(rank, "the plan's roles give no inter_send SM for the puts or no intra_comm SM for the forwards");
  for (const auto& p : op->moves_.pulls) op->mates_.push_back(p.mate);

  // The layout, from the allocator (executed_plan() reports it; the plan's copy must agree).
  transport::HeapAllocator alloc(UINT64_MAX / 2);
  auto region = [&](const char* name, uint64_t bytes) -> Status {
    uint64_t off = 0;
    WEFT_CHECK(alloc.allocate(bytes, 256, name, &off));
    op->regions_.push_back({name, off, bytes});
    return Status::kOk;
  };
  op->shard_bytes_ = uint64_t(op->m_loc_ * op->k_) * sizeof(bf16);
  WEFT_CHECK(region("ag_nodes.a", op->shard_bytes_ * uint64_t(W)));
  WEFT_CHECK(region("ag_nodes.flags", uint64_t(W * op->chunks_) * 8));
  WEFT_CHECK(region("ag_nodes.freed", uint64_t(2 * W) * 8));
  WEFT_CHECK(region("ag_nodes.ready", uint64_t(W) * 8));
  op->arena_bytes_ = (alloc.used() + 4095) / 4096 * 4096;
  WEFT_CHECK(ctx.reserve(op->arena_bytes_, "ag_gemm across nodes", &op->arena_));

  WEFT_CHECK(ctx.transport(plan.exec.channels, plan.inter_backend, plan.exec.signal_mode, &op->tp_));
  WEFT_CHECK(transport::preload_kernels(
      {kernels::ag_gemm_nodes_kernel_ptr(), kernels::ag_gemm_nodes_freed_kernel_ptr()}, "ag_gemm_nodes"));

  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&op->copy_, cudaStreamNonBlocking));
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&op->side_, cudaStreamNonBlocking));
  WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&op->fork_, cudaEventDisableTiming));
  WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&op->join_, cudaEventDisableTiming));
  WEFT_CUDA_CHECK(cudaHostAlloc(&op->push_error_, 2 * sizeof(int32_t), cudaHostAllocMapped));
  op->push_error_[0] = op->push_error_[1] = 0;
  int32_t* push_error_dev = nullptr;
  WEFT_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&push_error_dev), op->push_error_, 0));
  WEFT_CHECK(op->record_.create());
  WEFT_CHECK(op->frame_.create(rank));

  kernels::AgNodesKernelParams& kp = op->kp_;
  WEFT_CHECK(op->frame_.params(plan.roles, &kp.frame));
  kp.frame.launch = op->record_.device();
  kp.moves = kernels::ag_nodes_device_moves(op->moves_, op->chunks_, op->offset_of("ag_nodes.a"), op->shard_bytes_,
                                            op->offset_of("ag_nodes.flags"), op->offset_of("ag_nodes.freed"));
  for (int ch = 0; ch < plan.exec.channels; ++ch) kp.fifo[ch] = ctx.fifo(ch);
  kp.channels = plan.exec.channels;
  kp.heap = static_cast<char*>(ctx.local(0));
  kp.peers = reinterpret_cast<char* const*>(ctx.device_peers());
  kp.epi.rows_per_owner = op->m_loc_;
  kp.epi.ldc = op->n_;
  kp.epi.paired = op->n_ % 2 == 0;
  kp.gate.flags = op->word("ag_nodes.flags", rank, 0);
  kp.gate.granularity = kernels::kFlagPerShard;
  kp.compute = 1;
  kp.push_error = push_error_dev;
  kp.push_error_peer = push_error_dev + 1;

  // Fresh words (the arena may have held another op's): every peer has freed run 0. Nobody writes
  // into a peer before every rank has cleared its own.
  WEFT_CUDA_CHECK(cudaMemset(ctx.local(op->arena_), 0, op->arena_bytes_));
  WEFT_CUDA_CHECK(cudaDeviceSynchronize());
  WEFT_CHECK(ctx.boot().barrier("weft.ag_nodes.create." + std::to_string(op->arena_)));
  AgGemmNodesOp* raw = op.get();
  op->watch_ = ctx.watch(
      [raw](std::string* why) {
        // Host-mapped: the device writes them while the op runs.
        if (*reinterpret_cast<const volatile int32_t*>(&raw->frame_.record().status) != 0) {
          raw->frame_.check("ag_gemm_nodes");  // logs rank, role, block and the awaited flag
          *why = "ag_gemm across nodes: a device wait timed out on rank " + std::to_string(raw->rank_);
          return true;
        }
        const int32_t push = *reinterpret_cast<const volatile int32_t*>(raw->push_error_);
        if (push != 0) {
          *why = "ag_gemm across nodes: rank " + std::to_string(raw->rank_) + "'s FIFO push for rank " +
                 std::to_string(raw->push_error_[1]) + " failed (" + to_string(static_cast<Status>(push)) +
                 "): the proxy did not drain within WEFT_PROXY_TIMEOUT; " + raw->tp_->error_message();
          return true;
        }
        if (raw->tp_->status() != Status::kOk) {
          *why = "ag_gemm across nodes: rank " + std::to_string(raw->rank_) +
                 "'s transport failed: " + raw->tp_->error_message();
          return true;
        }
        return false;
      },
      [raw] { raw->unstick(); });
  *out = std::move(op);
  return Status::kOk;
}

AgGemmNodesOp::~AgGemmNodesOp() {
  // The last call's work, bounded: its stream waits are released past WEFT_DEVICE_TIMEOUT (a peer
  // that never came), while the watchdog still knows this op.
  if (join_)
    event_wait_bounded(join_, param_double_or_default("WEFT_DEVICE_TIMEOUT") + 1, "ag_gemm across nodes' last call",
                       [this] { unstick(); });
  await_last_freed();
  if (ctx_ && watch_ >= 0) ctx_->unwatch(watch_);
  if (copy_) cudaStreamSynchronize(copy_), cudaStreamDestroy(copy_);
  if (side_) cudaStreamSynchronize(side_), cudaStreamDestroy(side_);
  if (fork_) cudaEventDestroy(fork_);
  if (join_) cudaEventDestroy(join_);
  if (push_error_) cudaFreeHost(push_error_);
  if (ctx_ && arena_bytes_) ctx_->release(arena_);
}

void AgGemmNodesOp::await_last_freed() const {
  if (!ctx_ || epoch_ == 0 || ctx_->poisoned()) return;
  const auto end =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(param_double_or_default("WEFT_DEVICE_TIMEOUT"));
  std::vector<uint64_t> freed(size_t(2 * world_));
  for (;;) {
    if (cudaMemcpy(freed.data(), word("ag_nodes.freed", rank_, 0), freed.size() * 8, cudaMemcpyDeviceToHost) !=
        cudaSuccess)
      return;
    std::string missing;
    for (const auto& send : moves_.sends)
      if (freed[size_t(send.peer)] < epoch_)
        missing += " rail peer " + std::to_string(send.peer) + " (through its proxy; seen " +
                   std::to_string(freed[size_t(send.peer)]) + ")";
    for (int q : mates_)
      if (freed[size_t(world_ + q)] < epoch_)
        missing += " node-mate " + std::to_string(q) + " (seen " + std::to_string(freed[size_t(world_ + q)]) + ")";
    if (missing.empty()) return;
    if (std::chrono::steady_clock::now() > end) {
      WEFT_WARN(kKernel,
                "rank %d: ag_gemm across nodes, destroyed after %llu calls: still no freed word of the last call "
                "from%s within WEFT_DEVICE_TIMEOUT",
                rank_, static_cast<unsigned long long>(epoch_), missing.c_str());
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

uint64_t AgGemmNodesOp::offset_of(const char* name) const {
  for (const auto& r : regions_)
    if (r.name == name) return arena_ + r.offset;
  return 0;
}

uint64_t* AgGemmNodesOp::word(const char* region, int rank, int64_t index) const {
  void* base = rank == rank_ ? ctx_->local(offset_of(region)) : ctx_->peer(rank, offset_of(region));
  return base ? static_cast<uint64_t*>(base) + index : nullptr;
}

bf16* AgGemmNodesOp::position(int pos) const {
  return reinterpret_cast<bf16*>(static_cast<char*>(ctx_->local(offset_of("ag_nodes.a"))) +
                                 uint64_t(pos) * shard_bytes_);
}

Status AgGemmNodesOp::make_gemm(const bf16* b) {
  if (b == b_) return Status::kOk;
  // A is the heap's positions, one M-shard per (position, chunk), in this rank's order.
  kernels::GemmArgs args;
  args.m = m_;
  args.n = n_;
  args.k = k_;
  args.a = position(0);
  args.lda = k_;
  args.b = b;
  args.ldb = k_;
  args.num_shards = world_ * chunks_;
  args.first_shard = 0;
  args.cluster_m = plan_.exec.cluster;
  args.group_m = plan_.exec.group_m;
  WEFT_CHECK(kernels::make_gemm_params(args, &kp_.gemm));
  b_ = b;
  return Status::kOk;
}

Status AgGemmNodesOp::run(const bf16* a, const bf16* b, bf16* c, cudaStream_t s) {
  WEFT_CHECK(ctx_->check_usable("ag_gemm run"));
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  WEFT_CUDA_CHECK(cudaStreamIsCapturing(s, &capture));
  if (capture != cudaStreamCaptureStatusNone) {
    WEFT_WARN(kKernel, "rank %d: ag_gemm across nodes: this plan's variant (%s) is not capturable in a CUDA graph",
              rank_, plan_.exec.variant.c_str());
    return Status::kUnsupported;
  }
  if (!a || !b || !c) return refuse(rank_, "run() needs a, b and c");
  // A call on another stream than the last starts after it: its own kernel may still read position 0.
  Status st = cudaStreamWaitEvent(s, join_) == cudaSuccess ? Status::kOk : Status::kCudaError;
  if (st == Status::kOk) st = make_gemm(b);
  const uint64_t e = ++epoch_;
  // My position 0 is free once every node-mate (its pulls) and rail peer (my proxy's puts to it) is
  // done with the last call.
  std::vector<StreamMemOp> ops;
  for (int q : mates_) ops.push_back({StreamMemOp::kWaitGeq, word("ag_nodes.freed", rank_, world_ + q), e - 1});
  for (const auto& send : moves_.sends)
    ops.push_back({StreamMemOp::kWaitGeq, word("ag_nodes.freed", rank_, send.peer), e - 1});
  if (st == Status::kOk && !ops.empty()) st = stream_mem_ops(s, ops);
  if (st == Status::kOk && a != shard())
    st = cudaMemcpyAsync(shard(), a, shard_bytes_, cudaMemcpyDeviceToDevice, s) == cudaSuccess ? Status::kOk
                                                                                               : Status::kCudaError;
  ops.clear();
  for (int ch = 0; ch < chunks_; ++ch) ops.push_back({StreamMemOp::kWrite, word("ag_nodes.flags", rank_, ch), e});
  for (int q : mates_) ops.push_back({StreamMemOp::kWrite, word("ag_nodes.ready", q, rank_), e});
  if (st == Status::kOk) st = stream_mem_ops(s, ops);
  // The node-mates' shards, by the copy engines, each chunk behind its flag.
  if (st == Status::kOk)
    st = cudaEventRecord(fork_, s) == cudaSuccess && cudaStreamWaitEvent(copy_, fork_) == cudaSuccess
             ? Status::kOk
             : Status::kCudaError;
  const uint64_t chunk_bytes = shard_bytes_ / uint64_t(chunks_);
  for (size_t i = 0; st == Status::kOk && i < moves_.pulls.size(); ++i) {
    const kernels::AgNodesPull& p = moves_.pulls[i];
    st = stream_wait_u64_geq(copy_, word("ag_nodes.ready", rank_, p.mate), e);
    const char* src = static_cast<const char*>(ctx_->peer(p.mate, offset_of("ag_nodes.a")));  // its position 0
    char* dst = reinterpret_cast<char*>(position(p.dst_pos));
    for (int ch = 0; st == Status::kOk && ch < chunks_; ++ch) {
      st = cudaMemcpyAsync(dst + ch * chunk_bytes, src + ch * chunk_bytes, chunk_bytes, cudaMemcpyDeviceToDevice,
                           copy_) == cudaSuccess
               ? Status::kOk
               : Status::kCudaError;
      if (st == Status::kOk) st = stream_write_u64(copy_, word("ag_nodes.flags", rank_, p.dst_pos * chunks_ + ch), e);
    }
  }
  if (st == Status::kOk) {
    for (int pos = 0; pos < world_; ++pos) kp_.epi.dst[pos] = c + int64_t(moves_.order[size_t(pos)]) * m_loc_ * n_;
    kp_.epoch = e;
    kp_.gate.expected = e;
    st = kernels::launch_ag_gemm_nodes(kp_, s);
  }
  if (st == Status::kOk) st = kernels::launch_ag_gemm_nodes_freed(kp_, s);
  if (st == Status::kOk)
    st = cudaEventRecord(join_, copy_) == cudaSuccess && cudaStreamWaitEvent(s, join_) == cudaSuccess
             ? Status::kOk
             : Status::kCudaError;
  if (st == Status::kOk) st = record_done(join_, s);
  if (st != Status::kOk)
    ctx_->poison("ag_gemm across nodes: run failed on rank " + std::to_string(rank_) + ": " + to_string(st));
  return st;
}

void AgGemmNodesOp::unstick() {
  // Every word this op's streams wait on, raised past any epoch, from a stream of its own.
  for (const char* name : {"ag_nodes.freed", "ag_nodes.ready", "ag_nodes.flags"})
    for (const auto& r : regions_)
      if (r.name == name) cudaMemsetAsync(ctx_->local(arena_ + r.offset), 0x7F, r.bytes, side_);
}

Status AgGemmNodesOp::clear_launch_record() { return record_.clear(); }

Status AgGemmNodesOp::executed_plan(Plan* out) const {
  return record_.executed(
      plan_, regions_, arena_bytes_, rank_, "ag_gemm across nodes",
      [](int32_t kernel) -> std::string {
        return kernel == int32_t(kernels::KernelKind::kAgGemmNodes) ? "hierarchical" : "unknown";
      },
      out);
}

}  // namespace weft::runtime
