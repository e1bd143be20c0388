// The grouped GEMM's persistent ring for sm_90a, shared by its launches (kernels/grouped_gemm.cu: the
// grouped GEMM and the expert FFN; kernels/moe_ffn_combine.cu: the FFN with the MoE layer's combine
// and home reduction after it in the same launch):
//
//   block (384 threads) = warpgroup 0: producer (one thread claims units and issues TMA loads)
//                         warpgroups 1, 2: consumers (wgmma m64n256k16, 64 rows of 128 each)
//   u ─moe_grouped_tile_at─► (row tile m, n block) ─moe_expert_of_tile─► expert e
//   X rows [128 m, +128) ──TMA──► smem ring {X 128x64, W 256x64} x 4 ──wgmma──► fp32 regs
//   W rows [e n + 256 nb, +256) ┘                                     │
//   epilogue per consumer half (64 rows) ◄────────────────────────────┘
//     every row the expert's: bf16 into a swizzled 64x64 staging box ──TMA store──► Y (tmap_y)
//     an expert's last, partial half: from registers, rows below offsets[e] + counts[e]
//   (kSwiGlu: accumulator columns j and j + 128 are gate and up of one H column)
//   a tail unit (after every GEMM unit): handed to the consumers in a stage with no loads; its
//   8 warps run it as SIMT work (Tail::run) and free the stage
//
// The same warp-specialized ring as kernels/gemm_sm90.cuh (its bounded barrier wait is reused), but
// its own walk: the standalone core's TileSchedule needs M on the host, and here M is a device
// value. W's 256-row box may reach into the next expert's rows when n is not a multiple of 256:
// those columns are computed and never stored (TMA clips the store at Y's width). A TMA store's box
// is a whole 64-row half, so the half holding an expert's last rows (its bound a device value) is
// stored from registers: no padding row is ever written. Templated on the tail so the launches
// without one compile as they did before it.
//
// A row tile's counter (tile_done, down_done) counts consumer warps. A half stored from registers
// adds 1 per warp after its stores; a half stored through TMA adds 4 once its stores are complete
// (cp.async.bulk.wait_group 0), which its thread 0 defers past the next unit's first k-block so
// the stores' latency hides behind MMAs. Deferred, never held: it is settled before the consumer
// waits on a stage that is not yet full (the producer may be waiting for this very count), before
// a tail unit (which may wait for it) and before the consumer leaves.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/frame.cuh"
#include "kernels/gemm_sm90.cuh"
#include "kernels/grouped_gemm.h"
#include "kernels/moe_plan.h"

namespace weft::kernels::grouped_ring {

using Cfg = GemmConfig;

struct __align__(1024) GroupedShared {
  __nv_bfloat16 a[Cfg::kStages][Cfg::kTileM * Cfg::kTileK];
  __nv_bfloat16 b[Cfg::kStages][Cfg::kTileN * Cfg::kTileK];
  // Epilogue staging: per consumer, two 64 x 64 bf16 boxes (128-byte swizzle, 1024-byte aligned)
  // that alternate.
  __nv_bfloat16 c[Cfg::kConsumers][2][Cfg::kStoreBox * Cfg::kStoreBox];
  uint64_t full[Cfg::kStages];
  uint64_t empty[Cfg::kStages];
  int64_t unit[Cfg::kStages];  // the unit whose first k-block a stage holds (-1: no more units)
};
static_assert(sizeof(GroupedShared) + 1024 <= 227 * 1024, "shared-memory budget of one H100/H200 block");
static_assert(offsetof(GroupedShared, c) % 1024 == 0, "the staging boxes' swizzle repeats every 1024 bytes");
static_assert(Cfg::kTileM == kMoeTileRows, "the expert offsets are padded to the GEMM's row tile");
constexpr size_t kSmemBytes = sizeof(GroupedShared) + 1024;

struct Walk {
  int32_t m_tiles = 0;
  int64_t units = 0;
};

__device__ __forceinline__ Walk walk_of(const GroupedGemmParams& p) {
  Walk w;
  const int32_t rows = p.offsets[p.experts];
  w.m_tiles = min(rows / Cfg::kTileM, p.capacity_tiles);
  w.units = int64_t(w.m_tiles) * p.n_blocks;
  return w;
}

__device__ __forceinline__ TileCoord coord_of(const GroupedGemmParams& p, const Walk& w, int64_t u, int32_t* e) {
  TileCoord c;
  moe_grouped_tile_at(u, w.m_tiles, p.n_blocks, p.group_m, &c.m_block, &c.n_block);
  *e = moe_expert_of_tile(p.offsets, p.experts, Cfg::kTileM, c.m_block);
  return c;
}

// A launch's units after its GEMM units, run by the consumer warps as SIMT work (the MoE layer's
// combine and home reduction, kernels/moe_ffn_combine.cu); the plain GEMM and the expert FFN have none.
struct NoTail {
  static constexpr bool kHas = false;
  int64_t units = 0;
  __device__ __forceinline__ bool run(int64_t, const FrameParams&, int32_t, int32_t) const { return true; }
};

// The units of one launch: the plain GEMM's (one phase), or the expert FFN's gate/up units then its
// down units (two phases over the same row tiles), then the tail's. A down unit of row tile m is
// gated on tile_done[m], which each gate/up unit of tile m raises by one after its H columns are
// stored; with a tail, each down unit raises down_done[m] likewise, which the tail's units wait for.
template <class Tail>
struct Phases {
  const GroupedGemmParams* p[2] = {};
  int64_t units0 = 0, units = 0;  // phase 0's units, both phases' units
  int64_t all = 0;                // and the tail's
  int32_t m_tiles = 0;
  // Split over K, the workspace being phase 1's (p[1]->split_ws): phase 0's (row tile, column block)
  // pairs from split0 on run as parts0 units each (its last, partial wave: moe_up_tail_parts), with
  // slots and arrival words from 0; phase 1's pairs as `parts` units each (split_parts), with slots
  // from slot1 and words from word1.
  int64_t split0 = 0;
  int32_t parts0 = 1;
  int32_t parts = 1;
  int64_t slot1 = 0, word1 = 0;
  uint64_t* tile_done = nullptr;  // two phases only: capacity_tiles words, zero at launch
  uint64_t* down_done = nullptr;  // with a tail: the next capacity_tiles words, zero at launch
  // Two phases: the units are claimed in order from this word (zero at launch), so every unit a
  // later unit waits for was claimed earlier by a running block, which finishes it without waiting
  // on later ones; one phase: block b takes b, b + grid, ...
  unsigned long long* claims = nullptr;
  const Tail* tail = nullptr;
};

// Parts per (row tile, column block) of a split phase (moe_split_parts, kernels/moe_plan.h): the same
// on every block for the same counts and blocks.
__device__ __forceinline__ int32_t split_parts(const GroupedGemmParams& p, int64_t tiles, int32_t slots) {
  if (!p.split_ws || !p.split_cnt) return 1;
  if (p.split_fixed > 0) {
    int32_t q = min(p.split_fixed, kMoeMaxSplit);
    while (q > 1 && (tiles * q > slots || p.k_iters < q * kMoeMinSplitIters)) --q;
    return q;
  }
  return moe_split_parts(tiles, p.k_iters, p.split_sms, slots, p.split_max);
}

template <class Tail>
__device__ __forceinline__ Phases<Tail> phases_of(const GroupedGemmParams& p0, const GroupedGemmParams* p1,
                                                  uint64_t* tile_done, const Tail* tail) {
  Phases<Tail> ph;
  const Walk w = walk_of(p0);  // both phases walk the same row tiles (the same offsets)
  ph.p[0] = &p0;
  ph.p[1] = p1;
  ph.m_tiles = w.m_tiles;
  ph.split0 = w.units;
  int64_t used = 0;  // workspace slots phase 0's split takes
  if (p1 && p1->split_ws && p1->split_cnt && p1->split_tail) {
    ph.parts0 = moe_up_tail_parts(w.units, w.m_tiles, p0.group_m, p0.k_iters, p1->split_sms, p1->split_slots,
                                  p1->split_max, &ph.split0);
    if (ph.parts0 > 1) {
      used = (w.units - ph.split0) * ph.parts0;
      ph.slot1 = used;
      ph.word1 = (w.units - ph.split0) * 8;
    }
  }
  ph.units0 = ph.split0 + (w.units - ph.split0) * ph.parts0;
  const int64_t tiles1 = p1 ? int64_t(w.m_tiles) * p1->n_blocks : 0;
  ph.parts = p1 ? split_parts(*p1, tiles1, int32_t(p1->split_slots - used)) : 1;
  ph.units = ph.units0 + tiles1 * ph.parts;
  ph.all = ph.units;
  ph.tile_done = tile_done;
  if (p1) ph.claims = reinterpret_cast<unsigned long long*>(tile_done + p0.capacity_tiles);
  if constexpr (Tail::kHas) {
    ph.tail = tail;
    ph.all += tail->units;
    ph.down_done = tile_done + p0.capacity_tiles;
    ph.claims = reinterpret_cast<unsigned long long*>(tile_done + 2 * int64_t(p0.capacity_tiles));
  }
  return ph;
}

// Unit u of the launch: its phase, parameters, tile and expert, the (row tile, column block) pair's
// index in the phase's walk, and the k-blocks [kb0, kb1) it sums. Split over K: which of the pair's
// `parts` it is (its parts adjacent in the claim order), the pair's first workspace slot and its
// arrival words (split_sum).
struct UnitAt {
  int32_t phase = 0, e = 0, part = 0, parts = 1, kb0 = 0, kb1 = 0;
  int64_t tile = 0, slot = 0, word = 0;
  TileCoord c;
};

template <class Tail>
__device__ __forceinline__ const GroupedGemmParams& unit_at(const Phases<Tail>& ph, int64_t u, UnitAt* at) {
  at->phase = u < ph.units0 ? 0 : 1;
  const GroupedGemmParams& p = *ph.p[at->phase];
  Walk w;
  w.m_tiles = ph.m_tiles;
  w.units = int64_t(ph.m_tiles) * p.n_blocks;
  if (at->phase == 0 && u < ph.split0) {
    at->tile = u, at->part = 0, at->parts = 1;
  } else if (at->phase == 0) {
    const int64_t v = u - ph.split0, pair = v / ph.parts0;
    at->tile = ph.split0 + pair, at->part = int32_t(v % ph.parts0), at->parts = ph.parts0;
    at->slot = pair * ph.parts0, at->word = pair * 8;
  } else {
    const int64_t v = u - ph.units0;
    at->tile = v / ph.parts, at->part = int32_t(v % ph.parts), at->parts = ph.parts;
    at->slot = ph.slot1 + at->tile * ph.parts, at->word = ph.word1 + at->tile * 8;
  }
  at->kb0 = int32_t(int64_t(at->part) * p.k_iters / at->parts);
  at->kb1 = int32_t(int64_t(at->part + 1) * p.k_iters / at->parts);
  at->c = coord_of(p, w, at->tile, &at->e);
  return p;
}

template <class Tail>
__device__ __forceinline__ int64_t next_unit(const Phases<Tail>& ph, int64_t u) {
  if (ph.claims) return int64_t(atomicAdd(ph.claims, 1ull));
  return u < 0 ? int64_t(blockIdx.x) : u + gridDim.x;
}

// The producer passes each unit to the consumers in the stage of its first k-block (a tail unit in a
// stage of its own, with no loads), and -1 in one more stage when it has no more.
template <class Tail>
__device__ __forceinline__ void producer(const Phases<Tail>& ph, const FrameParams& f, GroupedShared& s) {
  constexpr uint32_t kStageBytes = (Cfg::kTileM + Cfg::kTileN) * Cfg::kTileK * sizeof(__nv_bfloat16);
  uint32_t it = 0;
  for (int64_t u = next_unit(ph, -1); u < ph.all; u = next_unit(ph, u)) {
    if constexpr (Tail::kHas) {
      if (u >= ph.units) {
        const uint32_t stage = it % Cfg::kStages, phase_bit = (it / Cfg::kStages) & 1;
        if (!gemm_detail::wait_barrier(&s.empty[stage], phase_bit ^ 1, f, TileCoord{})) return;
        s.unit[stage] = u;
        sm90::mbar_arrive(&s.full[stage]);
        // One tail unit in flight per block: the next ticket is claimed once the consumers are done
        // with this one, so idle blocks take the tail's units instead of a few blocks queueing them.
        if (!gemm_detail::wait_barrier(&s.empty[stage], phase_bit, f, TileCoord{})) return;
        ++it;
        continue;
      }
    }
    UnitAt at;
    const GroupedGemmParams& p = unit_at(ph, u, &at);
    const TileCoord c = at.c;
    if (at.phase == 1) {
      // Every consumer warp of every gate/up unit of this row tile has stored its H columns; H is read
      // by TMA (async proxy) next.
      const uint64_t* flag = ph.tile_done + c.m_block;
      const uint64_t all = uint64_t(ph.p[0]->n_blocks) * Cfg::kConsumers * 4;
      if (!frame_wait_flag(f, flag, all, Role::kCompute, c.m_block, c.n_block, -1))  // the tile names it
        return;  // the consumers see the launch abandoned at their next barrier wait
      asm volatile("fence.proxy.async.global;" ::: "memory");
    }
    const int32_t row_a = c.m_block * Cfg::kTileM;
    const int32_t row_b = at.e * p.n + c.n_block * Cfg::kTileN;
    for (int32_t kb = at.kb0; kb < at.kb1; ++kb, ++it) {
      const uint32_t stage = it % Cfg::kStages, phase_bit = (it / Cfg::kStages) & 1;
      if (!gemm_detail::wait_barrier(&s.empty[stage], phase_bit ^ 1, f, c)) return;
      if (kb == at.kb0) s.unit[stage] = u;
      sm90::mbar_arrive_expect_tx(&s.full[stage], kStageBytes);
      sm90::tma_load_2d(s.a[stage], &p.tmap_x, &s.full[stage], kb * Cfg::kTileK, row_a);
      sm90::tma_load_2d(s.b[stage], &p.tmap_w, &s.full[stage], kb * Cfg::kTileK, row_b);
    }
  }
  const uint32_t stage = it % Cfg::kStages, phase_bit = (it / Cfg::kStages) & 1;
  if (!gemm_detail::wait_barrier(&s.empty[stage], phase_bit ^ 1, f, TileCoord{})) return;
  s.unit[stage] = -1;
  sm90::mbar_arrive(&s.full[stage]);
}

__device__ __forceinline__ float silu(float g) { return g / (1.f + __expf(-g)); }

__device__ __forceinline__ void store_tile(const GroupedGemmParams& p, const float (&acc)[128], int32_t row,
                                           int32_t row_end, int32_t n_block, int32_t lane) {
  if (p.epilogue == int32_t(GroupedEpilogue::kSwiGlu)) {
    // Accumulator columns 8j + q (j < 16) are gate, 128 + 8j + q the up of the same H column.
    const int32_t col0 = n_block * (Cfg::kTileN / 2) + 2 * (lane % 4);
#pragma unroll
    for (int32_t j = 0; j < 16; ++j) {
      const int32_t col = col0 + 8 * j;
      if (row < row_end)
        *reinterpret_cast<__nv_bfloat162*>(p.y + int64_t(row) * p.ldy + col) = __floats2bfloat162_rn(
            silu(acc[4 * j + 0]) * acc[4 * (j + 16) + 0], silu(acc[4 * j + 1]) * acc[4 * (j + 16) + 1]);
      if (row + 8 < row_end)
        *reinterpret_cast<__nv_bfloat162*>(p.y + int64_t(row + 8) * p.ldy + col) = __floats2bfloat162_rn(
            silu(acc[4 * j + 2]) * acc[4 * (j + 16) + 2], silu(acc[4 * j + 3]) * acc[4 * (j + 16) + 3]);
    }
    return;
  }
  const int32_t col0 = n_block * Cfg::kTileN + 2 * (lane % 4);
#pragma unroll
  for (int32_t j = 0; j < 32; ++j) {
    const int32_t col = col0 + 8 * j;
    if (col >= p.n) continue;  // n % 8 == 0: col + 1 < n too
    if (row < row_end)
      *reinterpret_cast<__nv_bfloat162*>(p.y + int64_t(row) * p.ldy + col) =
          __floats2bfloat162_rn(acc[4 * j + 0], acc[4 * j + 1]);
    if (row + 8 < row_end)
      *reinterpret_cast<__nv_bfloat162*>(p.y + int64_t(row + 8) * p.ldy + col) =
          __floats2bfloat162_rn(acc[4 * j + 2], acc[4 * j + 3]);
  }
}

// This consumer's 64-row half of the tile (rows row0 .. row0 + 63 of Y, every one its expert's) through
// shared memory and TMA: 64 x 64 boxes (two for kSwiGlu's 128 H columns, four for kStore's 256),
// the threads packing bf16 pairs into the 128-byte-swizzled staging box (kernels/gemm_sm90.cuh's
// store_tile_tma has the layout), thread 0 handing each box to the TMA unit as its own bulk group.
// A staging box is rewritten only after the store issued from it two boxes earlier has read it:
// *seq counts this half's boxes across units (a unit of kStore may issue an odd number of them).
__device__ __forceinline__ void store_half_tma(const GroupedGemmParams& p, GroupedShared& s, const float (&acc)[128],
                                               int32_t half, int32_t row0, int32_t n_block, int32_t t128,
                                               uint32_t* seq) {
  const bool swiglu = p.epilogue == int32_t(GroupedEpilogue::kSwiGlu);
  const int32_t warp = t128 / 32, lane = t128 % 32;
  const int32_t r0 = warp * 16 + lane / 4;  // rows r0 and r0 + 8 of the half
  const int32_t swz = r0 & 7;               // (r0 + 8) & 7 is the same
  const uint32_t bar_id = 2 + uint32_t(half);
  const int32_t col_base = n_block * (swiglu ? Cfg::kTileN / 2 : Cfg::kTileN);
  const int32_t boxes = (swiglu ? Cfg::kTileN / 2 : Cfg::kTileN) / Cfg::kStoreBox;
#pragma unroll
  for (int32_t box = 0; box < Cfg::kTileN / Cfg::kStoreBox; ++box) {
    // Past Y's width (kStore with n not a multiple of 256): nothing of this box is stored.
    if (box >= boxes || col_base + box * Cfg::kStoreBox >= p.ldy) break;
    uint8_t* buf = reinterpret_cast<uint8_t*>(s.c[half][(*seq)++ & 1]);
    if (t128 == 0) sm90::bulk_wait_read<1>();
    sm90::named_barrier_sync(bar_id, 128);
#pragma unroll
    for (int32_t jj = 0; jj < 8; ++jj) {  // 16-byte chunk jj of each row: columns 8 jj + 2 (lane % 4) + {0, 1}
      const int32_t j = box * 8 + jj;
      const int32_t off = ((jj ^ swz) * 16) + 4 * (lane % 4);
      float v0, v1, v2, v3;
      if (swiglu) {  // j < 16 here: gate in accumulator columns 8j + q, up in 128 + 8j + q
        const int32_t g = 4 * j, u = 4 * (j + 16);
        v0 = silu(acc[g + 0]) * acc[u + 0], v1 = silu(acc[g + 1]) * acc[u + 1];
        v2 = silu(acc[g + 2]) * acc[u + 2], v3 = silu(acc[g + 3]) * acc[u + 3];
      } else {
        v0 = acc[4 * j + 0], v1 = acc[4 * j + 1], v2 = acc[4 * j + 2], v3 = acc[4 * j + 3];
      }
      sm90::st_shared_u32(buf + r0 * 128 + off, gemm_detail::pack_bf16x2(v0, v1));
      sm90::st_shared_u32(buf + (r0 + 8) * 128 + off, gemm_detail::pack_bf16x2(v2, v3));
    }
    sm90::fence_proxy_async_shared();
    sm90::named_barrier_sync(bar_id, 128);
    if (t128 == 0) {
      sm90::tma_store_2d(&p.tmap_y, buf, col_base + box * Cfg::kStoreBox, row0);
      sm90::bulk_commit();
    }
  }
}

// A TMA-stored half's count, added once its stores are complete (thread 0 of the half, which issued
// them); nothing when none is outstanding.
__device__ __forceinline__ void settle(uint64_t** pending) {
  if (!*pending) return;
  sm90::bulk_wait<0>();
  asm volatile("fence.proxy.async.global;" ::: "memory");  // the TMA stores before the generic release
  asm volatile("red.release.gpu.global.add.u64 [%0], %1;" ::"l"(*pending), "l"(uint64_t(4)) : "memory");
  *pending = nullptr;
}

// A warp's share of a split unit (16 rows x 256 columns of its half: 32 lanes x 128 fp32) into its
// workspace slot (the pair's first slot + its part), then one arrival on the pair's word of this warp
// (word + warp8), which the launch zeroed. The last of the parts to arrive reads every part's slot, its own included,
// and sums them in part order (K order), so the bits do not depend on which part finished last; it returns true to
// store the sums. Slots are written and read at L2 (st.cg / ld.cg: no SM's L1 holds a stale copy
// from an earlier launch). Each lane fences its own stores; lane 0 fences before and after the
// arrival, and the warp's barriers carry that order to the other lanes' loads.
__device__ __forceinline__ bool split_sum(const GroupedGemmParams& p, float (&acc)[128], const UnitAt& at,
                                          int32_t warp8, int32_t lane) {
  constexpr int64_t kWarpVecs = 32 * 32;  // float4s of one warp's share
  const int32_t parts = at.parts, part = at.part;
  float4* ws = reinterpret_cast<float4*>(p.split_ws) + (at.slot * 8 + warp8) * kWarpVecs + lane;
  float4* mine = ws + part * 8 * kWarpVecs;
#pragma unroll
  for (int32_t j = 0; j < 32; ++j)
    __stcg(mine + 32 * j, make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]));
  __threadfence();
  __syncwarp();
  uint32_t before = 0;
  if (lane == 0) {
    __threadfence();
    before = atomicAdd(p.split_cnt + at.word + warp8, 1u);
    __threadfence();
  }
  before = __shfl_sync(0xffffffffu, before, 0);
  __syncwarp();
  if (before != uint32_t(parts - 1)) return false;
#pragma unroll
  for (int32_t j = 0; j < 32; ++j) {
    const float4 v = __ldcg(ws + 32 * j);
    acc[4 * j] = v.x, acc[4 * j + 1] = v.y, acc[4 * j + 2] = v.z, acc[4 * j + 3] = v.w;
  }
#pragma unroll 1
  for (int32_t q = 1; q < parts; ++q) {
    const float4* slot = ws + q * 8 * kWarpVecs;
#pragma unroll
    for (int32_t j = 0; j < 32; ++j) {
      const float4 v = __ldcg(slot + 32 * j);
      acc[4 * j] += v.x, acc[4 * j + 1] += v.y, acc[4 * j + 2] += v.z, acc[4 * j + 3] += v.w;
    }
  }
  return true;
}

template <class Tail>
__device__ __forceinline__ void consumer(const Phases<Tail>& ph, const FrameParams& f, GroupedShared& s) {
  const int32_t half = threadIdx.x / 128 - 1;  // which 64-row half of the tile
  const int32_t t128 = threadIdx.x % 128, warp = t128 / 32, lane = t128 % 32;
  float acc[128];
  uint32_t it = 0;
  uint64_t* pending = nullptr;  // thread 0 of the half: the counter its last TMA-stored half still owes
  uint32_t boxes = 0;           // staging boxes this half has filled (which of the two is next)
  for (;;) {
    // The producer may be waiting for the count this half owes before it fills the stage.
    if (pending && !sm90::mbar_try_wait(&s.full[it % Cfg::kStages], (it / Cfg::kStages) & 1)) settle(&pending);
    if (!gemm_detail::wait_barrier(&s.full[it % Cfg::kStages], (it / Cfg::kStages) & 1, f, TileCoord{})) {
      if (t128 == 0) sm90::bulk_wait<0>();  // no TMA store left reading the staging boxes
      return;
    }
    const int64_t u = s.unit[it % Cfg::kStages];
    if (u < 0) {
      settle(&pending);
      if (t128 == 0) sm90::bulk_wait<0>();
      return;
    }
    if constexpr (Tail::kHas) {
      if (u >= ph.units) {  // SIMT work on the 8 consumer warps; a false return: the launch is abandoned
        settle(&pending);   // the tail unit may wait for that count
        if (!ph.tail->run(u - ph.units, f, half * 4 + warp, lane)) {
          if (t128 == 0) sm90::bulk_wait<0>();
          return;
        }
        __syncwarp();
        if (lane == 0) sm90::mbar_arrive(&s.empty[it % Cfg::kStages]);
        ++it;
        continue;
      }
    }
    UnitAt at;
    const GroupedGemmParams& p = unit_at(ph, u, &at);
    const TileCoord c = at.c;
    const int32_t e = at.e, phase = at.phase;
    for (int32_t kb = at.kb0; kb < at.kb1; ++kb, ++it) {
      const uint32_t stage = it % Cfg::kStages, phase_bit = (it / Cfg::kStages) & 1;
      if (kb > at.kb0 && !gemm_detail::wait_barrier(&s.full[stage], phase_bit, f, c)) {
        sm90::wgmma_wait<0>();                // leave nothing in flight
        if (t128 == 0) sm90::bulk_wait<0>();  // nor a TMA store reading the staging boxes
        return;
      }
      const uint64_t desc_a = sm90::make_smem_desc_sw128(s.a[stage] + half * 64 * Cfg::kTileK);
      const uint64_t desc_b = sm90::make_smem_desc_sw128(s.b[stage]);
      sm90::wgmma_fence();
#pragma unroll
      for (int32_t k = 0; k < Cfg::kTileK / 16; ++k)  // +32 bytes per k16 step: +2 in the >>4 field
        sm90::wgmma_m64n256k16(acc, desc_a + 2 * k, desc_b + 2 * k, (kb > at.kb0 || k > 0) ? 1 : 0);
      sm90::wgmma_commit();
      if (kb == at.kb0) settle(&pending);  // the last half's stores completed behind this k-block's MMAs
      sm90::wgmma_wait<1>();               // the previous k-block's MMAs are done reading their stage
      if (kb > at.kb0 && lane == 0) sm90::mbar_arrive(&s.empty[(it - 1) % Cfg::kStages]);
    }
    sm90::wgmma_wait<0>();
    if (lane == 0) sm90::mbar_arrive(&s.empty[(it - 1) % Cfg::kStages]);
    // The down units of the tile (any SM) wait for every warp of every gate/up unit of it
    // (tile_done); with a tail, the tail's units for every warp of every down unit (down_done).
    uint64_t* counter = phase == 0 ? ph.tile_done : nullptr;
    if constexpr (Tail::kHas) {
      if (phase == 1) counter = ph.down_done;
    }
    if (counter) counter += c.m_block;
    const int32_t half_row0 = c.m_block * Cfg::kTileM + half * 64;
    // A part of a split unit: only the last of the parts to finish (per warp) stores, from registers
    // (the workspace is phase 1's, for either phase).
    if (at.parts > 1 && !split_sum(*ph.p[1], acc, at, half * 4 + warp, lane)) continue;
    if (p.store_tma && at.parts == 1 && half_row0 + 64 <= p.offsets[e] + p.counts[e]) {
      store_half_tma(p, s, acc, half, half_row0, c.n_block, t128, &boxes);
      if (t128 == 0) pending = counter;  // settled behind the next unit's first k-block
      continue;
    }
    store_tile(p, acc, half_row0 + warp * 16 + lane / 4, p.offsets[e] + p.counts[e], c.n_block, lane);
    if (counter) {
      // Each warp's stores, then one release per warp. Per warp, not a block-wide barrier: a warp
      // that left on an abandoned launch must not hold the others (its count is then missing, and
      // the waiting producer times out, bounded).
      __syncwarp();
      if (lane == 0) flag_add_release(counter, 1);
    }
  }
}

template <class Tail>
__device__ __forceinline__ void grouped_body(const Phases<Tail>& ph, const FrameParams& f) {
  extern __shared__ uint8_t smem_raw[];
  GroupedShared& s =
      *reinterpret_cast<GroupedShared*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const GroupedGemmParams& p = *ph.p[0];
  if (threadIdx.x == 0) {
    for (int32_t i = 0; i < Cfg::kStages; ++i) {
      sm90::mbar_init(&s.full[i], 1);
      sm90::mbar_init(&s.empty[i], Cfg::kConsumers * 4);  // one arrival per consumer warp
    }
    sm90::fence_barrier_init();
    sm90::tma_prefetch_desc(&p.tmap_x);
    sm90::tma_prefetch_desc(&p.tmap_w);
    if (ph.p[1]) {
      sm90::tma_prefetch_desc(&ph.p[1]->tmap_x);
      sm90::tma_prefetch_desc(&ph.p[1]->tmap_w);
    }
    // Rows routed beyond the reservation are not computed: counted, never silently lost.
    const int32_t rows = p.offsets[p.experts];
    if (blockIdx.x == 0 && p.dropped && rows > p.capacity_tiles * Cfg::kTileM)
      atomicAdd(p.dropped, rows - p.capacity_tiles * Cfg::kTileM);
    // The expert FFN's most K parts of a pair (down's, or gate/up's last wave's), for the op's read-back
    // of what ran (LaunchRecord::parts).
    if (blockIdx.x == 0 && ph.p[1] && f.launch) f.launch->parts = max(ph.parts, ph.parts0);
  }
  __syncthreads();
  if (threadIdx.x < 128) {
    sm90::setmaxnreg_dec<40>();
    if (threadIdx.x == 0) producer(ph, f, s);
  } else {
    sm90::setmaxnreg_inc<232>();
    consumer(ph, f, s);
  }
}

}  // namespace weft::kernels::grouped_ring
