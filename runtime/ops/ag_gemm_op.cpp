// AllGather+GEMM on one node: C_r = gather(A) · B_rᵀ, rank r holding A_r (m/W × k) and its weight
// block B_r (n/W × k); every rank gets C_r (m × n/W). Two ways to move A's shards, both measured:
//
//   copy engines (no SMs):  copy stream: pull A_{r+1} (or its chunks) over NVLink ─► flag = epoch ─► ...
//                           GEMM on every SM: shard r ─► shard r+1 (waits its flag) ─► ...
//   SM movers (one launch): intra_comm blocks pull (or peers push) 128-row chunks through the
//                           peer-mapped buffers and raise per-tile flags; compute blocks run the
//                           same GEMM core gated per tile (kernels/ag_gemm_fused.cu)
//
// Either way the GEMM starts on the local shard and takes remote tiles as their flags arrive, in a
// rank-rotated order. Where the GEMM's last wave is partly empty (2048 × 7168: 448 tiles on 132 SMs)
// a copy-engine variant uses fewer compute SMs (the rest idle): the most whose last round is full
// once the split tail has cut it (128: 64 tail tiles in K halves), else the fewest that give the
// same number of waves; SM movers get the SMs above that fewest count (112: 20 movers). An opt-in
// variant (split_k_tail) computes the last tile columns as a split-K pair after the gated part (two
// more launches: measured slower, docs/ops.md).
// WEFT_AG_MOVER picks the variants (default: all, and the fastest validated one is kept). Each is
// validated (gathered A bit for bit against NCCL's all-gather: every rank's data is seeded by its
// rank, so a misrouted shard is caught; C against cuBLAS on NCCL's gathered A) before it is timed.
// Every timed row (baselines, weft's GEMM alone, variants, diagnostics) runs interleaved with the
// others, launch by launch, so the GPU's clock steps under its power cap fall on all rows alike.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/params.h"
#include "kernels/ag_gemm_fused.h"
#include "kernels/gemm.h"
#include "runtime/exec/ag_gemm.h"
#include "runtime/exec/context.h"
#include "runtime/exec/device_data.h"
#include "runtime/ops/cuda_check.h"
#include "runtime/ops/op_harness.h"
#include "runtime/ops/ops.h"
#include "runtime/tuner.h"
#include "runtime/workload.h"

namespace weft::runtime::ops {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kRows = kernels::GemmConfig::kTileM, kCols = kernels::GemmConfig::kTileN;

// One way to run the op, with its own flags and epochs (variants never share a flag).
struct Variant {
  std::string name;
  bool sm = false;  // SM movers; else copy engines
  kernels::AgMover mover = kernels::AgMover::kPullVec;
  RoleCounts roles;              // compute, and intra_comm for the SM movers
  int ce_chunks = 1;             // copy engines: copies (each with its flag) per shard
  int cluster = 0;               // copy engines: the GEMM's CTAs per cluster (0: the op's, WEFT_GEMM_CLUSTER)
  bool tail = false;             // last tile columns as a split-K pair after the gated part
  kernels::GemmParams gemm;      // the gated GEMM (all of n, or the columns before the tail)
  RunnerHeap heap;               // SM movers: sm_flags' symmetric memory
  HeapBuffer sm_flags;           // SM movers: per-tile flags + clear-to-send words, peer-mapped
  uint64_t* ce_flags = nullptr;  // copy engines: one per chunk
  uint64_t epoch = 0;
  bool valid = false;
  double ms = 0;
  ~Variant() {
    if (ce_flags) cudaFree(ce_flags);
  }
};

struct AgGemm {
  int rank = 0, world = 1, sms = 0;
  int cluster = 1;                         // the copy-engine variants' GEMM: CTAs per cluster (WEFT_GEMM_CLUSTER)
  int64_t m = 0, n = 0, k = 0, m_loc = 0;  // n is this rank's block
  RunnerHeap heap;                         // a_full's symmetric memory
  HeapBuffer a_full;                       // m × k, shard s at rows [s·m_loc, (s+1)·m_loc)
  bf16 *b = nullptr, *c = nullptr, *c_ref = nullptr, *a_nccl = nullptr;
  float* acc = nullptr;         // split-K tail partial sums, zero between runs
  int64_t n_main = 0;           // columns before the tail (n when there is none)
  kernels::GemmParams half[2];  // the tail's K halves
  cudaStream_t main = nullptr, copy = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  bf16* local_dst = nullptr;  // diagnostic: scratch for copies within this GPU instead of from the peers
  kernels::FrameHost frame;
  kernels::FrameParams frame_base;  // roles set per launch; the error record is cleared only between runs
  std::vector<std::unique_ptr<Variant>> variants;

  bf16* shard(int s) const { return a_full.local<bf16>() + int64_t(s) * m_loc * k; }
  const bf16* peer_shard(int s) const { return a_full.peer<bf16>(s) + int64_t(s) * m_loc * k; }
  kernels::EpiStoreBf16 epi() const { return kernels::EpiStoreBf16{c, n, n % 2 == 0}; }

  Status make_gemm(int64_t cols, const bf16* a, int64_t kk, const bf16* bb, int shards, int first,
                   kernels::GemmParams* out, int cluster = 1) const {
    kernels::GemmArgs args;
    args.m = m;
    args.n = cols;
    args.k = kk;
    args.a = a;
    args.lda = k;
    args.b = bb;
    args.ldb = k;
    args.num_shards = shards;
    args.first_shard = first;
    args.cluster_m = cluster;
    WEFT_CHECK(gemm_group(&args.group_m));
    return kernels::make_gemm_params(args, out);
  }

  // The split-K pair and the fp32 -> bf16 pass after the gated part (the data is all there then).
  Status enqueue_tail() {
    kernels::FrameParams fp = frame_base;
    fp.roles = RoleCounts{};
    fp.roles.compute = sms - sms % 2;
    WEFT_CHECK(kernels::launch_split_k_pair(half[0], half[1], fp, acc, main));
    return kernels::launch_acc_to_bf16(acc, m, n - n_main, c + n_main, n, main);
  }

  // copies = false or gated = false: the diagnostics (the GEMM behind gates already open; the copies
  // beside a GEMM that does not wait for them).
  // local: the same bytes from NCCL's gathered A into local_dst, within this GPU (a diagnostic).
  Status enqueue_copy_engines(Variant& v, bool gemm, bool copies = true, bool gated = true, bool recheck = false,
                              bool local = false) {
    if (copies) {
      ++v.epoch;
      WEFT_CUDA_CHECK(cudaEventRecord(fork, main));
      WEFT_CUDA_CHECK(cudaStreamWaitEvent(copy, fork));
      const int64_t rows = m_loc / v.ce_chunks;
      for (int i = 1; i < world; ++i) {
        const int s = (rank + i) % world;
        const bf16* src = local ? a_nccl + int64_t(s) * m_loc * k : peer_shard(s);
        bf16* dst = local ? local_dst + int64_t(i - 1) * m_loc * k : shard(s);
        for (int ch = 0; ch < v.ce_chunks; ++ch) {
          WEFT_CUDA_CHECK(cudaMemcpyAsync(dst + ch * rows * k, src + ch * rows * k, size_t(rows * k) * sizeof(bf16),
                                          cudaMemcpyDeviceToDevice, copy));
          WEFT_CHECK(stream_write_u64(copy, v.ce_flags + s * v.ce_chunks + ch, v.epoch));
        }
      }
    }
    if (gemm) {
      kernels::FrameParams fp = frame_base;
      fp.roles = v.roles;
      kernels::FlagGate gate =
          gated ? kernels::FlagGate{v.ce_flags, kernels::kFlagPerShard, v.epoch} : kernels::FlagGate{};
      gate.recheck = recheck;
      WEFT_CHECK(kernels::launch_gemm(v.gemm, fp, epi(), gate, kernels::TileSignal{}, main, bench_gemm_options()));
      if (v.tail) WEFT_CHECK(enqueue_tail());
    }
    if (copies) {
      WEFT_CUDA_CHECK(cudaEventRecord(join, copy));
      WEFT_CUDA_CHECK(cudaStreamWaitEvent(main, join));
    }
    return Status::kOk;
  }

  // gemm = false: the movers alone (no compute block), what the shards' transfer costs them.
  Status enqueue_sm(Variant& v, bool gemm) {
    ++v.epoch;
    kernels::AgMoveParams mv;
    for (int r = 0; r < world; ++r) {
      mv.a[r] = a_full.peer<bf16>(r);
      mv.flags[r] = v.sm_flags.peer<uint64_t>(r);
    }
    mv.rank = rank;
    mv.world = world;
    mv.shard_rows = int32_t(m_loc);
    mv.k = int32_t(k);
    mv.m_blocks = int32_t(m / kRows);
    mv.flag_cols = v.gemm.n_blocks;
    mv.epoch = v.epoch;
    mv.mover = v.mover;
    RoleCounts roles = v.roles;
    if (!gemm) roles.compute = 0;
    kernels::FrameParams fp = frame_base;
    fp.roles = roles;
    kernels::FlagGate gate{v.sm_flags.local<uint64_t>(), kernels::kFlagPerTile, v.epoch * uint64_t(v.roles.intra_comm)};
    WEFT_CHECK(kernels::launch_ag_gemm_fused(v.gemm, fp, epi(), gate, mv, main, bench_gemm_options()));
    if (gemm && v.tail) WEFT_CHECK(enqueue_tail());
    return Status::kOk;
  }

  Status enqueue(Variant& v, bool gemm = true) { return v.sm ? enqueue_sm(v, gemm) : enqueue_copy_engines(v, gemm); }

  ~AgGemm() {
    cudaDeviceSynchronize();
    variants.clear();
    for (void* p : {static_cast<void*>(b), static_cast<void*>(c), static_cast<void*>(c_ref), static_cast<void*>(a_nccl),
                    static_cast<void*>(acc)})
      if (p) cudaFree(p);
    if (fork) cudaEventDestroy(fork);
    if (join) cudaEventDestroy(join);
    if (copy) cudaStreamDestroy(copy);
    if (main) cudaStreamDestroy(main);
  }
};

// The tail pays when the gated part then fills whole waves and the split pair fits into one:
// e.g. 2048 × 7168 on 128 compute SMs: 448 tiles = 3.5 waves (4 tile times), but 384 tiles + 64
// tiles in K halves on 128 SMs = 3 + 0.5 tile times. Returns the columns before the tail, or n.
int64_t tail_split(int64_t m, int64_t n, int64_t k, int compute, int sms) {
  const int64_t mb = m / kRows, nb = (n + kCols - 1) / kCols, tiles = mb * nb;
  if (k % 16 || compute <= 0 || tiles % compute == 0) return n;
  const int64_t nb_main = (tiles / compute) * compute / mb;
  if (nb_main <= 0 || nb_main >= nb) return n;
  const int64_t pairs = mb * (nb - nb_main), per_half = sms / 2;
  const double before = double((tiles + compute - 1) / compute);
  const double after = double((mb * nb_main + compute - 1) / compute) + 0.5 * double((pairs + per_half - 1) / per_half);
  return after + 0.25 <= before ? nb_main * kCols : n;
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// Which variants WEFT_AG_MOVER asks for; false (logged) for an unknown name.
bool wanted_movers(int rank, bool* copy_engine, std::vector<kernels::AgMover>* sm, bool* tail) {
  std::string spec;
  if (get_param("WEFT_AG_MOVER", &spec) != Status::kOk) return false;
  const kernels::AgMover all[] = {kernels::AgMover::kPullVec, kernels::AgMover::kPushVec, kernels::AgMover::kPullBulk,
                                  kernels::AgMover::kPushBulk};
  *copy_engine = false;
  *tail = false;
  sm->clear();
  for (const auto& item : split_list(spec)) {
    kernels::AgMover one;
    if (item == "split_k_tail") {
      *tail = true;
      continue;
    }
    if (item == "auto" || item == "copy_engine") *copy_engine = true;
    if (item == "auto" || item == "sm") {
      sm->assign(std::begin(all), std::end(all));
    } else if (kernels::parse_ag_mover(item.c_str(), &one)) {
      if (std::find(sm->begin(), sm->end(), one) == sm->end()) sm->push_back(one);
    } else if (item != "copy_engine" && item != "auto") {
      WEFT_WARN(kKernel,
                "rank %d: WEFT_AG_MOVER: '%s' is not copy_engine, sm, pull_vec, push_vec, pull_bulk, "
                "push_bulk, split_k_tail or auto",
                rank, item.c_str());
      return false;
    }
  }
  return *copy_engine || !sm->empty();
}

Status reference(AgGemm& op, ncclComm_t comm, cublasHandle_t blas) {
  WEFT_NCCL_CHECK(ncclAllGather(op.shard(op.rank), op.a_nccl, size_t(op.m_loc * op.k), ncclBfloat16, comm, op.main));
  WEFT_CHECK(cublas_gemm_tn(blas, op.m, op.n, op.k, op.a_nccl, op.k, op.b, op.k, op.c_ref, op.n, op.main));
  WEFT_CUDA_CHECK(cudaStreamSynchronize(op.main));
  return Status::kOk;
}

// One fused run on poisoned outputs, checked against the reference. kOk only when all is right.
Status validate(AgGemm& op, Variant& v, const Workload& wl) {
  for (int s = 0; s < op.world; ++s)
    if (s != op.rank) WEFT_CHECK(poison_bf16(op.shard(s), op.m_loc * op.k, op.main));
  WEFT_CHECK(poison_bf16(op.c, op.m * op.n, op.main));
  WEFT_CUDA_CHECK(cudaStreamSynchronize(op.main));
  WEFT_CHECK(op.frame.params(v.roles, &op.frame_base));  // a clean error record for this variant
  WEFT_CHECK(op.enqueue(v));
  WEFT_CHECK(
      sync_bounded(op.main, 2 * param_double_or_default("WEFT_DEVICE_TIMEOUT") + 1, "ag_gemm validation run", nullptr));
  WEFT_CHECK(op.frame.check(("ag_gemm " + v.name).c_str()));
  for (int s = 0; s < op.world; ++s) {
    Comparison cmp;
    WEFT_CHECK(compare_bf16(op.shard(s), op.a_nccl + s * op.m_loc * op.k, op.m_loc * op.k, op.main, &cmp));
    if (cmp.mismatched) {
      WEFT_WARN(kKernel,
                "rank %d: ag_gemm (%s): gathered shard of rank %d differs from NCCL's all-gather in %lld of "
                "%lld elements (first at %lld): shard misrouted or not delivered",
                op.rank, v.name.c_str(), s, static_cast<long long>(cmp.mismatched),
                static_cast<long long>(op.m_loc * op.k), static_cast<long long>(cmp.first_mismatch));
      return Status::kInternal;
    }
  }
  Comparison cmp;
  WEFT_CHECK(compare_bf16(op.c, op.c_ref, op.m * op.n, op.main, &cmp));
  const double tol = 1e-2;  // bf16 output rounding is ~2e-3
  if (cmp.non_finite || !(cmp.rel_err < tol)) {
    WEFT_WARN(kKernel,
              "rank %d: ag_gemm (%s, %s): C differs from cuBLAS: rel err %.3g (tolerance %.0e), %lld "
              "elements not written or not finite",
              op.rank, wl.name.c_str(), v.name.c_str(), cmp.rel_err, tol, static_cast<long long>(cmp.non_finite));
    return Status::kInternal;
  }
  if (op.rank == 0)
    printf(
        "rank 0: ag_gemm %s validated: gathered A equals NCCL's bit for bit; C vs cuBLAS rel err %.2e, %lld of "
        "%lld elements bit-identical\n",
        v.name.c_str(), cmp.rel_err, static_cast<long long>(op.m * op.n - cmp.mismatched),
        static_cast<long long>(op.m * op.n));
  return Status::kOk;
}

// Adds a variant and its flags (collective for the SM movers: every rank maps their flags).
Status add_variant(AgGemm& op, bootstrap::Bootstrap& boot, std::unique_ptr<Variant> v) {
  const int64_t cols = v->tail ? op.n_main : op.n;
  const int64_t own_blocks = op.m_loc / kRows;
  if (v->sm) {
    WEFT_CHECK(op.make_gemm(cols, op.a_full.local<bf16>(), op.k, op.b, op.world, op.rank, &v->gemm));
    // The same C epilogue as launch_gemm's (it encodes C's tensor map itself for the copy engines' GEMM).
    if (bench_gemm_options().tma_store) WEFT_CHECK(kernels::enable_tma_store(op.epi(), &v->gemm));
    const int64_t words = (op.m / kRows) * v->gemm.n_blocks + op.world;
    const std::string name = "ag_gemm.flags." + std::to_string(op.variants.size());
    v->heap.take(size_t(words) * 8, &v->sm_flags);
    WEFT_CHECK(v->heap.create(boot, name.c_str()));  // zero
    uint64_t* f = v->sm_flags.local<uint64_t>();
    // The rank's own rows are in place before every launch (stream order): their gate always passes.
    WEFT_CUDA_CHECK(
        cudaMemset(f + op.rank * own_blocks * v->gemm.n_blocks, 0xFF, size_t(own_blocks * v->gemm.n_blocks) * 8));
  } else {
    WEFT_CHECK(op.make_gemm(cols, op.a_full.local<bf16>(), op.k, op.b, op.world * v->ce_chunks, op.rank * v->ce_chunks,
                            &v->gemm, v->cluster ? v->cluster : op.cluster));
    // The blocks after the own shard's tiles start on a peer's shard and wait for it: a chunked
    // tail (a static walk: the 2-CTA kernel) leaves them out (TileSchedule::max_chunks).
    const int cl = v->gemm.cluster_m;
    const int64_t own_units = op.m_loc / (kRows * cl) * v->gemm.sched.n_blocks;
    if (own_units < op.sms / cl) v->gemm.sched.max_chunks = int32_t(own_units);
    const size_t count = size_t(op.world * v->ce_chunks);
    WEFT_CUDA_CHECK(cudaMalloc(&v->ce_flags, count * 8));
    WEFT_CUDA_CHECK(cudaMemset(v->ce_flags, 0, count * 8));
    WEFT_CUDA_CHECK(cudaMemset(v->ce_flags + op.rank * v->ce_chunks, 0xFF, size_t(v->ce_chunks) * 8));
  }
  op.variants.push_back(std::move(v));
  return Status::kOk;
}

std::string roles_text(const RoleCounts& r) {
  return "compute " + std::to_string(r.compute) + ", intra_comm " + std::to_string(r.intra_comm);
}

}  // namespace

Status run_ag_gemm(const bootstrap::RankContext& ctx, const Workload& wl, bootstrap::Bootstrap& boot) {
  const auto& info = boot.info();
  if (ctx.gpu < 0) {
    WEFT_WARN(kKernel, "rank %d: ag_gemm needs a GPU and this rank has none", info.rank);
    return Status::kUnsupported;
  }
  if (info.num_nodes > 1) return run_ag_gemm_nodes(ctx, wl, boot);  // across nodes: ag_gemm_nodes_op.cpp
  if (wl.world_size() != info.size) {
    WEFT_WARN(kKernel, "rank %d: %s needs %d ranks (layout %d x %d) but the job has %d", info.rank, wl.source.c_str(),
              wl.world_size(), wl.layout.nodes, wl.layout.gpus_per_node, info.size);
    return Status::kInvalidArgument;
  }
  if (info.size > kernels::AgMoveParams::kMaxRanks) {
    WEFT_WARN(kKernel, "rank %d: ag_gemm on one node handles at most %d GPUs, the job has %d", info.rank,
              kernels::AgMoveParams::kMaxRanks, info.size);
    return Status::kInvalidArgument;
  }
  if ((wl.gemm.m / info.size) % kRows != 0) {
    WEFT_WARN(kKernel,
              "rank %d: %s: ag_gemm needs m / ranks (%lld) to be a multiple of %d rows: a tile must not "
              "span two ranks' shards",
              info.rank, wl.source.c_str(), static_cast<long long>(wl.gemm.m / info.size), kRows);
    return Status::kInvalidArgument;
  }
  bool want_ce = false, want_tail = false;
  std::vector<kernels::AgMover> want_sm;
  if (!wanted_movers(info.rank, &want_ce, &want_sm, &want_tail)) return Status::kInvalidArgument;
  std::vector<int> extra_intra;
  std::string intra_spec;
  WEFT_CHECK(get_param("WEFT_AG_INTRA", &intra_spec));
  for (const auto& item : split_list(intra_spec)) {
    const int x = atoi(item.c_str());
    if (x < 1) {
      WEFT_WARN(kKernel, "rank %d: WEFT_AG_INTRA: '%s' is not a positive SM count", info.rank, item.c_str());
      return Status::kInvalidArgument;
    }
    extra_intra.push_back(x);
  }

  AgGemm op;
  op.rank = info.rank;
  op.world = info.size;
  const GemmShard sh = wl.gemm_shard();
  op.m = wl.gemm.m;
  op.k = wl.gemm.k;
  op.n = sh.n;
  op.m_loc = op.m / op.world;
  int64_t cluster = 1;
  WEFT_CHECK(get_param("WEFT_GEMM_CLUSTER", &cluster));
  if ((cluster != 1 && cluster != 2) || op.m_loc % (kRows * cluster) != 0) {
    WEFT_WARN(
        kKernel, "rank %d: %s: WEFT_GEMM_CLUSTER is %lld: use 1, or 2 where m / ranks (%lld) is a multiple of %d rows",
        info.rank, wl.source.c_str(), static_cast<long long>(cluster), static_cast<long long>(op.m_loc), 2 * kRows);
    return Status::kInvalidArgument;
  }
  op.cluster = int(cluster);
  WEFT_CHECK(kernels::device_sm_count(&op.sms));

  // Role counts: the copy engines use no SM; the SM movers take the plan's (the tuner's, or the YAML's).
  const Plan plan_sm = plan_for(wl, info.rank, IntraMover::kSm);
  const Plan plan_ce = plan_for(wl, info.rank, IntraMover::kCopyEngine);
  RoleCounts ce_roles;
  ce_roles.compute = op.sms;
  RoleCounts sm_roles;
  sm_roles.intra_comm = plan_sm.makespan_s > 0 && plan_sm.roles.intra_comm > 0 ? plan_sm.roles.intra_comm : 8;
  sm_roles.compute = plan_sm.makespan_s > 0 ? std::min(plan_sm.roles.compute, op.sms - sm_roles.intra_comm)
                                            : op.sms - sm_roles.intra_comm;
  if (sm_roles.compute < 1) sm_roles.compute = op.sms - sm_roles.intra_comm;
  // The fewest compute SMs that still finish in as many tile waves as all of them: the SMs above it
  // only shorten the last wave's idle tail (2048 x 7168: 448 tiles are 4 waves on 112 SMs as on 132).
  const int64_t tiles = (op.m / kRows) * ((op.n + kCols - 1) / kCols);
  const int64_t waves = (tiles + op.sms - 1) / op.sms;
  const int same_waves = int((tiles + waves - 1) / waves);
  // The most compute SMs below all whose last round of work is full once the GEMM's split tail has
  // cut the last wave (2048 x 7168: 128, where 64 tail tiles in K halves fill the round; on 132 the
  // last round leaves 28 SMs idle): the copy engines need no SM, so the rest may idle.
  int full_round = 0;
  {
    kernels::TileSchedule ts;
    const char* why = nullptr;
    if (kernels::TileSchedule::make(op.m, op.n, kRows, kCols, 16, op.world, op.rank, &ts, &why)) {
      ts.k_iters = int32_t((op.k + kernels::GemmConfig::kTileK - 1) / kernels::GemmConfig::kTileK);
      full_round = ts.full_round_blocks(op.sms, op.sms - 16, 8);
    }
  }

  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&op.main, cudaStreamNonBlocking));
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&op.copy, cudaStreamNonBlocking));
  WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&op.fork, cudaEventDisableTiming));
  WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&op.join, cudaEventDisableTiming));
  op.heap.take(size_t(op.m * op.k) * sizeof(bf16), &op.a_full);
  WEFT_CHECK(op.heap.create(boot, "ag_gemm"));
  WEFT_CUDA_CHECK(cudaMalloc(&op.b, size_t(op.n * op.k) * sizeof(bf16)));
  WEFT_CUDA_CHECK(cudaMalloc(&op.c, size_t(op.m * op.n) * sizeof(bf16)));
  WEFT_CUDA_CHECK(cudaMalloc(&op.c_ref, size_t(op.m * op.n) * sizeof(bf16)));
  WEFT_CUDA_CHECK(cudaMalloc(&op.a_nccl, size_t(op.m * op.k) * sizeof(bf16)));
  WEFT_CHECK(op.frame.create(op.rank));
  WEFT_CHECK(op.frame.params(ce_roles, &op.frame_base));

  // Fresh inputs every run: the seed comes from rank 0's clock, shards are seeded by rank.
  uint64_t seed = 0;
  WEFT_CHECK(shared_seed(boot, "weft.ag_gemm.seed", &seed));
  WEFT_CHECK(fill_random_bf16(op.shard(op.rank), op.m_loc * op.k, seed, op.rank, 1.0f, op.main));
  WEFT_CHECK(fill_random_bf16(op.b, op.n * op.k, seed + 1, op.rank, 1.0f, op.main));
  WEFT_CUDA_CHECK(cudaStreamSynchronize(op.main));

  // The split-K tail, where the last wave is mostly empty for the copy engines' or the SM movers' count.
  op.n_main = tail_split(op.m, op.n, op.k, ce_roles.compute, op.sms);
  if (op.n_main == op.n) op.n_main = tail_split(op.m, op.n, op.k, sm_roles.compute, op.sms);
  auto tail_for = [&](const RoleCounts& r) {
    return want_tail && op.n_main < op.n && tail_split(op.m, op.n, op.k, r.compute, op.sms) == op.n_main;
  };
  if (want_tail && op.n_main < op.n) {
    const bf16* b_tail = op.b + op.n_main * op.k;
    for (int h = 0; h < 2; ++h)
      WEFT_CHECK(op.make_gemm(op.n - op.n_main, op.a_full.local<bf16>() + h * op.k / 2, op.k / 2, b_tail + h * op.k / 2,
                              1, 0, &op.half[h]));
    WEFT_CUDA_CHECK(cudaMalloc(&op.acc, size_t(op.m * (op.n - op.n_main)) * sizeof(float)));
    WEFT_CUDA_CHECK(cudaMemset(op.acc, 0, size_t(op.m * (op.n - op.n_main)) * sizeof(float)));
  }

  // The variants, cheapest to trust first (a fault in a later one cannot lose the earlier rows).
  auto variant = [](const std::string& name, bool sm, const RoleCounts& roles) {
    auto v = std::make_unique<Variant>();
    v->name = name;
    v->sm = sm;
    v->roles = roles;
    return v;
  };
  if (want_ce) {
    std::vector<int> chunk_counts = {1};
    const int64_t unit_rows = kRows * op.cluster;  // chunks must split a shard into whole (cluster) tiles
    int chunked = int(std::max<int64_t>(1, std::min<int64_t>(4, op.m_loc / unit_rows)));
    while ((op.m_loc / unit_rows) % chunked) --chunked;
    if (chunked > 1) chunk_counts.push_back(chunked);
    for (int chunks : chunk_counts) {
      for (bool tail : {false, true}) {
        if (tail && !tail_for(ce_roles)) continue;
        std::string name =
            chunks == 1 ? "copy engines, per shard" : "copy engines, " + std::to_string(chunks) + " chunks/shard";
        if (tail) name += " + split-K tail";
        auto v = variant(name, false, ce_roles);
        v->ce_chunks = chunks;
        v->tail = tail;
        WEFT_CHECK(add_variant(op, boot, std::move(v)));
      }
    }
    // The 2-CTA kernel (B shared by multicast, a static walk whose ragged last wave may be cut into
    // one chunk per cluster): on one H200 it was the fastest weft GEMM on all three example shapes
    // (docs/gemm.md), so it is measured here too when the op's kernel is the 1-CTA one.
    if (op.cluster == 1 && op.m_loc % (2 * kRows) == 0 && op.sms % 2 == 0) {
      auto v = variant("copy engines, per shard, 2-CTA", false, ce_roles);
      v->cluster = 2;
      WEFT_CHECK(add_variant(op, boot, std::move(v)));
    }
    // Fewer compute SMs: a full last round, or else the fewest for the same waves.
    int fewer_sms = full_round > 0 ? full_round : same_waves;
    fewer_sms -= fewer_sms % op.cluster;  // whole clusters
    if (fewer_sms < op.sms) {
      RoleCounts fewer;
      fewer.compute = fewer_sms;
      auto v = variant("copy engines, per shard, " + std::to_string(fewer_sms) + " compute SMs", false, fewer);
      WEFT_CHECK(add_variant(op, boot, std::move(v)));
    }
  }
  if (same_waves < op.sms) extra_intra.push_back(op.sms - same_waves);
  for (kernels::AgMover mv : want_sm) {
    std::vector<int> counts = {sm_roles.intra_comm};
    for (int x : extra_intra)
      if (std::find(counts.begin(), counts.end(), x) == counts.end() && x < op.sms) counts.push_back(x);
    for (size_t i = 0; i < counts.size(); ++i) {
      RoleCounts r;
      r.intra_comm = counts[i];
      r.compute = i == 0 ? sm_roles.compute : op.sms - counts[i];
      for (bool tail : {false, true}) {
        if (tail && (i > 0 || !tail_for(r))) continue;
        std::string name = std::string("SM ") + kernels::to_string(mv) + ", " + std::to_string(r.intra_comm) + " SMs";
        if (tail) name += " + split-K tail";
        auto v = variant(name, true, r);
        v->mover = mv;
        v->tail = tail;
        WEFT_CHECK(add_variant(op, boot, std::move(v)));
      }
    }
  }
  WEFT_CUDA_CHECK(cudaDeviceSynchronize());
  WEFT_CHECK(boot.barrier("weft.ag_gemm.inputs"));  // every shard and flag written before anyone pulls or pushes

  ncclComm_t comm = nullptr;
  WEFT_CHECK(create_nccl_comm(boot, &comm));
  cublasHandle_t blas = nullptr;
  WEFT_CUBLAS_CHECK(cublasCreate(&blas));
  WEFT_CHECK(reference(op, comm, blas));
  // weft's GEMM alone reads the gathered A too: the GPU runs at its power cap, and zeros (the peers'
  // rows before any variant has run) cost less power than data, so a GEMM on them runs faster.
  for (int s = 0; s < op.world; ++s)
    if (s != op.rank)
      WEFT_CUDA_CHECK(cudaMemcpyAsync(op.shard(s), op.a_nccl + s * op.m_loc * op.k,
                                      size_t(op.m_loc * op.k) * sizeof(bf16), cudaMemcpyDeviceToDevice, op.main));
  WEFT_CUDA_CHECK(cudaStreamSynchronize(op.main));

  const int warm = wl.run.warmup, iters = wl.run.iters;
  const double flops = 2.0 * double(op.m) * double(op.n) * double(op.k);
  auto tf = [&](double ms) { return ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0; };
  int key = 0;

  // Each variant is validated on every rank first (all ranks agree); only those that pass are timed.
  std::vector<bool> passed(op.variants.size(), false);
  for (size_t i = 0; i < op.variants.size(); ++i) {
    const Status st = validate(op, *op.variants[i], wl);
    if (st == Status::kCudaError) return st;  // the context may be gone: nothing after it can be trusted
    double any_bad = 0;
    WEFT_CHECK(max_over_ranks(boot, "weft.ag_gemm.ok" + std::to_string(key++), st == Status::kOk ? 0 : 1, &any_bad));
    passed[i] = any_bad == 0;
    if (!passed[i] && op.rank == 0)
      printf("rank 0: ag_gemm %s FAILED validation on some rank: not timed\n", op.variants[i]->name.c_str());
  }

  // Everything is timed together, interleaved (InterleavedTimer): the baselines, weft's GEMM alone,
  // every validated variant, and the diagnostics that split a variant's time.
  InterleavedTimer timer;
  const size_t i_seq = timer.add([&]() -> Status {
    WEFT_NCCL_CHECK(ncclAllGather(op.shard(op.rank), op.a_nccl, size_t(op.m_loc * op.k), ncclBfloat16, comm, op.main));
    return cublas_gemm_tn(blas, op.m, op.n, op.k, op.a_nccl, op.k, op.b, op.k, op.c_ref, op.n, op.main);
  });
  const size_t i_gemm = timer.add(
      [&] { return cublas_gemm_tn(blas, op.m, op.n, op.k, op.a_nccl, op.k, op.b, op.k, op.c_ref, op.n, op.main); });
  const size_t i_comm = timer.add([&]() -> Status {
    WEFT_NCCL_CHECK(ncclAllGather(op.shard(op.rank), op.a_nccl, size_t(op.m_loc * op.k), ncclBfloat16, comm, op.main));
    return Status::kOk;
  });
  kernels::GemmParams plain;
  WEFT_CHECK(op.make_gemm(op.n, op.a_full.local<bf16>(), op.k, op.b, op.world, op.rank, &plain));
  auto gemm_alone = [&](const kernels::GemmParams& g, int compute) {
    kernels::FrameParams fp = op.frame_base;
    fp.roles = RoleCounts{};
    fp.roles.compute = compute;
    return kernels::launch_gemm(g, fp, op.epi(), kernels::FlagGate{}, kernels::TileSignal{}, op.main,
                                bench_gemm_options());
  };
  const size_t i_wgemm = timer.add([&] { return gemm_alone(plain, op.sms); });
  // The same GEMM in one raster over all of A (as if every shard were there from the start): what the
  // rank-rotated per-shard order costs or saves (raster groups end at shard borders).
  kernels::GemmParams one_shard;
  WEFT_CHECK(op.make_gemm(op.n, op.a_full.local<bf16>(), op.k, op.b, 1, 0, &one_shard));
  const size_t i_wgemm_one = timer.add([&] { return gemm_alone(one_shard, op.sms); });
  const size_t none = ~size_t(0);
  size_t i_wgemm_sm = none, i_wgemm_waves = none, i_wgemm_full = none;
  if (!want_sm.empty()) i_wgemm_sm = timer.add([&] { return gemm_alone(plain, sm_roles.compute); });
  if (same_waves < op.sms && same_waves != sm_roles.compute)
    i_wgemm_waves = timer.add([&] { return gemm_alone(plain, same_waves); });
  if (full_round > 0 && full_round != same_waves && (want_sm.empty() || full_round != sm_roles.compute))
    i_wgemm_full = timer.add([&] { return gemm_alone(plain, full_round); });

  // Per variant: the fused run; for the first of each mover (no tail, the default count) what the
  // shards' transfer alone costs it; for the copy engines, the diagnostics.
  struct VariantTimes {
    size_t fused = ~size_t(0), gather = ~size_t(0), gates_open = ~size_t(0), recheck = ~size_t(0), beside = ~size_t(0),
           local_alone = ~size_t(0), local_beside = ~size_t(0);
  };
  std::vector<VariantTimes> vt(op.variants.size());
  const size_t local_bytes = size_t((op.world - 1) * op.m_loc * op.k) * sizeof(bf16);
  for (size_t i = 0; i < op.variants.size(); ++i) {
    if (!passed[i]) continue;
    Variant* pv = op.variants[i].get();
    const Variant& v = *pv;
    vt[i].fused = timer.add([&op, pv] { return op.enqueue(*pv); });
    if (v.tail || !(v.sm ? v.roles.intra_comm == sm_roles.intra_comm : v.ce_chunks == 1 && v.roles.compute == op.sms))
      continue;
    vt[i].gather = timer.add([&op, pv] { return op.enqueue(*pv, false); });
    if (v.sm) continue;
    // Where the fused time goes: the gates alone, the copies beside an ungated GEMM, and the same
    // bytes copied within this GPU (no NVLink), alone and beside the ungated GEMM.
    vt[i].gates_open = timer.add([&op, pv] { return op.enqueue_copy_engines(*pv, true, false, true); });
    vt[i].recheck = timer.add([&op, pv] { return op.enqueue_copy_engines(*pv, true, false, true, true); });
    vt[i].beside = timer.add([&op, pv] { return op.enqueue_copy_engines(*pv, true, true, false); });
    if (!op.local_dst) WEFT_CUDA_CHECK(cudaMalloc(&op.local_dst, local_bytes));
    vt[i].local_alone = timer.add([&op, pv] { return op.enqueue_copy_engines(*pv, false, true, false, false, true); });
    vt[i].local_beside = timer.add([&op, pv] { return op.enqueue_copy_engines(*pv, true, true, false, false, true); });
  }
  // The runtime op (runtime/exec/ag_gemm.h, what `weftrun run` and the API execute) on the model's
  // plan (the tuner's, with the op's own mover, without a tuning cache entry), on a context of its
  // own, in the same rounds: this rank's shard copied in from the runner's A on every call, and
  // written into the op's heap slot once (shard(), the API's zero-copy path). Every rank agrees
  // whether it runs (the context and the op are collective).
  const Plan rt_plan = plan_for(wl, info.rank, plan_mover(wl, wl.layout));
  std::unique_ptr<runtime::Context> rt_ctx;
  std::unique_ptr<runtime::AgGemmOp> rt_op;
  bf16* rt_c = nullptr;
  size_t i_rt = none, i_rt_heap = none;
  double rt_off = 0;
  WEFT_CHECK(max_over_ranks(boot, "weft.ag_gemm.rt.agree",
                            rt_plan.exec.executable && rt_plan.world_size == op.world ? 0 : 1, &rt_off));
  if (rt_off == 0) {
    WEFT_CHECK(runtime::Context::create(boot, rt_plan.heap_bytes + (4u << 20), &rt_ctx));
    WEFT_CHECK(runtime::AgGemmOp::create(*rt_ctx, rt_plan, &rt_op));
    WEFT_CUDA_CHECK(cudaMalloc(&rt_c, size_t(op.m * op.n) * sizeof(bf16)));
    WEFT_CHECK(poison_bf16(rt_c, op.m * op.n, op.main));  // an element no call writes fails the check below
    WEFT_CUDA_CHECK(cudaMemcpyAsync(rt_op->shard(), op.shard(op.rank), size_t(op.m_loc * op.k) * sizeof(bf16),
                                    cudaMemcpyDeviceToDevice, op.main));
    i_rt = timer.add([&] { return rt_op->run(op.shard(op.rank), op.b, rt_c, op.main); });
    i_rt_heap = timer.add([&] { return rt_op->run(rt_op->shard(), op.b, rt_c, op.main); });
  } else if (op.rank == 0) {
    printf("(no runtime op rows: %s)\n", !rt_plan.exec.executable         ? rt_plan.exec.not_executable.c_str()
                                         : rt_plan.world_size != op.world ? "the plan is for another number of ranks"
                                                                          : "another rank has no plan to run");
  }
  if (op.rank == 0) {
    printf("rank 0: ag_gemm timing %zu runs interleaved, %d warm-up + %d timed rounds\n", timer.size(), warm, iters);
    fflush(stdout);
  }
  const Status timed_st = timer.run(boot, comm, op.main, warm, iters, "weft.ag_gemm.t" + std::to_string(key++), [&] {
    if (rt_op) rt_op->unstick();
  });
  if (op.local_dst) cudaFree(op.local_dst);
  op.local_dst = nullptr;
  WEFT_CHECK(timed_st);
  const bool timed_ok = op.frame.check("ag_gemm timed runs") == Status::kOk;
  double any_timeout = 0;
  WEFT_CHECK(max_over_ranks(boot, "weft.ag_gemm.ok" + std::to_string(key++), timed_ok ? 0 : 1, &any_timeout));

  const double t_seq = timer.ms(i_seq), t_gemm = timer.ms(i_gemm), t_comm = timer.ms(i_comm);
  const double t_wgemm = timer.ms(i_wgemm), t_wgemm_one = timer.ms(i_wgemm_one);
  const double bound = std::max(t_gemm, t_comm);
  std::vector<ResultRow> rows;
  char note[256];
  rows.push_back({"nccl all-gather + cublas", t_seq, tf(t_seq), "sequential baseline"});
  rows.push_back({"cublas gemm alone", t_gemm, tf(t_gemm), ""});
  rows.push_back({"nccl all-gather alone", t_comm, 0, ""});
  rows.push_back({"bound", bound, tf(bound), "max(gemm, all-gather)"});
  rows.push_back({"weft gemm alone (no wait)", t_wgemm, tf(t_wgemm), std::to_string(op.sms) + " SMs"});
  rows.push_back({"diag: weft gemm alone, one raster", t_wgemm_one, tf(t_wgemm_one),
                  "all of A in one raster, not rank-rotated per shard"});
  if (i_wgemm_sm != none)
    rows.push_back({"weft gemm alone, SM movers' count", timer.ms(i_wgemm_sm), tf(timer.ms(i_wgemm_sm)),
                    std::to_string(sm_roles.compute) + " SMs"});
  if (i_wgemm_waves != none)
    rows.push_back({"weft gemm alone, same waves", timer.ms(i_wgemm_waves), tf(timer.ms(i_wgemm_waves)),
                    std::to_string(same_waves) + " SMs (the fewest for " + std::to_string(waves) + " waves)"});
  if (i_wgemm_full != none)
    rows.push_back({"weft gemm alone, full last round", timer.ms(i_wgemm_full), tf(timer.ms(i_wgemm_full)),
                    std::to_string(full_round) + " SMs (the split tail's last round fills them)"});

  const Variant* best = nullptr;
  for (size_t i = 0; i < op.variants.size(); ++i) {
    Variant& v = *op.variants[i];
    if (!passed[i]) {
      rows.push_back({"FAILED: " + v.name, 0, 0, "validation failed (see the warnings)"});
      continue;
    }
    if (any_timeout > 0) {
      rows.push_back({"FAILED: " + v.name, 0, 0, "a device wait timed out during the timed runs (all interleaved)"});
      continue;
    }
    v.valid = true;
    v.ms = timer.ms(vt[i].fused);
    const Plan& plan = v.sm ? plan_sm : plan_ce;
    snprintf(note, sizeof note, "%.2fx bound; %s; tuner %.3f ms", v.ms / bound, roles_text(v.roles).c_str(),
             plan.makespan_s * 1e3);
    rows.push_back({"weft fused: " + v.name, v.ms, tf(v.ms), note});
    if (op.rank == 0) printf("rank 0: ag_gemm %s: %.3f ms (%s)\n", v.name.c_str(), v.ms, note);
    if (!best || v.ms < best->ms) best = &v;
    if (vt[i].gather == none) continue;
    const double t = timer.ms(vt[i].gather);
    const double gbps = double(op.world - 1) * double(op.m_loc * op.k) * sizeof(bf16) / (t * 1e-3) / 1e9;
    if (v.sm)
      snprintf(note, sizeof note, "%.0f GB/s in, %.1f GB/s per intra_comm SM", gbps, gbps / v.roles.intra_comm);
    else
      snprintf(note, sizeof note, "%.0f GB/s in", gbps);
    rows.push_back({"gather alone: " + v.name, t, 0, note});
    if (op.rank == 0) printf("rank 0: ag_gemm gather alone, %s: %.3f ms (%s)\n", v.name.c_str(), t, note);
    if (vt[i].gates_open == none) continue;
    auto diag = [&](size_t idx, const std::string& what, const char* why) {
      rows.push_back({"diag: " + what, timer.ms(idx), tf(timer.ms(idx)), why});
    };
    diag(vt[i].gates_open, v.name + ", gates open, no copies", "what the gates cost");
    diag(vt[i].recheck, v.name + ", gates open, checked every tile",
         "a flag load and proxy fence per tile, not per shard");
    diag(vt[i].beside, v.name + ", copies beside, no gates", "what the copies cost the GEMM");
    const double t_local = timer.ms(vt[i].local_alone);
    snprintf(note, sizeof note, "%.0f GB/s", double(local_bytes) / (t_local * 1e-3) / 1e9);
    rows.push_back({"diag: the same bytes copied within the GPU, alone", t_local, 0, note});
    diag(vt[i].local_beside, "the same bytes copied within the GPU, beside the GEMM, no gates",
         "what local copies of those bytes cost the GEMM");
  }
  if (rt_op) {
    // The op's C of its last call against cuBLAS on NCCL's gathered A (both rows ran every round).
    Comparison cmp;
    WEFT_CUDA_CHECK(cudaStreamSynchronize(op.main));
    WEFT_CHECK(compare_bf16(rt_c, op.c_ref, op.m * op.n, op.main, &cmp));
    const bool wrong = cmp.non_finite || !(cmp.rel_err < 1e-2);
    if (wrong)
      WEFT_WARN(kKernel,
                "rank %d: ag_gemm: the runtime op's C differs from cuBLAS: rel err %.3g, %lld elements not finite",
                op.rank, cmp.rel_err, static_cast<long long>(cmp.non_finite));
    double any_wrong = 0;  // every rank stops here together, or none does
    WEFT_CHECK(max_over_ranks(boot, "weft.ag_gemm.rt.check", wrong ? 1 : 0, &any_wrong));
    if (any_wrong > 0) {
      rt_op.reset();
      rt_ctx.reset();
      cudaFree(rt_c);
      return Status::kInternal;
    }
    const double fastest = best ? best->ms : 0;
    snprintf(note, sizeof note, "%.3fx the fastest fused row; the plan: %s, %s; C rel err %.1e; shard copied in",
             fastest > 0 ? timer.ms(i_rt) / fastest : 0.0, to_string(rt_plan.intra_mover()),
             roles_text(rt_plan.roles).c_str(), cmp.rel_err);
    rows.insert(rows.begin(), {"weft runtime op, the plan", timer.ms(i_rt), tf(timer.ms(i_rt)), note});
    snprintf(note, sizeof note, "%.3fx the fastest fused row; A written into the op's heap slot (shard())",
             fastest > 0 ? timer.ms(i_rt_heap) / fastest : 0.0);
    rows.insert(rows.begin() + 1,
                {"weft runtime op, A in the heap", timer.ms(i_rt_heap), tf(timer.ms(i_rt_heap)), note});
  }
  if (best) {
    snprintf(note, sizeof note, "%.2fx bound, %.2fx faster than nccl+cublas; auto keeps: %s (%s)", best->ms / bound,
             t_seq / best->ms, best->name.c_str(), roles_text(best->roles).c_str());
    rows.insert(rows.begin(), {"weft fused (one launch)", best->ms, tf(best->ms), note});
  }
  for (const Plan* p : {&plan_sm, &plan_ce}) {
    if (p->makespan_s <= 0) continue;
    snprintf(note, sizeof note, "%s: %s, limited by %s", to_string(p->intra_mover()), roles_text(p->roles).c_str(),
             p->limited_by.c_str());
    rows.push_back({std::string("tuner prediction, ") + to_string(p->intra_mover()), p->makespan_s * 1e3,
                    tf(p->makespan_s * 1e3), note});
  }
  char title[256];
  snprintf(title, sizeof title,
           "ag_gemm %s: M %lld x N %lld (per rank) x K %lld, %d ranks, median of %d, max over ranks", wl.name.c_str(),
           static_cast<long long>(op.m), static_cast<long long>(op.n), static_cast<long long>(op.k), op.world, iters);
  char extra[256];
  snprintf(extra, sizeof extra, "\"op\": \"ag_gemm\", \"m\": %lld, \"n\": %lld, \"k\": %lld, \"world\": %d",
           static_cast<long long>(op.m), static_cast<long long>(op.n), static_cast<long long>(op.k), op.world);
  print_results(boot, title, rows, extra);
  rt_op.reset();  // before its context
  rt_ctx.reset();
  if (rt_c) cudaFree(rt_c);

  cublasDestroy(blas);
  ncclCommDestroy(comm);
  if (!best) {
    WEFT_WARN(kKernel, "rank %d: ag_gemm %s: no variant validated", op.rank, wl.name.c_str());
    return Status::kInternal;
  }
  for (const auto& v : op.variants)
    if (!v->valid) return Status::kInternal;  // every variant asked for must work
  return Status::kOk;
}

}  // namespace weft::runtime::ops
