// Persistent tile scheduler: which output tile each compute block works on, in which order.
//
// The output C (M x N) is cut into m_blocks x n_blocks tiles of tile_m x tile_n. The M dimension
// is further cut into `num_shards` equal M-shards (for AllGather+GEMM a shard is one rank's rows
// of A; for GEMM+ReduceScatter one destination rank's rows of C). Tiles get a linear order:
//
//   step:    0 1 2 ... T-1 | T ... 2T-1 | ...          T = tiles per shard
//   shard:   first_shard   | first+1    | ... (mod num_shards)   <- rank-rotated start
//
// inside one shard, grouped ("swizzled") rasterization: group_m consecutive m-blocks are walked
// down one column of n-blocks before moving right, so the A rows of a group and the B column
// stay in L2 together:
//
//           n=0  n=1  n=2  ...
//   m=0      0    4    8          group_m = 4: indices run down 4 m-blocks, then to the next
//   m=1      1    5    9          column; the last group may be shorter (fewer m-blocks).
//   m=2      2    6   10
//   m=3      3    7   11
//   m=4     4N  4N+2 ...          (second group starts at 4*n_blocks)
//   m=5    4N+1 4N+3
//
// Compute block b of B takes linear indices b, b+B, b+2B, ...: all blocks sweep the order
// together, so the first shard is finished first (the one a rank already holds, or the one
// whose result must leave first). Every tile is visited exactly once across the B blocks
// (unit-tested on the host for many shapes and block counts).
#pragma once

#include <cstdint>

#include "runtime/roles.h"  // WEFT_HD

namespace weft::kernels {

struct TileCoord {
  int32_t m_block = 0;  // tile row: rows [m_block * tile_m, ...)
  int32_t n_block = 0;  // tile column
  int32_t shard = 0;    // M-shard holding m_block
  int64_t linear = 0;   // position in the schedule (0 .. num_tiles-1)
};

// The schedule's shape; a POD passed by value to kernels.
struct TileSchedule {
  int32_t m_blocks = 0;
  int32_t n_blocks = 0;
  int32_t group_m = 8;      // m-blocks per raster group (>= 1)
  int32_t num_shards = 1;   // M-shards; m_blocks % num_shards == 0
  int32_t first_shard = 0;  // shard visited first (e.g. this rank's own shard)

  // Builds the schedule for an M x N output; false (and *why set) when the shard split does not
  // fall on tile boundaries.
  static bool make(int64_t m, int64_t n, int32_t tile_m, int32_t tile_n, int32_t group_m, int32_t num_shards,
                   int32_t first_shard, TileSchedule* out, const char** why) {
    if (m <= 0 || n <= 0 || tile_m <= 0 || tile_n <= 0 || group_m <= 0 || num_shards <= 0) {
      *why = "sizes, tile sizes, group_m and num_shards must be positive";
      return false;
    }
    int64_t mb = (m + tile_m - 1) / tile_m;
    int64_t nb = (n + tile_n - 1) / tile_n;
    if (num_shards > 1 && (m % num_shards != 0 || (m / num_shards) % tile_m != 0)) {
      *why = "M / num_shards must be a whole multiple of the tile height";
      return false;
    }
    if (first_shard < 0 || first_shard >= num_shards) {
      *why = "first_shard must be in [0, num_shards)";
      return false;
    }
    if (mb * nb >= (int64_t(1) << 31)) {
      *why = "too many tiles (at most 2^31 - 1)";
      return false;
    }
    out->m_blocks = int32_t(mb);
    out->n_blocks = int32_t(nb);
    out->group_m = group_m;
    out->num_shards = num_shards;
    out->first_shard = first_shard;
    return true;
  }

  WEFT_HD int64_t num_tiles() const { return int64_t(m_blocks) * n_blocks; }
  WEFT_HD int32_t shard_m_blocks() const { return m_blocks / num_shards; }
  WEFT_HD int64_t tiles_per_shard() const { return int64_t(shard_m_blocks()) * n_blocks; }

  // The tile at position `linear` (< num_tiles() < 2^31) of the order drawn above. 32-bit index
  // math: a 64-bit division is a called subroutine on the GPU, whose return address the register-
  // hungry GEMM consumers would have to keep on the stack.
  WEFT_HD TileCoord tile_at(int64_t linear) const {
    TileCoord c;
    c.linear = linear;
    const uint32_t lin = uint32_t(linear);
    const uint32_t per_shard = uint32_t(shard_m_blocks()) * uint32_t(n_blocks);
    const uint32_t step = lin / per_shard;
    uint32_t i = lin - step * per_shard;
    c.shard = int32_t((uint32_t(first_shard) + step) % uint32_t(num_shards));
    const int32_t smb = shard_m_blocks();
    const uint32_t per_group = uint32_t(group_m) * uint32_t(n_blocks);
    const uint32_t group = i / per_group;
    const int32_t first_m = int32_t(group) * group_m;
    const int32_t rows = (smb - first_m) < group_m ? (smb - first_m) : group_m;
    i -= group * per_group;
    c.m_block = c.shard * smb + first_m + int32_t(i % uint32_t(rows));
    c.n_block = int32_t(i / uint32_t(rows));
    return c;
  }
};

// One compute block's walk through a TileSchedule: for (s.init(...); s.valid(); s.advance()).
class PersistentTileIter {
 public:
  WEFT_HD PersistentTileIter(const TileSchedule& sched, int32_t block, int32_t num_blocks)
      : sched_(sched), next_(block), stride_(num_blocks) {}

  WEFT_HD bool valid() const { return next_ < sched_.num_tiles(); }
  WEFT_HD TileCoord current() const { return sched_.tile_at(next_); }
  WEFT_HD void advance() { next_ += stride_; }
  WEFT_HD int64_t linear() const { return next_; }

 private:
  TileSchedule sched_;
  int64_t next_;
  int64_t stride_;
};

}  // namespace weft::kernels
