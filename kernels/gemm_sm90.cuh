// The persistent warp-specialized bf16 GEMM main loop for sm_90a, written once for every kernel
// that computes C = A * B^T tiles: the standalone GEMM and the fused communication kernels.
//
//   block (384 threads) = warpgroup 0: producer  (setmaxnreg 40; one thread issues TMA loads)
//                         warpgroups 1, 2: consumers (setmaxnreg 232; wgmma m64n256k16, each
//                                          owns 64 rows of the 128 x 256 tile)
//
//   global A (M x K) ──TMA──► smem ring of kStages {A 128x64, B 256x64} ──wgmma──► fp32 regs
//   global B (N x K) ──TMA──┘   full[s]: TMA bytes landed      empty[s]: 8 consumer warps done
//                                                                 │
//                           epilogue (per tile, from registers) ◄─┘ store / add / signal
//
// A fused kernel calls gemm_compute_block() from the compute branch of its role switch and
// supplies: an Epilogue (where a finished fp32 pair goes: local or peer store, add into a peer's
// heap), a FlagGate (flag the producer waits on before loading a tile's operands: e.g. "rank r's
// rows of A have arrived") and a TileSignal (flag bumped after a tile is stored).
#pragma once

#include <cuda_bf16.h>

#include <type_traits>

#include "kernels/frame.cuh"
#include "kernels/gemm_epilogues.h"
#include "kernels/gemm_types.h"
#include "kernels/sm90.cuh"
#include "kernels/tile_scheduler.h"

namespace weft::kernels {

#if defined(__CUDACC__)

namespace gemm_detail {

// Timing hooks for bench/gemm/trace_gemm.cu only: a translation unit that defines WEFT_GEMM_TRACE
// as the name of a __device__ uint64_t* (before including this header) gets clock64() stamps of
// every k-block of blocks 0 and 1: [block][0 = consumer issue, 1 = producer load][k-block].
// Compiled out everywhere else.
#ifdef WEFT_GEMM_TRACE
constexpr int kTraceBlocks = 2, kTraceIters = 4096;
__device__ __forceinline__ void trace_stamp(int kind, uint32_t it) {
  if (blockIdx.x < kTraceBlocks && it < uint32_t(kTraceIters))
    WEFT_GEMM_TRACE[(blockIdx.x * 2 + kind) * kTraceIters + it] = clock64();
}
#define WEFT_TRACE_STAMP(kind, it) trace_stamp(kind, it)
#else
#define WEFT_TRACE_STAMP(kind, it) ((void)0)
#endif

struct __align__(1024) SharedStorage {
  __nv_bfloat16 a[GemmConfig::kStages][GemmConfig::kTileM * GemmConfig::kTileK];
  __nv_bfloat16 b[GemmConfig::kStages][GemmConfig::kTileN * GemmConfig::kTileK];
  // Epilogue staging for TMA stores: per consumer, two 64 x 64 bf16 sub-tiles (128B swizzle).
  __nv_bfloat16 c[GemmConfig::kConsumers][2][GemmConfig::kStoreBox * GemmConfig::kStoreBox];
  uint64_t full[GemmConfig::kStages];
  uint64_t empty[GemmConfig::kStages];
  int32_t abort;
};
static_assert(sizeof(__nv_bfloat16) * GemmConfig::kTileM * GemmConfig::kTileK % 1024 == 0,
              "every A stage must stay 1024-B aligned for the 128B swizzle");
static_assert(sizeof(SharedStorage) + 1024 <= 227 * 1024, "shared-memory budget of one H100/H200 block");

// Bounded wait on an in-block barrier; false when the launch is abandoned (this or another
// block timed out), so the caller leaves its role function. The clock and the launch-wide abort
// word are read only every 1024 failed tries: every waiting thread of every SM polling one
// global word would flood its L2 slice and slow the copy engine's loads down with it.
__device__ __forceinline__ bool wait_barrier(uint64_t* bar, uint32_t phase, const FrameParams& f, const TileCoord& c) {
  if (sm90::mbar_try_wait(bar, phase)) return true;
  uint64_t start = 0;
  for (uint32_t tries = 1;; ++tries) {
    if (sm90::mbar_try_wait(bar, phase)) return true;
    if ((tries & 1023) == 0) {
      const uint64_t now = globaltimer_ns();
      if (start == 0) start = now;
      if (frame_aborted(f)) return false;
      // Twice the flag bound: a producer gated on a slow flag must time out (and say why) first.
      if (now - start > 2 * f.timeout_ns) {
        frame_record_error(f, DeviceErrorKind::kBarrierTimeout, Role::kCompute, c.m_block, c.n_block, -1, bar, phase, 0,
                           now - start);
        return false;
      }
    }
  }
}

__device__ __forceinline__ int32_t flag_index(int32_t granularity, const GemmParams& g, const TileCoord& c) {
  return granularity == kFlagPerShard ? c.shard : c.m_block * g.n_blocks + c.n_block;
}

// Releases a ring stage: one arrival per consumer warp on the stage's `empty` barrier of every
// CTA of the cluster (each CTA's producer multicasts into all of them).
template <int kCluster>
__device__ __forceinline__ void release_stage(uint64_t* bar) {
  if constexpr (kCluster == 1) {
    sm90::mbar_arrive(bar);
  } else {
#pragma unroll
    for (uint32_t r = 0; r < kCluster; ++r) sm90::mbar_arrive_cluster(bar, r);
  }
}

// The CTA's own 128-row tile inside the cluster tile `cc`.
template <int kCluster>
__device__ __forceinline__ TileCoord cta_tile(const TileCoord& cc, uint32_t cta) {
  TileCoord c = cc;
  c.m_block = cc.m_block * kCluster + int32_t(cta);
  return c;
}

template <int kCluster>
__device__ __forceinline__ void producer_loop(const GemmParams& g, const FrameParams& f, const FlagGate& gate,
                                              SharedStorage& s, uint32_t cta, int32_t cluster_idx, int32_t clusters) {
  using Cfg = GemmConfig;
  constexpr uint32_t kStageBytes = (Cfg::kTileM + Cfg::kTileN) * Cfg::kTileK * sizeof(__nv_bfloat16);
  constexpr int32_t kBRows = Cfg::kTileN / kCluster;  // rows of B this CTA loads (and multicasts)
  const int32_t k_iters = (g.k + Cfg::kTileK - 1) / Cfg::kTileK;
  uint32_t it = 0;
  for (PersistentTileIter t(g.sched, cluster_idx, clusters); t.valid(); t.advance()) {
    const TileCoord c = cta_tile<kCluster>(t.current(), cta);
    bool ok = true;
    if (gate.flags && (gate.granularity == kFlagPerShard || c.m_block < g.cta_m_blocks)) {
      const int32_t idx = flag_index(gate.granularity, g, c);
      ok = frame_wait_flag(f, gate.flags + idx, gate.expected, Role::kCompute, c.m_block, c.n_block, idx);
      // The data behind the flag is read by the copy engine (async proxy) next.
      asm volatile("fence.proxy.async.global;" ::: "memory");
    }
    if (!ok) {
      // Wake this CTA's consumers with an empty arrival on the next stage; they see `abort`.
      const uint32_t stage = it % Cfg::kStages, phase = (it / Cfg::kStages) & 1;
      if (!wait_barrier(&s.empty[stage], phase ^ 1, f, c)) return;
      s.abort = 1;
      sm90::mbar_arrive(&s.full[stage]);
      return;
    }
    const int32_t row_a = c.m_block * Cfg::kTileM;
    const int32_t row_b = c.n_block * Cfg::kTileN + int32_t(cta) * kBRows;
    for (int32_t kb = 0; kb < k_iters; ++kb, ++it) {
      const uint32_t stage = it % Cfg::kStages, phase = (it / Cfg::kStages) & 1;
      if (!wait_barrier(&s.empty[stage], phase ^ 1, f, c)) return;
      WEFT_TRACE_STAMP(1, it);
      // A (own) + all of B (own part + the peers' multicast parts) land on this barrier.
      sm90::mbar_arrive_expect_tx(&s.full[stage], kStageBytes);
      sm90::tma_load_2d(s.a[stage], &g.tmap_a, &s.full[stage], kb * Cfg::kTileK, row_a);
      if constexpr (kCluster == 1) {
        sm90::tma_load_2d(s.b[stage], &g.tmap_b, &s.full[stage], kb * Cfg::kTileK, row_b);
      } else {
        sm90::tma_load_2d_multicast(s.b[stage] + cta * kBRows * Cfg::kTileK, &g.tmap_b, &s.full[stage],
                                    kb * Cfg::kTileK, row_b, uint16_t((1u << kCluster) - 1));
      }
    }
  }
}

// ---- deferred bf16 stores (EpiScatterBf16 without a TileSignal) --------------------------------
// A finished tile is packed to bf16x2 (64 registers per thread) and its stores are issued while the
// tensor cores already run the next tile's first k-blocks (wgmma is asynchronous; the warps are
// otherwise idle in wgmma.wait_group), instead of both consumer warpgroups stopping the MMAs to
// store. The values, rounding and addresses are exactly those of the epilogue's pair().
template <class Epilogue>
struct DeferredStore {
  // EpiStoreBf16 stores through shared memory and TMA (store_tile_tma) or, where C does not allow
  // that, with pair(): holding a packed tile next to the TMA path's registers would spill.
  static constexpr bool kEnabled = std::is_same<Epilogue, EpiScatterBf16>::value;
};

// An epilogue with fragment(row, col0, m, n, acc) takes a thread's whole finished tile at once
// (EpiReduceSlots batches its loads of the staged partials) instead of one pair() at a time.
template <class Epilogue>
struct FragmentEpilogue {
  static constexpr bool kEnabled = std::is_same<Epilogue, EpiReduceSlots>::value;
};

// Whether a tile's signal may be released at GPU scope instead of system scope: EpiReduceSlots'
// tile counts are read only by this GPU's copy engines and stream waits (GEMM+RS/AR), for which
// GPU scope is enough (on H200 both scopes measured the same, docs/ops.md). Every other epilogue
// keeps system scope: its flags may be in a peer's memory.
__device__ __forceinline__ bool gpu_scope_signal(const EpiReduceSlots& e) { return e.local_signal; }
template <class Epilogue>
__device__ __forceinline__ bool gpu_scope_signal(const Epilogue&) {
  return false;
}

// Where row `row` of C starts (column 0), or null for an epilogue without the deferred path.
__device__ __forceinline__ __nv_bfloat16* row_base(const EpiStoreBf16& e, int32_t row) {
  return e.c + int64_t(row) * e.ldc;
}
__device__ __forceinline__ __nv_bfloat16* row_base(const EpiScatterBf16& e, int32_t row) {
  const int32_t o = row / int32_t(e.rows_per_owner);  // 32-bit: rows_per_owner <= M < 2^31
  return e.dst[o] + (int64_t(row) - int64_t(o) * e.rows_per_owner) * e.ldc;
}
template <class Epilogue>
__device__ __forceinline__ __nv_bfloat16* row_base(const Epilogue&, int32_t) {
  return nullptr;
}

// One tile's packed results, held by one consumer thread until they are stored.
struct PendingTile {
  static constexpr int kChunks = 4;  // stores issued in 4 slices, one per k-block of the next tile
  uint32_t v[64];                    // v[2j]: row r, columns col0 + 8j + {0,1}; v[2j+1]: row r + 8
  __nv_bfloat16* row0 = nullptr;     // C[r][col0] (null: row past M, or nothing pending)
  __nv_bfloat16* row1 = nullptr;     // C[r + 8][col0]
  int32_t col0 = 0;
  bool paired = true;
  bool full = false;  // paired, and all 256 columns inside N: plain 4-byte stores, no checks
};

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

__device__ __forceinline__ void store_packed(__nv_bfloat16* p, uint32_t v, bool two, bool paired) {
  if (two && paired) {
    *reinterpret_cast<uint32_t*>(p) = v;
  } else {
    p[0] = __ushort_as_bfloat16(uint16_t(v & 0xFFFF));
    if (two) p[1] = __ushort_as_bfloat16(uint16_t(v >> 16));
  }
}

// Issues slice `kChunk` (16 of the 64 stores) of the pending tile.
template <int kChunk>
__device__ __forceinline__ void store_pending_chunk(const PendingTile& pt, int32_t n) {
  constexpr int kPer = 32 / PendingTile::kChunks;
  if (pt.full) {
#pragma unroll
    for (int j = kChunk * kPer; j < (kChunk + 1) * kPer; ++j) {
      if (pt.row0) *reinterpret_cast<uint32_t*>(pt.row0 + 8 * j) = pt.v[2 * j];
      if (pt.row1) *reinterpret_cast<uint32_t*>(pt.row1 + 8 * j) = pt.v[2 * j + 1];
    }
    return;
  }
#pragma unroll
  for (int j = kChunk * kPer; j < (kChunk + 1) * kPer; ++j) {
    const int32_t col = pt.col0 + 8 * j;
    if (col < n) {
      const bool two = col + 1 < n;
      if (pt.row0) store_packed(pt.row0 + 8 * j, pt.v[2 * j], two, pt.paired);
      if (pt.row1) store_packed(pt.row1 + 8 * j, pt.v[2 * j + 1], two, pt.paired);
    }
  }
}

// Slices [from, kChunks) of the pending tile (from is a run-time value; the slices are unrolled
// so that v[] is indexed with constants only and stays in registers).
__device__ __forceinline__ void store_pending_from(const PendingTile& pt, int32_t from, int32_t n) {
  if (from <= 0) store_pending_chunk<0>(pt, n);
  if (from <= 1) store_pending_chunk<1>(pt, n);
  if (from <= 2) store_pending_chunk<2>(pt, n);
  if (from <= 3) store_pending_chunk<3>(pt, n);
}
static_assert(PendingTile::kChunks == 4, "store_pending_from and the k-loop issue 4 slices");

// ---- bf16 stores through shared memory and TMA (EpiStoreBf16 with GemmParams::store_tma) ------
// A consumer warpgroup's 64 x 256 half of the tile leaves as four 64 x 64 boxes: the threads pack
// their fp32 pairs to bf16x2 into a 128B-swizzled staging buffer (conflict-free 4-byte shared
// stores), and one thread hands the box to the TMA unit, which writes whole lines to global
// memory while the warps go on with the next tile. Two buffers alternate; a buffer is rewritten
// only after the store issued from it two boxes earlier has read it. Storing straight from
// registers (4-byte stores, each warp instruction touching 8 rows) stalled the consumers for
// ~8k cycles per tile, ~6% of a K = 8192 tile (bench/gemm/trace_gemm.cu, docs/gemm.md).
__device__ __forceinline__ void store_tile_tma(const GemmParams& g, SharedStorage& s, const float (&acc)[128],
                                               const TileCoord& c, int32_t consumer, int32_t t128) {
  using Cfg = GemmConfig;
  const int32_t warp = t128 / 32, lane = t128 % 32;
  const int32_t r0 = warp * 16 + lane / 4;  // rows r0 and r0 + 8 of this warpgroup's 64
  const int32_t swz = r0 & 7;               // (r0 + 8) & 7 is the same
  const uint32_t bar_id = 2 + uint32_t(consumer);
#pragma unroll
  for (int box = 0; box < Cfg::kTileN / Cfg::kStoreBox; ++box) {
    uint8_t* buf = reinterpret_cast<uint8_t*>(s.c[consumer][box & 1]);
    if (t128 == 0) sm90::bulk_wait_read<1>();  // the store issued from this buffer 2 boxes ago
    sm90::named_barrier_sync(bar_id, 128);
#pragma unroll
    for (int jj = 0; jj < 8; ++jj) {  // 8 columns pairs-of-4 per 16-byte chunk: chunk jj of each row
      const int j = box * 8 + jj;
      const int32_t off = ((jj ^ swz) * 16) + 4 * (lane % 4);
      sm90::st_shared_u32(buf + r0 * 128 + off, pack_bf16x2(acc[4 * j + 0], acc[4 * j + 1]));
      sm90::st_shared_u32(buf + (r0 + 8) * 128 + off, pack_bf16x2(acc[4 * j + 2], acc[4 * j + 3]));
    }
    sm90::fence_proxy_async_shared();
    sm90::named_barrier_sync(bar_id, 128);
    if (t128 == 0) {
      sm90::tma_store_2d(&g.tmap_c, buf, c.n_block * Cfg::kTileN + box * Cfg::kStoreBox,
                         c.m_block * Cfg::kTileM + consumer * 64);
      sm90::bulk_commit();
    }
  }
}

template <int kCluster, class Epilogue>
__device__ __forceinline__ void consumer_loop(const GemmParams& g, const FrameParams& f, const Epilogue& epi,
                                              const TileSignal& signal, SharedStorage& s, uint32_t cta,
                                              int32_t cluster_idx, int32_t clusters) {
  using Cfg = GemmConfig;
  const int32_t k_iters = (g.k + Cfg::kTileK - 1) / Cfg::kTileK;
  const int32_t consumer = threadIdx.x / 128 - 1;  // which 64-row half of the tile
  const int32_t t128 = threadIdx.x % 128;
  const int32_t warp = t128 / 32, lane = t128 % 32;
  float acc[128];
  uint32_t it = 0;
  // Deferred stores need no ordering against a signal; with a TileSignal the tile is stored (and
  // signalled) right away.
  constexpr bool kCanDefer = DeferredStore<Epilogue>::kEnabled;
  const bool tma_store = std::is_same<Epilogue, EpiStoreBf16>::value && g.store_tma;
  const bool defer = kCanDefer && signal.flags == nullptr && !tma_store;
  PendingTile pending;
  for (PersistentTileIter t(g.sched, cluster_idx, clusters); t.valid(); t.advance()) {
    const TileCoord c = cta_tile<kCluster>(t.current(), cta);
    for (int32_t kb = 0; kb < k_iters; ++kb, ++it) {
      const uint32_t stage = it % Cfg::kStages, phase = (it / Cfg::kStages) & 1;
      // Normally the previous k-block's stage is released after this one's MMAs are issued
      // (below). When this k-block's data is late, retire the previous MMAs now and hand their
      // stage back at once, so that the refill does not wait for the late data too (a late stage
      // would otherwise hold the one before it, and with 2-CTA multicast the peer's as well).
      // The choice is made per warp (wgmma.wait_group is warp-synchronous).
      bool released = false;
      if (kb > 0 && !__all_sync(0xffffffffu, sm90::mbar_try_wait(&s.full[stage], phase))) {
        sm90::wgmma_wait<0>();
        if (lane == 0) release_stage<kCluster>(&s.empty[(it - 1) % Cfg::kStages]);
        released = true;
      }
      if (!wait_barrier(&s.full[stage], phase, f, c) || sm90::ld_shared_volatile(&s.abort)) {
        sm90::wgmma_wait<0>();  // leave nothing in flight (else the compiler waits on every path)
        if (tma_store && t128 == 0) sm90::bulk_wait<0>();
        return;
      }
      if (consumer == 0 && t128 == 0) WEFT_TRACE_STAMP(0, it);
      const uint64_t desc_a = sm90::make_smem_desc_sw128(s.a[stage] + consumer * 64 * Cfg::kTileK);
      const uint64_t desc_b = sm90::make_smem_desc_sw128(s.b[stage]);
      sm90::wgmma_fence();
#pragma unroll
      for (int k = 0; k < Cfg::kTileK / 16; ++k) {
        // +32 bytes per k16 step inside the swizzled 128-byte row: +2 in the >>4 address field.
        sm90::wgmma_m64n256k16(acc, desc_a + 2 * k, desc_b + 2 * k, (kb > 0 || k > 0) ? 1 : 0);
      }
      sm90::wgmma_commit();
      if constexpr (kCanDefer) {
        // The previous tile's stores, one slice per k-block, while this k-block's MMAs run.
        if (defer && kb < PendingTile::kChunks) {
          if (kb == 0) store_pending_chunk<0>(pending, g.n);
          if (kb == 1) store_pending_chunk<1>(pending, g.n);
          if (kb == 2) store_pending_chunk<2>(pending, g.n);
          if (kb == 3) store_pending_chunk<3>(pending, g.n);
        }
      }
      // Keep one k-block of MMAs in flight; the one before it is done reading its stage.
      sm90::wgmma_wait<1>();
      if (kb > 0 && !released && lane == 0) release_stage<kCluster>(&s.empty[(it - 1) % Cfg::kStages]);
    }
    sm90::wgmma_wait<0>();
    if (lane == 0) release_stage<kCluster>(&s.empty[(it - 1) % Cfg::kStages]);

    // The accumulator fragment: thread holds, for j in [0, 32), rows r and r+8, columns
    // 8j + 2*(lane%4) + {0, 1}.
    const int32_t row = c.m_block * Cfg::kTileM + consumer * 64 + warp * 16 + lane / 4;
    const int32_t col0 = c.n_block * Cfg::kTileN + 2 * (lane % 4);
    if (tma_store) {
      if (c.m_block >= g.cta_m_blocks) continue;  // the cluster's tile past M: nothing to store
      store_tile_tma(g, s, acc, c, consumer, t128);
      // A signalled tile must be in global memory before its flag moves.
      if (signal.flags && t128 == 0) sm90::bulk_wait<0>();
    } else if constexpr (kCanDefer) {
      // Slices of the previous tile not yet issued (K shorter than kChunks k-blocks).
      if (defer && k_iters < PendingTile::kChunks) store_pending_from(pending, k_iters, g.n);
      // Rows past M (also the cluster's second tile hanging past M) get a null row pointer.
      pending.row0 = row < g.m ? row_base(epi, row) + col0 : nullptr;
      pending.row1 = row + 8 < g.m ? row_base(epi, row + 8) + col0 : nullptr;
      pending.col0 = col0;
      pending.paired = epi.paired;
      pending.full = epi.paired && c.n_block * Cfg::kTileN + Cfg::kTileN <= g.n;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        pending.v[2 * j] = pack_bf16x2(acc[4 * j + 0], acc[4 * j + 1]);
        pending.v[2 * j + 1] = pack_bf16x2(acc[4 * j + 2], acc[4 * j + 3]);
      }
      if (defer) continue;
      // With a signal: store now, then signal below.
      store_pending_from(pending, 0, g.n);
      if (c.m_block >= g.cta_m_blocks) continue;  // no signal for the cluster's tile past M
    } else {
      // Epilogue straight from the accumulator fragment (nothing for a cluster tile past M).
      if (c.m_block >= g.cta_m_blocks) continue;
      if constexpr (FragmentEpilogue<Epilogue>::kEnabled) epi.fragment(row, col0, g.m, g.n, acc);
      else
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const int32_t col = col0 + 8 * j;
        if (col < g.n) {
          const bool two = col + 1 < g.n;
          if (row < g.m) epi.pair(row, col, acc[4 * j + 0], acc[4 * j + 1], two);
          if (row + 8 < g.m) epi.pair(row + 8, col, acc[4 * j + 2], acc[4 * j + 3], two);
        }
      }
    }
    if (signal.flags) {
      // Every consumer thread's stores of this tile happen before the release below.
      sm90::named_barrier_sync(1, Cfg::kConsumers * 128);
      if (t128 == 0 && consumer == 0) {
        uint64_t* flag = signal.flags + flag_index(signal.granularity, g, c);
        if (gpu_scope_signal(epi)) {
          asm volatile("red.release.gpu.global.add.u64 [%0], %1;" ::"l"(flag), "l"(signal.add) : "memory");
        } else {
          __threadfence_system();
          flag_add_release(flag, signal.add);
        }
      }
    }
  }
  if constexpr (kCanDefer) {
    if (defer) store_pending_from(pending, 0, g.n);  // the block's last tile
  }
  // The staging buffers must stay valid until the TMA unit has read them.
  if (tma_store && t128 == 0) sm90::bulk_wait<0>();
}

}  // namespace gemm_detail

constexpr size_t gemm_smem_bytes() { return sizeof(gemm_detail::SharedStorage) + 1024; }

// The compute role of a persistent GEMM block. All 384 threads of the block call it; it returns
// when this block's tiles are done or the launch was abandoned after a timeout.
//   kCluster: GemmParams::cluster_m (1 or 2); the launch must use clusters of that many CTAs
//     along x, compute blocks must start at block 0 and come in whole clusters.
//   block_in_role / blocks_in_role: this block's index among the compute blocks and their count.
//   smem_raw: the kernel's dynamic shared memory (at least gemm_smem_bytes()).
template <int kCluster, class Epilogue>
__device__ __forceinline__ void gemm_compute_block(const GemmParams& g, const FrameParams& f, const Epilogue& epi,
                                                   const FlagGate& gate, const TileSignal& signal,
                                                   int32_t block_in_role, int32_t blocks_in_role, uint8_t* smem_raw) {
  static_assert(kCluster == 1 || kCluster == 2, "cluster of 1 or 2 CTAs along M");
  using Cfg = GemmConfig;
  using gemm_detail::SharedStorage;
  SharedStorage& s =
      *reinterpret_cast<SharedStorage*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const uint32_t cta = kCluster > 1 ? sm90::cluster_ctarank() : 0;
  const int32_t cluster_idx = block_in_role / kCluster, clusters = blocks_in_role / kCluster;

  if (threadIdx.x == 0) {
    for (int i = 0; i < Cfg::kStages; ++i) {
      sm90::mbar_init(&s.full[i], 1);
      sm90::mbar_init(&s.empty[i], Cfg::kConsumers * 4 * kCluster);
    }
    s.abort = 0;
    sm90::fence_barrier_init();
    sm90::tma_prefetch_desc(&g.tmap_a);
    sm90::tma_prefetch_desc(&g.tmap_b);
  }
  // Peers arrive on (and multicast into) this CTA's barriers: all must be initialised first.
  if constexpr (kCluster > 1)
    sm90::cluster_sync();
  else
    __syncthreads();

  // No thread leaves before the cluster's final barrier: a peer may still arrive on this CTA's
  // barriers or write into its shared memory until then.
  if (threadIdx.x < 128) {
    sm90::setmaxnreg_dec<40>();
    if (threadIdx.x == 0) gemm_detail::producer_loop<kCluster>(g, f, gate, s, cta, cluster_idx, clusters);
    __syncwarp();
    if constexpr (kCluster > 1) sm90::cluster_sync();
  } else {
    sm90::setmaxnreg_inc<232>();
    gemm_detail::consumer_loop<kCluster>(g, f, epi, signal, s, cta, cluster_idx, clusters);
    if constexpr (kCluster > 1) sm90::cluster_sync();
  }
}

// The standalone GEMM kernel: the frame with the compute role only (blocks given to other roles
// have nothing to do here; the benchmark uses them to model SMs lent to communication).
template <class Epilogue>
struct GemmKernelParams {
  GemmParams gemm;
  FrameParams frame;
  Epilogue epi;
  FlagGate gate;
  TileSignal signal;
};

template <int kCluster, class Epilogue>
__global__ void __launch_bounds__(GemmConfig::kThreads, 1)
    gemm_persistent_kernel(const __grid_constant__ GemmKernelParams<Epilogue> p) {
  extern __shared__ uint8_t gemm_smem[];
  if (p.frame.roles.role_of(blockIdx.x) == Role::kCompute) {
    gemm_compute_block<kCluster>(p.gemm, p.frame, p.epi, p.gate, p.signal, int32_t(blockIdx.x), p.frame.roles.compute,
                                 gemm_smem);
  }
}

#endif  // __CUDACC__

}  // namespace weft::kernels
