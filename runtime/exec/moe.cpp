// MoeOp: the heap layout from the allocator, the worst-case grouped rows, the per-call launches.
#include "runtime/exec/moe.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "base/log.h"
#include "base/params.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/placement.h"
#include "kernels/gemm.h"
#include "kernels/moe_ffn_combine.h"
#include "kernels/moe_router.h"
#include "runtime/exec/cuda_check.h"
#include "runtime/exec/stream_ops.h"

namespace weft::runtime {
namespace {

using bf16 = __nv_bfloat16;

Status refuse(int rank, const std::string& what) {
  WEFT_WARN(kKernel, "rank %d: moe: %s", rank, what.c_str());
  return Status::kInvalidArgument;
}

}  // namespace

Status MoeOp::alloc(void** p, size_t bytes) {
  WEFT_CUDA_CHECK(cudaMalloc(p, bytes));
  owned_.push_back(*p);
  return Status::kOk;
}

Status MoeOp::create(Context& ctx, const Plan& plan, const MoeWeights& wts, std::unique_ptr<MoeOp>* out) {
  const int rank = ctx.rank(), W = ctx.size();
  WEFT_CHECK(ctx.check_usable("moe create"));
  if (plan.op != Op::kMoe) return refuse(rank, std::string("the plan is for ") + to_string(plan.op));
  const bool across = plan.exec.variant == "hierarchical";
  const int job_nodes = ctx.boot().info().num_nodes;
  if (plan.world_size != W || W > kernels::MoeExchangeArgs::kMaxRanks || (!across && plan.nodes != 1) ||
      (across && (plan.nodes < 2 || plan.nodes != job_nodes || W % plan.nodes != 0)))
    return refuse(rank, "the plan is for " + std::to_string(plan.world_size) + " ranks on " +
                            std::to_string(plan.nodes) + " node(s) (" + (across ? "hierarchical" : "one node") +
                            "), the job has " + std::to_string(W) + " on " + std::to_string(job_nodes) +
                            " (this build: up to 8 ranks; across nodes the hierarchical variant)");
  if (!wts.router || !wts.gate || !wts.up || !wts.down) return refuse(rank, "every weight pointer is needed");
  kernels::MoeShape s;
  s.tokens = int32_t(plan.moe.tokens / W);
  s.hidden = int32_t(plan.moe.hidden);
  s.ffn = int32_t(plan.moe.ffn);
  s.experts = int32_t(plan.moe.experts);
  s.topk = int32_t(plan.moe.topk);
  s.world = W;
  if (plan.moe.tokens % W != 0 || plan.moe.tokens > (int64_t(1) << 30) || plan.moe.hidden > 65536 ||
      plan.moe.ffn > 65536)
    return refuse(rank, "tokens must split evenly over the ranks; hidden and ffn at most 65536");
  if (const char* why = s.invalid()) return refuse(rank, why);

  const bool fused = plan.exec.variant == "ffn_combine";
  if (!fused && !across && plan.exec.variant != "staged" && !plan.exec.variant.empty())  // empty: made in code
    return refuse(rank, "unknown variant '" + plan.exec.variant + "' (expected staged, ffn_combine or hierarchical)");
  // Across nodes: where every rank sits (collective), and with lazy module loading a kernel loaded at
  // its first launch waits for the device to go idle while a wait for the proxy holds it (the
  // proxy's copies wait behind the load): refused before anything is allocated.
  kernels::MoeNodesPlacement placement;
  if (across) {  // the environment first: refused before the collective gather
    const char* loading = getenv("CUDA_MODULE_LOADING");
    if (!loading || strcmp(loading, "EAGER") != 0)
      return refuse(rank, std::string("across nodes the op needs CUDA_MODULE_LOADING=EAGER (it is ") +
                              (loading ? loading : "unset, i.e. lazy") +
                              "): a kernel loaded lazily while a call waits for the network deadlocks with the "
                              "proxy's copies (weftrun sets it; under srun or mpirun export it)");
    // Streams beyond the GPU's hardware work queues share one: a proxy copy queued behind this op's
    // wait for that proxy stalls the call (seen with 4 proxy channels and CUDA's default of 8 queues).
    const char* queues = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    if (!queues || atoi(queues) < 32)
      return refuse(rank, std::string("across nodes the op needs CUDA_DEVICE_MAX_CONNECTIONS=32 (it is ") +
                              (queues ? queues : "unset, i.e. 8") +
                              "): with fewer hardware work queues the proxy's copies can queue behind the op's "
                              "waits for them (weftrun sets it; under srun or mpirun export it)");
    std::vector<int> node_of, local_of;
    WEFT_CHECK(bootstrap::gather_node_placement(ctx.boot(), &node_of, &local_of));
    std::string why;
    if (!placement.make(node_of, local_of, &why)) return refuse(rank, why);
    if (placement.per_node != plan.gpus_per_node)
      return refuse(rank, "the plan has " + std::to_string(plan.gpus_per_node) + " ranks per node, the job " +
                              std::to_string(placement.per_node));
  }
  if (fused) {  // every rank refuses alike (only the ranks that share a GPU know it): one exchange
    const uint8_t mine = ctx.shares_gpu() ? 1 : 0;
    std::vector<bootstrap::Blob> all;
    static int creates = 0;  // every rank creates its ops in the same order: a key per exchange
    WEFT_CHECK(
        ctx.boot().allgather("weft.moe.shared." + std::to_string(creates++), bootstrap::Blob(&mine, &mine + 1), &all));
    bool shared = false;
    for (const auto& b : all) shared = shared || (!b.empty() && b[0] != 0);
    if (shared)
      return refuse(rank,
                    "the ffn_combine variant needs a GPU per rank (its launch waits for the peers' combine while "
                    "it holds the SMs); ranks of this job share a GPU: use the staged variant");
  }

  std::unique_ptr<MoeOp> op(new MoeOp());
  op->ctx_ = &ctx;
  op->fused_ = fused;
  op->plan_ = plan;
  op->rank_ = rank, op->world_ = W;
  op->tokens_ = s.tokens, op->hidden_ = s.hidden, op->ffn_ = s.ffn, op->experts_ = s.experts, op->topk_ = s.topk;
  op->local_ = s.local_experts();
  const int64_t T = s.tokens, H = s.hidden, F = s.ffn, L = op->local_, E = s.experts, K = s.topk;

  // Symmetric heap: receive slots, combine rows, flags and the grouped rows, laid out as the plan
  // laid them out (its heap bytes are the budget: 0 or enough for the worst case keeps the worst case).
  // Across nodes the cross-node regions follow (kernels/moe_nodes_plan.h); the plan's budget covers both.
  kernels::MoeHeapLayout layout;
  kernels::MoeNodesHeap nodes_heap;
  const char* why = nullptr;
  int64_t budget = int64_t(std::min<uint64_t>(plan.heap_bytes, uint64_t(INT64_MAX / 2)));
  if (across) {
    if (!kernels::moe_nodes_heap(s, placement.nodes, placement.per_node, plan.exec.channels, 0, &nodes_heap, &why))
      return refuse(rank, why);
    if (budget > 0 && budget <= nodes_heap.total_bytes)
      return refuse(rank, "the plan's heap bytes do not hold the cross-node regions (raise WEFT_HEAP_BYTES)");
    if (budget > 0) budget -= nodes_heap.total_bytes;
  }
  if (!kernels::moe_heap_layout(s, budget, &layout, &why)) return refuse(rank, why);
  if (across && !kernels::moe_nodes_heap(s, placement.nodes, placement.per_node, plan.exec.channels, layout.total_bytes,
                                         &nodes_heap, &why))
    return refuse(rank, why);
  const uint64_t recv_off = uint64_t(layout.recv_offset), comb_off = uint64_t(layout.combine_offset);
  op->flags_off_ = uint64_t(layout.flags_offset);
  op->regions_ = {{"moe.recv", recv_off, uint64_t(layout.recv_bytes)},
                  {"moe.combine", comb_off, uint64_t(layout.combine_bytes)},
                  {"moe.flags", op->flags_off_, uint64_t(layout.flags_bytes)},
                  {"moe.x", uint64_t(layout.x_offset), uint64_t(layout.h_offset - layout.x_offset)},
                  {"moe.h", uint64_t(layout.h_offset), uint64_t(layout.y_offset - layout.h_offset)},
                  {"moe.y", uint64_t(layout.y_offset), uint64_t(layout.grouped_rows * s.hidden * 2)}};
  op->arena_bytes_ = uint64_t(layout.total_bytes);
  if (across) {
    for (const auto& r : nodes_heap.regions()) op->regions_.push_back({r.name, uint64_t(r.offset), uint64_t(r.bytes)});
    op->arena_bytes_ = uint64_t(nodes_heap.total_bytes);
  }
  op->capacity_ = layout.grouped_rows;
  if (op->arena_bytes_ > ctx.heap_bytes() - ctx.reserved_bytes())
    return refuse(rank, "the symmetric heap is too small: this op needs " + std::to_string(op->arena_bytes_) +
                            " bytes per rank and " + std::to_string(ctx.heap_bytes() - ctx.reserved_bytes()) +
                            " are free (raise WEFT_HEAP_BYTES)");
  WEFT_CHECK(ctx.reserve(op->arena_bytes_, "moe", &op->arena_));
  WEFT_CUDA_CHECK(cudaMemset(ctx.local(op->arena_), 0, op->arena_bytes_));

  // Local memory, sized once: routing, counters, the gate/up and router weights as the kernels want
  // them; the grouped rows are in the arena.
  const int64_t cap = op->capacity_;
  void* p = nullptr;
  WEFT_CHECK(op->alloc(&p, size_t(L * 2 * F * H) * 2));
  op->w13_ = static_cast<bf16*>(p);
  op->x_ = static_cast<bf16*>(ctx.local(op->arena_ + uint64_t(layout.x_offset)));
  op->h_ = static_cast<bf16*>(ctx.local(op->arena_ + uint64_t(layout.h_offset)));
  op->y_ = static_cast<bf16*>(ctx.local(op->arena_ + uint64_t(layout.y_offset)));
  WEFT_CHECK(op->alloc(&p, size_t(T * E) * 4));
  op->logits_ = static_cast<float*>(p);
  WEFT_CHECK(op->alloc(&p, size_t(T * K) * 4));
  op->weights_ = static_cast<float*>(p);
  WEFT_CHECK(op->alloc(&p, size_t(T * K) * 4));
  op->ids_ = static_cast<int32_t*>(p);
  WEFT_CHECK(op->alloc(&p, size_t(E) * 4));
  op->router_counts_ = static_cast<int32_t*>(p);
  WEFT_CHECK(op->alloc(&p, 3 * 4));
  op->drops_ = static_cast<int32_t*>(p);
  WEFT_CHECK(op->alloc(&p, size_t(L) * 4));
  op->counts_ = static_cast<int32_t*>(p);
  WEFT_CHECK(op->alloc(&p, sizeof(uint64_t)));
  op->ex_.epoch = static_cast<uint64_t*>(p);
  WEFT_CUDA_CHECK(cudaMemset(p, 0, sizeof(uint64_t)));
  WEFT_CHECK(op->alloc(&p, size_t(L + 1) * 4));
  op->offsets_ = static_cast<int32_t*>(p);
  WEFT_CHECK(op->alloc(&p, size_t(L) * 4));
  op->cursor_ = static_cast<int32_t*>(p);
  WEFT_CHECK(op->alloc(&p, size_t(W * T * K) * 4));
  op->slot_pos_ = static_cast<int32_t*>(p);
  WEFT_CUDA_CHECK(cudaMemset(op->drops_, 0, 3 * 4));
  WEFT_CUDA_CHECK(cudaMemset(op->offsets_, 0, size_t(L + 1) * 4));
  WEFT_CHECK(
      kernels::launch_interleave_gate_up(wts.gate, wts.up, int32_t(L), int32_t(F), int32_t(H), op->w13_, nullptr));
  WEFT_CHECK(op->alloc(&p, size_t(E * H) * 2));
  op->router_wt_ = static_cast<bf16*>(p);
  WEFT_CHECK(kernels::launch_moe_router_weight_t(wts.router, int32_t(H), int32_t(E), op->router_wt_, nullptr));

  kernels::GroupedGemmArgs up;
  up.experts = int32_t(L), up.capacity_rows = cap, up.n = int32_t(2 * F), up.k = int32_t(H);
  up.x = op->x_, up.w = op->w13_, up.counts = op->counts_, up.offsets = op->offsets_, up.y = op->h_;
  up.epilogue = kernels::GroupedEpilogue::kSwiGlu;
  up.dropped = op->drops_ + 2;
  kernels::GroupedGemmArgs down = up;
  down.n = int32_t(H), down.k = int32_t(F), down.x = op->h_, down.w = wts.down, down.y = op->y_;
  down.epilogue = kernels::GroupedEpilogue::kStore;
  down.dropped = nullptr;  // the same rows as up's: counted once
  WEFT_CHECK(kernels::make_grouped_gemm_params(up, &op->up_));
  WEFT_CHECK(kernels::make_grouped_gemm_params(down, &op->down_));
  if (plan.exec.split_k > 1) {  // Down, and gate/up's last wave, split over K into at most split_k parts where
                                // they fit one wave of the plan's blocks (moe_split_parts, moe_up_tail_parts:
                                // decode counts): two slots per SM, one wave each (33 MiB on 132 SMs).
    int device = 0, sms = 0;
    WEFT_CUDA_CHECK(cudaGetDevice(&device));
    WEFT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    WEFT_CHECK(op->alloc(&p, size_t(kernels::grouped_split_bytes(2 * sms))));
    WEFT_CHECK(kernels::enable_grouped_split(&op->down_, p, 2 * sms));
    op->down_.split_max = plan.exec.split_k;
  }
  // The FFN's per-row-tile counters (gate/up done, and for ffn_combine down done) and its claim counter.
  WEFT_CHECK(op->alloc(&p, size_t(2 * int64_t(op->up_.capacity_tiles) + 1) * sizeof(uint64_t)));
  op->tile_done_ = static_cast<uint64_t*>(p);

  kernels::MoeExchangeArgs& ex = op->ex_;
  ex.world = W, ex.rank = rank, ex.tokens = int32_t(T), ex.hidden = int32_t(H), ex.topk = int32_t(K);
  ex.local_experts = int32_t(L);
  ex.topk_ids = op->ids_, ex.topk_weights = op->weights_;
  for (int q = 0; q < W; ++q) {
    ex.recv[q] = static_cast<uint8_t*>(ctx.peer(q, op->arena_ + recv_off));
    ex.comb[q] = static_cast<bf16*>(ctx.peer(q, op->arena_ + comb_off));
    ex.flags[q] = static_cast<uint64_t*>(ctx.peer(q, op->arena_ + op->flags_off_));
    op->comb_done_.comb_done[q] = ex.flags[q] ? ex.flags[q] + 2 * W : nullptr;  // after the 2 W exchange flags
    const bool mate = !across || placement.node_of[size_t(q)] == placement.node_of[size_t(rank)];
    if (mate && (!ex.recv[q] || !ex.comb[q] || !ex.flags[q]))
      return refuse(rank, "rank " + std::to_string(q) + "'s heap is not mapped here (not on this node)");
    if (!mate) ex.recv[q] = nullptr, ex.comb[q] = nullptr, ex.flags[q] = nullptr;
  }
  ex.counts = op->counts_, ex.offsets = op->offsets_, ex.cursor = op->cursor_, ex.slot_pos = op->slot_pos_;
  ex.dropped = op->drops_ + 1;
  ex.grouped_x = op->x_, ex.grouped_y = op->y_, ex.capacity_rows = cap;
  // The fused launch and the relays across nodes must run to their end on an overflow (a failed wait
  // ends a call's later waits at once: a relay would sum rows its node-mates have not written yet).
  ex.capacity_after = fused || across;

  if (across) WEFT_CHECK(op->create_nodes(placement, nodes_heap));
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&op->side_, cudaStreamNonBlocking));
  WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&op->done_, cudaEventDisableTiming));
  WEFT_CHECK(op->frame_.create(rank));
  const RoleCounts& roles = plan.roles;  // the plan's, as written: every kernel's grid
  if (roles.compute < 1 || roles.total() > ctx.sm_count())
    return refuse(rank, "the plan's SM counts (" + std::to_string(roles.compute) + " compute, " +
                            std::to_string(roles.total()) + " in all) do not fit this GPU's " +
                            std::to_string(ctx.sm_count()) + " SMs");
  WEFT_CHECK(op->frame_.params(roles, &op->frame_params_));
  WEFT_CHECK(op->record_.create());
  op->frame_params_.launch = op->record_.device();
  WEFT_CUDA_CHECK(cudaDeviceSynchronize());
  WEFT_CHECK(ctx.boot().barrier("weft.moe.create." + std::to_string(op->arena_)));
  MoeOp* raw = op.get();
  op->watch_ = ctx.watch(
      [raw](std::string* why) {
        if (raw->network_failed(why)) return true;
        if (*reinterpret_cast<const volatile int32_t*>(&raw->frame_.record().status) == 0) return false;
        raw->frame_.check("moe");
        std::string what = kernels::describe_moe_wait(raw->frame_.record(), raw->world_);
        // Across nodes a remote home's tokens come from this node's relay for it: name that rank too.
        const int32_t flag = raw->frame_.record().flag_index;
        if (raw->nodes_ && !what.empty() && flag >= 0 && flag < raw->world_) {
          const kernels::MoeNodesArgs& a = *raw->nodes_;
          if (a.node_of[flag] != a.node)
            what += " (forwarded by rank " + std::to_string(a.rank_at[a.node * a.per_node + a.local_of[flag]]) +
                    ", this node's relay for it)";
        }
        *why = "moe: " + (what.empty() ? "a device wait timed out on rank " + std::to_string(raw->rank_) : what);
        return true;
      },
      [raw] { raw->unstick(); });
  *out = std::move(op);
  return Status::kOk;
}

MoeOp::~MoeOp() {
  if (done_) {
    event_wait_bounded(done_, param_double_or_default("WEFT_DEVICE_TIMEOUT") + 1, "moe's last call",
                       [this] { unstick(); });
    cudaEventDestroy(done_);
  }
  if (ctx_ && watch_ >= 0) ctx_->unwatch(watch_);
  if (side_) cudaStreamDestroy(side_);
  if (push_error_) cudaFreeHost(push_error_);
  for (void* p : owned_) cudaFree(p);
  if (ctx_ && arena_bytes_) ctx_->release(arena_);
}

Status MoeOp::run(const bf16* x, bf16* out, cudaStream_t s) {
  WEFT_CHECK(ctx_->check_usable("moe run"));
  if (!x || !out) return refuse(rank_, "run() needs x and out");
  if (x != router_x_) {  // a new token buffer: the router GEMM's tensor map is made again (host only)
    kernels::GemmArgs g;
    g.m = tokens_, g.n = experts_, g.k = hidden_;
    g.a = x, g.b = router_wt_;
    WEFT_CHECK(kernels::make_gemm_params(g, &router_gemm_));
    router_x_ = x;
  }
  kernels::MoeRouterArgs ra;
  ra.tokens = x, ra.weight = nullptr, ra.tokens_n = tokens_, ra.hidden = hidden_, ra.experts = experts_;
  ra.topk = topk_;
  kernels::MoeRouterOut ro;
  ro.logits = logits_, ro.topk_ids = ids_, ro.topk_weights = weights_, ro.counts = router_counts_;
  ro.dropped = drops_;
  kernels::MoeExchangeArgs ex = ex_;
  ex.x = x, ex.out = out;
  auto mark = [&](int i) {
    if (phases_) cudaEventRecord(phases_[i], s);
  };
  mark(0);
  Status st = kernels::launch_moe_begin(ex, s);
  if (st == Status::kOk)
    st = cudaMemsetAsync(drops_ + 1, 0, 2 * 4, s) == cudaSuccess ? Status::kOk : Status::kCudaError;
  if (st == Status::kOk)
    st = cudaMemsetAsync(logits_, 0, size_t(tokens_) * experts_ * 4, s) == cudaSuccess ? Status::kOk
                                                                                       : Status::kCudaError;
  if (st == Status::kOk) {  // one add per logit into zeros (no K split): the same bits every call
    kernels::GemmOptions one_add;
    one_add.split_tail = one_add.chunked_tail = false;
    st = kernels::launch_gemm(router_gemm_, frame_params_, kernels::EpiAddF32{logits_, experts_}, kernels::FlagGate{},
                              kernels::TileSignal{}, s, one_add);
  }
  if (st == Status::kOk) st = kernels::launch_moe_topk(ra, ro, s);
  mark(1);
  kernels::MoeNodesArgs na;
  if (nodes_) na = *nodes_, na.ex = ex;
  if (st == Status::kOk)
    st = nodes_ ? kernels::launch_moe_nodes_dispatch(na, frame_params_, s) : kernels::launch_moe_dispatch(ex, s);
  mark(2);
  if (st == Status::kOk) st = kernels::launch_moe_arrange(ex, frame_params_, s);
  mark(3);
  if (fused_) {  // the FFN, combine and home reduction in one launch: the last two marks together
    kernels::MoeFfnCombineArgs fa = comb_done_;
    fa.ex = &ex;
    if (st == Status::kOk) st = kernels::launch_moe_ffn_combine(up_, down_, fa, tile_done_, frame_params_, s);
    if (st == Status::kOk) st = kernels::launch_moe_capacity(ex, frame_params_, s);  // after: see capacity_after
    mark(4);
  } else {
    if (st == Status::kOk) st = kernels::launch_grouped_ffn(up_, down_, tile_done_, frame_params_, s);
    mark(4);
    if (st == Status::kOk)
      st = nodes_ ? kernels::launch_moe_nodes_combine(na, frame_params_, s)
                  : kernels::launch_moe_combine(ex, frame_params_, s);
    if (st == Status::kOk && nodes_) st = kernels::launch_moe_capacity(ex, frame_params_, s);  // capacity_after
  }
  mark(5);
  if (st == Status::kOk) st = record_done(done_, s);
  if (st != Status::kOk) ctx_->poison("moe run failed on rank " + std::to_string(rank_));
  return st;
}

void MoeOp::unstick() {
  // The waits are bounded on the device; raising this rank's flags lets its own later waits pass.
  // (the flags region: the exchange's flags and the fused launch's comb_done counters)
  for (const HeapRegion& r : regions_)
    if (r.name == "moe.flags" || r.name == "moe.rail_flags")
      cudaMemsetAsync(ctx_->local(arena_ + r.offset), 0x7F, r.bytes, side_);
}

Status MoeOp::clear_launch_record() { return record_.clear(); }

Status MoeOp::executed_plan(Plan* out) const {
  WEFT_CHECK(record_.executed(
      plan_, regions_, arena_bytes_, rank_, "moe",
      [](int32_t kernel) -> std::string {
        // The call's last launch that notes itself: the router GEMM (staged) or the fused FFN + combine.
        return kernel == int32_t(kernels::KernelKind::kGemm)            ? "staged"
               : kernel == int32_t(kernels::KernelKind::kMoeFfnCombine) ? "ffn_combine"
                                                                        : "unknown";
      },
      out));
  // Across nodes the combine's last push notes the nodes it served (kernels/moe_nodes.cu).
  kernels::LaunchRecord rec{};
  WEFT_CHECK(record_.read(&rec));
  if (out->exec.variant == "staged" && rec.shards >= 2) out->exec.variant = "hierarchical";
  // The FFN launch notes the parts its down projection ran in: within the plan's cap, else the launch
  // did not run as planned.
  std::string why;
  if (!check_moe_split(rec, plan_, &why)) {
    WEFT_WARN(kKernel, "rank %d: moe: %s", rank_, why.c_str());
    return Status::kNotFound;
  }
  return Status::kOk;
}

Status MoeOp::dropped(int64_t* out) {
  WEFT_CHECK(event_wait_bounded(done_, param_double_or_default("WEFT_DEVICE_TIMEOUT") + 1, "moe's last call",
                                [this] { unstick(); }));
  int32_t d[3] = {};
  WEFT_CUDA_CHECK(cudaMemcpy(d, drops_, sizeof d, cudaMemcpyDeviceToHost));
  *out = int64_t(d[0]) + d[1] + d[2];
  return Status::kOk;
}

}  // namespace weft::runtime
