// Host tests of the persistent tile scheduler's index math (kernels/tile_scheduler.h).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "kernels/tile_scheduler.h"

using weft::kernels::PersistentTileIter;
using weft::kernels::TileCoord;
using weft::kernels::TileSchedule;

namespace {

TileSchedule make(int64_t m, int64_t n, int group, int shards, int first) {
  TileSchedule s;
  const char* why = nullptr;
  REQUIRE_MESSAGE(TileSchedule::make(m, n, 128, 256, group, shards, first, &s, &why), (why ? why : ""));
  return s;
}

// Index of a split tile among the tail tiles (what TileCoord::tail_index must say).
int64_t tile_index_in_tail(const TileSchedule& s, const TileCoord& c) {
  for (int64_t i = s.split_from; i < s.num_tiles(); ++i) {
    const TileCoord t = s.tile_at(i);
    if (t.m_block == c.m_block && t.n_block == c.n_block) return i - s.split_from;
  }
  return -1;
}

// Walks every block's iterator; returns per-tile visit counts (row-major m_block, n_block).
std::vector<int> visits(const TileSchedule& s, int blocks) {
  std::vector<int> count(std::size_t(s.num_tiles()), 0);
  for (int b = 0; b < blocks; ++b)
    for (PersistentTileIter it(s, b, blocks); it.valid(); it.advance()) {
      TileCoord c = it.current();
      REQUIRE(c.m_block >= 0);
      REQUIRE(c.m_block < s.m_blocks);
      REQUIRE(c.n_block >= 0);
      REQUIRE(c.n_block < s.n_blocks);
      REQUIRE(c.linear == it.linear());
      // A tile's shard is the one holding its m_block.
      REQUIRE(c.shard == c.m_block / s.shard_m_blocks());
      ++count[std::size_t(c.m_block) * s.n_blocks + c.n_block];
    }
  return count;
}

}  // namespace

TEST_CASE("every tile is visited exactly once for many shapes, groups, shards and block counts") {
  const int64_t ms[] = {1, 127, 128, 129, 1000, 2048, 8192, 16384, 5 * 128 * 4};
  const int64_t ns[] = {1, 255, 256, 257, 2048, 7168, 8192};
  const int groups[] = {1, 3, 8, 16};
  const int block_counts[] = {1, 7, 116, 124, 132, 1000};
  int checked = 0;
  for (int64_t m : ms)
    for (int64_t n : ns)
      for (int g : groups)
        for (int shards : {1, 2, 4})
          for (int blocks : block_counts) {
            TileSchedule s;
            const char* why = nullptr;
            const int first = shards - 1;
            if (!TileSchedule::make(m, n, 128, 256, g, shards, first, &s, &why)) {
              // Only shard splits off the tile grid are refused.
              CHECK(shards > 1);
              continue;
            }
            std::vector<int> count = visits(s, blocks);
            for (std::size_t t = 0; t < count.size(); ++t)
              REQUIRE_MESSAGE(count[t] == 1, "tile " << t << " m " << m << " n " << n << " g " << g << " shards "
                                                     << shards << " blocks " << blocks);
            ++checked;
          }
  CHECK(checked > 500);
}

TEST_CASE("rank-rotated order starts on the caller's shard and then wraps around") {
  // 8192 rows in 4 shards of 2048 rows = 16 m-blocks each; 28 n-blocks (N = 7168).
  for (int first = 0; first < 4; ++first) {
    TileSchedule s = make(8192, 7168, 8, 4, first);
    CHECK(s.tiles_per_shard() == 16 * 28);
    for (int64_t t = 0; t < s.num_tiles(); ++t) {
      TileCoord c = s.tile_at(t);
      const int expect_shard = int((first + t / s.tiles_per_shard()) % 4);
      REQUIRE(c.shard == expect_shard);
      REQUIRE(c.m_block / 16 == expect_shard);
    }
  }
  // With 132 blocks, the first wave of tiles all belongs to the first shard.
  TileSchedule s = make(8192, 7168, 8, 4, 2);
  for (int b = 0; b < 132; ++b) CHECK(PersistentTileIter(s, b, 132).current().shard == 2);
}

TEST_CASE("piece-major order: each piece round by owner, own piece j after round j + lag, every shard once") {
  for (int owners : {2, 3, 4, 8})
    for (int pieces : {1, 2, 4, 5})
      for (int lag = 1; lag <= pieces; ++lag)
        for (int owner = 0; owner < owners; ++owner) {
          CAPTURE(owners);
          CAPTURE(pieces);
          CAPTURE(lag);
          CAPTURE(owner);
          TileSchedule s = make(128 * 2 * owners * pieces, 512, 8, owners * pieces, 0);
          const char* why = nullptr;
          REQUIRE(s.set_piece_major(owners, pieces, owner, lag, &why));
          std::vector<int> seen(std::size_t(owners * pieces), 0);
          std::vector<int> own_at(std::size_t(pieces), -1), last_other_at(std::size_t(pieces), -1);
          int prev_piece_other = 0;
          for (int step = 0; step < owners * pieces; ++step) {
            const int shard = s.shard_at(uint32_t(step));
            REQUIRE(shard >= 0);
            REQUIRE(shard < owners * pieces);
            ++seen[std::size_t(shard)];
            const int o = shard / pieces, j = shard % pieces;
            if (o == owner) {
              own_at[std::size_t(j)] = step;
            } else {
              // Other owners' pieces in piece order, owners rotated from owner + 1 inside a piece.
              REQUIRE(j >= prev_piece_other);
              prev_piece_other = j;
              last_other_at[std::size_t(j)] = step;
            }
          }
          for (int c : seen) REQUIRE(c == 1);
          for (int j = 0; j < pieces; ++j) {
            // Own piece j right after round min(j + lag, S - 1) (or after the own piece before it).
            const int round = std::min(j + lag, pieces - 1);
            REQUIRE(own_at[std::size_t(j)] > last_other_at[std::size_t(round)]);
            if (round + 1 < pieces) REQUIRE(own_at[std::size_t(j)] < last_other_at[std::size_t(round + 1)]);
            if (j > 0)
              REQUIRE(own_at[std::size_t(j)] ==
                      std::max(own_at[std::size_t(j - 1)] + 1, last_other_at[std::size_t(round)] + 1));
          }
          REQUIRE(own_at[std::size_t(pieces - 1)] == owners * pieces - 1);
          // The tiles follow the shard order and each is visited once.
          for (int b : {1, 7, 132}) {
            std::vector<int> count = visits(s, b);
            for (int c : count) REQUIRE(c == 1);
          }
          REQUIRE(s.tile_at(0).shard == ((owner + 1) % owners) * pieces);
        }
  TileSchedule s = make(1024, 256, 8, 4, 0);
  const char* why = nullptr;
  CHECK_FALSE(s.set_piece_major(3, 1, 0, 1, &why));  // 4 shards are not 3 x 1
  CHECK_FALSE(s.set_piece_major(2, 2, 2, 1, &why));  // owner out of range
  CHECK_FALSE(s.set_piece_major(2, 2, 0, 3, &why));  // lag beyond the pieces
  REQUIRE(why != nullptr);
}

TEST_CASE("grouped rasterization walks group_m m-blocks down a column before moving right") {
  TileSchedule s = make(128 * 10, 256 * 5, 4, 1, 0);
  // First group: m 0..3 down column 0, then column 1.
  for (int i = 0; i < 4; ++i) {
    CHECK(s.tile_at(i).m_block == i);
    CHECK(s.tile_at(i).n_block == 0);
    CHECK(s.tile_at(4 + i).m_block == i);
    CHECK(s.tile_at(4 + i).n_block == 1);
  }
  // Second group starts after 4 * 5 tiles at m 4.
  CHECK(s.tile_at(20).m_block == 4);
  CHECK(s.tile_at(20).n_block == 0);
  // Last group has only 2 m-blocks (8, 9): it alternates between them.
  CHECK(s.tile_at(40).m_block == 8);
  CHECK(s.tile_at(41).m_block == 9);
  CHECK(s.tile_at(41).n_block == 0);
  CHECK(s.tile_at(42).n_block == 1);
  CHECK(s.tile_at(49).m_block == 9);
  CHECK(s.tile_at(49).n_block == 4);
}

TEST_CASE("a schedule whose shards do not fall on tile boundaries is refused with a reason") {
  TileSchedule s;
  const char* why = nullptr;
  CHECK_FALSE(TileSchedule::make(1000, 256, 128, 256, 8, 4, 0, &s, &why));  // 250 rows per shard
  REQUIRE(why != nullptr);
  CHECK(std::string(why).find("multiple of the tile height") != std::string::npos);
  CHECK_FALSE(TileSchedule::make(1024, 256, 128, 256, 8, 4, 4, &s, &why));  // first shard out of range
  CHECK_FALSE(TileSchedule::make(0, 256, 128, 256, 8, 1, 0, &s, &why));
}

TEST_CASE("split tail in K-slices: every k-block of every tile computed once, final slices after all partials") {
  int split_seen = 0;
  for (int64_t mb : {3, 16, 64})
    for (int64_t nb : {1, 7, 28})
      for (int k_iters : {1, 5, 28, 128})
        for (int blocks : {1, 5, 66, 132}) {
          TileSchedule s = make(128 * mb, 256 * nb, 8, 1, 0);
          s.k_iters = k_iters;
          s.plan_split(blocks, 8, false);
          REQUIRE(s.chunks == 0);
          CAPTURE(mb);
          CAPTURE(nb);
          CAPTURE(k_iters);
          CAPTURE(blocks);
          CAPTURE(s.split);
          if (s.split > 1) ++split_seen;
          REQUIRE(s.split >= 1);
          REQUIRE(s.split <= 8);
          if (s.split > 1) {
            CHECK(k_iters / s.split >= 4);  // slices keep at least 4 k-blocks
            CHECK(s.num_tiles() % blocks != 0);
            CHECK(s.split_from == s.num_tiles() - s.num_tiles() % blocks);
          }
          std::vector<int> kb_count(std::size_t(s.num_tiles() * k_iters), 0);
          std::vector<int64_t> last_partial(std::size_t(s.num_tiles()), -1), final_unit(std::size_t(s.num_tiles()), -1);
          for (int b = 0; b < blocks; ++b)
            for (PersistentTileIter it(s, b, blocks); it.valid(); it.advance()) {
              const TileCoord c = it.current();
              const int64_t tile = int64_t(c.m_block) * s.n_blocks + c.n_block;
              REQUIRE(c.k_begin < c.k_end);
              REQUIRE(c.k_end <= k_iters);
              for (int kb = c.k_begin; kb < c.k_end; ++kb) ++kb_count[std::size_t(tile * k_iters + kb)];
              if (c.split > 1 && c.slice < c.split - 1)
                last_partial[std::size_t(tile)] = std::max(last_partial[std::size_t(tile)], c.linear);
              if (c.split > 1 && c.slice == c.split - 1) final_unit[std::size_t(tile)] = c.linear;
              if (c.split > 1) REQUIRE(c.tail_index == tile_index_in_tail(s, c));
            }
          for (int v : kb_count) REQUIRE(v == 1);
          // A block walks its units in increasing order, so a final slice that comes after every
          // partial of its tile in the global order never waits on a block that is itself waiting.
          for (std::size_t t = 0; t < last_partial.size(); ++t)
            if (final_unit[t] >= 0) REQUIRE(final_unit[t] > last_partial[t]);
        }
  CHECK(split_seen > 0);
}

TEST_CASE("split tail: the planner splits a ragged last wave and leaves full waves alone") {
  TileSchedule s = make(2048, 7168 + 0 * 256, 8, 1, 0);  // 16 x 28 = 448 tiles: 3 waves + 52
  s.k_iters = 128;
  s.plan_split(132, 8, false);
  CHECK(s.split > 1);
  CHECK(s.split_from == 396);
  CHECK(s.tail_tiles() == 52);
  CHECK(s.num_units() == 396 + 52 * s.split);
  // With chunks allowed: 6656 tail k-blocks in 132 chunks of 50-51, at most 4 pieces a tile.
  TileSchedule chunked = s;
  chunked.plan_split(132, 8);
  CHECK(chunked.chunks == 132);
  CHECK(chunked.split == 4);
  CHECK(chunked.split_from == 396);
  CHECK(chunked.num_claims() == 396 + 132);
  CHECK(chunked.num_units() == 396 + 2 * 132);
  // Chunks for the first 112 blocks only (a shard's tiles: the blocks after them wait for a peer).
  TileSchedule own_first = s;
  own_first.max_chunks = 112;
  own_first.plan_split(132, 8);
  CHECK(own_first.chunks == 112);
  CHECK(own_first.num_claims() == 396 + 112);         // blocks 112..131 take no claim after their whole tiles
  TileSchedule full = make(128 * 132, 256, 8, 1, 0);  // exactly one wave
  full.k_iters = 128;
  full.plan_split(132, 8);
  CHECK(full.split == 1);
  CHECK(full.num_units() == full.num_tiles());
  TileSchedule short_k = make(2048, 7168, 8, 1, 0);  // K too short to cut: 5 k-blocks
  short_k.k_iters = 5;
  short_k.plan_split(132, 8);
  CHECK(short_k.split == 1);
}

TEST_CASE("split tail: the most blocks below all whose last round is full") {
  TileSchedule s = make(2048, 7168, 8, 4, 0);  // 448 tiles, K = 8192
  s.k_iters = 128;
  // 132: 52 tail tiles in halves, 104 units in the last round; 131..129 no better; 128: 64 x 2.
  CHECK(s.full_round_blocks(132, 116, 8) == 128);
  CHECK(s.split == 1);                          // the schedule itself is left as it was
  TileSchedule sq = make(8192, 7168, 8, 4, 0);  // 1792 tiles = 14 x 128
  sq.k_iters = 128;
  CHECK(sq.full_round_blocks(132, 116, 8) == 128);
  // Nothing in range: 5 k-blocks cannot be cut, and no count in [125, 132) divides 448.
  TileSchedule short_k = make(2048, 7168, 8, 4, 0);
  short_k.k_iters = 5;
  CHECK(short_k.full_round_blocks(132, 125, 8) == 0);
  CHECK(short_k.full_round_blocks(132, 100, 8) == 112);  // 448 = 4 x 112
}

namespace {

// Every unit of every claim of a chunked tail, per block: block b's claims b, b+B, ... in order.
struct ChunkWalk {
  std::vector<std::vector<TileCoord>> per_block;
};

ChunkWalk walk(const TileSchedule& s, int blocks) {
  ChunkWalk w;
  w.per_block.resize(std::size_t(blocks));
  for (int b = 0; b < blocks; ++b)
    for (PersistentTileIter it(s, b, blocks); it.valid(); it.advance())
      w.per_block[std::size_t(b)].push_back(it.current());
  return w;
}

// Runs the units as blocks that claim dynamically and always hold one claim beyond the current
// one (the GEMM producer claims its next unit before the current one is done; holding it all the
// time is the worst case): a final piece runs only once every other piece of its tile has.
// Returns false when no block can move while units remain (a deadlock).
bool claims_finish(const TileSchedule& s, int blocks) {
  std::vector<int> done_pieces(std::size_t(s.num_tiles()), 0);
  using Held = std::vector<std::pair<int64_t, int64_t>>;  // (claim, unit), in order
  std::vector<Held> held(static_cast<std::size_t>(blocks));
  int64_t next_claim = 0, remaining = s.num_units();
  auto top_up = [&](Held& q) {
    while (next_claim < s.num_claims() && (q.empty() || q.front().first == q.back().first)) {
      const int64_t v = next_claim++, u = s.claim_unit(v);
      q.push_back({v, u});
      if (s.pair_first(u)) q.push_back({v, u + 1});
    }
  };
  for (int round = 0; round < 2; ++round)
    for (auto& q : held)
      if (next_claim < s.num_claims() && (q.empty() || round == 1)) {
        const int64_t v = next_claim++, u = s.claim_unit(v);
        q.push_back({v, u});
        if (s.pair_first(u)) q.push_back({v, u + 1});
      }
  while (remaining > 0) {
    bool moved = false;
    for (auto& q : held) {
      if (q.empty()) continue;
      const TileCoord c = s.unit_at(q.front().second);
      const int64_t tile = int64_t(c.m_block) * s.n_blocks + c.n_block;
      const bool piece = c.k_begin < c.k_end && c.split > 1;
      if (piece && c.slice == c.split - 1 && done_pieces[std::size_t(tile)] < c.split - 1) continue;
      if (piece) ++done_pieces[std::size_t(tile)];
      q.erase(q.begin());
      --remaining;
      moved = true;
      top_up(q);
    }
    if (!moved) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("split tail in chunks: every k-block once, pieces in K order, finals wait only on lower claims") {
  int chunked_seen = 0;
  for (int64_t mb : {3, 16, 64})
    for (int64_t nb : {1, 7, 28})
      for (int k_iters : {5, 28, 128, 1024})
        for (int blocks : {5, 66, 132, 264})
          for (int max_chunks : {0, blocks * 3 / 4}) {
            TileSchedule s = make(128 * mb, 256 * nb, 8, 1, 0);
            s.k_iters = k_iters;
            s.max_chunks = max_chunks;
            s.plan_split(blocks, 8);
            CAPTURE(max_chunks);
            if (max_chunks > 0) REQUIRE(s.chunks <= max_chunks);
            CAPTURE(mb);
            CAPTURE(nb);
            CAPTURE(k_iters);
            CAPTURE(blocks);
            CAPTURE(s.chunks);
            if (s.chunks == 0) continue;
            ++chunked_seen;
            REQUIRE(s.chunks > s.tail_tiles());
            REQUIRE(s.chunks <= blocks);
            REQUIRE(s.split >= 2);
            REQUIRE(s.split <= 8);
            const ChunkWalk w = walk(s, blocks);
            std::vector<int> kb_count(std::size_t(s.num_tiles() * k_iters), 0);
            // Per tail tile: each piece's k-range by slice, and the claim each piece belongs to.
            std::vector<std::vector<std::pair<int, int>>> ranges(std::size_t(s.num_tiles()));
            std::vector<std::vector<int64_t>> claim_of(std::size_t(s.num_tiles()));
            for (const auto& units : w.per_block) {
              for (std::size_t i = 0; i < units.size(); ++i) {
                const TileCoord& c = units[i];
                if (c.k_begin == c.k_end) {
                  REQUIRE(s.pair_first(c.linear));  // only a chunk's piece B may be empty
                  continue;
                }
                REQUIRE(c.k_begin < c.k_end);
                REQUIRE(c.k_end <= k_iters);
                const int64_t tile = int64_t(c.m_block) * s.n_blocks + c.n_block;
                for (int kb = c.k_begin; kb < c.k_end; ++kb) ++kb_count[std::size_t(tile * k_iters + kb)];
                if (c.linear < s.split_from) continue;
                REQUIRE(c.tail_index == tile_index_in_tail(s, c));
                REQUIRE(c.split >= 2);
                REQUIRE(c.split <= s.split);
                auto& r = ranges[std::size_t(tile)];
                if (r.empty())
                  r.assign(std::size_t(c.split), {-1, -1}),
                      claim_of[std::size_t(tile)].assign(std::size_t(c.split), -1);
                REQUIRE(int(r.size()) == c.split);
                REQUIRE(r[std::size_t(c.slice)].first == -1);
                r[std::size_t(c.slice)] = {c.k_begin, c.k_end};
                claim_of[std::size_t(tile)][std::size_t(c.slice)] = s.split_from + (c.linear - s.split_from) / 2;
                // A chunk's piece B (its unit comes first) never finishes a tile.
                if (s.pair_first(c.linear)) REQUIRE(c.slice < c.split - 1);
              }
            }
            for (int v : kb_count) REQUIRE(v == 1);
            for (std::size_t t = 0; t < ranges.size(); ++t) {
              const auto& r = ranges[t];
              if (r.empty()) continue;
              // Slices run along K in order and the last one ends the tile.
              CHECK(r.front().first == 0);
              CHECK(r.back().second == k_iters);
              for (std::size_t q = 1; q < r.size(); ++q) CHECK(r[q].first == r[q - 1].second);
              // The final piece's claim is the highest: it waits only on lower claims.
              for (std::size_t q = 0; q + 1 < r.size(); ++q) CHECK(claim_of[t][q] < claim_of[t].back());
            }
            REQUIRE(claims_finish(s, blocks));
          }
  CHECK(chunked_seen > 0);
}
