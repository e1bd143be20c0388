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
// Per work unit, from consumer 0's thread 0: clock64() of each event of the first kTraceUnits
// units of blocks 0 and 1, and %globaltimer of the same events for every block below
// kTraceTimelineBlocks (one timeline across SMs). Events: kUnitTop (loop top: the previous unit's
// epilogue issued), kUnitTaken, kUnitFirstMma, kUnitMmaDone, kUnitFixed (split fixup done);
// kUnitShape holds split << 8 | slice instead of a time.
enum TraceEvent { kUnitTop, kUnitTaken, kUnitFirstMma, kUnitMmaDone, kUnitFixed, kUnitShape, kTraceEvents };
constexpr int kTraceUnits = 32, kTraceTimelineBlocks = 264;
constexpr size_t kTraceClockAt = size_t(kTraceBlocks) * 2 * kTraceIters;
constexpr size_t kTraceTimelineAt = kTraceClockAt + size_t(kTraceBlocks) * kTraceUnits * kTraceEvents;
constexpr size_t kTraceWords = kTraceTimelineAt + size_t(kTraceTimelineBlocks) * kTraceUnits * kTraceEvents;
__device__ __forceinline__ void trace_unit(int ev, uint32_t n, uint64_t value = 0) {
  if (threadIdx.x != 128 || n >= uint32_t(kTraceUnits)) return;
  uint64_t now = value;
  if (ev != kUnitShape) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  if (blockIdx.x < kTraceTimelineBlocks)
    WEFT_GEMM_TRACE[kTraceTimelineAt + (size_t(blockIdx.x) * kTraceUnits + n) * kTraceEvents + ev] = now;
  if (blockIdx.x < kTraceBlocks)
    WEFT_GEMM_TRACE[kTraceClockAt + (size_t(blockIdx.x) * kTraceUnits + n) * kTraceEvents + ev] =
        ev == kUnitShape ? value : clock64();
}
#define WEFT_TRACE_STAMP(kind, it) trace_stamp(kind, it)
#define WEFT_TRACE_UNIT(ev, n) trace_unit(ev, n)
#define WEFT_TRACE_SHAPE(n, value) trace_unit(kUnitShape, n, value)
#else
#define WEFT_TRACE_STAMP(kind, it) ((void)0)
#define WEFT_TRACE_UNIT(ev, n) ((void)(n))
#define WEFT_TRACE_SHAPE(n, value) ((void)(n))
#endif

struct __align__(1024) SharedStorage {
  __nv_bfloat16 a[GemmConfig::kStages][GemmConfig::kTileM * GemmConfig::kTileK];
  __nv_bfloat16 b[GemmConfig::kStages][GemmConfig::kTileN * GemmConfig::kTileK];
  // Epilogue staging for TMA stores: per consumer, two 64 x 64 bf16 sub-tiles (128B swizzle).
  __nv_bfloat16 c[GemmConfig::kConsumers][2][GemmConfig::kStoreBox * GemmConfig::kStoreBox];
  uint64_t full[GemmConfig::kStages];
  uint64_t empty[GemmConfig::kStages];
  // Claimed work units on their way from the producer to the consumers (GemmParams::claims).
  uint64_t unit_full[2];
  uint64_t unit_empty[2];
  int32_t unit[2];
  int32_t abort;
  // kSignalInLoop: arrivals of the two consumer warpgroups per signalled tile (slot: see
  // consumer_loop); the second one (odd count before it) moves the tile's flag.
  uint32_t signal_halves[16];
};
constexpr uint32_t kSignalSlots = 16;  // > 2 kStages: a warpgroup runs at most kStages k-blocks ahead
static_assert(sizeof(SharedStorage::signal_halves) == kSignalSlots * sizeof(uint32_t), "one word per slot");
static_assert(kSignalSlots > 2 * GemmConfig::kStages, "two tiles' halves in flight at once never share a slot");
constexpr int32_t kSignalAfterKBlocks = 3;  // kSignalInLoop: into the next tile
constexpr uint32_t kUnitSlots = 2;
constexpr int32_t kClaimAhead = 6;  // k-blocks
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

// ---- work units: static striding, or claimed one at a time (GemmParams::claims) ---------------
// Static: block b of B takes claims b, b + B, ... Claimed: the producer thread takes the next
// claim with one atomic add kClaimAhead k-blocks before the current unit's last load (about
// kStages + kClaimAhead k-blocks before the consumers need it) and hands its units to the
// consumers through a two-slot ring in shared memory (a chunk of a chunked tail is two units).
// A block held up (a gate that opened late, a slower SM) then takes fewer tiles instead of
// carrying its delay to the end of the kernel. Claims are taken in increasing order, so the
// split tail's final pieces never wait on a block that waits itself (tile_scheduler.h).

__device__ __forceinline__ TileCoord no_tile() {
  TileCoord c;
  c.m_block = -1;
  c.n_block = -1;
  return c;
}

// Producer: hands claim number n (unit u; u >= num_units() means "no more") to the consumers.
__device__ __forceinline__ bool hand_unit(SharedStorage& s, uint32_t n, uint32_t u, const FrameParams& f) {
  const uint32_t slot = n % kUnitSlots, phase = (n / kUnitSlots) & 1;
  if (!wait_barrier(&s.unit_empty[slot], phase ^ 1, f, no_tile())) return false;
  // The arrive releases the store to whoever sees the phase complete (mbarrier.try_wait acquires);
  // the consumers' arrivals on unit_empty release their reads of the slot's previous value the
  // same way. compute-sanitizer's racecheck does not follow this ordering and reports the slot
  // (scripts/gpu/20-gemm.sh runs it on static striding and on claims, and tells the two apart).
  s.unit[slot] = int32_t(u);
  sm90::mbar_arrive(&s.unit_full[slot]);
  return true;
}

// Consumer: takes claim number n; every warp frees the slot once all its threads have read it.
__device__ __forceinline__ bool take_unit(SharedStorage& s, uint32_t n, const FrameParams& f, int32_t lane,
                                          int64_t* u) {
  const uint32_t slot = n % kUnitSlots, phase = (n / kUnitSlots) & 1;
  if (!wait_barrier(&s.unit_full[slot], phase, f, no_tile())) return false;
  *u = int64_t(uint32_t(sm90::ld_shared_volatile(&s.unit[slot])));
  __syncwarp();
  if (lane == 0) sm90::mbar_arrive(&s.unit_empty[slot]);
  return true;
}

// Every producer calls this once on leaving (normally or not); the last of the `blocks` resets
// both words for the next launch (all claims of this launch are made by then).
__device__ __forceinline__ void finish_claims(uint32_t* claims, int32_t blocks) {
  __threadfence();
  if (atomicAdd(claims + 1, 1u) == uint32_t(blocks - 1)) {
    __threadfence();
    atomicExch(claims, 0u);
    atomicExch(claims + 1, 0u);
  }
}

// Whether the kernel built for this epilogue claims its tiles when GemmParams::claims is set: not
// with 2-CTA clusters (both producers would have to agree), and not for GEMM+RS/AR's epilogue,
// which measured slower with claims (docs/ops.md); left out, the code costs its registers nothing.
template <int kCluster, class Epilogue>
constexpr bool kClaimsTiles = kCluster == 1 && !std::is_same<Epilogue, EpiReduceSlots>::value;

// Whether the kernel built for this epilogue walks a chunked split tail (TileSchedule::chunks):
// not GEMM+RS/AR's, whose registers have no room for the chunk math (it spilled); its launches
// plan K-slices only (enable_tail_split's `chunked`).
template <class Epilogue>
constexpr bool kChunkedTail = !std::is_same<Epilogue, EpiReduceSlots>::value;

// ---- an own tile's staged partials through the ring (EpiReduceSlots::slot_maps) ---------------
// After the tile's last k-block the producer loads its slots as extra stages: box q < 4 x slots
// is slot q / 4's column box q % 4 (64 of the tile's 256 columns, all 128 rows), in extra stage
// q / 3 at place q % 3 (the stage's A buffer, then the two halves of its B buffer), 128B-swizzled
// as the TMA unit writes them. For every element the slots come in slot order (same bits every
// run), and the loads overlap the tile's last MMAs instead of following them.
constexpr int32_t kSlotBoxesPerStage = 3;
constexpr uint32_t kSlotBoxBytes = GemmConfig::kTileM * GemmConfig::kTileK * sizeof(__nv_bfloat16);
static_assert(kSlotBoxBytes * kSlotBoxesPerStage ==
                  (GemmConfig::kTileM + GemmConfig::kTileN) * GemmConfig::kTileK * sizeof(__nv_bfloat16),
              "three slot boxes fill one ring stage");
static_assert(GemmConfig::kTileN == 4 * GemmConfig::kTileK, "a tile row is four 64-column boxes");

// Extra ring stages of unit c: the final K-slice of an own tile when the slots travel through the
// ring (single-CTA kernel; the own-tile test is own_tile_tma's); 0 for every other unit.
template <int kCluster, class Epilogue>
__device__ __forceinline__ int32_t slot_stages(const Epilogue& e, const GemmParams& g, const TileCoord& c) {
  if constexpr (kCluster != 1 || !std::is_same<Epilogue, EpiReduceSlots>::value) {
    return 0;
  } else {
    const int32_t row0 = c.m_block * GemmConfig::kTileM;
    if (e.slot_maps == 0 || e.own_maps == 0 || c.m_block >= g.cta_m_blocks || row0 < e.lo || row0 >= e.hi ||
        (c.split > 1 && c.slice != c.split - 1))
      return 0;
    return (4 * e.slot_maps + kSlotBoxesPerStage - 1) / kSlotBoxesPerStage;
  }
}

// Where box `place` of a stage lands.
__device__ __forceinline__ __nv_bfloat16* slot_box(SharedStorage& s, uint32_t stage, int32_t place) {
  return place == 0 ? s.a[stage] : s.b[stage] + (place - 1) * GemmConfig::kTileM * GemmConfig::kTileK;
}

// Producer: extra stage x of unit c (slot_stages > 0) into ring stage `stage`.
template <class Epilogue>
__device__ __forceinline__ void load_slot_stage(const Epilogue&, SharedStorage&, const TileCoord&, int32_t, uint64_t*,
                                                uint32_t) {}
__device__ __forceinline__ void load_slot_stage(const EpiReduceSlots& e, SharedStorage& s, const TileCoord& c,
                                                int32_t x, uint64_t* full, uint32_t stage) {
  using Cfg = GemmConfig;
  const int32_t q0 = x * kSlotBoxesPerStage, n = min(kSlotBoxesPerStage, 4 * e.slot_maps - q0);
  const int32_t row = c.m_block * Cfg::kTileM - e.lo, col0 = c.n_block * Cfg::kTileN;
  sm90::mbar_arrive_expect_tx(full, uint32_t(n) * kSlotBoxBytes);
  for (int32_t p = 0; p < n; ++p) {
    const int32_t q = q0 + p;
    sm90::tma_load_2d(slot_box(s, stage, p), &e.slot_map[q / 4], full, col0 + (q % 4) * Cfg::kTileK, row);
  }
}

// Consumer: adds the extra stages' slots to acc (final, after wgmma.wait_group 0) and frees the
// stages; false when the launch was abandoned. The boxes go in groups of four stages (12 boxes,
// 3 slots), so that each place's column box, hence every acc index, is known at compile time.
template <class Epilogue>
__device__ __forceinline__ bool add_slot_stages(const Epilogue&, SharedStorage&, const FrameParams&, const TileCoord&,
                                                float (&)[128], uint32_t&, int32_t, int32_t) {
  return true;
}
__device__ __forceinline__ bool add_slot_stages(const EpiReduceSlots& e, SharedStorage& s, const FrameParams& f,
                                                const TileCoord& c, float (&acc)[128], uint32_t& it, int32_t consumer,
                                                int32_t t128) {
  using Cfg = GemmConfig;
  const int32_t warp = t128 / 32, lane = t128 % 32;
  const int32_t r0 = consumer * 64 + warp * 16 + lane / 4;  // rows r0 and r0 + 8 of a 128-row box
  const int32_t swz = r0 & 7;                               // (r0 + 8) & 7 is the same
  const int32_t boxes = 4 * e.slot_maps;
  for (int32_t base = 0; base < boxes; base += 4 * kSlotBoxesPerStage) {
#pragma unroll
    for (int32_t x = 0; x < 4; ++x) {
      if (base + x * kSlotBoxesPerStage >= boxes) break;
      const uint32_t stage = it % Cfg::kStages, phase = (it / Cfg::kStages) & 1;
      if (!wait_barrier(&s.full[stage], phase, f, c) || sm90::ld_shared_volatile(&s.abort)) return false;
#pragma unroll
      for (int32_t p = 0; p < kSlotBoxesPerStage; ++p) {
        if (base + x * kSlotBoxesPerStage + p >= boxes) break;
        const uint8_t* box = reinterpret_cast<const uint8_t*>(slot_box(s, stage, p));
        const int32_t cb = (x * kSlotBoxesPerStage + p) % 4;  // base is a multiple of 4
        const __nv_bfloat162* row_lo = reinterpret_cast<const __nv_bfloat162*>(box + r0 * 128 + 4 * (lane % 4));
        const __nv_bfloat162* row_hi = row_lo + 8 * 128 / 4;  // row r0 + 8
#pragma unroll
        for (int32_t jj = 0; jj < 8; ++jj) {
          const int32_t j = cb * 8 + jj;
          const float2 x0 = __bfloat1622float2(row_lo[(jj ^ swz) * 4]);
          const float2 x1 = __bfloat1622float2(row_hi[(jj ^ swz) * 4]);
          acc[4 * j + 0] += x0.x;
          acc[4 * j + 1] += x0.y;
          acc[4 * j + 2] += x1.x;
          acc[4 * j + 3] += x1.y;
        }
      }
      __syncwarp();
      if (lane == 0) release_stage<1>(&s.empty[stage]);
      ++it;
    }
  }
  return true;
}

template <int kCluster, bool kClaims, class Epilogue>
__device__ __forceinline__ void producer_loop(const GemmParams& g, const FrameParams& f, const Epilogue& epi,
                                              const FlagGate& gate, SharedStorage& s, uint32_t cta, int32_t cluster_idx,
                                              int32_t clusters) {
  using Cfg = GemmConfig;
  constexpr uint32_t kStageBytes = (Cfg::kTileM + Cfg::kTileN) * Cfg::kTileK * sizeof(__nv_bfloat16);
  constexpr int32_t kBRows = Cfg::kTileN / kCluster;  // rows of B this CTA loads (and multicasts)
  uint32_t it = 0;
  const bool claim = kClaims && g.claims != nullptr;
  const int64_t units = g.sched.num_units();
  PersistentTileIter<kChunkedTail<Epilogue>> t(g.sched, cluster_idx, clusters);
  uint32_t next = 0;  // the next unit, claimed ahead (have_next)
  bool have_next = false;
  // Shards (below 32) whose per-shard flag this producer has already seen open: their later tiles
  // need neither the flag's load nor the proxy fence again (the flags only grow; FlagGate::recheck).
  // Not for GEMM+RS/AR's producer, whose slot stages leave no register for it (it spilled).
  constexpr bool kCacheOpenShards = !std::is_same<Epilogue, EpiReduceSlots>::value;
  uint32_t open_shards = 0;
  for (uint32_t handed = 0;;) {
    int64_t u;
    if (claim) {
      if (!have_next) next = uint32_t(g.sched.claim_unit(atomicAdd(g.claims, 1u)));
      have_next = false;
      if (!hand_unit(s, handed++, next, f) || int64_t(next) >= units) return;
      u = int64_t(next);
      if (g.sched.pair_first(u)) {  // its chunk's second unit follows without a claim
        next = uint32_t(u + 1);
        have_next = true;
      }
    } else {
      if (!t.valid()) return;
      u = t.linear();
      t.advance();
    }
    const TileCoord c = cta_tile<kCluster>(g.sched.unit_at<kChunkedTail<Epilogue>>(u), cta);
    if (kChunkedTail<Epilogue> && c.k_begin >= c.k_end) continue;  // an empty piece of a chunk
    // The unit's ring stages: its k-blocks, then (an own tile of GEMM+RS/AR) its staged partials,
    // which alone wait for the tile's gate. One loop, so that each wait is inlined once: the
    // producer has 40 registers.
    const int32_t k_last = c.k_end + slot_stages<kCluster>(epi, g, c);
    const bool per_shard = gate.granularity == kFlagPerShard;
    const bool cache = kCacheOpenShards && per_shard && !gate.recheck && c.shard < 32;
    const bool gated = gate.may_wait(c.shard) && (per_shard || c.m_block < g.cta_m_blocks) &&
                       !(cache && (open_shards >> c.shard & 1u));
    const int32_t gate_at = gated ? (k_last > c.k_end ? c.k_end : c.k_begin) : -1;
    const int32_t row_a = c.m_block * Cfg::kTileM;
    const int32_t row_b = c.n_block * Cfg::kTileN + int32_t(cta) * kBRows;
    for (int32_t kb = c.k_begin; kb < k_last; ++kb, ++it) {
      const uint32_t stage = it % Cfg::kStages, phase = (it / Cfg::kStages) & 1;
      // The next unit is claimed kClaimAhead k-blocks before this one's last load: the atomic's
      // round trip (several us while the SMs also push data over NVLink) overlaps the loads.
      if (claim && !have_next && kb + kClaimAhead >= c.k_end) {
        next = uint32_t(g.sched.claim_unit(atomicAdd(g.claims, 1u)));
        have_next = true;
      }
      if (kb == gate_at) {
        const int32_t idx = flag_index(gate.granularity, g, c);
        const bool ok = frame_wait_flag(f, gate.flags + idx, gate.expected, Role::kCompute, c.m_block, c.n_block, idx);
        // The data behind the flag is read by the copy engine (async proxy) next.
        asm volatile("fence.proxy.async.global;" ::: "memory");
        if (ok && cache) open_shards |= 1u << c.shard;
        if (!ok) {
          // Wake this CTA's consumers with an empty arrival on this stage; they see `abort`.
          if (!wait_barrier(&s.empty[stage], phase ^ 1, f, c)) return;
          s.abort = 1;
          sm90::mbar_arrive(&s.full[stage]);
          return;
        }
      }
      if (!wait_barrier(&s.empty[stage], phase ^ 1, f, c)) return;
      if (kb >= c.k_end) {
        load_slot_stage(epi, s, c, kb - c.k_end, &s.full[stage], stage);
        continue;
      }
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

// An epilogue with fragment(row, col0, m, n, acc) takes a thread's whole finished tile at once
// (EpiReduceSlots batches its loads of the staged partials) instead of one pair() at a time.
template <class Epilogue>
struct FragmentEpilogue {
  static constexpr bool kEnabled =
      std::is_same<Epilogue, EpiReduceSlots>::value || std::is_same<Epilogue, EpiScatterBf16>::value;
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

// Which tiles leave through the shared-memory + TMA store (to the C that enable_tma_store encoded
// in GemmParams::tmap_c): every tile of EpiStoreBf16; EpiReduceSlots' partial tiles (rows outside
// [lo, hi): stored as they are into `partial`); none for the other epilogues.
__device__ __forceinline__ bool tma_store_tile(const EpiStoreBf16&, int32_t) { return true; }
__device__ __forceinline__ bool tma_store_tile(const EpiReduceSlots& e, int32_t row0) {
  return e.part_owners == 0 && (row0 >= e.hi || row0 + GemmConfig::kTileM <= e.lo);
}
template <class Epilogue>
__device__ __forceinline__ bool tma_store_tile(const Epilogue&, int32_t) {
  return false;
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

// ---- bf16 stores through shared memory and TMA (EpiStoreBf16 with GemmParams::store_tma) ------
// A consumer warpgroup's 64 x 256 half of the tile leaves as four 64 x 64 boxes: the threads pack
// their fp32 pairs to bf16x2 into a 128B-swizzled staging buffer (conflict-free 4-byte shared
// stores), and one thread hands the box to the TMA unit, which writes whole lines to global
// memory while the warps go on with the next tile. Two buffers alternate; a buffer is rewritten
// only after the store issued from it two boxes earlier has read it. Storing straight from
// registers (4-byte stores, each warp instruction touching 8 rows) stalled the consumers for
// ~8k cycles per tile, ~6% of a K = 8192 tile (bench/gemm/trace_gemm.cu, docs/gemm.md).
// Each box goes to every one of the `nmaps` tensor maps (same coordinates: box column col0 + 64 b,
// row row0 + 64 consumer), committed as one bulk group.
__device__ __forceinline__ void store_tile_tma(const CUtensorMap* maps, int32_t nmaps, int32_t col0, int32_t row0,
                                               SharedStorage& s, const float (&acc)[128], int32_t consumer,
                                               int32_t t128) {
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
      for (int32_t i = 0; i < nmaps; ++i)
        sm90::tma_store_2d(maps + i, buf, col0 + box * Cfg::kStoreBox, row0 + consumer * 64);
      sm90::bulk_commit();
    }
  }
}

// ---- split tail: K-slices of the last wave's tiles (TileSchedule::plan_split) ------------------
enum class SplitFix { kFinish, kPartialStored, kAbort };

// One CTA tile's fp32 partial, 128 x 256 floats, laid out [i < 32][consumer thread < 256] as
// float4 (acc[4i .. 4i+3] of each thread): every warp access is 512 contiguous bytes, and the
// finishing slice reads back exactly the fragments its own threads hold.
constexpr int kPartialFloat4s = GemmConfig::kTileM * GemmConfig::kTileN / 4;

// A non-final slice stores its partial (L2 only) and counts it on the tile's flag; the final slice
// waits (bounded) for the split - 1 partials, adds them in slice order (the same bits every run)
// and goes on to the epilogue; it resets the flag for the next launch.
template <int kCluster>
__device__ __forceinline__ SplitFix split_fixup(const GemmParams& g, const FrameParams& f, SharedStorage& s,
                                                float (&acc)[128], const TileCoord& c, uint32_t cta, int32_t tid) {
  constexpr uint32_t kConsumerThreads = GemmConfig::kConsumers * 128;
  const int64_t slot = int64_t(c.tail_index) * kCluster + cta;
  uint64_t* flag = g.split_flags + slot;
  // Room for the most partials a tile has (sched.split - 1); this tile has c.split - 1 of them.
  float4* base = reinterpret_cast<float4*>(g.split_ws) + slot * (g.sched.split - 1) * kPartialFloat4s + tid;
  if (c.slice < c.split - 1) {
    float4* dst = base + int64_t(c.slice) * kPartialFloat4s;
#pragma unroll
    for (int i = 0; i < 32; ++i)
      __stcg(dst + i * int(kConsumerThreads), make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]));
    sm90::named_barrier_sync(1, kConsumerThreads);
    if (tid == 0) {
      __threadfence();
      flag_add_release(flag, 1);
    }
    return SplitFix::kPartialStored;
  }
  if (tid == 0 && !frame_wait_flag(f, flag, uint64_t(c.split - 1), Role::kCompute, c.m_block, c.n_block, int32_t(slot)))
    s.abort = 1;
  sm90::named_barrier_sync(1, kConsumerThreads);
  if (sm90::ld_shared_volatile(&s.abort)) return SplitFix::kAbort;
  for (int32_t sl = 0; sl < c.split - 1; ++sl) {
    const float4* src = base + int64_t(sl) * kPartialFloat4s;
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const float4 v = __ldcg(src + i * int(kConsumerThreads));
      acc[4 * i] += v.x;
      acc[4 * i + 1] += v.y;
      acc[4 * i + 2] += v.z;
      acc[4 * i + 3] += v.w;
    }
  }
  if (tid == 0) *flag = 0;  // read by nobody else in this launch; the next one starts from 0
  return SplitFix::kFinish;
}

// Moves a finished tile's flag: every consumer thread's stores (and, with `bulk`, the TMA stores
// each warpgroup issued) are complete before the release.
template <class Epilogue>
__device__ __forceinline__ void signal_tile(const Epilogue& epi, const TileSignal& signal, int32_t flag, bool bulk,
                                            int32_t consumer, int32_t t128) {
  if (signal.variant == kSignalBarrierOnly) {
    sm90::named_barrier_sync(1, GemmConfig::kConsumers * 128);
    return;
  }
  if (bulk && t128 == 0) sm90::bulk_wait<0>();
  if (signal.variant == kSignalPerWarpgroup) {
    if (t128 == 0)
      asm volatile("red.release.gpu.global.add.u64 [%0], %1;" ::"l"(signal.flags + flag), "l"(signal.add) : "memory");
    return;
  }
  sm90::named_barrier_sync(1, GemmConfig::kConsumers * 128);
  if (t128 == 0 && consumer == 0) {
    uint64_t* p = signal.flags + flag;
    if (signal.variant == kSignalRelaxed) {
      asm volatile("red.relaxed.gpu.global.add.u64 [%0], %1;" ::"l"(p), "l"(signal.add) : "memory");
    } else if (gpu_scope_signal(epi)) {
      asm volatile("red.release.gpu.global.add.u64 [%0], %1;" ::"l"(p), "l"(signal.add) : "memory");
    } else {
      __threadfence_system();
      flag_add_release(p, signal.add);
    }
  }
}

// kSignalInLoop: this warpgroup's half of a signalled TMA tile (shared slot `seq`) is stored; the
// second warpgroup to get here moves the tile's flag. The shared atomic (acq_rel, CTA scope) orders
// the first warpgroup's completed stores before the second one's release.
template <class Epilogue>
__device__ __forceinline__ void signal_half(const Epilogue& epi, const TileSignal& signal, SharedStorage& s,
                                            int32_t flag, uint32_t seq, int32_t t128) {
  if (t128 != 0) return;
  sm90::bulk_wait<0>();
  uint32_t before;
  asm volatile("atom.acq_rel.cta.shared::cta.add.u32 %0, [%1], 1;"
               : "=r"(before)
               : "r"(sm90::smem_addr(&s.signal_halves[seq % kSignalSlots]))
               : "memory");
  if ((before & 1) == 0) return;  // the other half is still on its way: it moves the flag
  uint64_t* p = signal.flags + flag;
  if (gpu_scope_signal(epi)) {
    asm volatile("red.release.gpu.global.add.u64 [%0], %1;" ::"l"(p), "l"(signal.add) : "memory");
  } else {
    __threadfence_system();
    flag_add_release(p, signal.add);
  }
}

// Partial tiles of EpiReduceSlots go straight to their owners when it has their tensor maps.
__device__ __forceinline__ bool remote_partial_tile(const EpiReduceSlots& e, int32_t row0) {
  return e.part_owners > 0 && (row0 >= e.hi || row0 + GemmConfig::kTileM <= e.lo);
}
template <class Epilogue>
__device__ __forceinline__ bool remote_partial_tile(const Epilogue&, int32_t) {
  return false;
}

// A tile whose TMA stores (into peers' memory, or its own output) are issued but not yet counted:
// the owner and piece of a partial tile sent by the SMs, whether peers' broadcast words move (own
// tile of an AllReduce gathered by the epilogue), and the tile's local count (-1: none).
struct HeldCount {
  int32_t owner = -1;
  int32_t piece = 0;
  bool bcast = false;
  int32_t local = -1;
  __device__ __forceinline__ bool any() const { return owner >= 0 || bcast || local >= 0; }
};

// Waits for the held tile's stores (this thread's bulk groups: issue the next tile's stores only
// after this), then the counts move: system scope for words in peers' memory, after a proxy fence
// (the TMA unit wrote the data); the local count at GPU scope where only this GPU reads it.
__device__ __forceinline__ void complete_held(const EpiReduceSlots& epi, const TileSignal& signal, HeldCount& h,
                                              int32_t consumer, int32_t t128) {
  if (!h.any()) return;
  if (t128 == 0) sm90::bulk_wait<0>();
  sm90::named_barrier_sync(1, GemmConfig::kConsumers * 128);
  if (t128 == 0 && consumer == 0) {
    const bool remote = h.owner >= 0 || h.bcast;
    if (remote) {
      asm volatile("fence.proxy.async.global;" ::: "memory");
      __threadfence_system();
    }
    if (h.owner >= 0) flag_add_release(epi.part_flags[h.owner] + h.piece, 1);
    if (h.bcast)
      for (int32_t i = 0; i < epi.nbcast; ++i) flag_add_release(epi.bcast_flags[i], 1);
    if (h.local >= 0) {
      uint64_t* p = signal.flags + h.local;
      if (epi.local_signal && !remote) {
        asm volatile("red.release.gpu.global.add.u64 [%0], %1;" ::"l"(p), "l"(signal.add) : "memory");
      } else {
        if (!remote) __threadfence_system();
        flag_add_release(p, signal.add);
      }
    }
  }
  h = HeldCount{};
}
template <class Epilogue>
__device__ __forceinline__ void complete_held(const Epilogue&, const TileSignal&, HeldCount&, int32_t, int32_t) {}

// Issues a partial tile's TMA stores into its owner's slot (over NVLink); the count is held.
template <class Epilogue>
__device__ __forceinline__ HeldCount remote_partial_store(const Epilogue&, const TileSignal&, const GemmParams&,
                                                          SharedStorage&, const float (&)[128], const TileCoord&,
                                                          int32_t, int32_t) {
  return HeldCount{};
}
__device__ __forceinline__ HeldCount remote_partial_store(const EpiReduceSlots& epi, const TileSignal& signal,
                                                          const GemmParams& g, SharedStorage& s,
                                                          const float (&acc)[128], const TileCoord& c, int32_t consumer,
                                                          int32_t t128) {
  using Cfg = GemmConfig;
  const int32_t row0 = c.m_block * Cfg::kTileM;
  const int32_t o = row0 / epi.rows_per_owner, local_row = row0 - o * epi.rows_per_owner;
  store_tile_tma(&epi.part_map[o], 1, c.n_block * Cfg::kTileN, local_row, s, acc, consumer, t128);
  HeldCount h;
  h.owner = o;
  h.piece = local_row / epi.rows_per_piece;
  // The tile's local count moves too, as for a tile stored here: the counts stay epoch x tiles
  // whichever way a run sent its tiles.
  h.local = signal.flags ? flag_index(signal.granularity, g, c) : -1;
  return h;
}

// Own tiles of EpiReduceSlots leave through shared memory and TMA when it has own tensor maps.
__device__ __forceinline__ bool own_tile_tma(const EpiReduceSlots& e, int32_t row0) {
  return e.own_maps > 0 && row0 >= e.lo && row0 < e.hi;
}
template <class Epilogue>
__device__ __forceinline__ bool own_tile_tma(const Epilogue&, int32_t) {
  return false;
}

// Reduces an own tile (EpiReduceSlots; unless its slots came through the ring) and issues its stores to every own map
// (this rank's output and, for an AllReduce gathered by the epilogue, every peer's C); the counts are held.
template <class Epilogue>
__device__ __forceinline__ HeldCount own_tile_store(const Epilogue&, const TileSignal&, const GemmParams&,
                                                    SharedStorage&, float (&)[128], const TileCoord&, int32_t, int32_t,
                                                    int32_t, int32_t, bool) {
  return HeldCount{};
}
__device__ __forceinline__ HeldCount own_tile_store(const EpiReduceSlots& epi, const TileSignal& signal,
                                                    const GemmParams& g, SharedStorage& s, float (&acc)[128],
                                                    const TileCoord& c, int32_t row, int32_t col0, int32_t consumer,
                                                    int32_t t128, bool slots_added) {
  using Cfg = GemmConfig;
  if (!slots_added) epi.add_slots(row, col0, g.n, acc);
  store_tile_tma(epi.own_map, epi.own_maps, c.n_block * Cfg::kTileN, c.m_block * Cfg::kTileM - epi.lo, s, acc, consumer,
                 t128);
  HeldCount h;
  h.bcast = epi.nbcast > 0;
  h.local = signal.flags ? flag_index(signal.granularity, g, c) : -1;
  return h;
}

template <int kCluster, class Epilogue>
__device__ __forceinline__ void consumer_loop(const GemmParams& g, const FrameParams& f, const Epilogue& epi,
                                              const FlagGate& gate, const TileSignal& signal, SharedStorage& s,
                                              uint32_t cta, int32_t cluster_idx, int32_t clusters) {
  using Cfg = GemmConfig;
  const int32_t consumer = threadIdx.x / 128 - 1;  // which 64-row half of the tile
  const int32_t t128 = threadIdx.x % 128;
  const int32_t warp = t128 / 32, lane = t128 % 32;
  float acc[128];
  uint32_t it = 0;
  constexpr bool kTmaEpilogue =
      std::is_same<Epilogue, EpiStoreBf16>::value || std::is_same<Epilogue, EpiReduceSlots>::value;
  const bool tma_store = kTmaEpilogue && g.store_tma;  // partial/C tiles through g.tmap_c
  // A TMA-stored tile's flag moves late, during the next tile's epilogue, when its bulk stores
  // are long complete (waiting for them right after the store stalled the consumers ~4 us a
  // tile). The flag is moved at once instead before a tile that may wait (gate, split fixup):
  // a peer's gate may depend on it.
  int32_t pending = -1;
  // A tile stored into peers' memory (EpiReduceSlots) is counted at once, or (kSignalDeferred)
  // before the next tile's stores, by when they are complete; before a tile that may wait too.
  HeldCount held;
  const bool hold = signal.variant == kSignalDeferred;
  // kSignalInLoop: the flag of this block's last TMA tile, moved kSignalAfterKBlocks into the next,
  // times kSignalSlots plus its slot: the ring position after the tile mod kSignalSlots (both
  // warpgroups agree on it, and two tiles whose halves may be in flight at once are fewer than
  // kSignalSlots stages apart). One register.
  int32_t loop_signal = -1;
  auto move_loop_signal = [&]() {
    if (loop_signal < 0) return;
    signal_half(epi, signal, s, loop_signal / int32_t(kSignalSlots), uint32_t(loop_signal) % kSignalSlots, t128);
    loop_signal = -1;
  };
  const bool claim = kClaimsTiles<kCluster, Epilogue> && g.claims != nullptr;
  const int64_t units = g.sched.num_units();
  PersistentTileIter<kChunkedTail<Epilogue>> t(g.sched, cluster_idx, clusters);
  for (uint32_t taken = 0, traced = 0;; ++traced) {
    WEFT_TRACE_UNIT(kUnitTop, traced);
    int64_t u;
    if (claim) {
      if (!take_unit(s, taken++, f, lane, &u)) {
        if (t128 == 0) sm90::bulk_wait<0>();  // staging read by any TMA store
        return;
      }
      if (u >= units) break;
    } else {
      if (!t.valid()) break;
      u = t.linear();
      t.advance();
    }
    const TileCoord c = cta_tile<kCluster>(g.sched.unit_at<kChunkedTail<Epilogue>>(u), cta);
    if (kChunkedTail<Epilogue> && c.k_begin >= c.k_end) continue;  // an empty piece of a chunk
    WEFT_TRACE_UNIT(kUnitTaken, traced);
    WEFT_TRACE_SHAPE(traced, uint64_t(c.split) << 8 | uint64_t(c.slice));
    if (c.split > 1 || gate.may_wait(c.shard)) {
      if (pending >= 0) signal_tile(epi, signal, pending, true, consumer, t128);
      pending = -1;
      move_loop_signal();
      complete_held(epi, signal, held, consumer, t128);
    }
    for (int32_t kb = c.k_begin; kb < c.k_end; ++kb, ++it) {
      const uint32_t stage = it % Cfg::kStages, phase = (it / Cfg::kStages) & 1;
      // Normally the previous k-block's stage is released after this one's MMAs are issued
      // (below). When this k-block's data is late, retire the previous MMAs now and hand their
      // stage back at once, so that the refill does not wait for the late data too (a late stage
      // would otherwise hold the one before it, and with 2-CTA multicast the peer's as well).
      // The choice is made per warp (wgmma.wait_group is warp-synchronous).
      bool released = false;
      if (kb > c.k_begin && !__all_sync(0xffffffffu, sm90::mbar_try_wait(&s.full[stage], phase))) {
        sm90::wgmma_wait<0>();
        if (lane == 0) release_stage<kCluster>(&s.empty[(it - 1) % Cfg::kStages]);
        released = true;
      }
      if (!wait_barrier(&s.full[stage], phase, f, c) || sm90::ld_shared_volatile(&s.abort)) {
        sm90::wgmma_wait<0>();                // leave nothing in flight (else the compiler waits on every path)
        if (t128 == 0) sm90::bulk_wait<0>();  // staging read by any TMA store
        return;
      }
      if (consumer == 0 && t128 == 0) WEFT_TRACE_STAMP(0, it);
      const uint64_t desc_a = sm90::make_smem_desc_sw128(s.a[stage] + consumer * 64 * Cfg::kTileK);
      const uint64_t desc_b = sm90::make_smem_desc_sw128(s.b[stage]);
      sm90::wgmma_fence();
#pragma unroll
      for (int k = 0; k < Cfg::kTileK / 16; ++k) {
        // +32 bytes per k16 step inside the swizzled 128-byte row: +2 in the >>4 address field.
        sm90::wgmma_m64n256k16(acc, desc_a + 2 * k, desc_b + 2 * k, (kb > c.k_begin || k > 0) ? 1 : 0);
      }
      sm90::wgmma_commit();
      if (kb == c.k_begin) WEFT_TRACE_UNIT(kUnitFirstMma, traced);
      // Keep one k-block of MMAs in flight; the one before it is done reading its stage.
      sm90::wgmma_wait<1>();
      if (kb > c.k_begin && !released && lane == 0) release_stage<kCluster>(&s.empty[(it - 1) % Cfg::kStages]);
      if (kb == c.k_begin + kSignalAfterKBlocks) move_loop_signal();
    }
    move_loop_signal();  // a tile shorter than that
    sm90::wgmma_wait<0>();
    WEFT_TRACE_UNIT(kUnitMmaDone, traced);
    if (lane == 0) release_stage<kCluster>(&s.empty[(it - 1) % Cfg::kStages]);
    // An own tile's staged partials, if they came through the ring.
    if (slot_stages<kCluster>(epi, g, c) > 0 && !add_slot_stages(epi, s, f, c, acc, it, consumer, t128)) {
      if (t128 == 0) sm90::bulk_wait<0>();  // staging read by any TMA store
      return;
    }

    // A K-slice of a split tail tile: hand the partial over, or fold the others' in.
    if (c.split > 1) {
      const SplitFix fix = split_fixup<kCluster>(g, f, s, acc, c, cta, consumer * 128 + t128);
      if (fix == SplitFix::kAbort) {
        if (t128 == 0) sm90::bulk_wait<0>();  // staging read by any TMA store
        return;
      }
      WEFT_TRACE_UNIT(kUnitFixed, traced);
      if (fix == SplitFix::kPartialStored) continue;
    }

    // The accumulator fragment: thread holds, for j in [0, 32), rows r and r+8, columns
    // 8j + 2*(lane%4) + {0, 1}.
    const int32_t row = c.m_block * Cfg::kTileM + consumer * 64 + warp * 16 + lane / 4;
    const int32_t col0 = c.n_block * Cfg::kTileN + 2 * (lane % 4);
    if (tma_store && tma_store_tile(epi, c.m_block * Cfg::kTileM)) {
      if (c.m_block >= g.cta_m_blocks) continue;  // the cluster's tile past M: nothing to store
      if (pending >= 0) signal_tile(epi, signal, pending, true, consumer, t128);
      complete_held(epi, signal, held, consumer, t128);
      store_tile_tma(&g.tmap_c, 1, c.n_block * Cfg::kTileN, c.m_block * Cfg::kTileM, s, acc, consumer, t128);
      pending = signal.flags ? flag_index(signal.granularity, g, c) : -1;
      if (pending >= 0 && signal.variant == kSignalImmediate) {
        signal_tile(epi, signal, pending, true, consumer, t128);
        pending = -1;
      } else if (pending >= 0 && signal.variant == kSignalInLoop) {
        loop_signal = pending * int32_t(kSignalSlots) + int32_t(it % kSignalSlots);
        pending = -1;
      }
      continue;
    } else if (remote_partial_tile(epi, c.m_block * Cfg::kTileM)) {
      // A partial tile of GEMM+RS/AR sent by the SMs: into its owner's slot, then counted there.
      if (c.m_block >= g.cta_m_blocks) continue;
      if (pending >= 0) {
        signal_tile(epi, signal, pending, true, consumer, t128);
        pending = -1;
      }
      complete_held(epi, signal, held, consumer, t128);
      held = remote_partial_store(epi, signal, g, s, acc, c, consumer, t128);
      if (!hold) complete_held(epi, signal, held, consumer, t128);
      continue;
    } else if (own_tile_tma(epi, c.m_block * Cfg::kTileM)) {
      // An own tile of GEMM+RS/AR: staged partials added, then through shared memory to this
      // rank's output and (AllReduce) every peer's C; counted once all those stores are complete.
      if (c.m_block >= g.cta_m_blocks) continue;
      if (pending >= 0) {
        signal_tile(epi, signal, pending, true, consumer, t128);
        pending = -1;
      }
      complete_held(epi, signal, held, consumer, t128);
      held = own_tile_store(epi, signal, g, s, acc, c, row, col0, consumer, t128, slot_stages<kCluster>(epi, g, c) > 0);
      if (signal.variant == kSignalInLoop && held.local >= 0 && held.owner < 0 && !held.bcast) {
        // Only the local count: it moves from the next tile's loop, as a partial tile's does.
        loop_signal = held.local * int32_t(kSignalSlots) + int32_t(it % kSignalSlots);
        held = HeldCount{};
      } else if (!hold) {
        complete_held(epi, signal, held, consumer, t128);
      }
      continue;
    } else {
      // Epilogue straight from the accumulator fragment (nothing for a cluster tile past M).
      if (c.m_block >= g.cta_m_blocks) continue;
      if constexpr (FragmentEpilogue<Epilogue>::kEnabled)
        epi.fragment(row, col0, g.m, g.n, acc);
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
    if (pending >= 0) {  // stores from registers: the previous TMA tile's flag first, then this one
      signal_tile(epi, signal, pending, true, consumer, t128);
      pending = -1;
    }
    complete_held(epi, signal, held, consumer, t128);
    if (signal.flags) signal_tile(epi, signal, flag_index(signal.granularity, g, c), false, consumer, t128);
  }
  if (pending >= 0) signal_tile(epi, signal, pending, true, consumer, t128);
  move_loop_signal();
  complete_held(epi, signal, held, consumer, t128);
  // The staging buffers must stay valid until the TMA unit has read them.
  if (t128 == 0) sm90::bulk_wait<0>();  // staging read by any TMA store
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
    for (uint32_t i = 0; i < gemm_detail::kUnitSlots; ++i) {
      sm90::mbar_init(&s.unit_full[i], 1);
      sm90::mbar_init(&s.unit_empty[i], Cfg::kConsumers * 4);
    }
    s.abort = 0;
    for (uint32_t i = 0; i < gemm_detail::kSignalSlots; ++i) s.signal_halves[i] = 0;
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
    if (threadIdx.x == 0) {
      constexpr bool kClaims = gemm_detail::kClaimsTiles<kCluster, Epilogue>;
      gemm_detail::producer_loop<kCluster, kClaims>(g, f, epi, gate, s, cta, cluster_idx, clusters);
      if (kClaims && g.claims) gemm_detail::finish_claims(g.claims, clusters);
    }
    __syncwarp();
    if constexpr (kCluster > 1) sm90::cluster_sync();
  } else {
    sm90::setmaxnreg_inc<232>();
    gemm_detail::consumer_loop<kCluster>(g, f, epi, gate, signal, s, cta, cluster_idx, clusters);
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

// What a GEMM launch writes into its record: the reducing epilogue names the overlap variant.
template <class Epilogue>
constexpr KernelKind gemm_launch_kind() {
  return std::is_same<Epilogue, EpiReduceSlots>::value ? KernelKind::kGemmReduceSlots : KernelKind::kGemm;
}

template <int kCluster, class Epilogue>
__global__ void __launch_bounds__(GemmConfig::kThreads, 1)
    gemm_persistent_kernel(const __grid_constant__ GemmKernelParams<Epilogue> p) {
  extern __shared__ uint8_t gemm_smem[];
  if (p.frame.roles.role_of(blockIdx.x) == Role::kCompute) {
    gemm_compute_block<kCluster>(p.gemm, p.frame, p.epi, p.gate, p.signal, int32_t(blockIdx.x), p.frame.roles.compute,
                                 gemm_smem);
  }
  // Noted at the end: at the entry its registers stayed live into the producer's 40 (ptxas spilled
  // 12 bytes in the EpiReduceSlots instances).
  frame_note_launch(p.frame, gemm_launch_kind<Epilogue>());
  if constexpr (std::is_same<Epilogue, EpiReduceSlots>::value)
    frame_note_schedule(
        p.frame, p.gemm.sched.num_shards, p.gemm.sched.pm_owners > 0 ? p.gemm.sched.pm_lag : 0,
        (p.epi.part_owners > 0 ? kEpilogueRemotePartials : 0) | (p.epi.nbcast > 0 ? kEpilogueBroadcast : 0));
}

#endif  // __CUDACC__

}  // namespace weft::kernels
