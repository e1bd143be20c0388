// GEMM+RS / GEMM+AR, overlap path: one persistent GEMM per rank, partial pieces moved by the copy
// engines as their tiles finish, own rows reduced in the GEMM's epilogue (gemm_reduce_op.cpp has
// the picture).
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
#include "runtime/ops/cuda_check.h"
#include "runtime/ops/gemm_reduce.h"

namespace weft::runtime::ops {

using bf16 = __nv_bfloat16;

Status GemmReduce::setup_overlap() {
  std::string order;
  int64_t want_lag = 0;
  WEFT_CHECK(get_param("WEFT_GEMM_REDUCE_ORDER", &order));
  WEFT_CHECK(get_param("WEFT_GEMM_REDUCE_LAG", &want_lag));
  if ((order != "piece" && order != "owner") || want_lag < 0) {
    WEFT_WARN(kKernel, "rank %d: WEFT_GEMM_REDUCE_ORDER='%s' is not piece or owner, or WEFT_GEMM_REDUCE_LAG=%lld < 0",
              rank, order.c_str(), static_cast<long long>(want_lag));
    return Status::kInvalidArgument;
  }
  piece_major = world > 1 && order == "piece";
  lag = want_lag > 0 ? int(std::min<int64_t>(want_lag, pieces)) : (all_reduce ? 1 : pieces);
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&gates, cudaStreamNonBlocking));
  WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&gates_done, cudaEventDisableTiming));
  sends.assign(size_t(world), nullptr);
  sent.assign(size_t(world), nullptr);
  for (int q = 0; q < world; ++q) {
    if (q == rank) continue;
    WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&sends[size_t(q)], cudaStreamNonBlocking));
    WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&sent[size_t(q)], cudaEventDisableTiming));
  }
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&movers, cudaStreamNonBlocking));
  WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&movers_done, cudaEventDisableTiming));
  if (mover_blocks > 0) WEFT_CHECK(kernels::prepare_piece_push());  // never loaded beside the GEMM
  if (all_reduce) {  // pushes (one stream per peer) or pulls (one per owner)
    push.assign(size_t(world), nullptr);
    pushed.assign(size_t(world), nullptr);
    for (int q = 0; q < world; ++q) {
      if (q == rank) continue;
      WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&push[size_t(q)], cudaStreamNonBlocking));
      WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&pushed[size_t(q)], cudaEventDisableTiming));
    }
  }
  return Status::kOk;
}

std::string GemmReduce::overlap_text() const {
  char text[384];
  char order[48];
  if (piece_major)
    snprintf(order, sizeof order, "piece-major order, own lag %d", lag);
  else
    snprintf(order, sizeof order, "owner-major order");
  char gathered_by[48] = "";
  if (all_reduce)
    snprintf(gathered_by, sizeof gathered_by, ", gather %s%s", ar_gather_name(gather),
             gather == ArGather::kPush && serial_push ? " (serial)" : "");
  char sends_by[160] = "copy engines";
  if (sm_send) {
    snprintf(sends_by, sizeof sends_by, "SM");
  } else if (use_movers()) {
    char what[96];
    if (mover_last && mover_rows > 0)
      snprintf(what, sizeof what, "the last owner's pieces, %lld rows of the others'",
               static_cast<long long>(mover_rows));
    else if (mover_last)
      snprintf(what, sizeof what, "each round's last owner's pieces");
    else
      snprintf(what, sizeof what, "%lld rows of each piece", static_cast<long long>(mover_rows));
    snprintf(sends_by, sizeof sends_by, "copy engines and %d mover SMs (%s)", mover_blocks, what);
  }
  snprintf(text, sizeof text, "overlap, %d pieces of %lld rows, %s, sends by %s%s%s%s%s", pieces,
           static_cast<long long>(m_piece), order, sends_by, gathered_by, sys_signal ? ", system-scope counts" : "",
           epi_fused.own_maps ? ", own tiles by TMA" : "", epi_fused.slot_maps ? ", slots through the ring" : "");
  return text;
}

Status GemmReduce::make_gemm() {
  kernels::GemmArgs args;
  args.m = m;
  args.n = n;
  args.k = k_loc;
  args.a = a;
  args.b = b;
  // Overlap path: one M-shard per piece (shard = owner * S + piece). Owner-major: other owners'
  // pieces first (r+1, r+2, ...), own last. Piece-major (AllReduce): piece by piece, own piece j
  // one round late, so reduced pieces can leave for the peers while the GEMM goes on.
  args.num_shards = overlap ? world * pieces : 1;
  args.first_shard = overlap ? ((rank + 1) % world) * pieces : 0;
  WEFT_CHECK(gemm_group(&args.group_m));
  if (overlap && piece_major) {
    args.piece_major_owners = world;
    args.piece_major_owner = rank;
    args.piece_major_lag = lag;
  }
  WEFT_CHECK(kernels::make_gemm_params(args, &gemm));
  tiles_per_piece = uint64_t(m_piece / kernels::GemmConfig::kTileM) * uint64_t(gemm.n_blocks);
  return Status::kOk;
}

kernels::EpiReduceSlots GemmReduce::reduce_epilogue(bool own_rows) const {
  kernels::EpiReduceSlots epi;
  epi.partial = partial.local<bf16>();
  epi.out = all_reduce ? c_full.local<bf16>() + int64_t(rank) * m_loc * n : out;
  for (int p = 0; p < world; ++p)
    if (p != rank) epi.slots[epi.nslots++] = staging.local<bf16>() + int64_t(p) * m_loc * n;
  epi.lo = own_rows ? int32_t(rank * m_loc) : 0;
  epi.hi = own_rows ? int32_t((rank + 1) * m_loc) : 0;
  epi.ldc = n;
  epi.paired = n % 2 == 0;
  epi.local_signal = !sys_signal;
  return epi;
}

const char* ar_gather_name(ArGather g) {
  switch (g) {
    case ArGather::kPush:
      return "push";
    case ArGather::kPull:
      return "pull";
    case ArGather::kSm:
      return "sm";
  }
  return "?";
}

Status GemmReduce::make_epilogues() {
  if (!overlap) return Status::kOk;
  epi_fused = reduce_epilogue(true);
  epi_diag = reduce_epilogue(true);
  const bool sm = all_reduce && gather == ArGather::kSm;
  std::vector<bf16*> peers;
  if (sm) {
    for (int i = 1; i < world; ++i) {
      const int q = (rank + i) % world;  // r+1 first: the peers' queues fill in turn
      peers.push_back(c_full.peer<bf16>(q) + int64_t(rank) * m_loc * n);
      epi_fused.bcast_flags[epi_fused.nbcast++] = bcast.peer<uint64_t>(q) + rank;
    }
  }
  if (own_tma || sm) {
    WEFT_CHECK(kernels::enable_own_tma_store(gemm, peers.data(), int(peers.size()), &epi_fused));
    WEFT_CHECK(kernels::enable_own_tma_store(gemm, nullptr, 0, &epi_diag));
  }
  if (slot_tma) {
    WEFT_CHECK(kernels::enable_slot_loads(gemm, &epi_fused));
    WEFT_CHECK(kernels::enable_slot_loads(gemm, &epi_diag));
  }
  if (sm_send) {
    std::vector<bf16*> slots(size_t(world), nullptr);
    std::vector<uint64_t*> counts(size_t(world), nullptr);
    for (int o = 0; o < world; ++o)
      if (o != rank) {
        slots[size_t(o)] = staging.peer<bf16>(o) + int64_t(rank) * m_loc * n;
        counts[size_t(o)] = landed.peer<uint64_t>(o) + o * pieces;
      }
    WEFT_CHECK(kernels::enable_remote_partials(gemm, slots.data(), counts.data(), world, int(m_piece), &epi_fused));
  }
  return Status::kOk;
}

Status GemmReduce::enqueue_overlap() {
  const uint64_t e = epoch;
  const int S = pieces;
  WEFT_CUDA_CHECK(cudaEventRecord(fork, main));
  WEFT_CUDA_CHECK(cudaStreamWaitEvent(comm, fork));
  WEFT_CUDA_CHECK(cudaStreamWaitEvent(gates, fork));
  for (int q = 0; q < world; ++q)
    if (q != rank) WEFT_CUDA_CHECK(cudaStreamWaitEvent(sends[size_t(q)], fork));
  // The GEMM is enqueued before the other streams' waits: should two streams share a hardware
  // queue, the launch must not sit behind a wait that only the GEMM itself can satisfy. Only this
  // rank's own pieces are gated (and only they may hold back a tile's deferred signal).
  kernels::FlagGate gate_args{gate, kernels::kFlagPerShard, e, rank * S, (rank + 1) * S};
  kernels::TileSignal signal{tiles, kernels::kFlagPerShard, 1, run_signal()};
  if (sm_send) {
    // The GEMM stores into the owners' slots itself: each owner must have read its slots of the
    // previous epoch (its GEMM is done), and own piece j waits until every peer's tiles of it landed.
    std::vector<StreamMemOp> before;
    for (int o = 0; o < world; ++o)
      if (o != rank) before.push_back({StreamMemOp::kWaitGeq, freed.local<uint64_t>() + o, e - 1});
    WEFT_CHECK(stream_mem_ops(main, before));
    ++send_runs;
    gate_args.flags = landed.local<uint64_t>();
    gate_args.expected = send_runs * uint64_t(world - 1) * tiles_per_piece;
  }
  mark(main, "start");
  WEFT_CHECK(kernels::launch_gemm(gemm, frame_params, epi_fused, gate_args, signal, main, bench_gemm_options()));
  const bool push_gather = all_reduce && gather == ArGather::kPush;
  if (all_reduce && gather == ArGather::kSm) ++bcast_runs;
  mark(main, "gemm");
  if (use_movers()) WEFT_CHECK(launch_movers(e * tiles_per_piece));

  // One stream per other owner: its pieces, copied into its slot as their tiles complete, each
  // followed by its arrival flag in the owner's memory. The streams run side by side, since one copy
  // engine pushing to one peer moves well below the GPU's NVLink bandwidth (measured:
  // docs/results/2026-11-gemm-reduce.md, "one copy stream per destination"); the host enqueues in
  // the GEMM's order.
  std::vector<StreamMemOp> ops;
  auto wait = [&](uint64_t* addr, uint64_t v) { ops.push_back({StreamMemOp::kWaitGeq, addr, v}); };
  auto write = [&](uint64_t* addr, uint64_t v) { ops.push_back({StreamMemOp::kWrite, addr, v}); };
  auto flush = [&](cudaStream_t s) -> Status {
    WEFT_CHECK(stream_mem_ops(s, ops));
    ops.clear();
    return Status::kOk;
  };
  const uint64_t piece_done = e * tiles_per_piece;
  // Each stream's arrival write goes out with its next waits (one call fewer per piece).
  std::vector<std::vector<StreamMemOp>> pend(static_cast<size_t>(world));
  auto send = [&](int o, int j) -> Status {
    const int64_t ce_rows = m_piece - mover_rows_of(rank, o);  // the mover SMs (if any) take the last rows
    if (ce_rows == 0) return Status::kOk;
    cudaStream_t s = sends[size_t(o)];
    std::vector<StreamMemOp>& q = pend[size_t(o)];
    if (j == 0) q.push_back({StreamMemOp::kWaitGeq, freed.local<uint64_t>() + o, e - 1});  // o read last epoch's
    q.push_back({StreamMemOp::kWaitGeq, tiles + o * S + j, piece_done});
    WEFT_CHECK(stream_mem_ops(s, q));
    q.clear();
    WEFT_CUDA_CHECK(cudaMemcpyAsync(staging.peer<bf16>(o) + piece_row(rank, j) * n,
                                    partial.local<bf16>() + piece_row(o, j) * n, size_t(ce_rows * n) * sizeof(bf16),
                                    cudaMemcpyDeviceToDevice, s));
    q.push_back({StreamMemOp::kWrite, arrived.peer<uint64_t>(o) + rank * S + j, e});
    if (recording) {
      WEFT_CHECK(stream_mem_ops(s, q));
      q.clear();
      mark(s, "send" + std::to_string(o) + "." + std::to_string(j));
    }
    return Status::kOk;
  };
  // The GEMM's shard order (shard = owner * S + piece), read from its schedule.
  for (int step = 0; step < world * S && !sm_send; ++step) {
    const int shard = gemm.sched.shard_at(uint32_t(step)), o = shard / S, j = shard % S;
    if (o != rank) WEFT_CHECK(send(o, j));
  }
  for (int o = 0; o < world; ++o)
    if (!pend[size_t(o)].empty()) WEFT_CHECK(stream_mem_ops(sends[size_t(o)], pend[size_t(o)]));
  if (push_gather && serial_push) {
    for (int j = 0; j < S; ++j) {
      wait(tiles + rank * S + j, piece_done);
      WEFT_CHECK(flush(comm));
      const int64_t at = piece_row(rank, j) * n;
      for (int i = 1; i < world; ++i) {  // r+1 first: each rank receives from one sender at a time
        const int q = (rank + i) % world;
        WEFT_CUDA_CHECK(cudaMemcpyAsync(c_full.peer<bf16>(q) + at, c_full.local<bf16>() + at, piece_bytes(),
                                        cudaMemcpyDeviceToDevice, comm));
      }
    }
    for (int q = 0; q < world; ++q)
      if (q != rank) write(gathered.peer<uint64_t>(q) + rank, e);
  }
  if (all_reduce && gather == ArGather::kPull) {
    // The owner only says when a piece is reduced; each peer's copy engines fetch it (below).
    for (int j = 0; j < S; ++j) {
      wait(tiles + rank * S + j, piece_done);
      for (int i = 1; i < world; ++i) write(ready.peer<uint64_t>((rank + i) % world) + rank * S + j, e);
    }
  }
  WEFT_CHECK(flush(comm));

  // Gate stream: own piece j opens once every peer's piece j is in its slot (copy-engine sends,
  // and the mover SMs' rows of it).
  for (int j = 0; j < S && !sm_send; ++j) {
    for (int p = 0; p < world; ++p) {
      if (p == rank) continue;
      const int64_t moved_rows = mover_rows_of(p, rank);
      if (moved_rows < m_piece) wait(arrived.local<uint64_t>() + p * S + j, e);
      if (moved_rows > 0) wait(moved.local<uint64_t>() + p * S + j, mover_runs * uint64_t(mover_blocks));
    }
    write(gate + rank * S + j, e);
    if (recording) {
      WEFT_CHECK(flush(gates));
      mark(gates, "gate" + std::to_string(j));
    }
  }
  WEFT_CHECK(flush(gates));

  if (all_reduce && gather == ArGather::kPull) {
    // One stream per owner: each waits for the owner's word that piece j is reduced, then pulls it.
    for (int i = 1; i < world; ++i) {
      const int o = (rank + world - i) % world;  // r-1 first: owner o's peers pull in turn
      cudaStream_t s = push[size_t(o)];
      WEFT_CUDA_CHECK(cudaStreamWaitEvent(s, fork));
      for (int j = 0; j < S; ++j) {
        WEFT_CHECK(stream_wait_u64_geq(s, ready.local<uint64_t>() + o * S + j, e));
        const int64_t at = piece_row(o, j) * n;
        WEFT_CUDA_CHECK(cudaMemcpyAsync(c_full.local<bf16>() + at, c_full.peer<bf16>(o) + at, piece_bytes(),
                                        cudaMemcpyDeviceToDevice, s));
        mark(s, "pull" + std::to_string(o) + "." + std::to_string(j));
      }
    }
  }
  if (push_gather && !serial_push) {
    // One stream per peer, enqueued after the GEMM and the comm stream (a shared hardware queue
    // then only serialises them): each waits for a reduced piece and pushes it to its peer.
    for (int i = 1; i < world; ++i) {
      const int q = (rank + i) % world;
      cudaStream_t s = push[size_t(q)];
      WEFT_CUDA_CHECK(cudaStreamWaitEvent(s, fork));
      for (int j = 0; j < S; ++j) {
        WEFT_CHECK(stream_wait_u64_geq(s, tiles + rank * S + j, piece_done));
        const int64_t at = piece_row(rank, j) * n;
        WEFT_CUDA_CHECK(cudaMemcpyAsync(c_full.peer<bf16>(q) + at, c_full.local<bf16>() + at, piece_bytes(),
                                        cudaMemcpyDeviceToDevice, s));
        mark(s, "push" + std::to_string(q) + "." + std::to_string(j));
      }
      WEFT_CHECK(stream_write_u64(s, gathered.peer<uint64_t>(q) + rank, e));
    }
  }

  std::vector<StreamMemOp> after;  // on main, behind the GEMM
  for (int p = 0; p < world; ++p)
    if (p != rank) after.push_back({StreamMemOp::kWrite, freed.peer<uint64_t>(p) + rank, e});
  if (push_gather)
    for (int p = 0; p < world; ++p)
      if (p != rank) after.push_back({StreamMemOp::kWaitGeq, gathered.local<uint64_t>() + p, e});
  if (all_reduce && gather == ArGather::kSm)  // every owner's tiles stored here by its epilogue
    for (int p = 0; p < world; ++p)
      if (p != rank)
        after.push_back({StreamMemOp::kWaitGeq, bcast.local<uint64_t>() + p, bcast_runs * tiles_per_owner()});
  WEFT_CHECK(stream_mem_ops(main, after));
  WEFT_CUDA_CHECK(cudaEventRecord(join, comm));
  WEFT_CUDA_CHECK(cudaStreamWaitEvent(main, join));
  for (int q = 0; q < world; ++q)
    if (q != rank) {
      WEFT_CUDA_CHECK(cudaEventRecord(sent[size_t(q)], sends[size_t(q)]));
      WEFT_CUDA_CHECK(cudaStreamWaitEvent(main, sent[size_t(q)]));
    }
  if (use_movers()) {
    WEFT_CUDA_CHECK(cudaEventRecord(movers_done, movers));
    WEFT_CUDA_CHECK(cudaStreamWaitEvent(main, movers_done));
  }
  WEFT_CUDA_CHECK(cudaEventRecord(gates_done, gates));
  WEFT_CUDA_CHECK(cudaStreamWaitEvent(main, gates_done));
  if (all_reduce && (gather == ArGather::kPull || (gather == ArGather::kPush && !serial_push)))
    for (int q = 0; q < world; ++q)
      if (q != rank) {
        WEFT_CUDA_CHECK(cudaEventRecord(pushed[size_t(q)], push[size_t(q)]));
        WEFT_CUDA_CHECK(cudaStreamWaitEvent(main, pushed[size_t(q)]));
      }
  mark(main, "end");
  return Status::kOk;
}

Status GemmReduce::launch_movers(uint64_t piece_done) {
  const uint64_t e = epoch;
  const int S = pieces;
  kernels::PiecePushParams p;
  for (int step = 0; step < world * S; ++step) {  // the GEMM's shard order
    const int shard = gemm.sched.shard_at(uint32_t(step)), o = shard / S, j = shard % S;
    const int64_t rows = o == rank ? 0 : mover_rows_of(rank, o);
    if (rows == 0) continue;
    const int64_t skip = m_piece - rows;  // the copy engines' rows come first
    if (p.steps == kernels::PiecePushParams::kMaxSteps) {
      WEFT_WARN(kKernel, "rank %d: mover SMs take at most %d pieces (%d ranks x %d pieces)", rank,
                kernels::PiecePushParams::kMaxSteps, world, S);
      return Status::kInvalidArgument;
    }
    kernels::PiecePushStep& st = p.step[p.steps++];
    st.src = partial.local<bf16>() + (piece_row(o, j) + skip) * n;
    st.dst = staging.peer<bf16>(o) + (piece_row(rank, j) + skip) * n;
    st.elems = rows * n;
    st.ready = tiles + o * S + j;
    st.ready_at = piece_done;
    st.clear = freed.local<uint64_t>() + o;
    st.clear_at = e - 1;
    st.landed = moved.peer<uint64_t>(o) + rank * S + j;
    st.owner = o;
    st.piece = j;
    st.ready_index = o * S + j;
    st.clear_index = o;
  }
  ++mover_runs;
  WEFT_CUDA_CHECK(cudaStreamWaitEvent(movers, fork));
  WEFT_CHECK(kernels::launch_piece_push(p, frame_params, mover_blocks, movers));
  mark(movers, "movers");
  return Status::kOk;
}

Status GemmReduce::enqueue_diag(bool own_rows, bool signalled, int variant) {
  kernels::TileSignal signal{signalled ? diag_tiles : nullptr, kernels::kFlagPerShard, 1,
                             variant < 0 ? signal_variant : variant};
  if (!own_rows)
    return kernels::launch_gemm(gemm, frame_params, reduce_epilogue(false), kernels::FlagGate{}, signal, main,
                                bench_gemm_options());
  return kernels::launch_gemm(gemm, frame_params, epi_diag, kernels::FlagGate{}, signal, main, bench_gemm_options());
}

void GemmReduce::mark(cudaStream_t s, std::string what) {
  if (!recording) return;
  cudaEvent_t ev = nullptr;
  if (cudaEventCreate(&ev) != cudaSuccess) return;
  cudaEventRecord(ev, s);
  marks.emplace_back(std::move(what), ev);
}

Status GemmReduce::probe(ncclComm_t nccl, int warm, int iters, bootstrap::Bootstrap& boot, const std::string& key,
                         std::vector<ResultRow>* rows) {
  bool on = false;
  WEFT_CHECK(get_param("WEFT_GEMM_REDUCE_PROBE", &on));
  if (!on || !overlap) return Status::kOk;
  struct Variant {
    int v;
    const char* what;
  };
  const Variant variants[] = {{kernels::kSignalDeferred, "probe: gemm + signals, deferred to the next tile"},
                              {kernels::kSignalImmediate, "probe: gemm + signals, immediate (wait for stores)"},
                              {kernels::kSignalInLoop, "probe: gemm + signals, from the next tile's loop"},
                              {kernels::kSignalRelaxed, "probe: gemm + signals, deferred, no release fence"},
                              {kernels::kSignalPerWarpgroup, "probe: gemm + signals, per warpgroup, no block barrier"},
                              {kernels::kSignalBarrierOnly, "probe: gemm + block barrier per tile only"}};
  for (const Variant& v : variants) {
    double t = 0, mx = 0;
    WEFT_CHECK(time_op(
        nccl, main, warm, iters, [&] { return enqueue_diag(false, true, v.v); }, &t));
    WEFT_CHECK(max_over_ranks(boot, key + "probe" + std::to_string(v.v), t, &mx));
    rows->push_back({v.what, mx, 0, "partial stores, no own rows, no copies"});
  }
  {
    double t = 0, mx = 0;
    int& variant = sm_send ? sm_send_signal : signal_variant;  // the one this run's tiles use
    const int in_use = variant;
    variant = in_use == kernels::kSignalImmediate ? kernels::kSignalDeferred : kernels::kSignalImmediate;
    WEFT_CHECK(time_op(
        nccl, main, warm, iters, [&] { return enqueue_fused(); }, &t, [&] { unstick(); }));
    const bool deferred = variant == kernels::kSignalDeferred;
    variant = in_use;
    WEFT_CHECK(max_over_ranks(boot, key + "probe_fused", t, &mx));
    rows->push_back({deferred ? "probe: weft fused, deferred signals" : "probe: weft fused, immediate signals", mx, 0,
                     deferred ? "a TMA tile's flag moves during the block's next tile"
                              : "each TMA tile waits for its stores, then signals"});
  }
  // One run's timeline: events on every stream, relative to the event before the GEMM.
  WEFT_CHECK(boot.barrier(key + "probe_line"));
  recording = true;
  Status st = enqueue_fused();
  recording = false;
  WEFT_CHECK(st);
  WEFT_CHECK(sync("probe timeline"));
  std::string line;
  for (size_t i = 0; i < marks.size(); ++i) {
    float ms = -1;
    const cudaError_t err = cudaEventElapsedTime(&ms, marks[0].second, marks[i].second);
    char item[128];
    snprintf(item, sizeof item, "%s%s %.0f%s", i ? ", " : "", marks[i].first.c_str(), ms * 1e3,
             err == cudaSuccess ? "" : cudaGetErrorString(err));
    line += item;
  }
  for (auto& m : marks) cudaEventDestroy(m.second);  // after every difference to marks[0] is taken
  marks.clear();
  printf("rank %d: probe timeline (us after the GEMM's launch): %s\n", rank, line.c_str());
  fflush(stdout);
  return Status::kOk;
}

}  // namespace weft::runtime::ops
