// AllGather+GEMM on one node: C_r = gather(A) · B_rᵀ in one persistent GEMM launch per rank.
//
//   rank r holds A_r (m/W × k), its weight block B_r (n/W × k); every rank gets C_r (m × n/W).
//
//   copy stream (no SMs):  pull A_{r+1} from peer r+1 over NVLink ─► flag[r+1] = epoch
//                          pull A_{r+2} ...                      ─► flag[r+2] = epoch   ...
//   GEMM (all SMs):        shard r (local, flag set up front) ─► shard r+1 (waits flag[r+1]) ─► ...
//
// The copy engines move the shards while every SM computes; the GEMM's producer warp waits on a
// shard's flag (acquire, bounded by WEFT_DEVICE_TIMEOUT) before loading its first tile, so the
// first shard's compute hides the later shards' transfers. Flags carry a rising epoch, so the
// buffers are reused across runs without resets. Validation: the gathered A must equal NCCL's
// all-gather bit for bit (a misrouted shard names its rank, since every rank's random data is
// seeded by its rank), and C must match cuBLAS on NCCL's gathered A.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/gemm.h"
#include "launcher/op_registry.h"
#include "runtime/log.h"
#include "runtime/ops/cuda_check.h"
#include "runtime/ops/device_data.h"
#include "runtime/ops/op_harness.h"
#include "runtime/ops/ops.h"
#include "runtime/workload.h"

namespace weft::runtime::ops {
namespace {

using bf16 = __nv_bfloat16;

struct AgGemm {
  int rank = 0, world = 1;
  int64_t m = 0, n = 0, k = 0, m_loc = 0;  // n is this rank's block
  PeerBuffer a_full;                       // m × k, shard s at rows [s·m_loc, (s+1)·m_loc)
  bf16 *b = nullptr, *c = nullptr, *c_ref = nullptr, *a_nccl = nullptr;
  uint64_t* flags = nullptr;               // per shard, local
  uint64_t epoch = 0;
  cudaStream_t main = nullptr, copy = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  kernels::GemmParams gemm;
  kernels::FrameHost frame;
  kernels::FrameParams frame_params;
  RoleCounts roles;

  bf16* shard(int s) const { return a_full.local<bf16>() + int64_t(s) * m_loc * k; }
  const bf16* peer_shard(int s) const { return a_full.peer<bf16>(s) + int64_t(s) * m_loc * k; }

  // One fused run: enqueue copies + flag writes on the copy stream, the gated GEMM on main.
  Status enqueue_fused() {
    ++epoch;
    WEFT_CUDA_CHECK(cudaEventRecord(fork, main));
    WEFT_CUDA_CHECK(cudaStreamWaitEvent(copy, fork));
    WEFT_CHECK(stream_write_u64(main, flags + rank, epoch));
    for (int i = 1; i < world; ++i) {
      const int s = (rank + i) % world;
      WEFT_CUDA_CHECK(cudaMemcpyAsync(shard(s), peer_shard(s), size_t(m_loc * k) * sizeof(bf16),
                                      cudaMemcpyDeviceToDevice, copy));
      WEFT_CHECK(stream_write_u64(copy, flags + s, epoch));
    }
    kernels::EpiStoreBf16 epi{c, n, n % 2 == 0};
    kernels::FlagGate gate{flags, kernels::kFlagPerShard, epoch};
    WEFT_CHECK(kernels::launch_gemm(gemm, frame_params, epi, gate, kernels::TileSignal{}, main));
    WEFT_CUDA_CHECK(cudaEventRecord(join, copy));
    WEFT_CUDA_CHECK(cudaStreamWaitEvent(main, join));
    return Status::kOk;
  }

  // The copy-engine gather alone (what the fused run must hide).
  Status enqueue_gather_only() {
    WEFT_CUDA_CHECK(cudaEventRecord(fork, main));
    WEFT_CUDA_CHECK(cudaStreamWaitEvent(copy, fork));
    for (int i = 1; i < world; ++i) {
      const int s = (rank + i) % world;
      WEFT_CUDA_CHECK(cudaMemcpyAsync(shard(s), peer_shard(s), size_t(m_loc * k) * sizeof(bf16),
                                      cudaMemcpyDeviceToDevice, copy));
    }
    WEFT_CUDA_CHECK(cudaEventRecord(join, copy));
    WEFT_CUDA_CHECK(cudaStreamWaitEvent(main, join));
    return Status::kOk;
  }

  Status enqueue_gemm_only() {
    kernels::EpiStoreBf16 epi{c, n, n % 2 == 0};
    return kernels::launch_gemm(gemm, frame_params, epi, kernels::FlagGate{}, kernels::TileSignal{}, main);
  }

  ~AgGemm() {
    cudaDeviceSynchronize();
    for (void* p : {static_cast<void*>(b), static_cast<void*>(c), static_cast<void*>(c_ref),
                    static_cast<void*>(a_nccl), static_cast<void*>(flags)})
      if (p) cudaFree(p);
    if (fork) cudaEventDestroy(fork);
    if (join) cudaEventDestroy(join);
    if (copy) cudaStreamDestroy(copy);
    if (main) cudaStreamDestroy(main);
  }
};

Status validate(AgGemm& op, ncclComm_t comm, cublasHandle_t blas, const Workload& wl) {
  const int64_t a_elems = op.m * op.k, c_elems = op.m * op.n;
  // Poison everything the fused run must write (the peers' shards and C).
  for (int s = 0; s < op.world; ++s)
    if (s != op.rank) WEFT_CHECK(poison_bf16(op.shard(s), op.m_loc * op.k, op.main));
  WEFT_CHECK(poison_bf16(op.c, c_elems, op.main));
  WEFT_CHECK(op.enqueue_fused());
  WEFT_CUDA_CHECK(cudaStreamSynchronize(op.main));
  WEFT_CHECK(op.frame.check("ag_gemm"));
  // Reference: NCCL all-gather of the shards, then cuBLAS.
  WEFT_NCCL_CHECK(ncclAllGather(op.shard(op.rank), op.a_nccl, size_t(op.m_loc * op.k), ncclBfloat16, comm, op.main));
  WEFT_CHECK(cublas_gemm_tn(blas, op.m, op.n, op.k, op.a_nccl, op.k, op.b, op.k, op.c_ref, op.n, op.main));
  for (int s = 0; s < op.world; ++s) {
    Comparison cmp;
    WEFT_CHECK(compare_bf16(op.shard(s), op.a_nccl + s * op.m_loc * op.k, op.m_loc * op.k, op.main, &cmp));
    if (cmp.mismatched) {
      WEFT_WARN(kKernel, "rank %d: ag_gemm: gathered shard of rank %d differs from NCCL's all-gather in %lld of %lld "
                "elements (first at %lld): shard misrouted or not delivered", op.rank, s,
                static_cast<long long>(cmp.mismatched), static_cast<long long>(op.m_loc * op.k),
                static_cast<long long>(cmp.first_mismatch));
      return Status::kInternal;
    }
  }
  Comparison cmp;
  WEFT_CHECK(compare_bf16(op.c, op.c_ref, c_elems, op.main, &cmp));
  const double tol = 1e-2;  // bf16 output rounding is ~2e-3
  if (cmp.non_finite || !(cmp.rel_err < tol)) {
    WEFT_WARN(kKernel, "rank %d: ag_gemm (%s): C differs from cuBLAS: rel err %.3g (tolerance %.0e), %lld elements "
              "not written or not finite", op.rank, wl.name.c_str(), cmp.rel_err, tol,
              static_cast<long long>(cmp.non_finite));
    return Status::kInternal;
  }
  printf("rank %d: ag_gemm validated: gathered A equals NCCL's bit for bit; C vs cuBLAS rel err %.2e, "
         "%lld of %lld elements bit-identical\n", op.rank, cmp.rel_err,
         static_cast<long long>(c_elems - cmp.mismatched), static_cast<long long>(c_elems));
  (void)a_elems;
  return Status::kOk;
}

}  // namespace

Status run_ag_gemm(const launcher::RankContext& ctx, const Workload& wl, bootstrap::Bootstrap& boot) {
  const auto& info = boot.info();
  if (ctx.gpu < 0) {
    WEFT_WARN(kKernel, "rank %d: ag_gemm needs a GPU and this rank has none", info.rank);
    return Status::kUnsupported;
  }
  if (info.num_nodes > 1) return run_ag_gemm_nodes(ctx, wl, boot);  // across nodes: ag_gemm_nodes_op.cpp
  if (wl.world_size() != info.size) {
    WEFT_WARN(kKernel, "rank %d: %s needs %d ranks (layout %d x %d) but the job has %d", info.rank,
              wl.source.c_str(), wl.world_size(), wl.layout.nodes, wl.layout.gpus_per_node, info.size);
    return Status::kInvalidArgument;
  }
  if ((wl.gemm.m / info.size) % kernels::GemmConfig::kTileM != 0) {
    WEFT_WARN(kKernel, "rank %d: %s: ag_gemm needs m / ranks (%lld) to be a multiple of %d rows: a tile must not "
              "span two ranks' shards", info.rank, wl.source.c_str(), static_cast<long long>(wl.gemm.m / info.size),
              kernels::GemmConfig::kTileM);
    return Status::kInvalidArgument;
  }
  AgGemm op;
  op.rank = info.rank;
  op.world = info.size;
  const GemmShard sh = wl.gemm_shard();
  op.m = wl.gemm.m;
  op.k = wl.gemm.k;
  op.n = sh.n;
  op.m_loc = op.m / op.world;

  const Plan plan = plan_for(wl, info.rank);
  int sms = 0;
  WEFT_CHECK(kernels::device_sm_count(&sms));
  // Copy engines move the shards: every SM computes (the plan's intra_comm SMs are not needed).
  op.roles.compute = sms - sms % 2;

  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&op.main, cudaStreamNonBlocking));
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&op.copy, cudaStreamNonBlocking));
  WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&op.fork, cudaEventDisableTiming));
  WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&op.join, cudaEventDisableTiming));
  WEFT_CHECK(PeerBuffer::create(boot, size_t(op.m * op.k) * sizeof(bf16), "ag_gemm.a", &op.a_full));
  WEFT_CUDA_CHECK(cudaMalloc(&op.b, size_t(op.n * op.k) * sizeof(bf16)));
  WEFT_CUDA_CHECK(cudaMalloc(&op.c, size_t(op.m * op.n) * sizeof(bf16)));
  WEFT_CUDA_CHECK(cudaMalloc(&op.c_ref, size_t(op.m * op.n) * sizeof(bf16)));
  WEFT_CUDA_CHECK(cudaMalloc(&op.a_nccl, size_t(op.m * op.k) * sizeof(bf16)));
  WEFT_CUDA_CHECK(cudaMalloc(&op.flags, sizeof(uint64_t) * op.world));
  WEFT_CUDA_CHECK(cudaMemset(op.flags, 0, sizeof(uint64_t) * op.world));

  // Fresh inputs every run: the seed comes from rank 0's clock, shards are seeded by rank.
  uint64_t seed = 0;
  WEFT_CHECK(shared_seed(boot, "weft.ag_gemm.seed", &seed));
  WEFT_CHECK(fill_random_bf16(op.shard(op.rank), op.m_loc * op.k, seed, op.rank, 1.0f, op.main));
  WEFT_CHECK(fill_random_bf16(op.b, op.n * op.k, seed + 1, op.rank, 1.0f, op.main));
  WEFT_CUDA_CHECK(cudaStreamSynchronize(op.main));
  WEFT_CHECK(boot.barrier("weft.ag_gemm.inputs"));  // every shard written before anyone pulls

  kernels::GemmArgs args;
  args.m = op.m;
  args.n = op.n;
  args.k = op.k;
  args.a = op.a_full.local<bf16>();
  args.b = op.b;
  args.num_shards = op.world;
  args.first_shard = op.rank;
  WEFT_CHECK(kernels::make_gemm_params(args, &op.gemm));
  WEFT_CHECK(op.frame.create(op.rank));
  WEFT_CHECK(op.frame.params(op.roles, &op.frame_params));

  ncclComm_t comm = nullptr;
  WEFT_CHECK(create_nccl_comm(boot, &comm));
  cublasHandle_t blas = nullptr;
  WEFT_CUBLAS_CHECK(cublasCreate(&blas));

  if (wl.run.validate) WEFT_CHECK(validate(op, comm, blas, wl));

  const int warm = wl.run.warmup, iters = wl.run.iters;
  double t_fused = 0, t_seq = 0, t_gemm = 0, t_comm = 0, t_weft_gemm = 0, t_ce = 0;
  WEFT_CHECK(time_op(comm, op.main, warm, iters, [&] { return op.enqueue_fused(); }, &t_fused));
  WEFT_CHECK(op.frame.check("ag_gemm"));
  WEFT_CHECK(time_op(comm, op.main, warm, iters, [&]() -> Status {
    WEFT_NCCL_CHECK(ncclAllGather(op.shard(op.rank), op.a_nccl, size_t(op.m_loc * op.k), ncclBfloat16, comm, op.main));
    return cublas_gemm_tn(blas, op.m, op.n, op.k, op.a_nccl, op.k, op.b, op.k, op.c_ref, op.n, op.main);
  }, &t_seq));
  WEFT_CHECK(time_op(comm, op.main, warm, iters, [&] {
    return cublas_gemm_tn(blas, op.m, op.n, op.k, op.a_nccl, op.k, op.b, op.k, op.c_ref, op.n, op.main);
  }, &t_gemm));
  WEFT_CHECK(time_op(comm, op.main, warm, iters, [&]() -> Status {
    WEFT_NCCL_CHECK(ncclAllGather(op.shard(op.rank), op.a_nccl, size_t(op.m_loc * op.k), ncclBfloat16, comm, op.main));
    return Status::kOk;
  }, &t_comm));
  WEFT_CHECK(time_op(comm, op.main, warm, iters, [&] { return op.enqueue_gemm_only(); }, &t_weft_gemm));
  WEFT_CHECK(time_op(comm, op.main, warm, iters, [&] { return op.enqueue_gather_only(); }, &t_ce));

  double f, s, g, c, wg, ce;
  WEFT_CHECK(max_over_ranks(boot, "weft.ag_gemm.t_fused", t_fused, &f));
  WEFT_CHECK(max_over_ranks(boot, "weft.ag_gemm.t_seq", t_seq, &s));
  WEFT_CHECK(max_over_ranks(boot, "weft.ag_gemm.t_gemm", t_gemm, &g));
  WEFT_CHECK(max_over_ranks(boot, "weft.ag_gemm.t_comm", t_comm, &c));
  WEFT_CHECK(max_over_ranks(boot, "weft.ag_gemm.t_wgemm", t_weft_gemm, &wg));
  WEFT_CHECK(max_over_ranks(boot, "weft.ag_gemm.t_ce", t_ce, &ce));
  const double flops = 2.0 * double(op.m) * double(op.n) * double(op.k);
  auto tf = [&](double ms) { return flops / (ms * 1e-3) / 1e12; };
  const double bound = std::max(g, c);
  char note[160];
  std::vector<ResultRow> rows;
  snprintf(note, sizeof note, "%.2fx bound, %.2fx faster than nccl+cublas; roles compute %d (copy engines move A)",
           f / bound, s / f, op.roles.compute);
  rows.push_back({"weft fused (one launch)", f, tf(f), note});
  rows.push_back({"nccl all-gather + cublas", s, tf(s), "sequential baseline"});
  rows.push_back({"cublas gemm alone", g, tf(g), ""});
  rows.push_back({"nccl all-gather alone", c, 0, ""});
  snprintf(note, sizeof note, "max(gemm, all-gather)");
  rows.push_back({"bound", bound, tf(bound), note});
  rows.push_back({"weft gemm alone (no wait)", wg, tf(wg), ""});
  rows.push_back({"copy-engine gather alone", ce, 0, ""});
  if (plan.makespan_s > 0) {
    snprintf(note, sizeof note, "tuner: compute %d intra %d, limited by %s", plan.roles.compute, plan.roles.intra_comm,
             plan.limited_by.c_str());
    rows.push_back({"tuner prediction", plan.makespan_s * 1e3, tf(plan.makespan_s * 1e3), note});
  }
  char title[256];
  snprintf(title, sizeof title, "ag_gemm %s: M %lld x N %lld (per rank) x K %lld, %d ranks, median of %d, max over ranks",
           wl.name.c_str(), static_cast<long long>(op.m), static_cast<long long>(op.n), static_cast<long long>(op.k),
           op.world, iters);
  char extra[256];
  snprintf(extra, sizeof extra, "\"op\": \"ag_gemm\", \"m\": %lld, \"n\": %lld, \"k\": %lld, \"world\": %d",
           static_cast<long long>(op.m), static_cast<long long>(op.n), static_cast<long long>(op.k), op.world);
  print_results(boot, title, rows, extra);

  cublasDestroy(blas);
  ncclCommDestroy(comm);
  return Status::kOk;
}

}  // namespace weft::runtime::ops
