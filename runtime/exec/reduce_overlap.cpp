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
  if (c_.sm_gather) {
    for (int i = 1; i < W; ++i) {
      const int q = (r + i) % W;  // r+1 first: the peers' queues fill in turn
      peers.push_back(b_.c_full.of<bf16>(q) + int64_t(r) * m_loc() * c_.n);
      epi.bcast_flags[epi.nbcast++] = b_.bcast.of<uint64_t>(q) + r;
    }
  }
  WEFT_CHECK(kernels::enable_own_tma_store(gemm_, peers.data(), int(peers.size()), &epi));
  WEFT_CHECK(kernels::enable_slot_loads(gemm_, &epi));
  if (c_.sm_send) {
    std::vector<bf16*> slots(size_t(W), nullptr);
    std::vector<uint64_t*> counts(size_t(W), nullptr);
    for (int o = 0; o < W; ++o)
      if (o != r) {
        slots[size_t(o)] = b_.staging.of<bf16>(o) + int64_t(r) * m_loc() * c_.n;
        counts[size_t(o)] = b_.landed.of<uint64_t>(o) + o * S;  // o's own pieces' words: every sender adds there
      }
    WEFT_CHECK(kernels::enable_remote_partials(gemm_, slots.data(), counts.data(), W, int(m_piece()), &epi));
  }
  epi_ = epi;
  a_ = a, b_in_ = b, out_ = out;
  prepared_ = true;
  return Status::kOk;
}

Status ReduceOverlap::enqueue(const bf16* a, const bf16* b, bf16* out, cudaStream_t main) {
  WEFT_CHECK(prepare(a, b, out));
  const int W = c_.world, r = c_.rank, S = c_.pieces;
  const uint64_t e = ++epoch_;
  const uint64_t piece_done = e * tiles_per_piece_;
  WEFT_CUDA_CHECK(cudaEventRecord(fork_, main));
  WEFT_CUDA_CHECK(cudaStreamWaitEvent(gates_, fork_));
  for (int q = 0; q < W; ++q)
    if (q != r) WEFT_CUDA_CHECK(cudaStreamWaitEvent(sends_[size_t(q)], fork_));

  // The GEMM first: should two streams share a hardware queue, its launch must not sit behind a
  // wait only it can satisfy. Only this rank's own pieces are gated.
  kernels::FlagGate gate{b_.gate, kernels::kFlagPerShard, e, r * S, (r + 1) * S};
  kernels::TileSignal signal{b_.tiles, kernels::kFlagPerShard, 1,
                             c_.sm_send ? kernels::kSignalDeferred : kernels::kSignalInLoop};
  if (c_.sm_send) {
    // The epilogue stores into the owners' slots: each owner must have read last call's slots, and
    // own piece j opens once every peer's tiles of it have landed here.
    std::vector<StreamMemOp> before;
    for (int o = 0; o < W; ++o)
      if (o != r) before.push_back({StreamMemOp::kWaitGeq, b_.freed.mine<uint64_t>() + o, e - 1});
    WEFT_CHECK(stream_mem_ops(main, before));
    ++landed_runs_;
    gate.flags = b_.landed.mine<uint64_t>();
    gate.expected = landed_runs_ * uint64_t(W - 1) * tiles_per_piece_;
  }
  if (c_.sm_gather) ++bcast_runs_;
  WEFT_CHECK(kernels::launch_gemm(gemm_, frame_, epi_, gate, signal, main, c_.gemm));
  if (movers_on()) WEFT_CHECK(launch_movers(e, fork_));

  // Copy sends: one stream per other owner, its pieces in the GEMM's order, each followed by its
  // arrival word in the owner's memory (sent with the stream's next waits: one call fewer per piece).
  std::vector<std::vector<StreamMemOp>> pend(static_cast<size_t>(W));
  for (int step = 0; step < W * S && !c_.sm_send; ++step) {
    const int shard = gemm_.sched.shard_at(uint32_t(step)), o = shard / S, j = shard % S;
    if (o == r || (movers_on() && o == last_owner_of(r))) continue;  // own rows; the movers' pieces
    std::vector<StreamMemOp>& q = pend[size_t(o)];
    cudaStream_t s = sends_[size_t(o)];
    if (j == 0) q.push_back({StreamMemOp::kWaitGeq, b_.freed.mine<uint64_t>() + o, e - 1});
    q.push_back({StreamMemOp::kWaitGeq, b_.tiles + o * S + j, piece_done});
    WEFT_CHECK(stream_mem_ops(s, q));
    q.clear();
    WEFT_CUDA_CHECK(cudaMemcpyAsync(b_.staging.of<bf16>(o) + piece_row(r, j) * c_.n,
                                    b_.partial.mine<bf16>() + piece_row(o, j) * c_.n,
                                    size_t(m_piece() * c_.n) * sizeof(bf16), cudaMemcpyDeviceToDevice, s));
    q.push_back({StreamMemOp::kWrite, b_.arrived.of<uint64_t>(o) + r * S + j, e});
  }
  for (int o = 0; o < W; ++o)
    if (!pend[size_t(o)].empty()) WEFT_CHECK(stream_mem_ops(sends_[size_t(o)], pend[size_t(o)]));

  // Gate stream (copy sends): own piece j opens once every peer's piece j is in its slot.
  if (!c_.sm_send) {
    std::vector<StreamMemOp> g;
    const int by_movers = (r + 1) % W;  // the peer whose last owner this rank is
    for (int j = 0; j < S; ++j) {
      for (int p = 0; p < W; ++p) {
        if (p == r) continue;
        if (movers_on() && p == by_movers)
          g.push_back(
              {StreamMemOp::kWaitGeq, b_.moved.mine<uint64_t>() + p * S + j, mover_runs_ * uint64_t(c_.movers)});
        else
          g.push_back({StreamMemOp::kWaitGeq, b_.arrived.mine<uint64_t>() + p * S + j, e});
      }
      g.push_back({StreamMemOp::kWrite, b_.gate + r * S + j, e});
      if (g.size() > 200) {  // a batch holds at most 255 steps
        WEFT_CHECK(stream_mem_ops(gates_, g));
        g.clear();
      }
    }
    WEFT_CHECK(stream_mem_ops(gates_, g));
  }

  // AR, copy-engine gather: one stream per peer pushes each reduced piece as its tiles complete.
  if (c_.all_reduce && !c_.sm_gather) {
    for (int i = 1; i < W; ++i) {
      const int q = (r + i) % W;
      cudaStream_t s = push_[size_t(q)];
      WEFT_CUDA_CHECK(cudaStreamWaitEvent(s, fork_));
      for (int j = 0; j < S; ++j) {
        WEFT_CHECK(stream_wait_u64_geq(s, b_.tiles + r * S + j, piece_done));
        const int64_t at = piece_row(r, j) * c_.n;
        WEFT_CUDA_CHECK(cudaMemcpyAsync(b_.c_full.of<bf16>(q) + at, b_.c_full.mine<bf16>() + at,
                                        size_t(m_piece() * c_.n) * sizeof(bf16), cudaMemcpyDeviceToDevice, s));
      }
      WEFT_CHECK(stream_write_u64(s, b_.gathered.of<uint64_t>(q) + r, e));
    }
  }

  // Behind the GEMM on the caller's stream: this rank has read its slots; AR: every owner's rows are here.
  std::vector<StreamMemOp> after;
  for (int p = 0; p < W; ++p)
    if (p != r) after.push_back({StreamMemOp::kWrite, b_.freed.of<uint64_t>(p) + r, e});
  for (int p = 0; p < W && c_.all_reduce; ++p) {
    if (p == r) continue;
    if (c_.sm_gather)
      after.push_back(
          {StreamMemOp::kWaitGeq, b_.bcast.mine<uint64_t>() + p, bcast_runs_ * tiles_per_piece_ * uint64_t(S)});
    else
      after.push_back({StreamMemOp::kWaitGeq, b_.gathered.mine<uint64_t>() + p, e});
  }
  WEFT_CHECK(stream_mem_ops(main, after));
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
Status ReduceOverlap::launch_movers(uint64_t e, cudaEvent_t fork) {
  const int W = c_.world, r = c_.rank, S = c_.pieces, o = last_owner_of(r);
  kernels::PiecePushParams p;
  for (int step = 0; step < W * S; ++step) {  // the GEMM's shard order
    const int shard = gemm_.sched.shard_at(uint32_t(step));
    if (shard / S != o) continue;
    const int j = shard % S;
    kernels::PiecePushStep& st = p.step[p.steps++];
    st.src = b_.partial.mine<bf16>() + piece_row(o, j) * c_.n;
    st.dst = b_.staging.of<bf16>(o) + piece_row(r, j) * c_.n;
    st.elems = m_piece() * c_.n;
    st.ready = b_.tiles + o * S + j;
    st.ready_at = e * tiles_per_piece_;
    st.clear = b_.freed.mine<uint64_t>() + o;
    st.clear_at = e - 1;
    st.landed = b_.moved.of<uint64_t>(o) + r * S + j;
    st.owner = o;
    st.piece = j;
    st.ready_index = o * S + j;
    st.clear_index = o;
  }
  ++mover_runs_;
  WEFT_CUDA_CHECK(cudaStreamWaitEvent(movers_, fork));
  return kernels::launch_piece_push(p, mover_frame_, c_.movers, movers_);
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
