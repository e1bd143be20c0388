// The SM-driven AllGather+GEMM kernel: one persistent launch per rank, its SMs split by role.
//
//   rank r, grid = compute + intra_comm blocks (one per SM)
//
//   intra_comm blocks (pull):  for step 1..W-1, shard s = r+step:   chunk 0 of s ─► chunk 1 ─► ...
//     each block copies its 1/intra slice of a 128-row chunk from rank s's buffer (NVLink) into
//     the local gathered A, then flags[chunk row block][0..flag_cols) += 1 (release, system scope)
//   intra_comm blocks (push):  for step 1..W-1, peer q = r-step (the peer that needs shard r next):
//     wait cts[q] (q's kernel of this epoch has started), store own chunks into q's buffer, add
//     to q's flags over NVLink
//   compute blocks:            gemm_compute_block, tiles of shard r first (its flags are ~0), then
//     r+1, r+2, ...; the producer waits flags[tile] >= epoch * intra before loading A's rows
//
// Chunks go in the order the GEMM consumes them (rank-rotated shards, rows in order), so the first
// remote tile row is ready after one chunk's transfer, not after a whole shard's.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstring>

#include "base/log.h"
#include "kernels/ag_gemm_fused.h"
#include "kernels/gemm.h"
#include "kernels/gemm_sm90.cuh"
#include "kernels/vec_copy.cuh"

namespace weft::kernels {

const char* to_string(AgMover m) {
  switch (m) {
    case AgMover::kPullVec:
      return "pull_vec";
    case AgMover::kPushVec:
      return "push_vec";
    case AgMover::kPullBulk:
      return "pull_bulk";
    case AgMover::kPushBulk:
      return "push_bulk";
  }
  return "?";
}

bool parse_ag_mover(const char* name, AgMover* out) {
  for (AgMover m : {AgMover::kPullVec, AgMover::kPushVec, AgMover::kPullBulk, AgMover::kPushBulk})
    if (!strcmp(name, to_string(m))) return *out = m, true;
  return false;
}

namespace ag_detail {

constexpr int kThreads = GemmConfig::kThreads;
constexpr int kUnroll = 8;               // 16-byte loads in flight per thread (48 KiB per SM)
constexpr uint32_t kPieceBytes = 32768;  // one bulk copy
constexpr int kBulkBufs = 4;             // 128 KiB of the block's shared memory in flight
constexpr int kChunkRows = GemmConfig::kTileM;

struct MoverShared {
  uint8_t buf[kBulkBufs][kPieceBytes];
  uint64_t full[kBulkBufs];
  int32_t ok;
};
static_assert(sizeof(MoverShared) + 1024 <= gemm_smem_bytes(), "the movers use the GEMM's shared memory");

// After a fence.acq_rel.sys (__threadfence_system), a relaxed add is a release: one fence for all
// of a chunk's flags instead of one per flag.
__device__ __forceinline__ void flag_add_relaxed(uint64_t* p, uint64_t v) {
  asm volatile("red.relaxed.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Bulk (non-tensor) copies through shared memory; sizes and addresses multiples of 16 bytes.
__device__ __forceinline__ void bulk_load(void* smem_dst, const void* src, uint32_t bytes, uint64_t* bar) {
  sm90::mbar_arrive_expect_tx(bar, bytes);
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   sm90::smem_addr(smem_dst)),
               "l"(src), "r"(bytes), "r"(sm90::smem_addr(bar))
               : "memory");
}
__device__ __forceinline__ void bulk_store(void* dst, const void* smem_src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(sm90::smem_addr(smem_src)),
               "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {  // shared source of all but kPending stores reusable
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ void bulk_wait_all() {  // every store's writes performed
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

// One chunk of this rank's transfer order: i = (step - 1) * chunks_per_shard + row block in shard.
struct Chunk {
  const __nv_bfloat16* src;
  __nv_bfloat16* dst;
  uint64_t* flags;  // the chunk's first flag (flag_cols of them)
  int32_t peer;     // the other rank
  bool first_to_peer;
};

__device__ __forceinline__ Chunk chunk_at(const AgMoveParams& p, int32_t i) {
  const int32_t per_shard = p.shard_rows / kChunkRows;
  const int32_t step = i / per_shard + 1, rb = i - (step - 1) * per_shard;
  const bool push = p.mover == AgMover::kPushVec || p.mover == AgMover::kPushBulk;
  // Pull: shard s = r + step comes from rank s. Push: own shard r goes to q = r - step, the rank
  // that computes on shard r at its step `step` (so each peer gets what it needs next).
  const int32_t peer = push ? (p.rank - step + p.world) % p.world : (p.rank + step) % p.world;
  const int32_t shard = push ? p.rank : peer;
  const int32_t dst_rank = push ? peer : p.rank;
  const int64_t row = int64_t(shard) * p.shard_rows + int64_t(rb) * kChunkRows;
  Chunk c;
  c.src = p.a[shard] + row * p.k;  // the owner's own rows, never written during the launch
  c.dst = p.a[dst_rank] + row * p.k;
  c.flags = p.flags[dst_rank] + (row / kChunkRows) * p.flag_cols;
  c.peer = peer;
  c.first_to_peer = rb == 0;
  return c;
}

// Push movers write into a peer's buffer only once the peer's kernel of this epoch is running (its
// previous GEMM, which read the buffer, is then done). One thread waits; false on timeout.
__device__ __forceinline__ bool wait_clear_to_send(const AgMoveParams& p, const FrameParams& f, int32_t peer) {
  const uint64_t* cts = p.flags[p.rank] + p.cts_offset() + peer;
  return frame_wait_flag(f, cts, p.epoch, Role::kIntraComm, -1, -1, int32_t(p.cts_offset() + peer));
}

__device__ __forceinline__ void publish_chunk(const AgMoveParams& p, const Chunk& c, int32_t lane, int32_t lanes) {
  __threadfence_system();
  for (int32_t nb = lane; nb < p.flag_cols; nb += lanes) flag_add_relaxed(c.flags + nb, 1);
}

__device__ __forceinline__ bool bounded_bar_wait(uint64_t* bar, uint32_t parity, const FrameParams& f) {
  if (sm90::mbar_try_wait(bar, parity)) return true;
  const uint64_t start = globaltimer_ns();
  for (uint32_t tries = 1;; ++tries) {
    if (sm90::mbar_try_wait(bar, parity)) return true;
    if ((tries & 1023) == 0) {
      const uint64_t waited = globaltimer_ns() - start;
      if (frame_aborted(f)) return false;
      if (waited > f.timeout_ns) {
        frame_record_error(f, DeviceErrorKind::kBarrierTimeout, Role::kIntraComm, -1, -1, -1, bar, parity, 0, waited);
        return false;
      }
    }
  }
}

// 16-byte loads and stores by all threads of the block.
__device__ void move_vec(const AgMoveParams& p, const FrameParams& f, int64_t v0, int64_t v1, int32_t chunks,
                         MoverShared& sh) {
  const bool push = p.mover == AgMover::kPushVec;
  const int64_t n = v1 - v0;
  for (int32_t i = 0; i < chunks; ++i) {
    const Chunk c = chunk_at(p, i);
    if (push && c.first_to_peer) {
      if (threadIdx.x == 0) sh.ok = wait_clear_to_send(p, f, c.peer);
      __syncthreads();
      if (!sh.ok) return;
    }
    // The owners' rows are never written while the kernel runs: the non-coherent path.
    vec::block_copy<kThreads, kUnroll, false>(reinterpret_cast<const uint4*>(c.src) + v0,
                                              reinterpret_cast<uint4*>(c.dst) + v0, n);
    __syncthreads();  // every thread's stores of the chunk before the flags (cumulative release)
    if (threadIdx.x < 32) publish_chunk(p, c, int32_t(threadIdx.x), 32);
  }
}

// Bulk copies issued by one thread: loads run kBulkBufs - 1 pieces ahead of the stores.
__device__ void move_bulk(const AgMoveParams& p, const FrameParams& f, int64_t v0, int64_t v1, int32_t chunks,
                          MoverShared& sh) {
  const bool push = p.mover == AgMover::kPushBulk;
  const int64_t slice = (v1 - v0) * 16;
  const int64_t pieces_per_chunk = (slice + kPieceBytes - 1) / kPieceBytes;
  const int64_t total = pieces_per_chunk * chunks;
  if (pieces_per_chunk == 0) {  // more movers than 16-byte vectors in a chunk: only the flags
    for (int32_t i = 0; i < chunks; ++i) {
      const Chunk c = chunk_at(p, i);
      if (push && c.first_to_peer && !wait_clear_to_send(p, f, c.peer)) return;
      publish_chunk(p, c, 0, 1);
    }
    return;
  }
  auto piece = [&](int64_t q, const uint8_t** src, uint8_t** dst, uint32_t* bytes) {
    const Chunk c = chunk_at(p, int32_t(q / pieces_per_chunk));
    const int64_t off = v0 * 16 + (q % pieces_per_chunk) * kPieceBytes;
    *src = reinterpret_cast<const uint8_t*>(c.src) + off;
    *dst = reinterpret_cast<uint8_t*>(c.dst) + off;
    const int64_t left = slice - (q % pieces_per_chunk) * kPieceBytes;
    *bytes = uint32_t(left < kPieceBytes ? left : kPieceBytes);
  };
  const uint8_t* src;
  uint8_t* dst;
  uint32_t bytes;
  for (int64_t q = 0; q < kBulkBufs - 1 && q < total; ++q) {
    piece(q, &src, &dst, &bytes);
    bulk_load(sh.buf[q], src, bytes, &sh.full[q]);
  }
  for (int64_t q = 0; q < total; ++q) {
    const int32_t b = int32_t(q % kBulkBufs);
    if (!bounded_bar_wait(&sh.full[b], uint32_t(q / kBulkBufs) & 1, f)) return;
    const int64_t j = q % pieces_per_chunk;
    const Chunk c = chunk_at(p, int32_t(q / pieces_per_chunk));
    if (push && j == 0 && c.first_to_peer && !wait_clear_to_send(p, f, c.peer)) return;
    piece(q, &src, &dst, &bytes);
    bulk_store(dst, sh.buf[b], bytes);
    if (j == pieces_per_chunk - 1) {
      bulk_wait_all();
      asm volatile("fence.proxy.async.global;" ::: "memory");  // async-proxy writes before the flags
      publish_chunk(p, c, 0, 1);
    }
    const int64_t next = q + kBulkBufs - 1;
    if (next < total) {
      bulk_wait_read<1>();  // the store of piece q - 1 has read buffer next % kBulkBufs
      piece(next, &src, &dst, &bytes);
      bulk_load(sh.buf[next % kBulkBufs], src, bytes, &sh.full[next % kBulkBufs]);
    }
  }
  bulk_wait_all();
}

__device__ void move_block(const AgMoveParams& p, const FrameParams& f, int32_t block, int32_t blocks, uint8_t* smem) {
  MoverShared& sh = *reinterpret_cast<MoverShared*>((reinterpret_cast<uintptr_t>(smem) + 1023) & ~uintptr_t(1023));
  const bool push = p.mover == AgMover::kPushVec || p.mover == AgMover::kPushBulk;
  // Tell every peer that this rank's buffer may be written for this epoch (thread t tells rank t).
  if (push && block == 0 && int32_t(threadIdx.x) < p.world && int32_t(threadIdx.x) != p.rank)
    flag_store_release(p.flags[threadIdx.x] + p.cts_offset() + p.rank, p.epoch);
  const int64_t vecs = int64_t(kChunkRows) * p.k / 8;  // 16-byte vectors per chunk
  const int64_t v0 = vecs * block / blocks, v1 = vecs * (block + 1) / blocks;
  const int32_t chunks = (p.world - 1) * (p.shard_rows / kChunkRows);
  if (p.mover == AgMover::kPullVec || p.mover == AgMover::kPushVec) {
    move_vec(p, f, v0, v1, chunks, sh);
    return;
  }
  if (threadIdx.x == 0) {
    for (int i = 0; i < kBulkBufs; ++i) sm90::mbar_init(&sh.full[i], 1);
    sm90::fence_barrier_init();
    move_bulk(p, f, v0, v1, chunks, sh);
  }
}

struct FusedParams {
  GemmParams gemm;
  FrameParams frame;
  EpiStoreBf16 epi;
  FlagGate gate;
  AgMoveParams move;
};

__global__ void __launch_bounds__(GemmConfig::kThreads, 1) ag_gemm_fused_kernel(const __grid_constant__ FusedParams p) {
  extern __shared__ uint8_t smem[];
  const int32_t block = int32_t(blockIdx.x);
  frame_note_launch(p.frame, KernelKind::kAgGemmFused);
  switch (p.frame.roles.role_of(block)) {
    case Role::kCompute:
      gemm_compute_block<1>(p.gemm, p.frame, p.epi, p.gate, TileSignal{}, block, p.frame.roles.compute, smem);
      break;
    case Role::kIntraComm:
      move_block(p.move, p.frame, p.frame.roles.index_in_role(block), p.frame.roles.intra_comm, smem);
      break;
    default:
      break;
  }
}

struct SplitKParams {
  GemmParams half[2];
  FrameParams frame;
  EpiAddF32 epi;
};

// Blocks [0, B/2) run K half 0, [B/2, B) half 1 of the same tiles; both add into the fp32 output.
__global__ void __launch_bounds__(GemmConfig::kThreads, 1) split_k_pair_kernel(const __grid_constant__ SplitKParams p) {
  extern __shared__ uint8_t smem[];
  const int32_t per_half = p.frame.roles.compute / 2, block = int32_t(blockIdx.x);
  if (block >= 2 * per_half) return;
  const int32_t h = block < per_half ? 0 : 1;
  gemm_compute_block<1>(p.half[h], p.frame, p.epi, FlagGate{}, TileSignal{}, block - h * per_half, per_half, smem);
}

__global__ void acc_to_bf16_kernel(float* acc, int64_t m, int64_t n, __nv_bfloat16* c, int64_t ldc) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  if (n % 4 == 0 && ldc % 4 == 0 && (reinterpret_cast<uintptr_t>(c) % 8) == 0) {
    const int64_t quads = m * n / 4;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < quads; i += stride) {
      float4* a4 = reinterpret_cast<float4*>(acc) + i;
      const float4 v = *a4;
      const int64_t row = 4 * i / n, col = 4 * i - row * n;
      __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(c + row * ldc + col);
      out[0] = __floats2bfloat162_rn(v.x, v.y);
      out[1] = __floats2bfloat162_rn(v.z, v.w);
      *a4 = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    return;
  }
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < m * n; i += stride) {
    const int64_t row = i / n, col = i - row * n;
    c[row * ldc + col] = __float2bfloat16_rn(acc[i]);
    acc[i] = 0.f;
  }
}

Status launch_error(const char* what, int32_t rank, cudaError_t err) {
  WEFT_WARN(kKernel, "%s: rank %d launch failed: %s", what, rank, cudaGetErrorString(err));
  return Status::kCudaError;
}

}  // namespace ag_detail

Status launch_ag_gemm_fused(const GemmParams& g, const FrameParams& frame, const EpiStoreBf16& epi,
                            const FlagGate& gate, const AgMoveParams& move, cudaStream_t stream,
                            const GemmOptions& opt) {
  const char* why = nullptr;
  if (g.cluster_m != 1) {
    why = "cluster_m must be 1";
  } else if (frame.roles.intra_comm < 1 || frame.roles.compute < 0) {
    why = "needs at least one intra_comm block";
  } else if (move.world < 1 || move.world > AgMoveParams::kMaxRanks || move.rank < 0 || move.rank >= move.world) {
    why = "rank / world out of range (at most 8 ranks)";
  } else if (move.shard_rows <= 0 || move.shard_rows % ag_detail::kChunkRows || move.k <= 0 || move.k % 8) {
    why = "shard rows must be a positive multiple of 128 and K a multiple of 8";
  } else if (move.epoch == 0) {
    why = "epochs start at 1";
  } else if (frame.roles.compute > 0 && (gate.granularity != kFlagPerTile || move.flag_cols != g.n_blocks ||
                                         gate.expected != move.epoch * uint64_t(frame.roles.intra_comm))) {
    why = "the gate must be per tile over the GEMM's n_blocks, expecting epoch * intra_comm";
  }
  for (int r = 0; !why && r < move.world; ++r)
    if (!move.a[r] || !move.flags[r]) why = "every rank's buffer and flags must be mapped";
  if (why) {
    WEFT_WARN(kKernel, "ag_gemm fused: rank %d: %s (compute %d, intra_comm %d, mover %s)", frame.rank, why,
              frame.roles.compute, frame.roles.intra_comm, to_string(move.mover));
    return Status::kInvalidArgument;
  }
  auto kernel = ag_detail::ag_gemm_fused_kernel;
  const int smem = int(gemm_smem_bytes());
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return ag_detail::launch_error("ag_gemm fused", frame.rank, err);
  ag_detail::FusedParams p;
  p.gemm = g;
  // A ragged last wave is cut along K inside the GEMM (kernels/gemm.h) unless the caller planned it.
  if (opt.dynamic_tiles && frame.roles.compute > 0 && !g.claims) {
    const Status st = enable_dynamic_tiles(stream, &p.gemm);
    if (st != Status::kOk) return st;
  }
  if (frame.roles.compute > 0 && g.sched.split <= 1) {  // chunks only for a static walk
    const Status st = enable_tail_split(frame.roles.compute, stream, &p.gemm, opt.chunked_tail && !p.gemm.claims,
                                        opt.split_tail ? kMaxTailSplit : 1);
    if (st != Status::kOk) return st;
  }
  p.frame = frame;
  p.epi = epi;
  p.gate = gate;
  p.move = move;
  kernel<<<unsigned(frame.roles.total()), GemmConfig::kThreads, size_t(smem), stream>>>(p);
  err = cudaGetLastError();
  if (err != cudaSuccess) return ag_detail::launch_error("ag_gemm fused", frame.rank, err);
  return Status::kOk;
}

Status launch_split_k_pair(const GemmParams& half0, const GemmParams& half1, const FrameParams& frame, float* acc,
                           cudaStream_t stream) {
  if (half0.cluster_m != 1 || half1.cluster_m != 1 || frame.roles.compute < 2 || half0.m != half1.m ||
      half0.n != half1.n || !acc || half0.claims || half1.claims) {
    WEFT_WARN(kKernel,
              "split-k tail: rank %d: needs cluster_m 1, static striding (no tile claims), two halves of one "
              "m x n output and >= 2 compute blocks (got %d)",
              frame.rank, frame.roles.compute);
    return Status::kInvalidArgument;
  }
  auto kernel = ag_detail::split_k_pair_kernel;
  const int smem = int(gemm_smem_bytes());
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return ag_detail::launch_error("split-k tail", frame.rank, err);
  ag_detail::SplitKParams p;
  p.half[0] = half0;
  p.half[1] = half1;
  p.frame = frame;
  p.epi.c = acc;
  p.epi.ldc = half0.n;
  kernel<<<unsigned(frame.roles.total()), GemmConfig::kThreads, size_t(smem), stream>>>(p);
  err = cudaGetLastError();
  if (err != cudaSuccess) return ag_detail::launch_error("split-k tail", frame.rank, err);
  return Status::kOk;
}

Status launch_acc_to_bf16(float* acc, int64_t m, int64_t n, __nv_bfloat16* c, int64_t ldc, cudaStream_t stream) {
  ag_detail::acc_to_bf16_kernel<<<264, 512, 0, stream>>>(acc, m, n, c, ldc);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return ag_detail::launch_error("acc to bf16", -1, err);
  return Status::kOk;
}

}  // namespace weft::kernels
