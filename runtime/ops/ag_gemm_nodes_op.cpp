// AllGather+GEMM across nodes: C_r = gather(A) · B_rᵀ, hierarchical, in one persistent launch per rank.
//
//   rank r holds A_r (m/W × k) and B_r (n/W × k); every rank gets C_r (m × n/W), rows in global order.
//
//   inter_send block:  A_r chunk 0, 1, ... ─FIFO─► proxy ─NIC─► rail peer on each other node (once per node)
//   intra_comm blocks: chunk of a rail peer's shard arrives (flag) ─NVLink stores─► node-mates, their flag
//   copy engines:      node-mates' own shards, pulled over NVLink, a flag per chunk
//   compute blocks:    the GEMM over this rank's order: own shard, node-mates', then each other node's
//                      (rail peer's first), every chunk gated by its flag (kernels/ag_gemm_nodes_plan.h)
//
// Validation: every position of the gathered A must equal NCCL's all-gather bit for bit (shards are
// seeded by rank, so a misrouted shard names the rank that delivered it), every element of C written
// (poisoned first) and within bf16 tolerance of cuBLAS on NCCL's gathered A. Timing: the fused op,
// NCCL all-gather + cuBLAS (NCCL_HOSTID per node, so NCCL crosses the emulated nodes through its
// network transport too), each alone, weft's GEMM alone and weft's gather alone.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/params.h"
#include "bootstrap/placement.h"
#include "kernels/ag_gemm_nodes.h"
#include "kernels/ag_gemm_nodes_plan.h"
#include "kernels/gemm.h"
#include "runtime/exec/ag_gemm.h"
#include "runtime/exec/context.h"
#include "runtime/exec/device_data.h"
#include "runtime/ops/cuda_check.h"
#include "runtime/ops/op_harness.h"
#include "runtime/ops/ops.h"
#include "runtime/workload.h"
#include "transport/cuda_transport.h"
#include "transport/heap.h"
#include "transport/transport.h"

namespace weft::runtime::ops {
namespace {

using bf16 = __nv_bfloat16;
using kernels::AgNodesDeviceMoves;
using kernels::AgNodesSource;

const char* source_text(AgNodesSource s) {
  switch (s) {
    case AgNodesSource::kOwn:
      return "its own input";
    case AgNodesSource::kPull:
      return "a copy-engine pull over NVLink from the node-mate";
    case AgNodesSource::kNet:
      return "the proxy path from the rail peer";
    case AgNodesSource::kForward:
      return "an NVLink forward by the node-mate";
  }
  return "?";
}

struct AgNodes {
  int rank = 0, world = 1, chunks = 1, channels = 1;
  int64_t m = 0, n = 0, k = 0, m_loc = 0;
  uint64_t shard_bytes = 0, chunk_bytes = 0, a_off = 0, flags_off = 0, freed_off = 0;
  kernels::AgNodesPlan plan;
  std::unique_ptr<Context> ctx;        // the runner's own, as a program's: heap (its first arena), transport, rings
  transport::Transport* tp = nullptr;  // ctx's
  bf16 *b = nullptr, *c = nullptr, *c_ref = nullptr, *a_nccl = nullptr;
  int32_t* push_err = nullptr;  // [status, peer]
  uint64_t epoch = 0;
  cudaStream_t main = nullptr, copy = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  kernels::GemmParams gemm_alone;  // weft's GEMM on NCCL's gathered A, for the "alone" row
  kernels::FrameHost frame;
  kernels::FrameParams frame_params;
  RoleCounts roles;
  kernels::AgNodesKernelParams kp;

  char* base() const { return static_cast<char*>(ctx->local(0)); }
  bf16* pos_ptr(int pos) const { return reinterpret_cast<bf16*>(base() + a_off + uint64_t(pos) * shard_bytes); }
  uint64_t* flag(int pos, int chunk) const {
    return reinterpret_cast<uint64_t*>(base() + flags_off) + int64_t(pos) * chunks + chunk;
  }

  // One run: own flags and the node-mates' pulls on the streams, then the kernel (compute: the GEMM
  // too; otherwise the gather alone).
  Status enqueue(bool compute) {
    ++epoch;
    WEFT_CUDA_CHECK(cudaEventRecord(fork, main));
    WEFT_CUDA_CHECK(cudaStreamWaitEvent(copy, fork));
    for (int ch = 0; ch < chunks; ++ch) WEFT_CHECK(stream_write_u64(main, flag(0, ch), epoch));
    for (const kernels::AgNodesPull& p : plan.pulls) {
      const char* src = static_cast<const char*>(ctx->peer(p.mate, 0)) + a_off;  // the mate's position 0
      for (int ch = 0; ch < chunks; ++ch) {
        WEFT_CUDA_CHECK(cudaMemcpyAsync(reinterpret_cast<char*>(pos_ptr(p.dst_pos)) + ch * chunk_bytes,
                                        src + ch * chunk_bytes, chunk_bytes, cudaMemcpyDeviceToDevice, copy));
        WEFT_CHECK(stream_write_u64(copy, flag(p.dst_pos, ch), epoch));
      }
    }
    kp.epoch = epoch;
    kp.gate.expected = epoch;
    kp.compute = compute ? 1 : 0;
    WEFT_CHECK(kernels::launch_ag_gemm_nodes(kp, main));
    WEFT_CUDA_CHECK(cudaEventRecord(join, copy));
    WEFT_CUDA_CHECK(cudaStreamWaitEvent(main, join));
    return Status::kOk;
  }

  Status enqueue_gemm_only() {
    kernels::EpiStoreBf16 epi{c, n, n % 2 == 0};
    return kernels::launch_gemm(gemm_alone, frame_params, epi, kernels::FlagGate{}, kernels::TileSignal{}, main,
                                bench_gemm_options());
  }

  // After a synchronized run: the kernel's timeouts, failed pushes, the proxies' first error.
  Status check(const char* what) const {
    WEFT_CHECK(frame.check(what));
    int32_t e[2] = {0, 0};
    WEFT_CUDA_CHECK(cudaMemcpy(e, push_err, sizeof e, cudaMemcpyDeviceToHost));
    if (e[0]) {
      std::string rings;
      for (int ch = 0; ch < channels; ++ch)
        rings += " channel " + std::to_string(ch) + " tail " +
                 std::to_string(__atomic_load_n(&tp->fifo_ring(ch)->tail, __ATOMIC_ACQUIRE)) + ";";
      WEFT_WARN(kKernel,
                "rank %d: %s: inter_send's FIFO push for rank %d failed with status %d (%s): the proxy "
                "did not drain within WEFT_PROXY_TIMEOUT (rings:%s) %s",
                rank, what, e[1], e[0], to_string(static_cast<Status>(e[0])), rings.c_str(),
                tp->error_message().c_str());
      return static_cast<Status>(e[0]);
    }
    if (tp->status() != Status::kOk) {
      WEFT_WARN(kKernel, "rank %d: %s: transport failed: %s", rank, what, tp->error_message().c_str());
      return tp->status();
    }
    return Status::kOk;
  }

  ~AgNodes() {
    // Still held here only when the runner left early (on success it is reset after the last
    // barrier): no collective heap close a peer that failed may never join.
    if (ctx) ctx->poison("the benchmark runner stopped early on this rank");
    cudaDeviceSynchronize();
    for (void* p : {static_cast<void*>(b), static_cast<void*>(c), static_cast<void*>(c_ref), static_cast<void*>(a_nccl),
                    static_cast<void*>(push_err)})
      if (p) cudaFree(p);
    if (fork) cudaEventDestroy(fork);
    if (join) cudaEventDestroy(join);
    if (copy) cudaStreamDestroy(copy);
    if (main) cudaStreamDestroy(main);
  }  // then ctx: its rings, transport and heap
};

Status validate(AgNodes& op, ncclComm_t comm, cublasHandle_t blas, bootstrap::Bootstrap& boot, const Workload& wl) {
  const int64_t shard_elems = op.m_loc * op.k, c_elems = op.m * op.n;
  for (int pos = 1; pos < op.world; ++pos) WEFT_CHECK(poison_bf16(op.pos_ptr(pos), shard_elems, op.main));
  WEFT_CHECK(poison_bf16(op.c, c_elems, op.main));
  WEFT_CUDA_CHECK(cudaStreamSynchronize(op.main));
  // Nobody sends into a heap before its owner has poisoned it.
  WEFT_CHECK(boot.barrier("weft.ag_gemm_nodes.poisoned"));
  WEFT_CHECK(op.enqueue(true));
  WEFT_CUDA_CHECK(cudaStreamSynchronize(op.main));
  WEFT_CHECK(op.check("ag_gemm_nodes"));
  WEFT_NCCL_CHECK(ncclAllGather(op.pos_ptr(0), op.a_nccl, size_t(shard_elems), ncclBfloat16, comm, op.main));
  WEFT_CHECK(cublas_gemm_tn(blas, op.m, op.n, op.k, op.a_nccl, op.k, op.b, op.k, op.c_ref, op.n, op.main));
  for (int pos = 0; pos < op.world; ++pos) {
    const int s = op.plan.order[pos];
    Comparison cmp;
    WEFT_CHECK(compare_bf16(op.pos_ptr(pos), op.a_nccl + s * shard_elems, shard_elems, op.main, &cmp));
    if (cmp.mismatched) {
      WEFT_WARN(kKernel,
                "rank %d: ag_gemm_nodes: position %d should hold rank %d's shard, delivered by %s (rank %d), "
                "but differs from NCCL's all-gather in %lld of %lld elements (first at %lld): misrouted or not "
                "delivered",
                op.rank, pos, s, source_text(op.plan.source[pos]), op.plan.source_rank[pos],
                static_cast<long long>(cmp.mismatched), static_cast<long long>(shard_elems),
                static_cast<long long>(cmp.first_mismatch));
      return Status::kInternal;
    }
  }
  Comparison cmp;
  WEFT_CHECK(compare_bf16(op.c, op.c_ref, c_elems, op.main, &cmp));
  const double tol = 1e-2;  // bf16 output rounding is ~2e-3
  if (cmp.non_finite || !(cmp.rel_err < tol)) {
    WEFT_WARN(kKernel,
              "rank %d: ag_gemm_nodes (%s): C differs from cuBLAS: rel err %.3g (tolerance %.0e), %lld "
              "elements not written or not finite",
              op.rank, wl.name.c_str(), cmp.rel_err, tol, static_cast<long long>(cmp.non_finite));
    return Status::kInternal;
  }
  printf(
      "rank %d: ag_gemm_nodes validated: gathered A equals NCCL's bit for bit in every position; C vs cuBLAS rel "
      "err %.2e, %lld of %lld elements bit-identical\n",
      op.rank, cmp.rel_err, static_cast<long long>(c_elems - cmp.mismatched), static_cast<long long>(c_elems));
  return Status::kOk;
}

Status setup(const Workload& wl, bootstrap::Bootstrap& boot, AgNodes& op) {
  const auto& info = boot.info();
  std::vector<int> node_of, local_of;
  WEFT_CHECK(bootstrap::gather_node_placement(boot, &node_of, &local_of));
  std::string why;
  if (!kernels::make_ag_nodes_plan(node_of, local_of, info.rank, &op.plan, &why)) {
    WEFT_WARN(kKernel, "rank %d: ag_gemm across %d nodes: %s", info.rank, info.num_nodes, why.c_str());
    return Status::kUnsupported;
  }
  const int max_owners = kernels::EpiScatterBf16::kMaxOwners;
  if (op.world > max_owners || int(op.plan.sends.size()) > AgNodesDeviceMoves::kMaxSends ||
      int(op.plan.forwards.size()) > AgNodesDeviceMoves::kMaxForwards ||
      op.plan.per_node - 1 > AgNodesDeviceMoves::kMaxTargets) {
    WEFT_WARN(kKernel, "rank %d: ag_gemm across nodes handles at most %d ranks (this job has %d)", info.rank,
              max_owners, op.world);
    return Status::kUnsupported;
  }
  int64_t max_chunks = 0, channels = 0;
  WEFT_CHECK(get_param("WEFT_AG_CHUNKS", &max_chunks));
  WEFT_CHECK(get_param("WEFT_NET_CHANNELS", &channels));
  op.chunks = kernels::ag_nodes_chunks(op.m_loc, kernels::GemmConfig::kTileM, int(max_chunks));
  op.channels = int(std::clamp<int64_t>(channels, 1, AgNodesDeviceMoves::kMaxChannels));
  op.shard_bytes = uint64_t(op.m_loc * op.k) * sizeof(bf16);
  op.chunk_bytes = op.shard_bytes / op.chunks;

  // Symmetric heap: A in this rank's position order, then the flags.
  const uint64_t a_bytes = op.shard_bytes * op.world, flag_bytes = sizeof(uint64_t) * op.world * op.chunks;
  const uint64_t freed_bytes = sizeof(uint64_t) * 2 * op.world;
  transport::HeapAllocator alloc(a_bytes + flag_bytes + freed_bytes + 4096);
  WEFT_CHECK(alloc.allocate(a_bytes, 1024, "ag_gemm_nodes A", &op.a_off));
  WEFT_CHECK(alloc.allocate(flag_bytes, 8, "ag_gemm_nodes flags", &op.flags_off));
  WEFT_CHECK(alloc.allocate(freed_bytes, 8, "ag_gemm_nodes freed", &op.freed_off));
  const uint64_t used = (alloc.used() + 4095) / 4096 * 4096;
  WEFT_CHECK(Context::create(boot, used, &op.ctx));
  uint64_t arena = 0;
  WEFT_CHECK(op.ctx->reserve(used, "ag_gemm across nodes (bench)", &arena));
  if (arena != 0) {
    WEFT_WARN(kKernel, "rank %d: ag_gemm across nodes: the runner's arena starts at %llu, not 0", info.rank,
              (unsigned long long)arena);
    return Status::kInternal;
  }
  WEFT_CHECK(
      op.ctx->transport(op.channels, to_string(wl.transport.inter_node), to_string(wl.transport.signal_mode), &op.tp));
  for (int ch = 0; ch < op.channels; ++ch) op.kp.fifo[ch] = op.ctx->fifo(ch);
  WEFT_CHECK(transport::preload_kernels({kernels::ag_gemm_nodes_kernel_ptr()}, "ag_gemm_nodes"));

  int sms = 0;
  WEFT_CHECK(kernels::device_sm_count(&sms));
  const int forward_items = int(op.plan.forwards.size()) * op.chunks;
  op.roles.inter_send = op.plan.sends.empty() ? 0 : 1;
  op.roles.intra_comm = std::min(4, forward_items);
  op.roles.compute = sms - op.roles.inter_send - op.roles.intra_comm;

  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&op.main, cudaStreamNonBlocking));
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&op.copy, cudaStreamNonBlocking));
  WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&op.fork, cudaEventDisableTiming));
  WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&op.join, cudaEventDisableTiming));
  WEFT_CUDA_CHECK(cudaMalloc(&op.b, size_t(op.n * op.k) * sizeof(bf16)));
  WEFT_CUDA_CHECK(cudaMalloc(&op.c, size_t(op.m * op.n) * sizeof(bf16)));
  WEFT_CUDA_CHECK(cudaMalloc(&op.c_ref, size_t(op.m * op.n) * sizeof(bf16)));
  WEFT_CUDA_CHECK(cudaMalloc(&op.a_nccl, size_t(op.m * op.k) * sizeof(bf16)));
  WEFT_CUDA_CHECK(cudaMalloc(&op.push_err, 2 * sizeof(int32_t)));
  WEFT_CUDA_CHECK(cudaMemset(op.push_err, 0, 2 * sizeof(int32_t)));

  uint64_t seed = 0;
  WEFT_CHECK(shared_seed(boot, "weft.ag_gemm_nodes.seed", &seed));
  WEFT_CHECK(fill_random_bf16(op.pos_ptr(0), op.m_loc * op.k, seed, op.rank, 1.0f, op.main));
  WEFT_CHECK(fill_random_bf16(op.b, op.n * op.k, seed + 1, op.rank, 1.0f, op.main));
  WEFT_CUDA_CHECK(cudaStreamSynchronize(op.main));

  // The fused GEMM: A is the heap's positions, one M-shard per (position, chunk), in order.
  kernels::GemmArgs args;
  args.m = op.m;
  args.n = op.n;
  args.k = op.k;
  args.a = op.pos_ptr(0);
  args.b = op.b;
  args.num_shards = op.world * op.chunks;
  args.first_shard = 0;
  WEFT_CHECK(gemm_group(&args.group_m));
  WEFT_CHECK(kernels::make_gemm_params(args, &op.kp.gemm));
  args.a = op.a_nccl;
  args.num_shards = 1;
  WEFT_CHECK(kernels::make_gemm_params(args, &op.gemm_alone));
  WEFT_CHECK(op.frame.create(op.rank));
  WEFT_CHECK(op.frame.params(op.roles, &op.frame_params));
  op.kp.frame = op.frame_params;
  op.kp.epi.rows_per_owner = op.m_loc;
  op.kp.epi.ldc = op.n;
  op.kp.epi.paired = op.n % 2 == 0;
  for (int pos = 0; pos < op.world; ++pos) op.kp.epi.dst[pos] = op.c + int64_t(op.plan.order[pos]) * op.m_loc * op.n;
  op.kp.gate.flags = op.flag(0, 0);
  op.kp.gate.granularity = kernels::kFlagPerShard;
  // freed: zero, as the heap is created (every peer has freed run 0).
  op.kp.moves =
      kernels::ag_nodes_device_moves(op.plan, op.chunks, op.a_off, op.shard_bytes, op.flags_off, op.freed_off);
  op.kp.channels = op.channels;
  op.kp.heap = op.base();
  op.kp.peers = reinterpret_cast<char* const*>(op.ctx->device_peers());
  op.kp.push_error = op.push_err;
  op.kp.push_error_peer = op.push_err + 1;
  WEFT_CHECK(boot.barrier("weft.ag_gemm_nodes.inputs"));  // every shard written before anyone reads one
  return Status::kOk;
}

}  // namespace

Status run_ag_gemm_nodes(const bootstrap::RankContext& /*ctx*/, const Workload& wl, bootstrap::Bootstrap& boot) {
  const auto& info = boot.info();
  if (wl.world_size() != info.size) {
    WEFT_WARN(kKernel, "rank %d: %s needs %d ranks (layout %d x %d) but the job has %d", info.rank, wl.source.c_str(),
              wl.world_size(), wl.layout.nodes, wl.layout.gpus_per_node, info.size);
    return Status::kInvalidArgument;
  }
  if (wl.gemm.m % info.size || (wl.gemm.m / info.size) % kernels::GemmConfig::kTileM != 0) {
    WEFT_WARN(kKernel,
              "rank %d: %s: ag_gemm needs m / ranks (%lld) to be a multiple of %d rows: a tile must not "
              "span two ranks' shards",
              info.rank, wl.source.c_str(), static_cast<long long>(wl.gemm.m / info.size), kernels::GemmConfig::kTileM);
    return Status::kInvalidArgument;
  }
  // NCCL's baseline must cross the (emulated) nodes through its network transport like weft does:
  // one host id per node (the launcher names emulated nodes differently). A user's value is kept.
  setenv("NCCL_HOSTID", info.hostname.c_str(), 0);

  AgNodes op;
  op.rank = info.rank;
  op.world = info.size;
  const GemmShard sh = wl.gemm_shard();
  op.m = wl.gemm.m;
  op.k = wl.gemm.k;
  op.n = sh.n;
  op.m_loc = op.m / op.world;
  WEFT_CHECK(setup(wl, boot, op));
  // The prediction for what runs: these role counts, intra-node forwarding by SMs.
  Workload as_run = wl;
  as_run.roles.automatic = false;
  as_run.roles.counts = op.roles;
  const Plan plan = plan_for(as_run, info.rank, IntraMover::kSm);

  ncclComm_t comm = nullptr;
  WEFT_CHECK(create_nccl_comm(boot, &comm));
  cublasHandle_t blas = nullptr;
  WEFT_CUBLAS_CHECK(cublasCreate(&blas));
  // Load every kernel the timed loops launch next to the fused kernel before the first fused launch
  // (lazy loading would wait for the device to idle while the fused kernel waits on the proxy).
  {
    int* word = nullptr;
    WEFT_CUDA_CHECK(cudaMalloc(&word, sizeof(int)));
    WEFT_NCCL_CHECK(ncclAllReduce(word, word, 1, ncclInt32, ncclSum, comm, op.main));
    WEFT_NCCL_CHECK(ncclAllGather(op.pos_ptr(0), op.a_nccl, size_t(op.m_loc * op.k), ncclBfloat16, comm, op.main));
    WEFT_CHECK(cublas_gemm_tn(blas, op.m, op.n, op.k, op.a_nccl, op.k, op.b, op.k, op.c_ref, op.n, op.main));
    WEFT_CHECK(op.enqueue_gemm_only());
    WEFT_CUDA_CHECK(cudaStreamSynchronize(op.main));
    WEFT_CUDA_CHECK(cudaFree(word));
  }

  if (wl.run.validate) WEFT_CHECK(validate(op, comm, blas, boot, wl));

  // The runtime op (runtime/exec/ag_gemm_nodes.h, what `weftrun run` and the API execute) beside the
  // runner, on a context of its own: with the runner's roles, and with the model's plan. Each copies
  // the runner's shard into its heap on every call, as a program's call does.
  const Plan model = plan_for(wl, info.rank);
  std::unique_ptr<runtime::Context> rt_ctx;
  std::unique_ptr<runtime::AgGemmOp> rt_same, rt_model;
  bf16* rt_c = nullptr;
  const bool rt = plan.exec.executable && model.exec.executable;
  if (rt) {
    WEFT_CHECK(runtime::Context::create(boot, std::max(plan.heap_bytes, model.heap_bytes) * 2 + (4u << 20), &rt_ctx));
    WEFT_CHECK(runtime::AgGemmOp::create(*rt_ctx, plan, &rt_same));
    WEFT_CHECK(runtime::AgGemmOp::create(*rt_ctx, model, &rt_model));
    WEFT_CUDA_CHECK(cudaMalloc(&rt_c, size_t(op.m * op.n) * sizeof(bf16)));
    WEFT_CHECK(poison_bf16(rt_c, op.m * op.n, op.main));  // an element no call writes fails the check below
  } else if (info.rank == 0) {
    printf("(no runtime op rows: %s)\n",
           !plan.exec.executable ? plan.exec.not_executable.c_str() : model.exec.not_executable.c_str());
  }

  const int warm = wl.run.warmup, iters = wl.run.iters;
  // The fused op and its baselines timed together, interleaved (InterleavedTimer: max over ranks);
  // the proxies' counters over those rounds count the fused runs' messages only (the others move
  // nothing through weft's transport). The gather alone after them.
  double t_gather = 0;
  WEFT_CHECK(op.tp->flush());  // the validation run's pushes are all posted: count the timed runs only
  const transport::TransportCounters c0 = op.tp->counters();
  InterleavedTimer timer;
  timer.add([&] { return op.enqueue(true); });  // 0
  timer.add([&]() -> Status {                   // 1
    WEFT_NCCL_CHECK(ncclAllGather(op.pos_ptr(0), op.a_nccl, size_t(op.m_loc * op.k), ncclBfloat16, comm, op.main));
    return cublas_gemm_tn(blas, op.m, op.n, op.k, op.a_nccl, op.k, op.b, op.k, op.c_ref, op.n, op.main);
  });
  timer.add([&] {  // 2
    return cublas_gemm_tn(blas, op.m, op.n, op.k, op.a_nccl, op.k, op.b, op.k, op.c_ref, op.n, op.main);
  });
  timer.add([&]() -> Status {  // 3
    WEFT_NCCL_CHECK(ncclAllGather(op.pos_ptr(0), op.a_nccl, size_t(op.m_loc * op.k), ncclBfloat16, comm, op.main));
    return Status::kOk;
  });
  timer.add([&] { return op.enqueue_gemm_only(); });  // 4
  if (rt) {
    timer.add([&] { return rt_same->run(op.pos_ptr(0), op.b, rt_c, op.main); });   // 5
    timer.add([&] { return rt_model->run(op.pos_ptr(0), op.b, rt_c, op.main); });  // 6
  }
  WEFT_CHECK(timer.run(boot, comm, op.main, warm, iters, "weft.ag_gemm_nodes.interleaved"));
  WEFT_CHECK(op.check("ag_gemm_nodes"));
  WEFT_CHECK(op.tp->flush());
  const transport::TransportCounters c1 = op.tp->counters();
  WEFT_CHECK(time_op(
      comm, op.main, warm, iters, [&] { return op.enqueue(false); }, &t_gather));
  WEFT_CHECK(op.check("ag_gemm_nodes gather"));

  // The runtime op's C of its last call (the model's plan), against cuBLAS on NCCL's gathered A.
  Comparison rt_cmp;
  if (rt) {
    WEFT_CUDA_CHECK(cudaStreamSynchronize(op.main));
    WEFT_CHECK(compare_bf16(rt_c, op.c_ref, op.m * op.n, op.main, &rt_cmp));
    if (rt_cmp.non_finite || !(rt_cmp.rel_err < 1e-2)) {
      WEFT_WARN(kKernel,
                "rank %d: ag_gemm_nodes: the runtime op's C differs from cuBLAS: rel err %.3g, %lld elements "
                "not finite",
                info.rank, rt_cmp.rel_err, static_cast<long long>(rt_cmp.non_finite));
      return Status::kInternal;
    }
  }
  const double f = timer.ms(0), s = timer.ms(1), g = timer.ms(2), c = timer.ms(3), wg = timer.ms(4);
  double ga = 0;
  WEFT_CHECK(max_over_ranks(boot, "weft.ag_gemm_nodes.t_gather", t_gather, &ga));
  const double flops = 2.0 * double(op.m) * double(op.n) * double(op.k);
  auto tf = [&](double ms) { return flops / (ms * 1e-3) / 1e12; };
  // Bytes each rank's proxy moves per run: its shard to each other node's rail peer.
  const double net_gb = double(op.shard_bytes) * double(op.plan.sends.size()) / 1e9;
  const double bound = std::max(g, c);
  const uint64_t runs = uint64_t(warm + iters);
  char note[256];
  std::vector<ResultRow> rows;
  snprintf(note, sizeof note,
           "%.2fx bound, %.2fx faster than nccl+cublas; roles compute %d intra_comm %d inter_send %d", f / bound, s / f,
           op.roles.compute, op.roles.intra_comm, op.roles.inter_send);
  rows.push_back({"weft fused (one launch)", f, tf(f), note});
  snprintf(note, sizeof note, "sequential baseline, NCCL_HOSTID per node");
  rows.push_back({"nccl all-gather + cublas", s, tf(s), note});
  rows.push_back({"cublas gemm alone", g, tf(g), ""});
  rows.push_back({"nccl all-gather alone", c, 0, "NCCL_HOSTID per node"});
  rows.push_back({"bound", bound, tf(bound), "max(gemm, all-gather)"});
  snprintf(note, sizeof note, "%d compute blocks", op.roles.compute);
  rows.push_back({"weft gemm alone (no wait)", wg, tf(wg), note});
  snprintf(note, sizeof note,
           "%s, %s, %d channel(s), %d chunks of %.1f MiB; %.2f GB/s out per rank; per run: puts %.1f "
           "signals %.1f fences %.1f batches %.1f stalls %.1f",
           op.tp->backend_name().c_str(), transport::to_string(op.tp->signal_mode()), op.channels, op.chunks,
           double(op.chunk_bytes) / (1 << 20), net_gb / (ga * 1e-3), double(c1.puts - c0.puts) / runs,
           double(c1.signals - c0.signals) / runs, double(c1.fences - c0.fences) / runs,
           double(c1.batches - c0.batches) / runs, double(c1.stalls - c0.stalls) / runs);
  rows.push_back({"weft gather alone (hierarchical)", ga, 0, note});
  if (rt) {
    snprintf(note, sizeof note, "%.3fx the runner's row; the runner's roles; shard copied in per call",
             timer.ms(5) / f);
    rows.push_back({"weft runtime op, same roles", timer.ms(5), tf(timer.ms(5)), note});
    snprintf(note, sizeof note, "the model's plan: compute %d intra_comm %d inter_send %d; C rel err %.1e",
             model.roles.compute, model.roles.intra_comm, model.roles.inter_send, rt_cmp.rel_err);
    rows.push_back({"weft runtime op, the plan", timer.ms(6), tf(timer.ms(6)), note});
  }
  if (plan.makespan_s > 0) {
    snprintf(note, sizeof note, "tuner: compute %d intra %d inter %d, limited by %s", plan.roles.compute,
             plan.roles.intra_comm, plan.roles.inter_send, plan.limited_by.c_str());
    rows.push_back({"tuner prediction", plan.makespan_s * 1e3, tf(plan.makespan_s * 1e3), note});
  }
  char title[256];
  snprintf(title, sizeof title,
           "ag_gemm %s: M %lld x N %lld (per rank) x K %lld, %d ranks on %d nodes, median of %d, "
           "max over ranks; the op and its baselines interleaved",
           wl.name.c_str(), static_cast<long long>(op.m), static_cast<long long>(op.n), static_cast<long long>(op.k),
           op.world, op.plan.nodes, iters);
  char extra[256];
  snprintf(extra, sizeof extra,
           "\"op\": \"ag_gemm\", \"m\": %lld, \"n\": %lld, \"k\": %lld, \"world\": %d, \"nodes\": %d, "
           "\"signal_mode\": \"%s\", \"channels\": %d, \"chunks\": %d",
           static_cast<long long>(op.m), static_cast<long long>(op.n), static_cast<long long>(op.k), op.world,
           op.plan.nodes, transport::to_string(op.tp->signal_mode()), op.channels, op.chunks);
  print_results(boot, title, rows, extra);

  // Every rank has what it waited for once all are here: then the proxies may stop.
  WEFT_CUDA_CHECK(cudaStreamSynchronize(op.main));
  rt_same.reset(), rt_model.reset();
  if (rt_ctx) WEFT_CHECK(boot.barrier("weft.ag_gemm_nodes.runtime_done"));  // nobody frees a heap a peer reads
  rt_ctx.reset();
  if (rt_c) cudaFree(rt_c);
  WEFT_CHECK(op.tp->flush());
  WEFT_CHECK(boot.barrier("weft.ag_gemm_nodes.done"));
  op.tp = nullptr;
  op.ctx.reset();  // its rings, transport and (collective close) heap
  cublasDestroy(blas);
  ncclCommDestroy(comm);
  return Status::kOk;
}

}  // namespace weft::runtime::ops
