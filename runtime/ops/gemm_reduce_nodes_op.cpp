// GEMM+ReduceScatter / GEMM+AllReduce across nodes: checks, validation against cuBLAS + NCCL, timing
// next to NCCL + cuBLAS, the result table. Hierarchical: each owner's rows are reduced inside every
// node first (NVLink, copy engines), cross the node boundary once per other node between rail peers
// (proxy), and are finished in the GEMM's epilogue (kernels/gemm_reduce_nodes_plan.h draws it;
// gemm_reduce_nodes_run.cpp enqueues it).
//
// Validation: inputs seeded by rank (a misrouted partial changes the sum), every buffer a run writes
// poisoned first (an element nobody wrote is a NaN), the result compared with NCCL's reduce-scatter /
// all-reduce of cuBLAS's partials on the same inputs, per owner's row block for AllReduce (a wrong
// block names the path that delivered it); WEFT_DETERMINISTIC=1: a second run must repeat bit for bit.
// Timing (same process, NCCL_HOSTID per node so NCCL crosses the emulated nodes through its network
// transport too): fused, NCCL + cuBLAS, each alone, weft's GEMM alone, the cross-node exchange alone.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/params.h"
#include "kernels/gemm.h"
#include "runtime/exec/device_data.h"
#include "runtime/ops/cuda_check.h"
#include "runtime/ops/gemm_reduce.h"
#include "runtime/ops/gemm_reduce_nodes.h"
#include "runtime/ops/op_harness.h"

namespace weft::runtime::ops {
namespace {

using bf16 = __nv_bfloat16;

// cuBLAS's partial of this rank (A in global row order), then NCCL's reduce-scatter or all-reduce.
Status enqueue_sequence(RsNodes& op, ncclComm_t comm, cublasHandle_t blas) {
  WEFT_CHECK(cublas_gemm_tn(blas, op.m, op.n, op.k_loc, op.a, op.k_loc, op.b, op.k_loc, op.ref_partial, op.n, op.main));
  if (op.all_reduce)
    WEFT_NCCL_CHECK(ncclAllReduce(op.ref_partial, op.ref, size_t(op.m * op.n), ncclBfloat16, ncclSum, comm, op.main));
  else
    WEFT_NCCL_CHECK(
        ncclReduceScatter(op.ref_partial, op.ref, size_t(op.m_loc * op.n), ncclBfloat16, ncclSum, comm, op.main));
  return Status::kOk;
}

Status enqueue_collective(RsNodes& op, ncclComm_t comm) {
  if (op.all_reduce)
    WEFT_NCCL_CHECK(ncclAllReduce(op.ref_partial, op.ref, size_t(op.m * op.n), ncclBfloat16, ncclSum, comm, op.main));
  else
    WEFT_NCCL_CHECK(
        ncclReduceScatter(op.ref_partial, op.ref, size_t(op.m_loc * op.n), ncclBfloat16, ncclSum, comm, op.main));
  return Status::kOk;
}

// One fused run on poisoned buffers (every rank poisons before anyone sends).
Status fused_run(RsNodes& op, bootstrap::Bootstrap& boot, const char* name, const std::string& tag) {
  WEFT_CHECK(op.poison());
  WEFT_CHECK(boot.barrier(tag));
  WEFT_CHECK(op.enqueue(op.a, op.b, op.main, true));
  Status synced = op.sync(name);
  WEFT_CHECK(op.check(name));
  return synced;
}

Status validate(RsNodes& op, ncclComm_t comm, cublasHandle_t blas, bootstrap::Bootstrap& boot, const char* name,
                bool deterministic) {
  WEFT_CHECK(fused_run(op, boot, name, std::string("weft.") + name + "_nodes.poisoned"));
  WEFT_CHECK(enqueue_sequence(op, comm, blas));
  const double tol = 1e-2;  // both sides round W partials to bf16 and sum them in different orders
  Comparison all;
  WEFT_CHECK(compare_bf16(op.result(), op.ref, op.result_elems(), op.main, &all));
  if (all.non_finite || !(all.rel_err < tol)) {
    // Name the row block (and the path that delivered it) that is wrong.
    for (int o = 0; o < (op.all_reduce ? op.world : 1); ++o) {
      const int owner = op.all_reduce ? o : op.rank;
      const int64_t at = op.all_reduce ? int64_t(o) * op.m_loc * op.n : 0;
      Comparison c;
      WEFT_CHECK(compare_bf16(op.result() + at, op.ref + at, op.m_loc * op.n, op.main, &c));
      if (!c.non_finite && c.rel_err < tol) continue;
      const kernels::RsNodesPath path = op.plan.path[size_t(owner)];
      WEFT_WARN(kKernel,
                "rank %d: %s across nodes: owner %d's rows differ from cuBLAS + NCCL: rel err %.3g "
                "(tolerance %.0e), %lld of %lld elements not written or not finite (first %lld); they came from %s "
                "(rank %d)%s",
                op.rank, name, owner, c.rel_err, tol, static_cast<long long>(c.non_finite),
                static_cast<long long>(op.m_loc * op.n), static_cast<long long>(c.first_mismatch),
                kernels::to_string(path), op.plan.path_rank[size_t(owner)],
                path == kernels::RsNodesPath::kOwn ? ", summed from this rank's partial, its node-mates' partials "
                                                     "(NVLink) and its rail peers' node sums (proxy)"
                                                   : "");
    }
    return Status::kInternal;
  }
  printf("rank %d: %s across %d nodes validated against cuBLAS + NCCL: rel err %.2e, every element written\n", op.rank,
         name, op.plan.nodes, all.rel_err);
  if (deterministic) {
    // WEFT_DETERMINISTIC: every sum runs over the slots in a fixed order, so a second run repeats.
    WEFT_CUDA_CHECK(cudaMemcpyAsync(op.ref, op.result(), size_t(op.result_elems()) * sizeof(bf16),
                                    cudaMemcpyDeviceToDevice, op.main));
    WEFT_CUDA_CHECK(cudaStreamSynchronize(op.main));
    WEFT_CHECK(fused_run(op, boot, name, std::string("weft.") + name + "_nodes.poisoned2"));
    Comparison c;
    WEFT_CHECK(compare_bf16(op.result(), op.ref, op.result_elems(), op.main, &c));
    if (c.mismatched) {
      WEFT_WARN(kKernel,
                "rank %d: %s across nodes: WEFT_DETERMINISTIC=1 but a second run differs in %lld elements "
                "(first %lld)",
                op.rank, name, static_cast<long long>(c.mismatched), static_cast<long long>(c.first_mismatch));
      return Status::kInternal;
    }
    printf("rank %d: %s across nodes repeated bit for bit (WEFT_DETERMINISTIC=1)\n", op.rank, name);
  }
  return Status::kOk;
}

}  // namespace

Status run_gemm_reduce_nodes(const bootstrap::RankContext& /*ctx*/, const Workload& wl, bootstrap::Bootstrap& boot,
                             bool all_reduce) {
  const auto& info = boot.info();
  const char* name = all_reduce ? "gemm_ar" : "gemm_rs";
  if (wl.world_size() != info.size) {
    WEFT_WARN(kKernel, "rank %d: %s needs %d ranks (layout %d x %d) but the job has %d", info.rank, wl.source.c_str(),
              wl.world_size(), wl.layout.nodes, wl.layout.gpus_per_node, info.size);
    return Status::kInvalidArgument;
  }
  const int64_t tile = kernels::GemmConfig::kTileM;
  if (wl.gemm.m % info.size || (wl.gemm.m / info.size) % tile || wl.gemm.k % info.size || (wl.gemm.k / info.size) % 8 ||
      wl.gemm.m >= (int64_t(1) << 31)) {
    WEFT_WARN(kKernel,
              "rank %d: %s: %s across nodes needs m / ranks (%lld) to be a multiple of %lld rows (a tile "
              "belongs to one owner) and k / ranks (%lld) a multiple of 8",
              info.rank, wl.source.c_str(), name, static_cast<long long>(wl.gemm.m / info.size),
              static_cast<long long>(tile), static_cast<long long>(wl.gemm.k / info.size));
    return Status::kInvalidArgument;
  }
  // NCCL's baseline crosses the (emulated) nodes through its network transport, like weft: one host
  // id per node (the launcher names emulated nodes differently). A user's value is kept.
  setenv("NCCL_HOSTID", info.hostname.c_str(), 0);

  RsNodes op;
  op.all_reduce = all_reduce;
  op.rank = info.rank;
  op.world = info.size;
  op.m = wl.gemm.m;
  op.n = wl.gemm.n;
  op.k_loc = wl.gemm.k / op.world;
  op.m_loc = op.m / op.world;
  int sms = 0;
  WEFT_CHECK(kernels::device_sm_count(&sms));
  WEFT_CHECK(setup_rs_nodes_bench(op, wl, boot, sms));
  bool deterministic = false;
  WEFT_CHECK(get_param("WEFT_DETERMINISTIC", &deterministic));

  ncclComm_t comm = nullptr;
  WEFT_CHECK(create_nccl_comm(boot, &comm));
  cublasHandle_t blas = nullptr;
  WEFT_CUBLAS_CHECK(cublasCreate(&blas));
  // Load (and allocate for) everything the runs launch next to the fused kernel before its first
  // launch: lazy loading or a cudaMalloc would wait for the device to idle while it waits on the proxy.
  {
    int* word = nullptr;
    WEFT_CUDA_CHECK(cudaMalloc(&word, sizeof(int)));
    WEFT_NCCL_CHECK(ncclAllReduce(word, word, 1, ncclInt32, ncclSum, comm, op.main));  // time_op's barrier
    WEFT_CHECK(enqueue_sequence(op, comm, blas));
    WEFT_CHECK(op.enqueue_gemm_alone());
    Comparison c;
    WEFT_CHECK(compare_bf16(op.ref, op.ref, 1, op.main, &c));
    WEFT_CUDA_CHECK(cudaStreamSynchronize(op.main));
    WEFT_CUDA_CHECK(cudaFree(word));
  }

  if (wl.run.validate) WEFT_CHECK(validate(op, comm, blas, boot, name, deterministic));

  const int warm = wl.run.warmup, iters = wl.run.iters;
  // The fused op and its baselines timed together, interleaved (InterleavedTimer: max over ranks);
  // the proxies' counters over those rounds count the fused runs' messages only (the others move
  // nothing through weft's transport). The exchange alone after them.
  double t_exchange = 0;
  auto unstick = [&] { op.unstick(); };
  WEFT_CHECK(op.tp->flush());  // count the timed runs' messages only
  const transport::TransportCounters c0 = op.tp->counters();
  op.host_us = 0;
  op.host_runs = 0;
  InterleavedTimer timer;
  timer.add([&] { return op.enqueue(op.a, op.b, op.main, true); });  // 0
  timer.add([&] { return enqueue_sequence(op, comm, blas); });       // 1
  timer.add([&] {                                                    // 2
    return cublas_gemm_tn(blas, op.m, op.n, op.k_loc, op.a, op.k_loc, op.b, op.k_loc, op.ref_partial, op.n, op.main);
  });
  timer.add([&] { return enqueue_collective(op, comm); });  // 3
  timer.add([&] { return op.enqueue_gemm_alone(); });       // 4
  const std::string key = std::string("weft.") + name + "_nodes.t";
  WEFT_CHECK(timer.run(boot, comm, op.main, warm, iters, key + "interleaved", unstick));
  WEFT_CHECK(op.check(name));
  const double host_us = op.host_runs ? op.host_us / double(op.host_runs) : 0;
  WEFT_CHECK(op.tp->flush());
  const transport::TransportCounters c1 = op.tp->counters();
  WEFT_CHECK(time_op(
      comm, op.main, warm, iters, [&] { return op.enqueue(op.a, op.b, op.main, false); }, &t_exchange, unstick));
  WEFT_CHECK(op.check((std::string(name) + " exchange").c_str()));
  WEFT_CHECK(op.frame.check(name));

  double mx[7];
  for (int i = 0; i < 5; ++i) mx[i] = timer.ms(size_t(i));
  WEFT_CHECK(max_over_ranks(boot, key + "5", t_exchange, &mx[5]));
  WEFT_CHECK(max_over_ranks(boot, key + "host", host_us, &mx[6]));

  const double flops = 2.0 * double(op.m) * double(op.n) * double(op.k_loc);
  auto tf = [&](double ms) { return flops / (ms * 1e-3) / 1e12; };
  const double bound = std::max(mx[2], mx[3]);
  const char* coll = all_reduce ? "all-reduce" : "reduce-scatter";
  // Bytes each rank's proxies send per run: its node sums of the rail peers' rows (and, AllReduce,
  // its reduced rows to every rail peer).
  const double net_gb = double(op.block_bytes) * double(op.plan.rails.size()) * (all_reduce ? 2.0 : 1.0) / 1e9;
  const uint64_t runs = uint64_t(warm + iters);
  char note[320];
  std::vector<ResultRow> rows;
  snprintf(note, sizeof note,
           "%.2fx bound, %.2fx faster than nccl+cublas; roles compute %d inter_send %d; %d pieces "
           "of %lld rows; host enqueue %.0f us%s",
           mx[0] / bound, mx[1] / mx[0], op.roles.compute, op.roles.inter_send, op.pieces,
           static_cast<long long>(op.m_piece), mx[6], deterministic ? ", deterministic" : "");
  rows.push_back({"weft fused (one launch)", mx[0], tf(mx[0]), note});
  rows.push_back({std::string("cublas + nccl ") + coll, mx[1], tf(mx[1]), "sequential baseline, NCCL_HOSTID per node"});
  rows.push_back({"cublas gemm alone", mx[2], tf(mx[2]), ""});
  rows.push_back({std::string("nccl ") + coll + " alone", mx[3], 0, "NCCL_HOSTID per node"});
  rows.push_back({"bound", bound, tf(bound), "max(gemm, collective)"});
  snprintf(note, sizeof note, "%d compute blocks, A in global order, no gates", op.roles.compute);
  rows.push_back({"weft gemm alone", mx[4], tf(mx[4]), note});
  snprintf(note, sizeof note,
           "the proxy messages alone (no GEMM, no NVLink): %s, %s, %d channel(s), %.1f MiB "
           "messages; %.2f GB/s out per rank; per run: puts %.1f signals %.1f fences %.1f batches %.1f stalls %.1f",
           op.tp->backend_name().c_str(), transport::to_string(op.tp->signal_mode()), op.channels,
           double(op.piece_bytes) / (1 << 20), net_gb / (mx[5] * 1e-3), double(c1.puts - c0.puts) / runs,
           double(c1.signals - c0.signals) / runs, double(c1.fences - c0.fences) / runs,
           double(c1.batches - c0.batches) / runs, double(c1.stalls - c0.stalls) / runs);
  rows.push_back({"weft cross-node exchange alone", mx[5], 0, note});
  char title[256];
  snprintf(title, sizeof title,
           "%s %s: M %lld x N %lld x K %lld (K/%d per rank), %d ranks on %d nodes, median of %d, "
           "max over ranks; the op and its baselines interleaved",
           name, wl.name.c_str(), static_cast<long long>(op.m), static_cast<long long>(op.n),
           static_cast<long long>(wl.gemm.k), op.world, op.world, op.plan.nodes, iters);
  char extra[320];
  snprintf(extra, sizeof extra,
           "\"op\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, \"world\": %d, \"nodes\": %d, "
           "\"pieces\": %d, \"channels\": %d, \"signal_mode\": \"%s\"",
           name, static_cast<long long>(op.m), static_cast<long long>(op.n), static_cast<long long>(wl.gemm.k),
           op.world, op.plan.nodes, op.pieces, op.channels, transport::to_string(op.tp->signal_mode()));
  print_results(boot, title, rows, extra);

  // Every rank has what it waited for once all are here: then the proxies may stop.
  WEFT_CUDA_CHECK(cudaStreamSynchronize(op.main));
  WEFT_CHECK(op.tp->flush());
  WEFT_CHECK(boot.barrier(std::string("weft.") + name + "_nodes.done"));
  op.tp = nullptr;
  op.own_ctx.reset();  // its rings, transport and (collective close) heap
  cublasDestroy(blas);
  ncclCommDestroy(comm);
  return Status::kOk;
}

}  // namespace weft::runtime::ops
