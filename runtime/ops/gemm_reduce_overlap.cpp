// GEMM+RS / GEMM+AR, overlap path: one persistent GEMM per rank, partial pieces moved by the copy
// engines as their tiles finish, own rows reduced in the GEMM's epilogue (gemm_reduce_op.cpp has
// the picture).
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/gemm.h"
#include "kernels/reduce_slots.h"
#include "runtime/ops/cuda_check.h"
#include "runtime/ops/gemm_reduce.h"
#include "runtime/log.h"
#include "runtime/params.h"

namespace weft::runtime::ops {

using bf16 = __nv_bfloat16;

Status GemmReduce::setup_overlap() {
  std::string order;
  WEFT_CHECK(get_param("WEFT_GEMM_AR_ORDER", &order));
  if (order != "piece" && order != "owner") {
    WEFT_WARN(kKernel, "rank %d: WEFT_GEMM_AR_ORDER='%s' is not piece or owner", rank, order.c_str());
    return Status::kInvalidArgument;
  }
  piece_major = all_reduce && world > 1 && order == "piece";
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&gates, cudaStreamNonBlocking));
  WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&gates_done, cudaEventDisableTiming));
  if (all_reduce && !serial_push) {
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
  char text[160];
  snprintf(text, sizeof text, "overlap, %d pieces of %lld rows, %s order%s%s", pieces, static_cast<long long>(m_piece),
           piece_major ? "piece-major" : "owner-major", sys_signal ? ", system-scope counts" : "",
           all_reduce && serial_push ? ", serial pushes" : "");
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
  if (overlap && piece_major) {
    args.piece_major_owners = world;
    args.piece_major_owner = rank;
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

Status GemmReduce::enqueue_overlap() {
  const uint64_t e = epoch;
  const int S = pieces;
  WEFT_CUDA_CHECK(cudaEventRecord(fork, main));
  WEFT_CUDA_CHECK(cudaStreamWaitEvent(comm, fork));
  WEFT_CUDA_CHECK(cudaStreamWaitEvent(gates, fork));
  // The GEMM is enqueued before the other streams' waits: should two streams share a hardware
  // queue, the launch must not sit behind a wait that only the GEMM itself can satisfy. Only this
  // rank's own pieces are gated (and only they may hold back a tile's deferred signal).
  kernels::FlagGate gate_args{gate, kernels::kFlagPerShard, e, rank * S, (rank + 1) * S};
  kernels::TileSignal signal{tiles, kernels::kFlagPerShard, 1};
  WEFT_CHECK(kernels::launch_gemm(gemm, frame_params, reduce_epilogue(), gate_args, signal, main));

  // Comm stream: each other owner's pieces, in the GEMM's order, copied into that owner's slot as
  // their tiles complete, each followed by its arrival flag in the owner's memory.
  std::vector<StreamMemOp> ops;
  auto wait = [&](uint64_t* addr, uint64_t v) { ops.push_back({StreamMemOp::kWaitGeq, addr, v}); };
  auto write = [&](uint64_t* addr, uint64_t v) { ops.push_back({StreamMemOp::kWrite, addr, v}); };
  auto flush = [&](cudaStream_t s) -> Status {
    WEFT_CHECK(stream_mem_ops(s, ops));
    ops.clear();
    return Status::kOk;
  };
  const uint64_t piece_done = e * tiles_per_piece;
  auto send = [&](int o, int j) -> Status {
    if (j == 0) wait(freed.local<uint64_t>() + o, e - 1);  // o has read what this rank sent it last epoch
    wait(tiles + o * S + j, piece_done);
    WEFT_CHECK(flush(comm));
    WEFT_CUDA_CHECK(cudaMemcpyAsync(staging.peer<bf16>(o) + piece_row(rank, j) * n,
                                    partial.local<bf16>() + piece_row(o, j) * n, piece_bytes(),
                                    cudaMemcpyDeviceToDevice, comm));
    write(arrived.peer<uint64_t>(o) + rank * S + j, e);
    return Status::kOk;
  };
  if (piece_major) {
    for (int j = 0; j < S; ++j)
      for (int i = 1; i < world; ++i) WEFT_CHECK(send((rank + i) % world, j));
  } else {
    for (int i = 1; i < world; ++i)
      for (int j = 0; j < S; ++j) WEFT_CHECK(send((rank + i) % world, j));
  }
  if (all_reduce && serial_push) {
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
  WEFT_CHECK(flush(comm));

  // Gate stream: own piece j opens once every peer's piece j is in its slot.
  for (int j = 0; j < S; ++j) {
    for (int p = 0; p < world; ++p)
      if (p != rank) wait(arrived.local<uint64_t>() + p * S + j, e);
    write(gate + rank * S + j, e);
  }
  WEFT_CHECK(flush(gates));

  if (all_reduce && !serial_push) {
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
      }
      WEFT_CHECK(stream_write_u64(s, gathered.peer<uint64_t>(q) + rank, e));
    }
  }

  std::vector<StreamMemOp> after;  // on main, behind the GEMM
  for (int p = 0; p < world; ++p)
    if (p != rank) after.push_back({StreamMemOp::kWrite, freed.peer<uint64_t>(p) + rank, e});
  if (all_reduce)
    for (int p = 0; p < world; ++p)
      if (p != rank) after.push_back({StreamMemOp::kWaitGeq, gathered.local<uint64_t>() + p, e});
  WEFT_CHECK(stream_mem_ops(main, after));
  WEFT_CUDA_CHECK(cudaEventRecord(join, comm));
  WEFT_CUDA_CHECK(cudaStreamWaitEvent(main, join));
  WEFT_CUDA_CHECK(cudaEventRecord(gates_done, gates));
  WEFT_CUDA_CHECK(cudaStreamWaitEvent(main, gates_done));
  if (all_reduce && !serial_push)
    for (int q = 0; q < world; ++q)
      if (q != rank) {
        WEFT_CUDA_CHECK(cudaEventRecord(pushed[size_t(q)], push[size_t(q)]));
        WEFT_CUDA_CHECK(cudaStreamWaitEvent(main, pushed[size_t(q)]));
      }
  return Status::kOk;
}


Status GemmReduce::enqueue_diag(bool own_rows, bool signalled) {
  kernels::TileSignal signal{signalled ? diag_tiles : nullptr, kernels::kFlagPerShard, 1};
  return kernels::launch_gemm(gemm, frame_params, reduce_epilogue(own_rows), kernels::FlagGate{}, signal, main);
}

}  // namespace weft::runtime::ops
