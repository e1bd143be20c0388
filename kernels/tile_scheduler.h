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
// Piece-major order (set_piece_major, GEMM+RS/AR): the shards are W owners x S pieces
// (shard = owner * S + piece) and the order runs in rounds, round j holding every other owner's
// piece j in rotated order r+1, r+2, ...; this rank's own piece j follows round j + L (lag L,
// 1 <= L <= S; it waits for the others' piece j to arrive), the pieces that would follow round S
// come after the last round. L = 1 (AllReduce: reduced pieces leave early):
//
//   round 0: (r+1, 0) (r+2, 0) .. (r+W-1, 0)
//   round j: (r+1, j) .. (r+W-1, j) (r, j-1)        j = 1 .. S-1
//   last:    (r, S-1)
//
// L = S (ReduceScatter): every round, then the own pieces 0 .. S-1 (the most slack for arrivals).
//
// Compute block b of B takes linear indices b, b+B, b+2B, ...: all blocks sweep the order
// together, so the first shard is finished first (the one a rank already holds, or the one
// whose result must leave first). Every tile is visited exactly once across the B blocks
// (unit-tested on the host for many shapes and block counts).
//
// Split tail (plan_split): when the tiles do not fill the last wave (T = W*B + tail, tail < B),
// the last `tail` tiles are cut along K, so the last wave's work spreads over all blocks instead
// of leaving B - tail of them idle for a whole tile time. Two ways, whichever the cost model
// prefers:
//
// K-slices: each tail tile is cut into `split` equal slices. Work units after the W*B whole
// tiles: first every non-final slice of every tail tile (they store fp32 partials and never
// wait), then the final slices (they wait for their tile's partials, add them in slice order and
// run the epilogue). A block walks its units in increasing order, so every partial a final slice
// waits for is computed by a block that never waits before it: no deadlock.
//
//   units:  whole tiles 0 .. W*B-1 | slices 0..s-2 of tail tiles | slice s-1 of tail tiles
//
// Chunks ("stream-K" tail, `chunks` = C > 0, tail < C <= B): the tail's tail*k_iters k-blocks, in
// tile order, are cut into C equal chunks, one per block; a chunk is shorter than a tile, so it
// holds the end of one tile (piece A) and may hold the start of the next (piece B). A tile's
// pieces are its slices (slice q = its q-th piece along K, split = its piece count, at most
// TileSchedule::split); the piece holding the tile's last k-block is the final one. Each chunk is
// two work units, piece B first (a non-final piece: it never waits), then piece A (final when the
// chunk holds the tile's last k-block; it waits only for pieces in lower chunks, which never
// wait themselves). A unit whose piece is empty has k_begin == k_end: walkers skip it. Work is
// handed out per claim (claim_unit): whole tile c, or chunk c - W*B = both its units, in order.
// A block's claims only grow, so the lowest waiting final piece waits on pieces that are running
// or held by blocks whose current unit does not wait: no deadlock. With max_chunks, blocks C..B-1
// of a static walk take no chunk (their first units may wait longer than the others').
//
//   claims: whole tiles 0 .. W*B-1 | chunk 0 (units B, A) | chunk 1 | ... | chunk C-1
#pragma once

#include <cstdint>

#include "base/roles.h"  // WEFT_HD

namespace weft::kernels {

struct TileCoord {
  int32_t m_block = 0;  // tile row: rows [m_block * tile_m, ...)
  int32_t n_block = 0;  // tile column
  int32_t shard = 0;    // M-shard holding m_block
  int64_t linear = 0;   // position in the schedule (0 .. num_units-1)
  int32_t k_begin = 0;  // k-blocks [k_begin, k_end) of this unit
  int32_t k_end = 0;
  int32_t slice = 0;       // K-slice of a split tail tile (split - 1: the one that finishes it)
  int32_t split = 1;       // slices of this tile (1: whole tile)
  int32_t tail_index = 0;  // tile's index among the split tail tiles (partials, flags)
};

// The schedule's shape; a POD passed by value to kernels.
struct TileSchedule {
  int32_t m_blocks = 0;
  int32_t n_blocks = 0;
  int32_t group_m = 8;      // m-blocks per raster group (>= 1)
  int32_t num_shards = 1;   // M-shards; m_blocks % num_shards == 0
  int32_t first_shard = 0;  // shard visited first (e.g. this rank's own shard)
  int32_t k_iters = 1;      // k-blocks per tile
  int32_t split = 1;        // K-slices per tail tile (plan_split); 1: no split
  int32_t split_from = 0;   // first split tile (linear); tiles before it are whole
  int32_t chunks = 0;       // > 0: the tail is cut into this many chunks (split: most pieces a tile)
  int32_t max_chunks = 0;   // > 0: plan_split gives chunks to at most this many blocks (the others
                            //   none: e.g. blocks whose first tile waits for a peer's shard)
  int32_t pm_owners = 0;    // piece-major order (set_piece_major): W owners; 0 = rotated order
  int32_t pm_pieces = 1;    //   S pieces per owner
  int32_t pm_owner = 0;     //   r: this rank, whose own pieces run late
  int32_t pm_lag = 1;       //   L: own piece j follows round j + L

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
    out->k_iters = 1;
    out->split = 1;
    out->split_from = int32_t(mb * nb);
    out->chunks = 0;
    out->max_chunks = 0;
    out->pm_owners = 0;
    out->pm_pieces = 1;
    out->pm_owner = 0;
    out->pm_lag = 1;
    return true;
  }

  // Switches to the piece-major order drawn above; false (and *why set) unless the shards are
  // exactly owners x pieces and owner is one of them.
  bool set_piece_major(int32_t owners, int32_t pieces, int32_t owner, int32_t lag, const char** why) {
    if (owners < 2 || pieces < 1 || int64_t(owners) * pieces != num_shards || owner < 0 || owner >= owners || lag < 1 ||
        lag > pieces) {
      *why =
          "piece-major order needs num_shards = owners x pieces (owners >= 2), 0 <= owner < owners and "
          "1 <= lag <= pieces";
      return false;
    }
    pm_owners = owners;
    pm_pieces = pieces;
    pm_owner = owner;
    pm_lag = lag;
    return true;
  }

  // The shard at position `step` of the shard order (rotated, or piece-major).
  WEFT_HD int32_t shard_at(uint32_t step) const {
    if (pm_owners == 0) return int32_t((uint32_t(first_shard) + step) % uint32_t(num_shards));
    const uint32_t w = uint32_t(pm_owners), pieces = uint32_t(pm_pieces), lag = uint32_t(pm_lag);
    const uint32_t peers = w - 1;
    auto peer = [&](uint32_t pos, uint32_t piece) {
      return int32_t(((uint32_t(pm_owner) + 1 + pos) % w) * pieces + piece);
    };
    auto own = [&](uint32_t piece) { return int32_t(uint32_t(pm_owner) * pieces + piece); };
    // Rounds 0 .. a-1: the others' pieces only.
    const uint32_t a = lag < pieces - 1 ? lag : pieces - 1;
    if (step < a * peers) return peer(step % peers, step / peers);
    step -= a * peers;
    // Rounds a .. S-2: the others' piece t, then own piece t - L.
    const uint32_t b = pieces - 1 - a;
    if (step < b * w) {
      const uint32_t t = a + step / w, pos = step % w;
      return pos < peers ? peer(pos, t) : own(t - lag);
    }
    step -= b * w;
    // The last round, then the own pieces b .. S-1.
    if (step < peers) return peer(step, pieces - 1);
    return own(b + step - peers);
  }

  // Chooses the tail split for `blocks` persistent blocks (sets split, split_from, chunks; split =
  // 1 when it does not pay). Cost model in k-blocks of one block's time: whole waves are equal for
  // all choices; a unit costs its k-blocks plus `boundary_kb` (its epilogue and start), a partial
  // written or read about `fixup_kb`. K-slices (s): ceil(tail * s / blocks) rounds of k_iters / s,
  // plus s partials; chunks (C): tail * k_iters / C, plus two units' boundaries and as many
  // partials as a tile has pieces. Slices and chunks keep >= min_slice_kb k-blocks; a tile has at
  // most max_split pieces. `chunked` = false: K-slices only. Returns the tail's modelled cost
  // (k_iters + boundary_kb unsplit; 0 without a tail).
  double plan_split(int32_t blocks, int32_t max_split, bool chunked = true, int32_t min_slice_kb = 4,
                    double fixup_kb = 2.0, double boundary_kb = 4.0) {
    double best = plan_split_slices(blocks, max_split, min_slice_kb, fixup_kb, boundary_kb);
    const int64_t t = num_tiles(), tail = blocks > 0 ? t % blocks : 0;
    if (tail == 0 || max_split <= 1) return best;
    const int64_t kb = tail * k_iters;
    const int64_t most = max_chunks > 0 && max_chunks < blocks ? max_chunks : blocks;
    // With max_chunks below the block count the caller knows the other blocks start late (the
    // model does not): any chunked plan beats K-slices, which would spread the tail over them too.
    const bool late_blocks = most < blocks;
    if (late_blocks) best = 1e30;
    for (int64_t c = chunked ? most : 0; c > tail; --c) {
      // Chunks keep min_slice_kb, stay shorter than a tile (so every tile has >= 2 pieces, a chunk
      // <= 2), and the chunk math stays in 32 bits.
      if (kb / c < min_slice_kb || (kb + c - 1) / c >= k_iters || kb * (c + 1) >= (int64_t(1) << 32)) continue;
      const int32_t pieces = max_pieces(int32_t(tail), int32_t(c));
      if (pieces > max_split) continue;
      const double cost = double(kb) / double(c) + 2 * boundary_kb + fixup_kb * pieces;
      if (cost < best * 0.97) {
        best = cost;
        split = pieces;
        chunks = int32_t(c);
      }
    }
    if (late_blocks && chunks == 0) return plan_split_slices(blocks, max_split, min_slice_kb, fixup_kb, boundary_kb);
    if (split > 1) split_from = int32_t(t - tail);
    return best;
  }

  // plan_split with K-slices only (the same cost model).
  double plan_split_slices(int32_t blocks, int32_t max_split, int32_t min_slice_kb, double fixup_kb,
                           double boundary_kb) {
    split = 1;
    chunks = 0;
    split_from = int32_t(num_tiles());
    const int64_t t = num_tiles(), tail = blocks > 0 ? t % blocks : 0;
    if (tail == 0) return 0;
    double best = double(k_iters) + boundary_kb;
    for (int32_t sp = 2; sp <= max_split && k_iters / sp >= min_slice_kb; ++sp) {
      const int64_t rounds = (tail * sp + blocks - 1) / blocks;
      const double cost = double(rounds) * (double(k_iters) / sp + boundary_kb) + fixup_kb * sp;
      if (cost < best * 0.97) {
        best = cost;
        split = sp;
      }
    }
    if (split > 1) split_from = int32_t(t - tail);
    return best;
  }

  // The most pieces any of `tail` tiles has when their k-blocks are cut into `c` chunks.
  int32_t max_pieces(int32_t tail, int32_t c) const {
    const uint32_t s = uint32_t(tail) * uint32_t(k_iters);
    int32_t most = 0;
    for (int32_t i = 0; i < tail; ++i) {
      const uint32_t first = chunk_of(uint32_t(i) * uint32_t(k_iters), s, uint32_t(c));
      const uint32_t last = chunk_of(uint32_t(i + 1) * uint32_t(k_iters) - 1, s, uint32_t(c));
      most = most > int32_t(last - first + 1) ? most : int32_t(last - first + 1);
    }
    return most;
  }

  // The chunk holding tail k-block x: the largest j with j * s / c <= x.
  WEFT_HD static uint32_t chunk_of(uint32_t x, uint32_t s, uint32_t c) { return ((x + 1) * c - 1) / s; }

  // The most blocks in [lo, blocks) whose last round of work units is full once plan_split(b,
  // max_split) has cut the tail into K-slices, or 0. E.g. 2048 x 7168 tiles of 128 x 256 at K =
  // 8192 on 132 blocks leave 52 tail tiles (104 half units: 28 blocks idle in the last round); on
  // 128 blocks 64 tail tiles in K halves are 128 units, a full round.
  int32_t full_round_blocks(int32_t blocks, int32_t lo, int32_t max_split) const {
    for (int32_t b = blocks - 1; b >= lo && b > 0; --b) {
      TileSchedule t = *this;
      t.plan_split(b, max_split, false);
      if (t.num_units() % b == 0) return b;
    }
    return 0;
  }

  WEFT_HD int64_t num_units() const {
    if (chunks > 0) return split_from + 2 * int64_t(chunks);
    return split_from + int64_t(int32_t(num_tiles()) - split_from) * split;
  }
  // Claims (what a block takes at a time): whole tiles, then one per chunk (its two units), or
  // one per unit when the tail is in K-slices.
  WEFT_HD int64_t num_claims() const { return chunks > 0 ? split_from + int64_t(chunks) : num_units(); }
  // The first unit of claim v (v >= num_claims(): some unit >= num_units()).
  WEFT_HD int64_t claim_unit(int64_t v) const { return chunks > 0 && v > split_from ? 2 * v - split_from : v; }
  // Whether unit u is the first of its claim's two (a chunk's piece B, which piece A follows).
  WEFT_HD bool pair_first(int64_t u) const { return chunks > 0 && u >= split_from && ((u - split_from) & 1) == 0; }
  // Split tail tiles (0 when no split).
  WEFT_HD int32_t tail_tiles() const { return split > 1 ? int32_t(num_tiles()) - split_from : 0; }

  // Work unit `u` (< num_units()): a whole tile, or one K-slice or chunk piece of a tail tile
  // (orders above); an empty piece has k_begin == k_end == 0. kChunked = false leaves the chunk
  // code out (a kernel whose registers have no room for it; its schedule must have chunks == 0).
  template <bool kChunked = true>
  WEFT_HD TileCoord unit_at(int64_t u) const {
    if (u < split_from || split <= 1) {
      TileCoord c = tile_at(u);
      c.k_end = k_iters;
      return c;
    }
    if (kChunked && chunks > 0) return piece_at(u);
    const uint32_t w = uint32_t(u - split_from), tail = uint32_t(tail_tiles());
    const uint32_t nonfinal = tail * uint32_t(split - 1);
    uint32_t idx, sl;
    if (w < nonfinal) {
      idx = w / uint32_t(split - 1);
      sl = w - idx * uint32_t(split - 1);
    } else {
      idx = w - nonfinal;
      sl = uint32_t(split - 1);
    }
    TileCoord c = tile_at(int64_t(split_from) + idx);
    c.linear = u;
    c.split = split;
    c.slice = int32_t(sl);
    c.tail_index = int32_t(idx);
    c.k_begin = int32_t(uint32_t(k_iters) * sl / uint32_t(split));
    c.k_end = int32_t(uint32_t(k_iters) * (sl + 1) / uint32_t(split));
    return c;
  }

  // A chunk's piece (chunks > 0, u >= split_from): unit 2j is chunk j's piece B, 2j + 1 its piece A.
  WEFT_HD TileCoord piece_at(int64_t u) const {
    const uint32_t w = uint32_t(u - split_from), j = w >> 1, kt = uint32_t(k_iters);
    const uint32_t s = uint32_t(tail_tiles()) * kt, nc = uint32_t(chunks);
    const uint32_t lo_j = j * s / nc, hi_j = (j + 1) * s / nc;
    const uint32_t boundary = (lo_j / kt + 1) * kt;  // the first tile start after the chunk's start
    uint32_t lo = lo_j, hi = hi_j < boundary ? hi_j : boundary;
    if ((w & 1) == 0) {
      if (hi_j <= boundary) {
        TileCoord empty;
        empty.linear = u;
        return empty;
      }
      lo = boundary, hi = hi_j;
    }
    const uint32_t idx = lo / kt, first = idx * kt;
    const uint32_t j0 = chunk_of(first, s, nc), j1 = chunk_of(first + kt - 1, s, nc);
    TileCoord c = tile_at(int64_t(split_from) + idx);
    c.linear = u;
    c.split = int32_t(j1 - j0 + 1);
    c.slice = int32_t(j - j0);  // piece B starts its tile: j0 == j
    c.tail_index = int32_t(idx);
    c.k_begin = int32_t(lo - first);
    c.k_end = int32_t(hi - first);
    return c;
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
    c.shard = shard_at(step);
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

// One compute block's walk through a TileSchedule's work units: for (...; it.valid(); it.advance()).
// It refers to the schedule (which must outlive it) instead of copying it: in a kernel the
// schedule stays in the parameter space and its fields are read from there, not kept in the
// register-hungry GEMM consumers' registers.
// Block b takes claims b, b+B, b+2B, ... (a chunk's claim: both its units, in order). Units of
// empty pieces (k_begin == k_end) are walked too: the caller skips them. kChunked = false: the
// walk without chunks (below), for a kernel that leaves the chunk code out (unit_at<false>).
template <bool kChunked = true>
class PersistentTileIter {
 public:
  WEFT_HD PersistentTileIter(const TileSchedule& sched, int32_t block, int32_t num_blocks)
      : sched_(sched), claim_(block), unit_(int32_t(sched.claim_unit(block))), stride_(num_blocks) {}

  WEFT_HD bool valid() const { return claim_ < sched_.num_claims(); }
  WEFT_HD TileCoord current() const { return sched_.unit_at(unit_); }
  WEFT_HD void advance() {
    if (sched_.pair_first(unit_)) {
      ++unit_;
      return;
    }
    claim_ += stride_;
    unit_ = int32_t(sched_.claim_unit(claim_));
  }
  WEFT_HD int64_t linear() const { return unit_; }

 private:
  // 32-bit (fewer than 2^31 tiles, TileSchedule::make): the GEMM producer runs on 40 registers.
  const TileSchedule& sched_;
  int32_t claim_;
  int32_t unit_;
  int32_t stride_;
};

// Without chunks: every unit is a claim (the walk of GEMM+RS/AR's register-tight kernel).
template <>
class PersistentTileIter<false> {
 public:
  WEFT_HD PersistentTileIter(const TileSchedule& sched, int32_t block, int32_t num_blocks)
      : sched_(sched), next_(block), stride_(num_blocks) {}

  WEFT_HD bool valid() const { return next_ < sched_.num_units(); }
  WEFT_HD TileCoord current() const { return sched_.unit_at<false>(next_); }
  WEFT_HD void advance() { next_ += stride_; }
  WEFT_HD int64_t linear() const { return next_; }

 private:
  const TileSchedule& sched_;
  int64_t next_;
  int64_t stride_;
};

}  // namespace weft::kernels
