// Epilogues of the GEMM main loop: where each finished pair of fp32 results goes (host + device).
#pragma once

#include <cuda.h>  // CUtensorMap
#include <cuda_bf16.h>

#include <cstdint>

namespace weft::kernels {

#if defined(__CUDACC__)
// Stores the bf16 pair (v0 at p, v1 at p + 1 when `two`): one 4-byte store when `paired` (ldc and
// the base allow it), else element by element.
__device__ __forceinline__ void store_bf16_pair(__nv_bfloat16* p, float v0, float v1, bool two, bool paired) {
  if (two && paired) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(v0, v1);
  } else {
    p[0] = __float2bfloat16_rn(v0);
    if (two) p[1] = __float2bfloat16_rn(v1);
  }
}
#endif

// ---- epilogues: one finished pair of columns (col, col+1) of one row ----------------------------
// Each epilogue gets (row, col, v0, v1, two): v1 belongs to col+1 and is valid only when `two`.
// Rows/cols are already bounds-checked. Members are plain pointers: local, or a peer's heap
// mapped through CUDA IPC (stores and reductions then travel over NVLink).

// Stores bf16 C (row-major, ldc elements). `paired` = ldc and c allow 4-byte stores.
struct EpiStoreBf16 {
  __nv_bfloat16* c = nullptr;
  int64_t ldc = 0;
  bool paired = true;
#if defined(__CUDACC__)
  __device__ __forceinline__ void pair(int32_t row, int32_t col, float v0, float v1, bool two) const {
    __nv_bfloat16* p = c + int64_t(row) * ldc + col;
    store_bf16_pair(p, v0, v1, two, paired);
  }
#endif
};

// Adds into fp32 C with atomic reductions (partial sums from several ranks).
struct EpiAddF32 {
  float* c = nullptr;
  int64_t ldc = 0;
#if defined(__CUDACC__)
  __device__ __forceinline__ void pair(int32_t row, int32_t col, float v0, float v1, bool two) const {
    float* p = c + int64_t(row) * ldc + col;
    atomicAdd(p, v0);
    if (two) atomicAdd(p + 1, v1);
  }
#endif
};

// Adds into bf16 C with bf16x2 atomic reductions (half the bytes of fp32; bf16 rounding per add).
struct EpiAddBf16 {
  __nv_bfloat16* c = nullptr;
  int64_t ldc = 0;
  bool paired = true;
#if defined(__CUDACC__)
  __device__ __forceinline__ void pair(int32_t row, int32_t col, float v0, float v1, bool two) const {
    __nv_bfloat16* p = c + int64_t(row) * ldc + col;
    if (two && paired) {
      atomicAdd(reinterpret_cast<__nv_bfloat162*>(p), __floats2bfloat162_rn(v0, v1));
    } else {
      atomicAdd(p, __float2bfloat16_rn(v0));
      if (two) atomicAdd(p + 1, __float2bfloat16_rn(v1));
    }
  }
#endif
};

// Scatters rows of C to their owners (GEMM+ReduceScatter / AllReduce): row `row` belongs to owner
// o = row / rows_per_owner and is stored as bf16 at dst[o] + (row - o * rows_per_owner) * ldc + col.
// dst[o] is this rank's slot in owner o's staging buffer, a peer pointer mapped through CUDA IPC
// (or local for o == this rank), so partial tiles travel over NVLink as soon as they are produced.
// AllGather+GEMM across nodes: o is a position and dst[o] the C rows of the shard held there; every
// rank holds all N x G shards of its group, so the bound is the largest tensor-parallel group
// (N <= 4 nodes x G <= 8 GPUs), not the job.
struct EpiScatterBf16 {
  static constexpr int kMaxOwners = 4 * 8;
  __nv_bfloat16* dst[kMaxOwners] = {};
  int64_t rows_per_owner = 0;
  int64_t ldc = 0;
  bool paired = true;
#if defined(__CUDACC__)
  __device__ __forceinline__ void pair(int32_t row, int32_t col, float v0, float v1, bool two) const {
    const int32_t o = int32_t(row / rows_per_owner);
    __nv_bfloat16* p = dst[o] + (int64_t(row) - int64_t(o) * rows_per_owner) * ldc + col;
    store_bf16_pair(p, v0, v1, two, paired);
  }

  // A consumer thread's whole fragment (rows row and row + 8, columns col0 + 8j + {0, 1}): the
  // owner division once per row instead of once per pair.
  __device__ __forceinline__ void fragment(int32_t row, int32_t col0, int32_t m, int32_t n, float (&acc)[128]) const {
    __nv_bfloat16* r[2] = {nullptr, nullptr};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int32_t rr = row + 8 * h;
      if (rr < m) {
        const int32_t o = rr / int32_t(rows_per_owner);  // 32-bit: rows_per_owner <= m < 2^31
        r[h] = dst[o] + (int64_t(rr) - int64_t(o) * rows_per_owner) * ldc;
      }
    }
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const int32_t col = col0 + 8 * j;
      if (col >= n) continue;
      const bool two = col + 1 < n;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (!r[h]) continue;
        __nv_bfloat16* p = r[h] + col;
        const float v0 = acc[4 * j + 2 * h], v1 = acc[4 * j + 2 * h + 1];
        store_bf16_pair(p, v0, v1, two, paired);
      }
    }
  }
#endif
};

// GEMM+ReduceScatter / AllReduce with the reduction in the epilogue. Rows [lo, hi) of C are this
// rank's: for them the peers' partials of the same rows, staged locally (slot i holds row lo + x at
// slots[i] + x * ldc), are added to the fp32 accumulator in slot order 0, 1, ... and the sum is
// rounded once to bf16 and stored at out + (row - lo) * ldc: the same bits on every run. Every other
// row is stored as this rank's bf16 partial at partial + row * ldc (the copy engines take it to its
// owner). With lo and hi multiples of the tile height, a tile is either all inside or all outside.
// The staged slots must be complete before they are read: gate the own rows' tiles on their arrival
// (FlagGate) — the producer's acquire orders the reads after the copies (it waits before the tile's
// operands, or with slot_maps before the slots' loads).
struct EpiReduceSlots {
  // Staged partials per own row: G - 1 node-mates and N - 1 rail peers (G <= 8, N <= 4).
  static constexpr int kMaxSlots = 7 + 3;
  // Slots read through the TMA ring (enable_slot_loads): the one-node op's G - 1 <= 7.
  static constexpr int kMaxRingSlots = 7;
  __nv_bfloat16* partial = nullptr;
  __nv_bfloat16* out = nullptr;
  const __nv_bfloat16* slots[kMaxSlots] = {};
  int32_t nslots = 0;
  int32_t lo = 0, hi = 0;
  int64_t ldc = 0;
  bool paired = true;
  // The GEMM's TileSignal counts are read only on this GPU (its copy engines, stream waits): the
  // GEMM releases them at GPU scope. false: system scope, as for a flag in another GPU's memory.
  bool local_signal = true;
  // Own tiles through shared memory and TMA (enable_own_tma_store; 0 maps: stores from registers).
  // own_map[0] is `out` (rows [lo, hi) as rows 0.., box {kStoreBox, kStoreBox}); own_map[1..] are
  // the same rows of peers' C (AllReduce: the reduced tile goes to every rank from the epilogue).
  // Once a tile's stores are complete, each bcast_flags[i] (a word in peer i's memory) += 1 at
  // system scope: a peer has owner r's rows once its word reached tiles-per-owner x epoch.
  // One node's ranks: the own rows and G - 1 <= 7 peers (or owners).
  static constexpr int kMaxOwnMaps = 8;
  int32_t own_maps = 0;
  int32_t nbcast = 0;
  uint64_t* bcast_flags[kMaxOwnMaps - 1] = {};
  CUtensorMap own_map[kMaxOwnMaps];
  // Partial tiles straight into their owners' staging slots (enable_remote_partials; 0: stored
  // into `partial`, and the copy engines move them): part_map[o] is this rank's slot in owner o's
  // staging (o's rows as rows 0..), and once a tile's stores are complete,
  // part_flags[o][(row - o * rows_per_owner) / rows_per_piece] += 1 at system scope (o's memory).
  int32_t part_owners = 0;
  int32_t rows_per_owner = 0, rows_per_piece = 0;
  uint64_t* part_flags[kMaxOwnMaps] = {};
  CUtensorMap part_map[kMaxOwnMaps];
  // The staged partials of own tiles through the GEMM's TMA ring (enable_slot_loads; 0: the
  // consumers load them from global memory in add_slots): slot_map[i] covers slots[i] (own rows as
  // rows 0.., box {64 columns, 128 rows}). After an own tile's last k-block the producer loads the
  // tile's slots as extra ring stages (3 boxes of 128 x 64 per stage), and only then waits for the
  // tile's gate: the tile's MMAs no longer wait for its partials to arrive.
  int32_t slot_maps = 0;
  CUtensorMap slot_map[kMaxRingSlots];
#if defined(__CUDACC__)
  __device__ __forceinline__ void pair(int32_t row, int32_t col, float v0, float v1, bool two) const {
    if (row < lo || row >= hi) {
      __nv_bfloat16* p = partial + int64_t(row) * ldc + col;
      store_bf16_pair(p, v0, v1, two, paired);
      return;
    }
    const int64_t off = int64_t(row - lo) * ldc + col;
#pragma unroll
    for (int i = 0; i < kMaxSlots; ++i) {
      if (i >= nslots) break;
      v0 += __bfloat162float(slots[i][off]);
      if (two) v1 += __bfloat162float(slots[i][off + 1]);
    }
    out[off] = __float2bfloat16_rn(v0);
    if (two) out[off + 1] = __float2bfloat16_rn(v1);
  }

  // Adds the staged partials of an own fragment (rows `row` and row + 8, columns col0 + 8j + {0, 1})
  // to acc in slot order; all of a slot's loads are issued before any is used. Needs `paired`
  // and own rows; columns at or past n are left alone (the TMA store clips them).
  __device__ __forceinline__ void add_slots(int32_t row, int32_t col0, int32_t n, float (&acc)[128]) const {
    const int64_t off0 = int64_t(row - lo) * ldc + col0, off1 = off0 + 8 * ldc;
#pragma unroll
    for (int i = 0; i < kMaxSlots; ++i) {
      if (i >= nslots) break;
      const uint32_t* s0 = reinterpret_cast<const uint32_t*>(slots[i] + off0);
      const uint32_t* s1 = reinterpret_cast<const uint32_t*>(slots[i] + off1);
      uint32_t v[64];
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const bool in = col0 + 8 * j < n;  // n even: the pair's second column is in too
        v[2 * j] = in ? s0[4 * j] : 0u;    // 8 bf16 columns = 4 words apart
        v[2 * j + 1] = in ? s1[4 * j] : 0u;
      }
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const float2 x0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v[2 * j]));
        const float2 x1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v[2 * j + 1]));
        acc[4 * j + 0] += x0.x;
        acc[4 * j + 1] += x0.y;
        acc[4 * j + 2] += x1.x;
        acc[4 * j + 3] += x1.y;
      }
    }
  }

  // The whole tile fragment of one consumer thread at once (the GEMM calls this instead of pair()):
  // rows `row` and row + 8, columns col0 + 8j + {0, 1} for j < 32; acc[4j], acc[4j+1] are row's,
  // acc[4j+2], acc[4j+3] row + 8's. For own rows all of a slot's 64 loads are issued before any is
  // used (one memory round trip per slot instead of one per pair: pair() after pair() could not
  // move a load above the previous pair's store); acc is consumed.
  __device__ __forceinline__ void fragment(int32_t row, int32_t col0, int32_t m, int32_t n, float (&acc)[128]) const {
    if (row >= lo && row < hi && paired && col0 + 8 * 31 + 1 < n) {
      const int64_t off0 = int64_t(row - lo) * ldc + col0, off1 = off0 + 8 * ldc;
      add_slots(row, col0, n, acc);
      __nv_bfloat16* o0 = out + off0;
      __nv_bfloat16* o1 = out + off1;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        *reinterpret_cast<__nv_bfloat162*>(o0 + 8 * j) = __floats2bfloat162_rn(acc[4 * j + 0], acc[4 * j + 1]);
        *reinterpret_cast<__nv_bfloat162*>(o1 + 8 * j) = __floats2bfloat162_rn(acc[4 * j + 2], acc[4 * j + 3]);
      }
      return;
    }
    // Partial rows, and own tiles at the right edge of C or with unpaired columns: pair by pair.
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const int32_t col = col0 + 8 * j;
      if (col < n) {
        const bool two = col + 1 < n;
        if (row < m) pair(row, col, acc[4 * j + 0], acc[4 * j + 1], two);
        if (row + 8 < m) pair(row + 8, col, acc[4 * j + 2], acc[4 * j + 3], two);
      }
    }
  }
#endif
};

}  // namespace weft::kernels
