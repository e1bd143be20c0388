// GEMM+ReduceScatter and GEMM+AllReduce on one node: K is split across ranks; each owner's block of
// partial rows leaves for its owner as soon as the GEMM has finished it.
//
//   rank r: A_r (m × k/W), B_r (n × k/W)  ─►  partial P_r = A_r · B_rᵀ (m × n), stored locally
//   GEMM (all SMs), tile order: owners r+1, r+2, …, r; after each tile: tiles[owner] += 1
//   copy stream (no SMs): wait tiles[o] == e·tiles_per_owner and freed[o] >= e-1 ─► copy P_r rows
//        of owner o into o's staging slot r over NVLink  ─►  done[r] = e on every owner
//   owner: waits for all W slots (bounded), sums them in slot order (same bits every run) ─►
//        RS: its m/W rows;  AR: its rows written into every rank's C, then gathered[r] = e on every
//        rank; each rank's op ends when all W blocks are in (bounded wait).
//   freed[o] = e (set by owner o on every writer after summing) keeps a slot from being
//   overwritten before it was read.
//
// Stores from the GEMM epilogue straight into peers' memory were measured slower (scattered 4-byte
// writes over NVLink, docs/ops.md); whole row blocks through the copy engines move at link speed.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/gemm.h"
#include "kernels/reduce_slots.h"
#include "launcher/op_registry.h"
#include "runtime/log.h"
#include "runtime/ops/cuda_check.h"
#include "runtime/ops/device_data.h"
#include "runtime/ops/op_harness.h"
#include "runtime/ops/ops.h"
#include "runtime/params.h"
#include "runtime/workload.h"

namespace weft::runtime::ops {
namespace {

using bf16 = __nv_bfloat16;

struct GemmReduce {
  bool all_reduce = false;
  bool sharded = true;  // owners' row blocks are whole tiles: copies start per owner during the GEMM
  int rank = 0, world = 1;
  int64_t m = 0, n = 0, k_loc = 0, m_loc = 0;
  uint64_t tiles_per_owner = 0;
  bf16 *a = nullptr, *b = nullptr, *out = nullptr, *ref = nullptr, *partial = nullptr;
  uint64_t* tiles = nullptr;  // per owner: finished tiles of its rows, local
  PeerBuffer staging;  // W slots of m_loc × n
  PeerBuffer c_full;   // AllReduce: m × n on every rank
  PeerBuffer done, freed, gathered;  // W uint64 flags each
  uint64_t epoch = 0;
  int reduce_blocks = 0;
  cudaStream_t main = nullptr, copy = nullptr;
  cudaEvent_t fork = nullptr, gemm_done = nullptr, join = nullptr;
  kernels::GemmParams gemm;
  kernels::FrameHost frame;
  kernels::FrameParams frame_params;
  RoleCounts roles;

  kernels::FlagTargets flags_on_every_rank(const PeerBuffer& buf) const {
    kernels::FlagTargets t;
    t.count = world;
    for (int s = 0; s < world; ++s) t.addr[s] = buf.peer<uint64_t>(s) + rank;
    return t;
  }

  Status enqueue_fused() {
    ++epoch;
    WEFT_CUDA_CHECK(cudaEventRecord(fork, main));
    WEFT_CUDA_CHECK(cudaStreamWaitEvent(copy, fork));
    kernels::EpiStoreBf16 epi{partial, n, n % 2 == 0};
    kernels::TileSignal signal{sharded ? tiles : nullptr, kernels::kFlagPerShard, 1};
    WEFT_CHECK(kernels::launch_gemm(gemm, frame_params, epi, kernels::FlagGate{}, signal, main));
    if (!sharded) {
      WEFT_CUDA_CHECK(cudaEventRecord(gemm_done, main));
      WEFT_CUDA_CHECK(cudaStreamWaitEvent(copy, gemm_done));
    }
    for (int i = 1; i <= world; ++i) {
      const int o = (rank + i) % world;
      if (sharded) WEFT_CHECK(stream_wait_u64_geq(copy, tiles + o, epoch * tiles_per_owner));
      WEFT_CHECK(stream_wait_u64_geq(copy, freed.local<uint64_t>() + o, epoch - 1));
      WEFT_CUDA_CHECK(cudaMemcpyAsync(staging.peer<bf16>(o) + int64_t(rank) * m_loc * n, partial + o * m_loc * n,
                                      size_t(m_loc * n) * sizeof(bf16), cudaMemcpyDeviceToDevice, copy));
    }
    WEFT_CHECK(kernels::launch_store_flags(flags_on_every_rank(done), epoch, copy));
    WEFT_CUDA_CHECK(cudaEventRecord(join, copy));
    WEFT_CUDA_CHECK(cudaStreamWaitEvent(main, join));
    kernels::ReduceSlotsArgs red;
    red.arrived = done.local<uint64_t>();
    red.slots = world;
    red.expected = epoch;
    red.base = staging.local<bf16>();
    red.elems = m_loc * n;
    if (all_reduce) {
      red.ndst = world;
      for (int s = 0; s < world; ++s) red.dst[s] = c_full.peer<bf16>(s) + int64_t(rank) * m_loc * n;
    } else {
      red.ndst = 1;
      red.dst[0] = out;
    }
    WEFT_CHECK(kernels::launch_reduce_slots(red, frame_params, reduce_blocks, main));
    WEFT_CHECK(kernels::launch_store_flags(flags_on_every_rank(freed), epoch, main));
    if (all_reduce) {
      WEFT_CHECK(kernels::launch_store_flags(flags_on_every_rank(gathered), epoch, main));
      WEFT_CHECK(kernels::launch_wait_flags(gathered.local<uint64_t>(), world, epoch, frame_params, main));
    }
    return Status::kOk;
  }

  // A failed GEMM never completes its tile counts, and a failed peer never frees its slot: raise
  // the flags the copy stream waits on so it drains and the error can be reported.
  void unstick() {
    cudaStream_t s = nullptr;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return;
    std::vector<uint64_t> big(size_t(world), ~0ull >> 1);
    cudaMemcpyAsync(tiles, big.data(), sizeof(uint64_t) * world, cudaMemcpyHostToDevice, s);
    cudaMemcpyAsync(freed.local<uint64_t>(), big.data(), sizeof(uint64_t) * world, cudaMemcpyHostToDevice, s);
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
  }

  Status sync(const char* what) {
    return sync_bounded(main, 2 * param_double_or_default("WEFT_DEVICE_TIMEOUT"), what, [this] { unstick(); });
  }

  bf16* result() const { return all_reduce ? c_full.local<bf16>() : out; }
  int64_t result_elems() const { return all_reduce ? m * n : m_loc * n; }

  ~GemmReduce() {
    cudaDeviceSynchronize();
    for (void* p : {static_cast<void*>(a), static_cast<void*>(b), static_cast<void*>(out), static_cast<void*>(ref),
                    static_cast<void*>(partial), static_cast<void*>(tiles)})
      if (p) cudaFree(p);
    for (cudaEvent_t e : {fork, gemm_done, join})
      if (e) cudaEventDestroy(e);
    if (copy) cudaStreamDestroy(copy);
    if (main) cudaStreamDestroy(main);
  }
};

// The NCCL + cuBLAS sequence: partial GEMM, then reduce-scatter or all-reduce.
Status enqueue_sequence(GemmReduce& op, ncclComm_t comm, cublasHandle_t blas) {
  WEFT_CHECK(cublas_gemm_tn(blas, op.m, op.n, op.k_loc, op.a, op.k_loc, op.b, op.k_loc, op.partial, op.n, op.main));
  if (op.all_reduce)
    WEFT_NCCL_CHECK(ncclAllReduce(op.partial, op.ref, size_t(op.m * op.n), ncclBfloat16, ncclSum, comm, op.main));
  else
    WEFT_NCCL_CHECK(ncclReduceScatter(op.partial, op.ref, size_t(op.m_loc * op.n), ncclBfloat16, ncclSum, comm, op.main));
  return Status::kOk;
}

Status validate(GemmReduce& op, ncclComm_t comm, cublasHandle_t blas, const char* name, bool deterministic) {
  WEFT_CHECK(poison_bf16(op.result(), op.result_elems(), op.main));
  WEFT_CUDA_CHECK(cudaStreamSynchronize(op.main));
  // Every rank's output is poisoned before anyone's fused run writes into it.
  WEFT_NCCL_CHECK(ncclAllReduce(op.partial, op.partial, 1, ncclBfloat16, ncclSum, comm, op.main));
  WEFT_CHECK(op.enqueue_fused());
  Status synced = op.sync(name);
  WEFT_CHECK(op.frame.check(name));
  WEFT_CHECK(synced);
  WEFT_CHECK(enqueue_sequence(op, comm, blas));
  Comparison cmp;
  WEFT_CHECK(compare_bf16(op.result(), op.ref, op.result_elems(), op.main, &cmp));
  // Both sides round each rank's partial to bf16 and sum W of them: the difference is summation
  // order and rounding, a few bf16 ulps.
  const double tol = 1e-2;
  if (cmp.non_finite || !(cmp.rel_err < tol)) {
    WEFT_WARN(kKernel, "rank %d: %s: result differs from cuBLAS + NCCL: rel err %.3g (tolerance %.0e), %lld elements "
              "not written or not finite (first bad element %lld)", op.rank, name, cmp.rel_err, tol,
              static_cast<long long>(cmp.non_finite), static_cast<long long>(cmp.first_mismatch));
    return Status::kInternal;
  }
  printf("rank %d: %s validated against cuBLAS + NCCL: rel err %.2e, every element written\n", op.rank, name,
         cmp.rel_err);
  if (deterministic) {
    // WEFT_DETERMINISTIC: the slots are summed in a fixed order, so a second run gives the same bits.
    WEFT_CUDA_CHECK(cudaMemcpyAsync(op.ref, op.result(), size_t(op.result_elems()) * sizeof(bf16),
                                    cudaMemcpyDeviceToDevice, op.main));
    WEFT_CHECK(op.enqueue_fused());
    WEFT_CHECK(op.sync(name));
    WEFT_CHECK(compare_bf16(op.result(), op.ref, op.result_elems(), op.main, &cmp));
    WEFT_CHECK(op.frame.check(name));
    if (cmp.mismatched) {
      WEFT_WARN(kKernel, "rank %d: %s: WEFT_DETERMINISTIC=1 but a second run differs in %lld elements", op.rank,
                name, static_cast<long long>(cmp.mismatched));
      return Status::kInternal;
    }
    printf("rank %d: %s repeated bit for bit (WEFT_DETERMINISTIC=1)\n", op.rank, name);
  }
  return Status::kOk;
}

Status run_gemm_reduce(const launcher::RankContext& ctx, const Workload& wl, bootstrap::Bootstrap& boot,
                       bool all_reduce) {
  const auto& info = boot.info();
  const char* name = all_reduce ? "gemm_ar" : "gemm_rs";
  if (ctx.gpu < 0) {
    WEFT_WARN(kKernel, "rank %d: %s needs a GPU and this rank has none", info.rank, name);
    return Status::kUnsupported;
  }
  if (info.num_nodes > 1) {
    WEFT_WARN(kKernel, "rank %d: %s across %d nodes needs the proxy path, which the fused kernel does not drive yet; "
              "run it on one node (layout.nodes: 1)", info.rank, name, info.num_nodes);
    return Status::kUnsupported;
  }
  if (wl.world_size() != info.size || info.size > kernels::EpiScatterBf16::kMaxOwners) {
    WEFT_WARN(kKernel, "rank %d: %s needs %d ranks (at most %d on one node) but the job has %d", info.rank, name,
              wl.world_size(), kernels::EpiScatterBf16::kMaxOwners, info.size);
    return Status::kInvalidArgument;
  }
  GemmReduce op;
  op.all_reduce = all_reduce;
  op.rank = info.rank;
  op.world = info.size;
  op.m = wl.gemm.m;
  op.n = wl.gemm.n;
  op.k_loc = wl.gemm.k / op.world;
  op.m_loc = op.m / op.world;
  if (op.m % op.world || (op.m_loc * op.n) % 8) {
    WEFT_WARN(kKernel, "rank %d: %s: %s: m %lld must split into %d row blocks of a multiple of 8 elements", info.rank,
              name, wl.source.c_str(), static_cast<long long>(op.m), op.world);
    return Status::kInvalidArgument;
  }

  const Plan plan = plan_for(wl, info.rank);
  int sms = 0;
  WEFT_CHECK(kernels::device_sm_count(&sms));
  op.roles.compute = sms - sms % 2;
  op.reduce_blocks = sms * 2;
  bool deterministic = false;
  WEFT_CHECK(get_param("WEFT_DETERMINISTIC", &deterministic));

  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&op.main, cudaStreamNonBlocking));
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&op.copy, cudaStreamNonBlocking));
  for (cudaEvent_t* e : {&op.fork, &op.gemm_done, &op.join})
    WEFT_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  WEFT_CUDA_CHECK(cudaMalloc(&op.tiles, sizeof(uint64_t) * op.world));
  WEFT_CUDA_CHECK(cudaMemset(op.tiles, 0, sizeof(uint64_t) * op.world));
  WEFT_CUDA_CHECK(cudaMalloc(&op.a, size_t(op.m * op.k_loc) * sizeof(bf16)));
  WEFT_CUDA_CHECK(cudaMalloc(&op.b, size_t(op.n * op.k_loc) * sizeof(bf16)));
  WEFT_CUDA_CHECK(cudaMalloc(&op.partial, size_t(op.m * op.n) * sizeof(bf16)));
  WEFT_CUDA_CHECK(cudaMalloc(&op.ref, size_t(op.result_elems()) * sizeof(bf16)));
  if (!all_reduce) WEFT_CUDA_CHECK(cudaMalloc(&op.out, size_t(op.m_loc * op.n) * sizeof(bf16)));
  std::string key = std::string(name) + ".";
  WEFT_CHECK(PeerBuffer::create(boot, size_t(op.world * op.m_loc * op.n) * sizeof(bf16), (key + "staging").c_str(),
                                &op.staging));
  if (all_reduce)
    WEFT_CHECK(PeerBuffer::create(boot, size_t(op.m * op.n) * sizeof(bf16), (key + "c").c_str(), &op.c_full));
  for (auto* f : {&op.done, &op.freed, &op.gathered}) {
    const char* which = f == &op.done ? "done" : f == &op.freed ? "freed" : "gathered";
    WEFT_CHECK(PeerBuffer::create(boot, sizeof(uint64_t) * op.world, (key + which).c_str(), f));
    WEFT_CUDA_CHECK(cudaMemset(f->local<void>(), 0, sizeof(uint64_t) * op.world));
  }

  uint64_t seed = 0;
  WEFT_CHECK(shared_seed(boot, key + "seed", &seed));
  WEFT_CHECK(fill_random_bf16(op.a, op.m * op.k_loc, seed, op.rank, 1.0f, op.main));
  WEFT_CHECK(fill_random_bf16(op.b, op.n * op.k_loc, seed + 1, op.rank, 1.0f, op.main));
  WEFT_CUDA_CHECK(cudaStreamSynchronize(op.main));
  WEFT_CUDA_CHECK(cudaDeviceSynchronize());
  WEFT_CHECK(boot.barrier(key + "inputs"));  // flags zeroed everywhere before anyone signals

  kernels::GemmArgs args;
  args.m = op.m;
  args.n = op.n;
  args.k = op.k_loc;
  args.a = op.a;
  args.b = op.b;
  // Remote owners' rows first, own rows last, when the owners' row blocks are whole tiles; a small
  // M (decode-like) runs in plain order: the epilogue still sends every row to its owner.
  op.sharded = op.m_loc % kernels::GemmConfig::kTileM == 0;
  args.num_shards = op.sharded ? op.world : 1;
  args.first_shard = op.sharded ? (op.rank + 1) % op.world : 0;
  WEFT_CHECK(kernels::make_gemm_params(args, &op.gemm));
  op.tiles_per_owner = uint64_t(op.m_loc / kernels::GemmConfig::kTileM) * uint64_t(op.gemm.n_blocks);
  WEFT_CHECK(op.frame.create(op.rank));
  WEFT_CHECK(op.frame.params(op.roles, &op.frame_params));

  ncclComm_t comm = nullptr;
  WEFT_CHECK(create_nccl_comm(boot, &comm));
  cublasHandle_t blas = nullptr;
  WEFT_CUBLAS_CHECK(cublasCreate(&blas));

  if (wl.run.validate) WEFT_CHECK(validate(op, comm, blas, name, deterministic));

  const int warm = wl.run.warmup, iters = wl.run.iters;
  double t[5] = {};
  WEFT_CHECK(time_op(comm, op.main, warm, iters, [&] { return op.enqueue_fused(); }, &t[0], [&] { op.unstick(); }));
  WEFT_CHECK(op.frame.check(name));
  WEFT_CHECK(time_op(comm, op.main, warm, iters, [&] { return enqueue_sequence(op, comm, blas); }, &t[1]));
  WEFT_CHECK(time_op(comm, op.main, warm, iters, [&] {
    return cublas_gemm_tn(blas, op.m, op.n, op.k_loc, op.a, op.k_loc, op.b, op.k_loc, op.partial, op.n, op.main);
  }, &t[2]));
  WEFT_CHECK(time_op(comm, op.main, warm, iters, [&]() -> Status {
    if (op.all_reduce)
      WEFT_NCCL_CHECK(ncclAllReduce(op.partial, op.ref, size_t(op.m * op.n), ncclBfloat16, ncclSum, comm, op.main));
    else
      WEFT_NCCL_CHECK(ncclReduceScatter(op.partial, op.ref, size_t(op.m_loc * op.n), ncclBfloat16, ncclSum, comm,
                                        op.main));
    return Status::kOk;
  }, &t[3]));
  WEFT_CHECK(time_op(comm, op.main, warm, iters, [&] {
    kernels::EpiStoreBf16 epi{op.partial, op.n, op.n % 2 == 0};
    return kernels::launch_gemm(op.gemm, op.frame_params, epi, kernels::FlagGate{}, kernels::TileSignal{}, op.main);
  }, &t[4]));
  double mx[5];
  for (int i = 0; i < 5; ++i) WEFT_CHECK(max_over_ranks(boot, key + "t" + std::to_string(i), t[i], &mx[i]));

  const double flops = 2.0 * double(op.m) * double(op.n) * double(op.k_loc);
  auto tf = [&](double ms) { return flops / (ms * 1e-3) / 1e12; };
  const double bound = std::max(mx[2], mx[3]);
  const char* coll = all_reduce ? "all-reduce" : "reduce-scatter";
  char note[200];
  std::vector<ResultRow> rows;
  snprintf(note, sizeof note, "%.2fx bound, %.2fx faster than nccl+cublas; compute %d blocks%s", mx[0] / bound,
           mx[1] / mx[0], op.roles.compute, deterministic ? ", deterministic" : "");
  rows.push_back({"weft fused", mx[0], tf(mx[0]), note});
  rows.push_back({std::string("cublas + nccl ") + coll, mx[1], tf(mx[1]), "sequential baseline"});
  rows.push_back({"cublas gemm alone", mx[2], tf(mx[2]), ""});
  rows.push_back({std::string("nccl ") + coll + " alone", mx[3], 0, ""});
  rows.push_back({"bound", bound, tf(bound), "max(gemm, collective)"});
  rows.push_back({"weft gemm alone (local store)", mx[4], tf(mx[4]), "the fused op's GEMM without its signals"});
  if (plan.makespan_s > 0) {
    snprintf(note, sizeof note, "tuner: compute %d intra %d, limited by %s", plan.roles.compute, plan.roles.intra_comm,
             plan.limited_by.c_str());
    rows.push_back({"tuner prediction", plan.makespan_s * 1e3, tf(plan.makespan_s * 1e3), note});
  }
  char title[256];
  snprintf(title, sizeof title, "%s %s: M %lld x N %lld x K %lld (K/%d per rank), %d ranks, median of %d, max over ranks",
           name, wl.name.c_str(), static_cast<long long>(op.m), static_cast<long long>(op.n),
           static_cast<long long>(wl.gemm.k), op.world, op.world, iters);
  char extra[256];
  snprintf(extra, sizeof extra, "\"op\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, \"world\": %d", name,
           static_cast<long long>(op.m), static_cast<long long>(op.n), static_cast<long long>(wl.gemm.k), op.world);
  print_results(boot, title, rows, extra);
  cublasDestroy(blas);
  ncclCommDestroy(comm);
  return Status::kOk;
}

}  // namespace

Status run_gemm_rs(const launcher::RankContext& ctx, const Workload& wl, bootstrap::Bootstrap& boot) {
  return run_gemm_reduce(ctx, wl, boot, false);
}
Status run_gemm_ar(const launcher::RankContext& ctx, const Workload& wl, bootstrap::Bootstrap& boot) {
  return run_gemm_reduce(ctx, wl, boot, true);
}

}  // namespace weft::runtime::ops
