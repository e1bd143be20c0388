// GEMM+ReduceScatter and GEMM+AllReduce on one node: K is split across ranks, each rank computes a
// partial C, and owner o (rank o) gets the sum of row block o.
//
// Overlap path (M / W a multiple of 128): one persistent GEMM per rank and no reduction kernel.
//   rank r: A_r (m × k/W), B_r (n × k/W)  ─►  partial P_r = A_r · B_rᵀ (m × n)
//   tile order: owners r+1, r+2, …, r (own rows last), each owner's rows in S pieces (M-shards);
//     after each tile: tiles[piece] += 1
//   rows of other owners: the epilogue stores P_r locally; the comm stream (copy engines, no SMs)
//     waits tiles[piece] complete ─► copies the piece into owner o's staging slot r over NVLink
//     ─► arrived[r·S + j] = e on o (a stream write into o's memory). With 3 or more ranks each
//     round's last owner's pieces go by 4 mover SMs beside the GEMM instead (kernels/piece_push.h:
//     16-byte stores over NVLink, then moved[r·S + j] += 1 per block on o): the copy engines run
//     only two copies of a round at once, and the third used to wait for them.
//   own rows: piece j's tiles wait (producer, bounded) on gate[j], which the gate stream raises
//     once every peer's piece j has arrived (arrival flags and mover counts); the epilogue adds
//     the W-1 staged partials to the fp32 accumulator in slot order (same bits every run), rounds
//     once, and stores the sum:
//     RS: this rank's output;  AR: its rows of C, which one stream per peer copies into that
//     peer's C, piece by piece as the tiles complete ─► gathered[r] = e on the peer; the op ends
//     when every peer's rows are here (stream waits).
//   The tile counts are released at GPU scope: only this GPU's copy engines and stream waits
//   read them.
//   After the GEMM: freed[r] = e on every peer (the slots may be overwritten in the next epoch).
//   Variants (all validated and timed by `auto`; gemm_reduce_overlap.cpp): partial tiles sent by
//   the epilogue itself (TMA into the owner's slot, a per-piece count in the owner's memory as the
//   gate; WEFT_GEMM_REDUCE_SEND=sm), and reduced rows pulled by the peers' copy engines or stored
//   into every peer's C by the epilogue (WEFT_GEMM_AR_GATHER=pull|sm).
// Peer path (small M, latency-bound): the GEMM stores P_r in a buffer every rank maps, then one
//   kernel (kernels/reduce_slots.h) sums rank r's rows of all W partials, read over NVLink, into
//   the output (RS) or its rows of C, and (AR) pulls every peer's reduced rows into its C.
//
// Every device wait is bounded: the GEMM and the peer kernel time out through the frame's error
// record; stream waits are released and reported by the host past WEFT_DEVICE_TIMEOUT.
#include <cuda_bf16.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/params.h"
#include "kernels/gemm.h"
#include "kernels/piece_push.h"
#include "kernels/reduce_slots.h"
#include "runtime/exec/context.h"
#include "runtime/exec/device_data.h"
#include "runtime/exec/gemm_reduce.h"
#include "runtime/ops/cuda_check.h"
#include "runtime/ops/gemm_reduce.h"
#include "runtime/ops/op_harness.h"
#include "runtime/ops/ops.h"
#include "runtime/workload.h"

namespace weft::runtime::ops {

using bf16 = __nv_bfloat16;

Status GemmReduce::enqueue_fused() {
  auto t0 = std::chrono::steady_clock::now();
  ++epoch;
  Status st = overlap ? enqueue_overlap() : enqueue_peer();
  host_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  ++host_runs;
  return st;
}

void GemmReduce::unstick() {
  cudaStream_t s = nullptr;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return;
  std::vector<uint64_t> big(size_t(world * pieces), kNeverFlag);
  for (uint64_t* f : {tiles, gate}) cudaMemcpyAsync(f, big.data(), big.size() * 8, cudaMemcpyHostToDevice, s);
  cudaMemcpyAsync(arrived.local<uint64_t>(), big.data(), big.size() * 8, cudaMemcpyHostToDevice, s);
  for (const HeapBuffer* f : {&freed, &gathered, &bcast})
    cudaMemcpyAsync(f->local<uint64_t>(), big.data(), sizeof(uint64_t) * world, cudaMemcpyHostToDevice, s);
  for (const HeapBuffer* f : {&ready, &landed, &moved})
    cudaMemcpyAsync(f->local<uint64_t>(), big.data(), big.size() * 8, cudaMemcpyHostToDevice, s);
  cudaStreamSynchronize(s);
  cudaStreamDestroy(s);
}

Status GemmReduce::set_roles() {
  const int gemm_sms = sms - (use_movers() ? mover_blocks : 0);
  roles.compute = gemm_sms - gemm_sms % 2;
  return frame.params(roles, &frame_params);
}

Status GemmReduce::sync(const char* what) {
  return sync_bounded(main, 2 * param_double_or_default("WEFT_DEVICE_TIMEOUT"), what, [this] { unstick(); });
}

GemmReduce::~GemmReduce() {
  cudaDeviceSynchronize();
  for (void* p : {static_cast<void*>(a), static_cast<void*>(b), static_cast<void*>(out), static_cast<void*>(ref),
                  static_cast<void*>(tiles), static_cast<void*>(gate), static_cast<void*>(diag_tiles),
                  static_cast<void*>(arrive)})
    if (p) cudaFree(p);
  for (cudaEvent_t e : {fork, join, gates_done, movers_done})
    if (e) cudaEventDestroy(e);
  for (const auto* events : {&pushed, &sent})
    for (cudaEvent_t e : *events)
      if (e) cudaEventDestroy(e);
  for (const auto* streams : {&push, &sends})
    for (cudaStream_t s : *streams)
      if (s) cudaStreamDestroy(s);
  for (cudaStream_t s : {comm, gates, movers})
    if (s) cudaStreamDestroy(s);
  if (main) cudaStreamDestroy(main);
}

namespace {

// The NCCL + cuBLAS sequence: partial GEMM, then reduce-scatter or all-reduce.
Status enqueue_sequence(GemmReduce& op, ncclComm_t comm, cublasHandle_t blas) {
  bf16* partial = op.partial.local<bf16>();
  WEFT_CHECK(cublas_gemm_tn(blas, op.m, op.n, op.k_loc, op.a, op.k_loc, op.b, op.k_loc, partial, op.n, op.main));
  if (op.all_reduce)
    WEFT_NCCL_CHECK(ncclAllReduce(partial, op.ref, size_t(op.m * op.n), ncclBfloat16, ncclSum, comm, op.main));
  else
    WEFT_NCCL_CHECK(ncclReduceScatter(partial, op.ref, size_t(op.m_loc * op.n), ncclBfloat16, ncclSum, comm, op.main));
  return Status::kOk;
}

Status validate(GemmReduce& op, ncclComm_t comm, cublasHandle_t blas, const char* name, bool deterministic) {
  WEFT_CHECK(poison_bf16(op.result(), op.result_elems(), op.main));
  // The staged slots too: an own tile that read a slot before its piece landed shows as NaN.
  if (op.overlap) WEFT_CHECK(poison_bf16(op.staging.local<bf16>(), op.world * op.m_loc * op.n, op.main));
  WEFT_CUDA_CHECK(cudaStreamSynchronize(op.main));
  // Every rank's output is poisoned before anyone's fused run writes into it.
  WEFT_NCCL_CHECK(ncclAllReduce(op.ref, op.ref, 1, ncclBfloat16, ncclSum, comm, op.main));
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
    WEFT_WARN(kKernel,
              "rank %d: %s: result differs from cuBLAS + NCCL: rel err %.3g (tolerance %.0e), %lld elements "
              "not written or not finite (first bad element %lld)",
              op.rank, name, cmp.rel_err, tol, static_cast<long long>(cmp.non_finite),
              static_cast<long long>(cmp.first_mismatch));
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
      WEFT_WARN(kKernel, "rank %d: %s: WEFT_DETERMINISTIC=1 but a second run differs in %lld elements", op.rank, name,
                static_cast<long long>(cmp.mismatched));
      return Status::kInternal;
    }
    printf("rank %d: %s repeated bit for bit (WEFT_DETERMINISTIC=1)\n", op.rank, name);
  }
  return Status::kOk;
}

// Overlap path where the owners' row blocks are whole tiles (and `want_pieces` of them, if set),
// else the peer path. Pieces: as many as asked, or the most (<= 4) of at least 2 MiB each. With
// copy-engine sends each piece costs host calls (a copy and flag batches), so past a few pieces the
// host's enqueue, not the GPU, sets the op's time (measured: docs/results/2026-11-gemm-reduce.md,
// "8 pieces of 4 MiB"). SM sends enqueue nothing per piece.
Status choose_path(GemmReduce& op, const char* name) {
  std::string path;
  int64_t want_pieces = 0;
  WEFT_CHECK(get_param("WEFT_GEMM_REDUCE_PATH", &path));
  WEFT_CHECK(get_param("WEFT_GEMM_REDUCE_PIECES", &want_pieces));
  const int64_t tile = kernels::GemmConfig::kTileM;
  const bool fits = op.m_loc % tile == 0;
  if (path != "auto" && path != "overlap" && path != "peer") {
    WEFT_WARN(kKernel, "rank %d: %s: WEFT_GEMM_REDUCE_PATH='%s' is not auto, overlap or peer", op.rank, name,
              path.c_str());
    return Status::kInvalidArgument;
  }
  if (path == "overlap" && !fits) {
    WEFT_WARN(kKernel, "rank %d: %s: the overlap path needs M/ranks (%lld) to be a multiple of %lld rows", op.rank,
              name, static_cast<long long>(op.m_loc), static_cast<long long>(tile));
    return Status::kInvalidArgument;
  }
  // auto: the overlap path where an owner's row block is whole tiles, and, when only the copy
  // engines may send, at least 16 MiB: below that a copy's fixed latency is not hidden behind the
  // GEMM, and the peer path (one reduction after it) is as fast or faster; SM sends have no such
  // latency (the 8 MiB blocks of GEMM+RS 2048 x 8192 x 7168: docs/results/2026-11-gemm-reduce.md).
  std::string send;
  WEFT_CHECK(get_param("WEFT_GEMM_REDUCE_SEND", &send));
  const int64_t block_bytes = op.m_loc * op.n * int64_t(sizeof(bf16));
  const bool big_enough = send != "copy" || block_bytes >= (int64_t(16) << 20);
  op.overlap = path == "overlap" || (path == "auto" && fits && big_enough);
  if (!op.overlap) return Status::kOk;
  if (want_pieces > 0) {
    if (want_pieces > 64 || op.m_loc % (tile * want_pieces) != 0) {
      WEFT_WARN(kKernel,
                "rank %d: %s: WEFT_GEMM_REDUCE_PIECES=%lld must split %lld rows into pieces of a multiple of "
                "%lld rows (at most 64 pieces)",
                op.rank, name, static_cast<long long>(want_pieces), static_cast<long long>(op.m_loc),
                static_cast<long long>(tile));
      return Status::kInvalidArgument;
    }
    op.pieces = int(want_pieces);
  } else {
    op.pieces = 1;
    while (op.pieces < 4 && op.m_loc % (tile * op.pieces * 2) == 0 && block_bytes / (op.pieces * 2) >= (2 << 20))
      op.pieces *= 2;
  }
  op.m_piece = op.m_loc / op.pieces;
  return Status::kOk;
}

// Mover SMs beside the overlap path's GEMM with copy-engine sends: WEFT_GEMM_REDUCE_MOVERS blocks
// push each round's last owner's pieces (WEFT_GEMM_REDUCE_MOVER_LAST, 3 or more ranks) and the last
// WEFT_GEMM_REDUCE_MOVER_ROWS rows of every other piece; the copy engines move the rest. The GEMM
// gets the other SMs (an even count). 0 blocks: the copy engines move everything.
Status choose_movers(GemmReduce& op, const char* name, int sms) {
  int64_t blocks = 0, rows = 0;
  WEFT_CHECK(get_param("WEFT_GEMM_REDUCE_MOVERS", &blocks));
  WEFT_CHECK(get_param("WEFT_GEMM_REDUCE_MOVER_ROWS", &rows));
  WEFT_CHECK(get_param("WEFT_GEMM_REDUCE_MOVER_LAST", &op.mover_last));
  if (!op.overlap || blocks == 0) rows = 0, op.mover_last = false;
  if (op.world < 3) op.mover_last = false;  // the last owner would be the only one: nothing left to the copy engines
  const bool on = rows > 0 || op.mover_last;
  // One kernel argument holds every piece the movers take: the last owner's, or every other owner's.
  const int64_t steps = on ? int64_t(rows > 0 ? op.world - 1 : 1) * op.pieces : 0;
  if (blocks < 0 || rows < 0 || rows > op.m_piece || (on && (blocks < 1 || blocks > sms / 2)) ||
      (op.m_piece - rows) * op.n % 8 || steps > kernels::PiecePushParams::kMaxSteps) {
    WEFT_WARN(kKernel,
              "rank %d: %s: WEFT_GEMM_REDUCE_MOVERS=%lld, WEFT_GEMM_REDUCE_MOVER_ROWS=%lld, "
              "WEFT_GEMM_REDUCE_MOVER_LAST=%d: the movers need 1 to %d blocks, at most the %lld rows of a piece "
              "(leaving a multiple of 8 elements to the copy engines) and at most %d pieces to push (%lld here, %d per "
              "owner)",
              op.rank, name, static_cast<long long>(blocks), static_cast<long long>(rows), int(op.mover_last), sms / 2,
              static_cast<long long>(op.m_piece), kernels::PiecePushParams::kMaxSteps, static_cast<long long>(steps),
              op.pieces);
    return Status::kInvalidArgument;
  }
  op.mover_rows = rows;
  op.mover_blocks = on ? int(blocks) : 0;
  op.sms = sms;
  return Status::kOk;
}

// How the overlap path moves data: partial tiles sent by the copy engines or the SMs
// (WEFT_GEMM_REDUCE_SEND), reduced rows gathered by push, pull or the SMs (WEFT_GEMM_AR_GATHER,
// AllReduce only). "auto" tries each; the peer path has one way.
struct Variant {
  bool sm_send;
  ArGather gather;
};

Status parse_variants(const GemmReduce& op, const char* name, std::vector<Variant>* out) {
  std::string send, gather;
  WEFT_CHECK(get_param("WEFT_GEMM_REDUCE_SEND", &send));
  WEFT_CHECK(get_param("WEFT_GEMM_AR_GATHER", &gather));
  std::vector<bool> sends;
  if (send == "auto" || send == "copy") sends.push_back(false);
  if (send == "auto" || send == "sm") sends.push_back(true);
  std::vector<ArGather> gathers;
  for (ArGather g : {ArGather::kPush, ArGather::kPull, ArGather::kSm})
    if (gather == "auto" || gather == ar_gather_name(g)) gathers.push_back(g);
  if (sends.empty() || gathers.empty()) {
    WEFT_WARN(kKernel,
              "rank %d: %s: WEFT_GEMM_REDUCE_SEND='%s' (copy, sm or auto) or WEFT_GEMM_AR_GATHER='%s' (push, "
              "pull, sm or auto) is not known",
              op.rank, name, send.c_str(), gather.c_str());
    return Status::kInvalidArgument;
  }
  if (!op.overlap) sends.resize(1);
  if (!op.overlap || !op.all_reduce) gathers.resize(1);
  out->clear();
  for (bool s : sends)
    for (ArGather g : gathers) out->push_back({s, g});
  return Status::kOk;
}

Status run_gemm_reduce(const bootstrap::RankContext& ctx, const Workload& wl, bootstrap::Bootstrap& boot,
                       bool all_reduce) {
  const auto& info = boot.info();
  const char* name = all_reduce ? "gemm_ar" : "gemm_rs";
  if (ctx.gpu < 0) {
    WEFT_WARN(kKernel, "rank %d: %s needs a GPU and this rank has none", info.rank, name);
    return Status::kUnsupported;
  }
  if (info.num_nodes > 1) return run_gemm_reduce_nodes(ctx, wl, boot, all_reduce);
  if (wl.world_size() != info.size || info.size > kernels::EpiReduceSlots::kMaxOwnMaps) {
    WEFT_WARN(kKernel, "rank %d: %s needs %d ranks (at most %d on one node) but the job has %d", info.rank, name,
              wl.world_size(), kernels::EpiReduceSlots::kMaxOwnMaps, info.size);
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
  if (op.m % op.world || (op.m_loc * op.n) % 8 || wl.gemm.k % op.world || op.m >= (int64_t(1) << 31)) {
    WEFT_WARN(kKernel,
              "rank %d: %s: %s: m %lld and k %lld must split over %d ranks (row blocks of a multiple of 8 "
              "elements)",
              info.rank, name, wl.source.c_str(), static_cast<long long>(op.m), static_cast<long long>(wl.gemm.k),
              op.world);
    return Status::kInvalidArgument;
  }
  WEFT_CHECK(choose_path(op, name));

  const Plan plan = plan_for(wl, info.rank);
  int sms = 0;
  WEFT_CHECK(kernels::device_sm_count(&sms));
  op.peer_blocks = sms * 2;
  WEFT_CHECK(choose_movers(op, name, sms));
  bool deterministic = false;
  WEFT_CHECK(get_param("WEFT_DETERMINISTIC", &deterministic));

  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&op.main, cudaStreamNonBlocking));
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&op.comm, cudaStreamNonBlocking));
  for (cudaEvent_t* e : {&op.fork, &op.join}) WEFT_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  WEFT_CHECK(get_param("WEFT_GEMM_REDUCE_SYS_SIGNAL", &op.sys_signal));
  WEFT_CHECK(get_param("WEFT_GEMM_AR_SERIAL_PUSH", &op.serial_push));
  WEFT_CHECK(get_param("WEFT_GEMM_REDUCE_OWN_TMA", &op.own_tma));
  WEFT_CHECK(get_param("WEFT_GEMM_REDUCE_SLOT_TMA", &op.slot_tma));
  bool loop_signal = true;
  WEFT_CHECK(get_param("WEFT_GEMM_REDUCE_LOOP_SIGNAL", &loop_signal));
  op.signal_variant = loop_signal ? kernels::kSignalInLoop : kernels::kSignalImmediate;
  std::vector<Variant> variants;
  WEFT_CHECK(parse_variants(op, name, &variants));
  if (op.overlap) WEFT_CHECK(op.setup_overlap());
  WEFT_CUDA_CHECK(cudaMalloc(&op.arrive, 2 * sizeof(uint64_t)));
  WEFT_CUDA_CHECK(cudaMemset(op.arrive, 0, 2 * sizeof(uint64_t)));
  const int nflags = op.world * op.pieces;
  for (uint64_t** f : {&op.tiles, &op.gate, &op.diag_tiles}) {
    WEFT_CUDA_CHECK(cudaMalloc(f, sizeof(uint64_t) * nflags));
    WEFT_CUDA_CHECK(cudaMemset(*f, 0, sizeof(uint64_t) * nflags));
  }
  // Other owners' pieces never wait; this rank's wait for the comm stream's epochs.
  std::vector<uint64_t> gate_init(size_t(nflags), kNeverFlag);
  for (int j = 0; j < op.pieces; ++j) gate_init[size_t(op.rank * op.pieces + j)] = 0;
  WEFT_CUDA_CHECK(cudaMemcpy(op.gate, gate_init.data(), sizeof(uint64_t) * nflags, cudaMemcpyHostToDevice));
  WEFT_CUDA_CHECK(cudaMalloc(&op.a, size_t(op.m * op.k_loc) * sizeof(bf16)));
  WEFT_CUDA_CHECK(cudaMalloc(&op.b, size_t(op.n * op.k_loc) * sizeof(bf16)));
  WEFT_CUDA_CHECK(cudaMalloc(&op.ref, size_t(op.result_elems()) * sizeof(bf16)));
  if (!all_reduce) WEFT_CUDA_CHECK(cudaMalloc(&op.out, size_t(op.m_loc * op.n) * sizeof(bf16)));
  const std::string key = std::string(name) + ".";
  // Every buffer a peer reads or writes, in one heap (all zero: the flags start at 0).
  op.heap.take(size_t(op.m * op.n) * sizeof(bf16), &op.partial);
  if (op.overlap) op.heap.take(size_t(op.world * op.m_loc * op.n) * sizeof(bf16), &op.staging);
  if (all_reduce) op.heap.take(size_t(op.m * op.n) * sizeof(bf16), &op.c_full);
  struct FlagSet {
    HeapBuffer* buf;
    int count;
  };
  for (const FlagSet& f : {FlagSet{&op.arrived, nflags}, FlagSet{&op.freed, op.world}, FlagSet{&op.gathered, op.world},
                           FlagSet{&op.ready, nflags}, FlagSet{&op.landed, nflags}, FlagSet{&op.moved, nflags},
                           FlagSet{&op.bcast, op.world}, FlagSet{&op.peer_flags, 3 * op.world}})
    op.heap.take(sizeof(uint64_t) * f.count, f.buf);
  WEFT_CHECK(op.setup_peer(boot, key));  // takes the peer path's buffers
  WEFT_CHECK(op.heap.create(boot, name));

  uint64_t seed = 0;
  WEFT_CHECK(shared_seed(boot, key + "seed", &seed));
  WEFT_CHECK(fill_random_bf16(op.a, op.m * op.k_loc, seed, op.rank, 1.0f, op.main));
  WEFT_CHECK(fill_random_bf16(op.b, op.n * op.k_loc, seed + 1, op.rank, 1.0f, op.main));
  WEFT_CUDA_CHECK(cudaStreamSynchronize(op.main));
  WEFT_CUDA_CHECK(cudaDeviceSynchronize());
  WEFT_CHECK(boot.barrier(key + "inputs"));  // flags zeroed everywhere before anyone signals

  WEFT_CHECK(op.make_gemm());
  WEFT_CHECK(op.make_epilogues());
  WEFT_CHECK(op.frame.create(op.rank));
  WEFT_CHECK(op.set_roles());

  ncclComm_t comm = nullptr;
  WEFT_CHECK(create_nccl_comm(boot, &comm));
  cublasHandle_t blas = nullptr;
  WEFT_CUBLAS_CHECK(cublasCreate(&blas));

  // Each variant validated, then timed; the fastest (max over ranks, so every rank picks the same)
  // is the op's. Then the op and its baselines are timed together, interleaved (InterleavedTimer):
  // the rows the summary compares come from one set of rounds.
  const int warm = wl.run.warmup, iters = wl.run.iters;
  double t[9] = {}, mx[9] = {};
  double best = 0;
  Variant best_variant = variants.front();
  std::vector<ResultRow> variant_rows;
  for (const Variant& v : variants) {
    op.sm_send = v.sm_send;
    op.gather = v.gather;
    WEFT_CHECK(op.make_epilogues());
    WEFT_CHECK(op.set_roles());
    std::string what = name;
    if (variants.size() > 1)
      what += std::string(" (sends ") + (v.sm_send ? "sm" : "copy") +
              (op.all_reduce ? std::string(", gather ") + ar_gather_name(v.gather) : std::string()) + ")";
    if (wl.run.validate) WEFT_CHECK(validate(op, comm, blas, what.c_str(), deterministic));
    if (variants.size() == 1) break;  // nothing to choose: the interleaved rounds below time it
    double tv = 0, mxv = 0;
    const Status timed = time_op(
        comm, op.main, warm, iters, [&] { return op.enqueue_fused(); }, &tv, [&] { op.unstick(); });
    const Status device = op.frame.check(what.c_str());  // a device wait that timed out says which
    WEFT_CHECK(timed);
    WEFT_CHECK(device);
    WEFT_CHECK(max_over_ranks(boot, key + "variant" + what, tv, &mxv));
    variant_rows.push_back({"weft fused, " + op.overlap_text(), mxv, 0, "variant"});
    if (best == 0 || mxv < best) {
      best = mxv;
      best_variant = v;
    }
  }
  op.sm_send = best_variant.sm_send;
  op.gather = best_variant.gather;
  WEFT_CHECK(op.make_epilogues());
  WEFT_CHECK(op.set_roles());
  // The runtime op (runtime/exec/gemm_reduce.h, what `weftrun run` and the API execute) on the
  // model's plan (the tuner's, without a tuning cache entry), on a context of its own, timed in the
  // same rounds as the runner: on the runner's inputs, C into a buffer of the caller's (AllReduce:
  // copied out of the heap) and, AllReduce, left in the heap (heap_c(), the API's zero-copy path).
  // Every rank agrees whether it runs (the context and the op are collective).
  std::unique_ptr<runtime::Context> rt_ctx;
  std::unique_ptr<runtime::GemmReduceOp> rt_op;
  bf16* rt_c = nullptr;
  const int64_t rt_elems = all_reduce ? op.m * op.n : op.m_loc * op.n;
  double rt_off = 0;
  WEFT_CHECK(
      max_over_ranks(boot, key + "rt.agree", plan.exec.executable && plan.world_size == op.world ? 0 : 1, &rt_off));
  if (rt_off == 0) {
    WEFT_CHECK(runtime::Context::create(boot, plan.heap_bytes + (4u << 20), &rt_ctx));
    WEFT_CHECK(runtime::GemmReduceOp::create(*rt_ctx, plan, &rt_op));
    WEFT_CUDA_CHECK(cudaMalloc(&rt_c, size_t(rt_elems) * sizeof(bf16)));
    WEFT_CHECK(poison_bf16(rt_c, rt_elems, op.main));  // an element no call writes fails the check below
  } else if (op.rank == 0) {
    printf("(no runtime op rows: %s)\n", !plan.exec.executable         ? plan.exec.not_executable.c_str()
                                         : plan.world_size != op.world ? "the plan is for another number of ranks"
                                                                       : "another rank has no plan to run");
  }
  InterleavedTimer timer;
  timer.add([&] { return op.enqueue_fused(); });                // 0
  timer.add([&] { return enqueue_sequence(op, comm, blas); });  // 1
  timer.add([&] {                                               // 2
    return cublas_gemm_tn(blas, op.m, op.n, op.k_loc, op.a, op.k_loc, op.b, op.k_loc, op.partial.local<bf16>(), op.n,
                          op.main);
  });
  timer.add([&]() -> Status {  // 3
    bf16* partial = op.partial.local<bf16>();
    if (op.all_reduce)
      WEFT_NCCL_CHECK(ncclAllReduce(partial, op.ref, size_t(op.m * op.n), ncclBfloat16, ncclSum, comm, op.main));
    else
      WEFT_NCCL_CHECK(
          ncclReduceScatter(partial, op.ref, size_t(op.m_loc * op.n), ncclBfloat16, ncclSum, comm, op.main));
    return Status::kOk;
  });
  timer.add([&] {  // 4
    kernels::EpiStoreBf16 epi{op.partial.local<bf16>(), op.n, op.n % 2 == 0};
    return kernels::launch_gemm(op.gemm, op.frame_params, epi, kernels::FlagGate{}, kernels::TileSignal{}, op.main,
                                bench_gemm_options());
  });
  size_t i_rt = 0, i_rt_heap = 0;
  if (rt_op) {
    i_rt = timer.add([&] { return rt_op->run(op.a, op.b, rt_c, op.main); });
    if (all_reduce) i_rt_heap = timer.add([&] { return rt_op->run(op.a, op.b, rt_op->heap_c(), op.main); });
  }
  op.host_us = 0;
  op.host_runs = 0;
  const Status timed = timer.run(boot, comm, op.main, warm, iters, key + "interleaved", [&] {
    op.unstick();
    if (rt_op) rt_op->unstick();
  });
  WEFT_CHECK(op.frame.check(name));  // a device wait that timed out says which
  WEFT_CHECK(timed);
  for (int i = 0; i < 5; ++i) mx[i] = timer.ms(size_t(i));
  // The runtime op's C of its last call against NCCL's result on the same inputs (the collective's
  // row ran in every round; its sum order differs, hence a tolerance).
  Comparison rt_cmp;
  if (rt_op) {
    WEFT_CUDA_CHECK(cudaStreamSynchronize(op.main));
    WEFT_CHECK(compare_bf16(rt_c, op.ref, rt_elems, op.main, &rt_cmp));
    const bool wrong = rt_cmp.non_finite || !(rt_cmp.rel_err < 1e-2);
    if (wrong)
      WEFT_WARN(kKernel, "rank %d: %s: the runtime op's C differs from NCCL's: rel err %.3g, %lld elements not finite",
                op.rank, name, rt_cmp.rel_err, static_cast<long long>(rt_cmp.non_finite));
    double any_wrong = 0;  // every rank stops here together, or none does
    WEFT_CHECK(max_over_ranks(boot, key + "rt.check", wrong ? 1 : 0, &any_wrong));
    if (any_wrong > 0) {
      rt_op.reset();
      rt_ctx.reset();
      cudaFree(rt_c);
      return Status::kInternal;
    }
  }
  const double host_us = op.host_runs ? op.host_us / double(op.host_runs) : 0;
  if (op.overlap) {  // diagnostics of the fused op's GEMM, one after another
    WEFT_CHECK(time_op(
        comm, op.main, warm, iters, [&] { return op.enqueue_diag(false, false); }, &t[6]));
    WEFT_CHECK(time_op(
        comm, op.main, warm, iters, [&] { return op.enqueue_diag(false, true); }, &t[7]));
    WEFT_CHECK(time_op(
        comm, op.main, warm, iters, [&] { return op.enqueue_diag(true, true); }, &t[5]));
    WEFT_CHECK(op.frame.check(name));
  }
  std::vector<ResultRow> probe_rows;
  WEFT_CHECK(op.probe(comm, warm, iters, boot, key, &probe_rows));
  for (int i = 5; i < 8; ++i) WEFT_CHECK(max_over_ranks(boot, key + "t" + std::to_string(i), t[i], &mx[i]));
  WEFT_CHECK(max_over_ranks(boot, key + "host", host_us, &mx[8]));

  const double flops = 2.0 * double(op.m) * double(op.n) * double(op.k_loc);
  auto tf = [&](double ms) { return flops / (ms * 1e-3) / 1e12; };
  const double bound = std::max(mx[2], mx[3]);
  const char* coll = all_reduce ? "all-reduce" : "reduce-scatter";
  char note[256];
  std::vector<ResultRow> rows;
  char path[128];
  if (op.overlap)
    snprintf(path, sizeof path, "%s", op.overlap_text().c_str());
  else
    snprintf(path, sizeof path, "peer path, %s", op.peer_variant_name());
  snprintf(note, sizeof note,
           "%.2fx bound, %.2fx faster than nccl+cublas; %s; compute %d blocks; host enqueue %.0f us%s", mx[0] / bound,
           mx[1] / mx[0], path, op.roles.compute, mx[8], deterministic ? ", deterministic" : "");
  rows.push_back({"weft fused", mx[0], tf(mx[0]), note});
  for (ResultRow& r : variant_rows) r.tflops = tf(r.ms);
  rows.insert(rows.end(), variant_rows.begin(), variant_rows.end());
  rows.push_back({std::string("cublas + nccl ") + coll, mx[1], tf(mx[1]), "sequential baseline"});
  rows.push_back({"cublas gemm alone", mx[2], tf(mx[2]), ""});
  rows.push_back({std::string("nccl ") + coll + " alone", mx[3], 0, ""});
  rows.push_back({"bound", bound, tf(bound), "max(gemm, collective)"});
  rows.push_back({"weft gemm alone (local store)", mx[4], tf(mx[4]), "the fused op's GEMM without its signals"});
  if (op.overlap) {
    const char* scope = op.sys_signal ? "system" : "GPU";
    rows.push_back({"weft gemm, partial stores", mx[6], tf(mx[6]), "the fused op's GEMM without own rows or signals"});
    snprintf(note, sizeof note, "+ a %s-scope count per tile", scope);
    rows.push_back({"weft gemm, + tile signals", mx[7], tf(mx[7]), note});
    rows.push_back({"weft gemm, + own-row reduction", mx[5], tf(mx[5]),
                    "the fused op's GEMM, epilogue and signals without gate or copies"});
  }
  if (rt_op) {
    const std::string plan_text = plan.exec.variant == "overlap"
                                      ? plan.exec.variant + ", " + std::to_string(plan.exec.pieces) +
                                            " pieces, sends " + plan.exec.send + ", " +
                                            std::to_string(plan.roles.intra_comm) + " mover SMs"
                                      : plan.exec.variant;
    snprintf(note, sizeof note, "%.3fx the weft fused row; the model's plan (%s); C rel err %.1e%s",
             timer.ms(i_rt) / mx[0], plan_text.c_str(), rt_cmp.rel_err, all_reduce ? "; C copied out of the heap" : "");
    rows.push_back({"weft runtime op, the plan", timer.ms(i_rt), tf(timer.ms(i_rt)), note});
    if (all_reduce) {
      snprintf(note, sizeof note, "%.3fx the weft fused row; C left in the heap (heap_c())",
               timer.ms(i_rt_heap) / mx[0]);
      rows.push_back({"weft runtime op, C in the heap", timer.ms(i_rt_heap), tf(timer.ms(i_rt_heap)), note});
    }
  }
  rows.insert(rows.end(), probe_rows.begin(), probe_rows.end());
  WEFT_CHECK(op.peer_rows(
      comm, boot, key, warm, iters, [&](const char* what) { return validate(op, comm, blas, what, deterministic); },
      &rows));
  if (plan.makespan_s > 0) {
    snprintf(note, sizeof note, "tuner: compute %d intra %d, limited by %s", plan.roles.compute, plan.roles.intra_comm,
             plan.limited_by.c_str());
    rows.push_back({"tuner prediction", plan.makespan_s * 1e3, tf(plan.makespan_s * 1e3), note});
  }
  char title[256];
  snprintf(title, sizeof title,
           "%s %s: M %lld x N %lld x K %lld (K/%d per rank), %d ranks, median of %d, max over ranks; the op "
           "and its baselines interleaved",
           name, wl.name.c_str(), static_cast<long long>(op.m), static_cast<long long>(op.n),
           static_cast<long long>(wl.gemm.k), op.world, op.world, iters);
  char extra[256];
  snprintf(extra, sizeof extra, "\"op\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, \"world\": %d, \"pieces\": %d",
           name, static_cast<long long>(op.m), static_cast<long long>(op.n), static_cast<long long>(wl.gemm.k),
           op.world, op.overlap ? op.pieces : 0);
  print_results(boot, title, rows, extra);
  rt_op.reset();  // before its context
  rt_ctx.reset();
  if (rt_c) cudaFree(rt_c);
  cublasDestroy(blas);
  ncclCommDestroy(comm);
  return Status::kOk;
}

}  // namespace

Status run_gemm_rs(const bootstrap::RankContext& ctx, const Workload& wl, bootstrap::Bootstrap& boot) {
  return run_gemm_reduce(ctx, wl, boot, false);
}
Status run_gemm_ar(const bootstrap::RankContext& ctx, const Workload& wl, bootstrap::Bootstrap& boot) {
  return run_gemm_reduce(ctx, wl, boot, true);
}

}  // namespace weft::runtime::ops
