// ReduceOverlap: the overlap path's streams, tensor maps and one call's enqueue (the picture is in
// reduce_overlap.h).
#include "runtime/exec/reduce_overlap.h"

#include <cstdio>

#include "base/log.h"
#include "kernels/piece_push.h"
#include "runtime/exec/cuda_check.h"
#include "runtime/exec/stream_ops.h"

namespace weft::runtime {

using bf16 = __nv_bfloat16;
static_assert(kernels::PiecePushParams::kMaxSteps == kernels::kOverlapMaxMoverPieces,
              "the plan's limit on the movers' pieces is the kernel's");

std::string ReduceOverlap::misfit(const OverlapConfig& c, int sm_count) {
  const int64_t tile = kernels::GemmConfig::kTileM;
  if (c.world < 2 || c.world > kernels::EpiReduceSlots::kMaxOwnMaps)
    return std::to_string(c.world) + " ranks: the overlap path runs on 2 to " +
           std::to_string(kernels::EpiReduceSlots::kMaxOwnMaps) + " GPUs of one node";
  if (c.m % c.world != 0 || c.k_loc < 8 || c.k_loc % 8 != 0 || c.n % 8 != 0 || c.m >= (int64_t(1) << 31))
    return "m (below 2^31) must split over the ranks, k / ranks and n must be multiples of 8";
  if (c.cluster != 1) return "the overlap path runs 1-CTA clusters";
  if (c.pieces < 1 || c.pieces > 64 || (c.m / c.world) % (tile * c.pieces) != 0)
    return std::to_string(c.pieces) + " pieces: each rank's " + std::to_string(c.m / c.world) +
           " rows must split into 1 to 64 pieces of a multiple of " + std::to_string(tile) + " rows";
  if (c.lag < 1 || c.lag > c.pieces)
    return "lag " + std::to_string(c.lag) + ": expected 1 to the " + std::to_string(c.pieces) + " pieces";
  if (c.sm_gather && !c.all_reduce) return "the sm gather is AllReduce's";
  if (c.movers < 0 || c.movers > sm_count / 2) return "at most half the GPU's SMs move pieces";
  if (c.movers > 0 && (c.sm_send || c.world < 3))
    return "mover SMs take each round's last owner's pieces when the copy engines send and there are 3 or more "
           "ranks";
  if (c.movers > 0 && c.pieces > kernels::PiecePushParams::kMaxSteps)
    return "mover SMs take at most " + std::to_string(kernels::PiecePushParams::kMaxSteps) + " pieces";
  return "";
}

std::string ReduceOverlap::text() const {
  char t[256];
  snprintf(t, sizeof t, "overlap, %d pieces of %lld rows, own lag %d, sends by %s%s%s", c_.pieces,
           static_cast<long long>(m_piece()), c_.lag, c_.sm_send ? "the epilogue" : "copy engines",
           movers_on() ? (" and " + std::to_string(c_.movers) + " mover SMs").c_str() : "",
           !c_.all_reduce ? ""
           : c_.sm_gather ? ", gather by the epilogue"
                          : ", gather by copy-engine pushes");
  return t;
}

Status ReduceOverlap::create(const OverlapConfig& c, const OverlapBuffers& b, const kernels::FrameParams& gemm_frame,
                             const kernels::FrameParams& mover_frame, cudaStream_t s) {
  int sms = 0;
  WEFT_CHECK(kernels::device_sm_count(&sms));
  const std::string why = misfit(c, sms);
  if (!why.empty()) {
    WEFT_WARN(kKernel, "rank %d: gemm_reduce overlap: %s", c.rank, why.c_str());
    return Status::kInvalidArgument;
  }
  c_ = c;
  b_ = b;
  frame_ = gemm_frame;
  mover_frame_ = mover_frame;
  const int W = c.world;
  sends_.assign(size_t(W), nullptr);
  sent_.assign(size_t(W), nullptr);
  push_.assign(size_t(W), nullptr);
  pushed_.assign(size_t(W), nullptr);
  for (int q = 0; q < W; ++q) {
    if (q == c.rank) continue;
    WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&sends_[size_t(q)], cudaStreamNonBlocking));
    WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&sent_[size_t(q)], cudaEventDisableTiming));
    if (c.all_reduce && !c.sm_gather) {
      WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&push_[size_t(q)], cudaStreamNonBlocking));
      WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&pushed_[size_t(q)], cudaEventDisableTiming));
    }
  }
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&gates_, cudaStreamNonBlocking));
  for (cudaEvent_t* e : {&fork_, &gates_done_, &movers_done_})
    WEFT_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  if (movers_on()) {
    WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&movers_, cudaStreamNonBlocking));
    WEFT_CHECK(kernels::prepare_piece_push());  // never loaded lazily beside the running GEMM
  }
  // Other owners' pieces never wait; this rank's wait for the call's epoch.
  std::vector<uint64_t> gate(size_t(W * c.pieces), kGateNever);
  for (int j = 0; j < c.pieces; ++j) gate[size_t(c.rank * c.pieces + j)] = 0;
  WEFT_CUDA_CHECK(cudaMemcpyAsync(b.gate, gate.data(), gate.size() * 8, cudaMemcpyHostToDevice, s));
  WEFT_CUDA_CHECK(cudaStreamSynchronize(s));
  WEFT_INFO(kKernel, "rank %d: gemm_%s: %s", c.rank, c.all_reduce ? "ar" : "rs", text().c_str());
  return Status::kOk;
}

ReduceOverlap::~ReduceOverlap() {
  for (const auto* events : {&sent_, &pushed_})
    for (cudaEvent_t e : *events)
      if (e) cudaEventDestroy(e);
  for (const auto* streams : {&sends_, &push_})
    for (cudaStream_t s : *streams)
      if (s) cudaStreamDestroy(s);
  for (cudaEvent_t e : {fork_, gates_done_, movers_done_})
    if (e) cudaEventDestroy(e);
  for (cudaStream_t s : {gates_, movers_})
    if (s) cudaStreamDestroy(s);
}

// The GEMM's tile order and tensor maps, and the epilogue's: again only when a, b or out change.
Status ReduceOverlap::prepare(const bf16* a, const bf16* b, bf16* out) {
  if (prepared_ && a == a_ && b == b_in_ && out == out_) return Status::kOk;
  const int W = c_.world, r = c_.rank, S = c_.pieces;
  kernels::GemmArgs args;
  args.m = c_.m;
  args.n = c_.n;
  args.k = c_.k_loc;
  args.a = a;
  args.lda = c_.k_loc;
  args.b = b;
  args.ldb = c_.k_loc;
  args.cluster_m = c_.cluster;
  args.group_m = c_.group_m;
  args.num_shards = W * S;  // shard = owner * S + piece
  args.first_shard = ((r + 1) % W) * S;
  args.piece_major_owners = W;
  args.piece_major_owner = r;
  args.piece_major_lag = c_.lag;
  WEFT_CHECK(kernels::make_gemm_params(args, &gemm_));
  tiles_per_piece_ = uint64_t(m_piece() / kernels::GemmConfig::kTileM) * uint64_t(gemm_.n_blocks);
  order_.assign(size_t(W * S), 0);
  for (int step = 0; step < W * S; ++step) order_[size_t(step)] = gemm_.sched.shard_at(uint32_t(step));

  // The epilogue's count words are the same every call: the plan's, from any call.
  kernels::OverlapCounts first;
  first.epoch = 1;
  const kernels::OverlapCall words = kernels::overlap_call(shape(), order_, tiles_per_piece_, first);
  kernels::EpiReduceSlots epi;
  epi.partial = b_.partial.mine<bf16>();
  epi.out = c_.all_reduce ? b_.c_full.mine<bf16>() + int64_t(r) * m_loc() * c_.n : out;
  for (int p = 0; p < W; ++p)
    if (p != r) epi.slots[epi.nslots++] = b_.staging.mine<bf16>() + int64_t(p) * m_loc() * c_.n;
  epi.lo = int32_t(r * m_loc());
  epi.hi = int32_t((r + 1) * m_loc());
  epi.ldc = c_.n;
  epi.paired = c_.n % 2 == 0;
  epi.local_signal = true;
  std::vector<bf16*> peers;
  for (const kernels::OverlapWord& w : words.bcast_counts) {  // r+1 first: the peers' queues fill in turn
    peers.push_back(b_.c_full.of<bf16>(w.rank) + int64_t(r) * m_loc() * c_.n);
    epi.bcast_flags[epi.nbcast++] = word(w);
  }
  WEFT_CHECK(kernels::enable_own_tma_store(gemm_, peers.data(), int(peers.size()), &epi));
  WEFT_CHECK(kernels::enable_slot_loads(gemm_, &epi));
  if (c_.sm_send) {
    std::vector<bf16*> slots(size_t(W), nullptr);
    std::vector<uint64_t*> counts(size_t(W), nullptr);
    for (int o = 0; o < W; ++o)
      if (o != r) {
        slots[size_t(o)] = b_.staging.of<bf16>(o) + int64_t(r) * m_loc() * c_.n;
        counts[size_t(o)] = word(words.part_counts[size_t(o)]);
      }
    WEFT_CHECK(kernels::enable_remote_partials(gemm_, slots.data(), counts.data(), W, int(m_piece()), &epi));
  }
  epi_ = epi;
  a_ = a, b_in_ = b, out_ = out;
  prepared_ = true;
  return Status::kOk;
}

uint64_t* ReduceOverlap::word(const kernels::OverlapWord& w) const {
  using K = kernels::OverlapWordKind;
  switch (w.kind) {
    case K::kTiles:
      return b_.tiles + w.index;  // local only: the plan names this rank's
    case K::kGate:
      return b_.gate + w.index;
    case K::kArrived:
      return b_.arrived.of<uint64_t>(w.rank) + w.index;
    case K::kLanded:
      return b_.landed.of<uint64_t>(w.rank) + w.index;
    case K::kMoved:
      return b_.moved.of<uint64_t>(w.rank) + w.index;
    case K::kFreed:
      return b_.freed.of<uint64_t>(w.rank) + w.index;
    case K::kGathered:
      return b_.gathered.of<uint64_t>(w.rank) + w.index;
    case K::kBcast:
      return b_.bcast.of<uint64_t>(w.rank) + w.index;
  }
  return nullptr;
}

// A stream's steps: runs of waits and writes as one batch each (at most 200 steps), copies between.
Status ReduceOverlap::run_steps(cudaStream_t s, const std::vector<kernels::OverlapStep>& steps) {
  using Step = kernels::OverlapStep;
  const size_t piece_bytes = size_t(m_piece() * c_.n) * sizeof(bf16);
  std::vector<StreamMemOp> batch;
  auto flush = [&]() -> Status {
    if (!batch.empty()) WEFT_CHECK(stream_mem_ops(s, batch));
    batch.clear();
    return Status::kOk;
  };
  for (const Step& st : steps) {
    if (st.kind == Step::kWait || st.kind == Step::kWrite) {
      batch.push_back({st.kind == Step::kWait ? StreamMemOp::kWaitGeq : StreamMemOp::kWrite, word(st.word), st.value});
      if (batch.size() >= 200) WEFT_CHECK(flush());
      continue;
    }
    WEFT_CHECK(flush());
    if (st.kind == Step::kCopyPiece)
      WEFT_CUDA_CHECK(cudaMemcpyAsync(b_.staging.of<bf16>(st.to) + piece_row(c_.rank, st.piece) * c_.n,
                                      b_.partial.mine<bf16>() + piece_row(st.owner, st.piece) * c_.n, piece_bytes,
                                      cudaMemcpyDeviceToDevice, s));
    else
      WEFT_CUDA_CHECK(cudaMemcpyAsync(b_.c_full.of<bf16>(st.to) + piece_row(c_.rank, st.piece) * c_.n,
                                      b_.c_full.mine<bf16>() + piece_row(c_.rank, st.piece) * c_.n, piece_bytes,
                                      cudaMemcpyDeviceToDevice, s));
  }
  return flush();
}

Status ReduceOverlap::enqueue(const bf16* a, const bf16* b, bf16* out, cudaStream_t main) {
  WEFT_CHECK(prepare(a, b, out));
  const int W = c_.world, r = c_.rank, S = c_.pieces;
  kernels::OverlapCounts n;
  n.epoch = ++epoch_;
  n.landed_runs = c_.sm_send ? ++landed_runs_ : landed_runs_;
  n.bcast_runs = c_.sm_gather ? ++bcast_runs_ : bcast_runs_;
  n.mover_runs = movers_on() ? ++mover_runs_ : mover_runs_;
  const kernels::OverlapCall call = kernels::overlap_call(shape(), order_, tiles_per_piece_, n);

  WEFT_CUDA_CHECK(cudaEventRecord(fork_, main));
  WEFT_CUDA_CHECK(cudaStreamWaitEvent(gates_, fork_));
  for (int q = 0; q < W; ++q) {
    if (q == r) continue;
    WEFT_CUDA_CHECK(cudaStreamWaitEvent(sends_[size_t(q)], fork_));
    if (push_[size_t(q)]) WEFT_CUDA_CHECK(cudaStreamWaitEvent(push_[size_t(q)], fork_));
  }
  // The GEMM first: should two streams share a hardware queue, its launch must not sit behind a
  // wait only it can satisfy. Only this rank's own pieces are gated.
  WEFT_CHECK(run_steps(main, call.before));
  kernels::FlagGate gate{word(call.gate), kernels::kFlagPerShard, call.gate_at, r * S, (r + 1) * S};
  kernels::TileSignal signal{word(call.tiles), kernels::kFlagPerShard, 1,
                             c_.sm_send ? kernels::kSignalDeferred : kernels::kSignalInLoop};
  WEFT_CHECK(kernels::launch_gemm(gemm_, frame_, epi_, gate, signal, main, c_.gemm));
  if (!call.moves.empty()) WEFT_CHECK(launch_movers(call));
  for (int q = 0; q < W; ++q)
    if (q != r) WEFT_CHECK(run_steps(sends_[size_t(q)], call.sends[size_t(q)]));
  WEFT_CHECK(run_steps(gates_, call.gates));
  for (int q = 0; q < W; ++q)
    if (push_[size_t(q)]) WEFT_CHECK(run_steps(push_[size_t(q)], call.push[size_t(q)]));
  WEFT_CHECK(run_steps(main, call.after));
  for (int q = 0; q < W; ++q) {
    if (q == r) continue;
    WEFT_CUDA_CHECK(cudaEventRecord(sent_[size_t(q)], sends_[size_t(q)]));
    WEFT_CUDA_CHECK(cudaStreamWaitEvent(main, sent_[size_t(q)]));
    if (push_[size_t(q)]) {
      WEFT_CUDA_CHECK(cudaEventRecord(pushed_[size_t(q)], push_[size_t(q)]));
      WEFT_CUDA_CHECK(cudaStreamWaitEvent(main, pushed_[size_t(q)]));
    }
  }
  WEFT_CUDA_CHECK(cudaEventRecord(gates_done_, gates_));
  WEFT_CUDA_CHECK(cudaStreamWaitEvent(main, gates_done_));
  if (movers_on()) {
    WEFT_CUDA_CHECK(cudaEventRecord(movers_done_, movers_));
    WEFT_CUDA_CHECK(cudaStreamWaitEvent(main, movers_done_));
  }
  return Status::kOk;
}

// The mover blocks take each round's last owner's pieces whole (that owner is r - 1 for every
// round: the piece-major order visits r+1, ..., r-1, then r's own piece).
Status ReduceOverlap::launch_movers(const kernels::OverlapCall& call) {
  const int r = c_.rank;
  kernels::PiecePushParams p;
  for (const kernels::OverlapMove& m : call.moves) {
    kernels::PiecePushStep& st = p.step[p.steps++];
    st.src = b_.partial.mine<bf16>() + piece_row(m.owner, m.piece) * c_.n;
    st.dst = b_.staging.of<bf16>(m.owner) + piece_row(r, m.piece) * c_.n;
    st.elems = m_piece() * c_.n;
    st.ready = word(m.ready);
    st.ready_at = m.ready_at;
    st.clear = word(m.clear);
    st.clear_at = m.clear_at;
    st.landed = word(m.landed);
    st.owner = m.owner;
    st.piece = m.piece;
    st.ready_index = int32_t(m.ready.index);
    st.clear_index = int32_t(m.clear.index);
  }
  WEFT_CUDA_CHECK(cudaStreamWaitEvent(movers_, fork_));
  return kernels::launch_piece_push(p, mover_frame_, c_.movers, movers_);
}

kernels::OverlapShape ReduceOverlap::shape() const {
  kernels::OverlapShape s;
  s.world = c_.world, s.rank = c_.rank, s.pieces = c_.pieces, s.lag = c_.lag;
  s.all_reduce = c_.all_reduce, s.sm_send = c_.sm_send, s.sm_gather = c_.sm_gather;
  s.movers = c_.movers;
  return s;
}

void ReduceOverlap::unstick(cudaStream_t s) const {
  const int W = c_.world, S = c_.pieces;
  std::vector<uint64_t> never(size_t(W * S), kGateNever);
  auto raise = [&](void* p, int words) {
    if (p) cudaMemcpyAsync(p, never.data(), size_t(words) * 8, cudaMemcpyHostToDevice, s);
  };
  raise(b_.tiles, W * S);
  raise(b_.gate, W * S);
  for (const SymView* v : {&b_.arrived, &b_.landed, &b_.moved}) raise(v->local, W * S);
  for (const SymView* v : {&b_.freed, &b_.gathered, &b_.bcast}) raise(v->local, W);
  cudaStreamSynchronize(s);
}

}  // namespace weft::runtime
