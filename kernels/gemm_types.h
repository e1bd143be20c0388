// Launch shape and device-ready arguments of the sm_90a GEMM main loop (host and device).
#pragma once

#include <cuda.h>  // CUtensorMap

#include <cstdint>

#include "kernels/tile_scheduler.h"

namespace weft::kernels {

// One fixed configuration, the one that measured best (docs/gemm.md).
struct GemmConfig {
  static constexpr int kTileM = 128;  // two consumer warpgroups x m64
  static constexpr int kTileN = 256;  // wgmma n256
  static constexpr int kTileK = 64;   // one 128-byte swizzled row of bf16
  static constexpr int kStages = 4;   // smem ring depth: 4 x 48 KiB
  static constexpr int kConsumers = 2;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kStoreBox = 64;  // epilogue: 64 x 64 bf16 sub-tiles, two buffers per consumer
};

// Launch choices of the GEMM core (a Plan's execution.gemm; weftrun bench's and bench_gemm's switches
// for comparisons). The defaults are what measured fastest (docs/gemm.md).
struct GemmOptions {
  bool split_tail = true;     // cut the last wave's tiles along K where blocks would idle (enable_tail_split)
  bool chunked_tail = true;   // ... into chunks of k-blocks, for a static walk of a kernel built for them
  bool dynamic_tiles = true;  // compute blocks claim their tiles one at a time (enable_dynamic_tiles)
  bool tma_store = true;      // C through shared memory + TMA where the epilogue allows (enable_tma_store)
};

// The most K-slices enable_tail_split cuts a tile into.
constexpr int32_t kMaxTailSplit = 8;

// Device-ready GEMM arguments: C (m x n) = A (m x k, K contiguous) * B (n x k, K contiguous)^T.
struct GemmParams {
  CUtensorMap tmap_a;  // box {kTileK, kTileM}, 128B swizzle, zero fill out of bounds
  CUtensorMap tmap_b;  // box {kTileK, kTileN}
  int32_t m = 0;
  int32_t n = 0;
  int32_t k = 0;
  int32_t cluster_m = 1;     // CTAs per cluster along M; with 2 they share (multicast) the B tile
  int32_t cta_m_blocks = 0;  // ceil(m / kTileM): rows of per-tile flags
  int32_t n_blocks = 0;      // ceil(n / kTileN)
  TileSchedule sched;        // over cluster tiles of (cluster_m * kTileM) x kTileN
  // Bf16 store epilogue through shared memory and TMA (set by enable_tma_store for one C): box
  // {kStoreBox cols, kStoreBox rows}, 128-byte swizzle. false: stores straight from registers.
  CUtensorMap tmap_c;
  bool store_tma = false;
  // Split tail (enable_tail_split): fp32 partials of the split tiles' non-final K-slices, and one
  // flag per split CTA tile counting them (zero between launches).
  float* split_ws = nullptr;
  uint64_t* split_flags = nullptr;
  // Dynamic tile claims (enable_dynamic_tiles; single-CTA clusters only): [0] the next unit to
  // hand out, [1] the compute blocks that are done with it; zero between launches (the last block
  // to finish resets both). null: block b takes units b, b + B, ... (static striding).
  uint32_t* claims = nullptr;
};

// Flags are indexed by 128-row CTA tiles: m_block = row / kTileM (not the cluster tile).
constexpr int32_t kFlagPerTile = 0;   // flags[m_block * n_blocks + n_block]
constexpr int32_t kFlagPerShard = 1;  // flags[shard]

// Producer-side wait before loading a tile's operands: flags[index] >= expected. No wait when
// flags is null, nor for tiles of shards outside [wait_lo, wait_hi). The range also tells the
// consumers which tiles may wait: a tile signal is deferred (sent during the next tile) unless the
// next tile may wait, so that no deferred signal is held while this GPU waits for a flag.
struct FlagGate {
  const uint64_t* flags = nullptr;
  int32_t granularity = kFlagPerShard;
  uint64_t expected = 0;
  int32_t wait_lo = 0;
  int32_t wait_hi = 0x7fffffff;
  // kFlagPerShard: a producer that has seen shard s's flag open does not load it again for the
  // shard's later tiles (flags only grow; not GEMM+RS/AR's EpiReduceSlots kernel). 1 checks every
  // tile (only to measure what that costs).
  int32_t recheck = 0;

  WEFT_HD bool may_wait(int32_t shard) const { return flags && shard >= wait_lo && shard < wait_hi; }
};

// After a tile's epilogue: flags[index] += add (release, system scope). Nothing when null. A tile
// stored through TMA is signalled late (during the next tile of the block, or before the block waits
// on anything: FlagGate): its stores are complete by then, and the consumers need not stall on them.
struct TileSignal {
  uint64_t* flags = nullptr;
  int32_t granularity = kFlagPerTile;
  uint64_t add = 1;
  int32_t variant = 0;  // kSignal*: 0 in use; the others only to measure what a signal costs
};

// TileSignal::variant. kSignalImmediate is correct too (each TMA tile waits for its stores and
// signals at once); the last three break the count's meaning and serve only the cost breakdown.
// EpiReduceSlots' tiles stored into peers' memory (SM sends, epilogue gather) are counted at once
// with kSignalImmediate and, with kSignalDeferred, just before the block's next tile's stores.
constexpr int32_t kSignalDeferred = 0;
constexpr int32_t kSignalImmediate = 1;
constexpr int32_t kSignalRelaxed = 2;       // no release fence before the add
constexpr int32_t kSignalPerWarpgroup = 3;  // each consumer warpgroup adds for its half, no block barrier
constexpr int32_t kSignalBarrierOnly = 4;   // the block barrier, no wait for the stores, no add
// Each consumer warpgroup waits for its half's stores a few k-blocks into the block's next tile
// (by then they are complete: no stall) and the second of the two to get there moves the count;
// no block barrier. Before a tile that may wait, and after the last, it moves at once.
constexpr int32_t kSignalInLoop = 5;

}  // namespace weft::kernels
