// Host tests of the MoE data-flow math (kernels/moe_plan.h): padded offsets, the tile -> expert
// map, the dispatch layout (once per destination rank) and the slot reservation against a budget.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kernels/moe_nodes_plan.h"
#include "kernels/moe_plan.h"

using namespace weft::kernels;

namespace {

std::vector<int32_t> offsets_of(const std::vector<int32_t>& counts, int32_t tile) {
  std::vector<int32_t> off(counts.size() + 1, -1);
  moe_expert_offsets(counts.data(), int32_t(counts.size()), tile, off.data());
  return off;
}

// Every tile of the padded layout maps back to the expert whose rows it holds, each expert's
// tiles are contiguous and enough for its count, and no tile holds two experts' rows.
void check_layout(const std::vector<int32_t>& counts, int32_t tile) {
  const int32_t experts = int32_t(counts.size());
  const std::vector<int32_t> off = offsets_of(counts, tile);
  int64_t padded = 0;
  for (int32_t e = 0; e < experts; ++e) {
    CAPTURE(e);
    REQUIRE(off[e] % tile == 0);
    REQUIRE(off[e + 1] - off[e] >= counts[e]);
    REQUIRE(off[e + 1] - off[e] < counts[e] + tile);
    REQUIRE(moe_expert_tiles(off.data(), e, tile) * tile == off[e + 1] - off[e]);
    padded += moe_pad_rows(counts[e], tile);
  }
  REQUIRE(off[experts] == padded);
  const int32_t tiles = off[experts] / tile;
  std::vector<int32_t> tiles_seen(experts, 0);
  for (int32_t m = 0; m < tiles; ++m) {
    const int32_t e = moe_expert_of_tile(off.data(), experts, tile, m);
    CAPTURE(m);
    REQUIRE(e >= 0);
    REQUIRE(e < experts);
    REQUIRE(counts[e] > 0);  // never an empty expert
    REQUIRE(off[e] <= m * tile);
    REQUIRE((m + 1) * tile <= off[e + 1]);
    // The tile's first row is a real row of e (padding only at an expert's end).
    REQUIRE(m * tile - off[e] < counts[e]);
    ++tiles_seen[e];
  }
  for (int32_t e = 0; e < experts; ++e) REQUIRE(tiles_seen[e] == (counts[e] + tile - 1) / tile);
}

}  // namespace

TEST_CASE("moe offsets: hand-written cases") {
  const std::vector<int32_t> off = offsets_of({300, 0, 128, 1}, 128);
  CHECK(off == std::vector<int32_t>{0, 384, 384, 512, 640});
  CHECK(moe_expert_of_tile(off.data(), 4, 128, 0) == 0);
  CHECK(moe_expert_of_tile(off.data(), 4, 128, 2) == 0);
  CHECK(moe_expert_of_tile(off.data(), 4, 128, 3) == 2);  // expert 1 is empty
  CHECK(moe_expert_of_tile(off.data(), 4, 128, 4) == 3);
  check_layout({300, 0, 128, 1}, 128);
}

TEST_CASE("moe offsets: empty experts, all to one, counts not multiples of the tile") {
  for (int32_t experts : {1, 2, 8, 32, 128, 256}) {
    CAPTURE(experts);
    std::vector<int32_t> zero(experts, 0);
    check_layout(zero, 128);
    REQUIRE(offsets_of(zero, 128)[experts] == 0);
    for (int32_t hot : {0, experts / 2, experts - 1}) {
      std::vector<int32_t> one(experts, 0);
      one[hot] = 4096 * 8;
      check_layout(one, 128);
      one[hot] = 4097;
      check_layout(one, 128);
      REQUIRE(offsets_of(one, 128)[experts] == 33 * 128);
    }
  }
}

TEST_CASE("moe offsets: random shapes") {
  std::mt19937 rng(std::random_device{}());
  for (int trial = 0; trial < 300; ++trial) {
    const int32_t experts = 1 + int32_t(rng() % 300);
    const int32_t tile = trial % 3 == 0 ? 64 : 128;
    std::vector<int32_t> counts(experts);
    const int32_t max_count = int32_t(rng() % 1000);
    for (auto& c : counts) c = rng() % 4 == 0 ? 0 : int32_t(rng() % (max_count + 1));
    CAPTURE(trial);
    check_layout(counts, tile);
  }
}

TEST_CASE("moe dispatch: each token once per destination rank, every pair exactly once") {
  std::mt19937 rng(std::random_device{}());
  for (int trial = 0; trial < 60; ++trial) {
    const int32_t world = 1 << (rng() % 4);  // 1, 2, 4, 8
    const int32_t local = 1 + int32_t(rng() % 8);
    const int32_t experts = world * local;
    const int32_t topk = 1 + int32_t(rng() % std::min(experts, kMoeMaxTopk));
    const int32_t tokens = 1 + int32_t(rng() % 200);
    CAPTURE(world);
    CAPTURE(experts);
    CAPTURE(topk);
    // Distinct top-k experts per token, random weights.
    std::vector<int32_t> ids(size_t(tokens) * topk);
    std::vector<float> w(ids.size());
    std::vector<int32_t> all(experts);
    for (int32_t e = 0; e < experts; ++e) all[e] = e;
    for (int32_t t = 0; t < tokens; ++t) {
      std::shuffle(all.begin(), all.end(), rng);
      for (int32_t j = 0; j < topk; ++j) {
        ids[t * topk + j] = all[j];
        w[t * topk + j] = float(rng() % 1000) / 1000.f;
      }
    }
    std::vector<int32_t> owner_count(experts, 0);  // pairs each expert receives through the records
    int64_t records = 0;
    for (int32_t t = 0; t < tokens; ++t) {
      const uint32_t mask = moe_dest_mask(&ids[t * topk], topk, local);
      std::set<int32_t> want;
      for (int32_t j = 0; j < topk; ++j) want.insert(ids[t * topk + j] / local);
      REQUIRE(__builtin_popcount(mask) == int(want.size()));
      for (int32_t dst = 0; dst < world; ++dst) {
        if (!(mask >> dst & 1u)) continue;
        ++records;
        const MoeDispatchMeta m = moe_dispatch_meta(3, t, &ids[t * topk], &w[t * topk], topk, local, dst);
        REQUIRE(m.src_rank == 3);
        REQUIRE(m.src_token == t);
        REQUIRE(m.pairs >= 1);
        int32_t pairs = 0;
        for (int32_t j = 0; j < kMoeMaxTopk; ++j) {
          if (m.local_expert[j] < 0) {
            REQUIRE(m.weight[j] == 0.f);
            continue;
          }
          REQUIRE(j < topk);
          REQUIRE(m.local_expert[j] < local);
          REQUIRE(dst * local + m.local_expert[j] == ids[t * topk + j]);  // the pair keeps its place
          REQUIRE(m.weight[j] == w[t * topk + j]);
          ++owner_count[ids[t * topk + j]];
          ++pairs;
        }
        REQUIRE(pairs == m.pairs);
      }
    }
    // Every (token, expert) pair arrives exactly once; at most min(k, W) records per token.
    std::vector<int32_t> direct(experts, 0);
    for (int32_t id : ids) ++direct[id];
    REQUIRE(owner_count == direct);
    REQUIRE(records <= int64_t(tokens) * std::min(topk, world));
    REQUIRE(records >= tokens);
  }
}

TEST_CASE("moe slots: worst case bounds every routing") {
  // Mixtral, Qwen3-30B-A3B and DeepSeek-V3 sizes on 4 ranks at prefill and decode.
  const MoeShape shapes[] = {{4096, 4096, 14336, 8, 2, 4}, {256, 4096, 14336, 8, 2, 4},   {4096, 2048, 768, 128, 8, 4},
                             {256, 2048, 768, 128, 8, 4},  {4096, 7168, 2048, 256, 8, 4}, {256, 7168, 2048, 256, 8, 4}};
  for (const MoeShape& s : shapes) {
    CAPTURE(s.experts);
    CAPTURE(s.tokens);
    const int32_t l = s.local_experts();
    const int64_t worst = moe_worst_grouped_rows(s);
    REQUIRE(worst % kMoeTileRows == 0);
    // All W T received tokens to one local expert (the "all to one expert" case) ...
    std::vector<int32_t> counts(l, 0);
    counts[0] = s.world * s.tokens;
    int64_t need = 0;
    for (int32_t c : counts) need += moe_pad_rows(c, kMoeTileRows);
    REQUIRE(need <= worst);
    // ... and every received token to min(k, L) local experts, counts just past a tile multiple.
    std::fill(counts.begin(), counts.end(), 0);
    const int32_t per = std::min(s.topk, l);
    for (int32_t j = 0; j < per; ++j) counts[j] = s.world * s.tokens;
    need = 0;
    for (int32_t c : counts) need += moe_pad_rows(c, kMoeTileRows);
    REQUIRE(need <= worst);
    MoeSlotPlan p;
    const char* why = nullptr;
    REQUIRE_MESSAGE(moe_plan_slots(s, int64_t(1) << 40, &p, &why), (why ? why : ""));
    REQUIRE(p.mode == MoeSlotMode::kWorstCase);
    REQUIRE(p.grouped_rows == worst);
    REQUIRE(p.recv_slots == int64_t(s.world) * s.tokens);
    REQUIRE(p.total_bytes() > 0);
    int64_t need_rows = 0;
    REQUIRE(moe_counts_fit(p, counts.data(), l, &need_rows, &why));
    REQUIRE(need_rows == need);
  }
  // Random routings never exceed the worst case.
  std::mt19937 rng(std::random_device{}());
  for (int trial = 0; trial < 200; ++trial) {
    MoeShape s{1 + int32_t(rng() % 300), 64, 128, 0, 0, 1 << (rng() % 4)};
    s.experts = s.world * (1 + int32_t(rng() % 16));
    s.topk = 1 + int32_t(rng() % std::min(s.experts, kMoeMaxTopk));
    const int32_t l = s.local_experts();
    std::vector<int32_t> counts(l, 0);
    // Each of W T received tokens picks up to min(k, L) distinct local experts.
    std::vector<int32_t> local(l);
    for (int32_t e = 0; e < l; ++e) local[e] = e;
    for (int64_t t = 0; t < int64_t(s.world) * s.tokens; ++t) {
      std::shuffle(local.begin(), local.end(), rng);
      const int32_t picks = 1 + int32_t(rng() % std::min(s.topk, l));
      for (int32_t j = 0; j < picks; ++j) ++counts[local[j]];
    }
    int64_t need = 0;
    for (int32_t c : counts) need += moe_pad_rows(c, kMoeTileRows);
    CAPTURE(trial);
    REQUIRE(need <= moe_worst_grouped_rows(s));
  }
}

TEST_CASE("moe slots: over budget goes counts-first, overflow is refused with a message") {
  const MoeShape s{4096, 7168, 2048, 256, 8, 4};
  MoeSlotPlan worst;
  const char* why = nullptr;
  REQUIRE(moe_plan_slots(s, int64_t(1) << 40, &worst, &why));
  // A budget just below the worst case: counts first, fewer rows, still within the budget.
  MoeSlotPlan p;
  const int64_t budget = worst.total_bytes() - 1;
  REQUIRE_MESSAGE(moe_plan_slots(s, budget, &p, &why), (why ? why : ""));
  REQUIRE(p.mode == MoeSlotMode::kCountsFirst);
  REQUIRE(p.grouped_rows < worst.grouped_rows);
  REQUIRE(p.grouped_rows % kMoeTileRows == 0);
  REQUIRE(p.total_bytes() <= budget);
  // Uniform routing fits; all tokens on every local expert does not, and says why.
  const int32_t l = s.local_experts();
  std::vector<int32_t> counts(l, s.world * s.tokens * s.topk / s.experts);
  int64_t need = 0;
  why = nullptr;
  REQUIRE(moe_counts_fit(p, counts.data(), l, &need, &why));
  std::fill(counts.begin(), counts.end(), s.world * s.tokens);
  REQUIRE_FALSE(moe_counts_fit(p, counts.data(), l, &need, &why));
  REQUIRE(why != nullptr);
  CHECK(std::string(why).find("overflow") != std::string::npos);
  REQUIRE(need > p.grouped_rows);
  // A budget that cannot hold the fixed part is refused.
  why = nullptr;
  REQUIRE_FALSE(moe_plan_slots(s, worst.recv_bytes, &p, &why));
  REQUIRE(why != nullptr);
  CHECK(std::string(why).find("heap budget") != std::string::npos);
}

TEST_CASE("moe shape: invalid shapes are refused with a reason") {
  MoeSlotPlan p;
  const char* why = nullptr;
  CHECK_FALSE(moe_plan_slots(MoeShape{4096, 4096, 14336, 8, 9, 1}, int64_t(1) << 40, &p, &why));  // topk > experts
  CHECK(why != nullptr);
  CHECK_FALSE(moe_plan_slots(MoeShape{4096, 4096, 14336, 10, 2, 4}, int64_t(1) << 40, &p, &why));  // uneven split
  CHECK_FALSE(moe_plan_slots(MoeShape{4096, 4096, 100, 8, 2, 4}, int64_t(1) << 40, &p, &why));     // ffn % 128
  CHECK_FALSE(moe_plan_slots(MoeShape{0, 4096, 14336, 8, 2, 4}, int64_t(1) << 40, &p, &why));
  CHECK(MoeShape{4096, 4096, 14336, 8, 2, 4}.invalid() == nullptr);
}

TEST_CASE("moe grouped tile order: every (row tile, n block) exactly once") {
  for (int32_t m_tiles : {0, 1, 3, 16, 17, 100, 257})
    for (int32_t n_blocks : {1, 3, 8, 112})
      for (int32_t group : {1, 8, 16}) {
        CAPTURE(m_tiles);
        CAPTURE(n_blocks);
        CAPTURE(group);
        std::vector<int> seen(size_t(m_tiles) * n_blocks, 0);
        int32_t prev_group = 0;
        for (int64_t u = 0; u < int64_t(m_tiles) * n_blocks; ++u) {
          int32_t m = -1, nb = -1;
          moe_grouped_tile_at(u, m_tiles, n_blocks, group, &m, &nb);
          REQUIRE(m >= 0);
          REQUIRE(m < m_tiles);
          REQUIRE(nb >= 0);
          REQUIRE(nb < n_blocks);
          REQUIRE(m / group >= prev_group);  // groups in order
          prev_group = m / group;
          ++seen[size_t(m) * n_blocks + nb];
        }
        for (int v : seen) REQUIRE(v == 1);
      }
}

TEST_CASE("moe heap layout: regions in order, aligned, disjoint; worst case or counts first; round trip") {
  for (int world : {1, 2, 4, 8})
    for (int tokens : {1, 200, 4096})
      for (int hidden : {8, 2048, 7168}) {
        MoeShape s;
        s.tokens = tokens, s.hidden = hidden, s.ffn = 128, s.experts = 8 * world, s.topk = 2, s.world = world;
        CAPTURE(world);
        CAPTURE(tokens);
        CAPTURE(hidden);
        const char* why = nullptr;
        MoeHeapLayout h;
        REQUIRE(moe_heap_layout(s, 0, &h, &why));
        CHECK(h.mode == MoeSlotMode::kWorstCase);
        CHECK(h.grouped_rows == moe_worst_grouped_rows(s));
        CHECK(h.recv_offset == 0);
        CHECK(h.recv_bytes == int64_t(world) * tokens * moe_slot_bytes(hidden));
        CHECK(h.combine_bytes == int64_t(world) * tokens * hidden * 2);
        for (int64_t off : {h.combine_offset, h.flags_offset, h.x_offset, h.h_offset, h.y_offset})
          CHECK(off % 256 == 0);
        CHECK(h.combine_offset >= h.recv_offset + h.recv_bytes);
        CHECK(h.flags_offset >= h.combine_offset + h.combine_bytes);
        CHECK(h.x_offset >= h.flags_offset + h.flags_bytes);
        CHECK(h.h_offset == h.x_offset + h.grouped_rows * hidden * 2);
        CHECK(h.y_offset == h.h_offset + h.grouped_rows * 128 * 2);
        CHECK(h.flags_bytes == 16 * world + 8 * world * ((s.tokens + 127) / 128));
        CHECK(h.total_bytes % 4096 == 0);
        CHECK(h.total_bytes >= h.y_offset + h.grouped_rows * hidden * 2);
        // A budget the worst case fits keeps it; the total fed back gives the same layout.
        MoeHeapLayout same;
        REQUIRE(moe_heap_layout(s, h.total_bytes, &same, &why));
        CHECK(same.mode == MoeSlotMode::kWorstCase);
        CHECK(same.grouped_rows == h.grouped_rows);
        // Half the grouped bytes: counts first, whole tiles, at least one per local expert, and again
        // the same layout from its own total.
        const int64_t row_bytes = (2 * int64_t(hidden) + 128) * 2;
        const int64_t budget = h.x_offset + h.grouped_rows * row_bytes / 2;
        MoeHeapLayout half;
        if (!moe_heap_layout(s, budget, &half, &why)) {
          CHECK(std::string(why).find("heap budget too small") == 0);
          CHECK(budget < h.x_offset + int64_t(8) * 128 * row_bytes);
          continue;
        }
        CHECK(half.mode == MoeSlotMode::kCountsFirst);
        CHECK(half.grouped_rows % 128 == 0);
        CHECK(half.grouped_rows >= 8 * 128);
        CHECK(half.grouped_rows < h.grouped_rows);
        CHECK(half.total_bytes <= budget + 4095);
        MoeHeapLayout back;
        REQUIRE(moe_heap_layout(s, half.total_bytes, &back, &why));
        CHECK(back.mode == MoeSlotMode::kCountsFirst);
        CHECK(back.grouped_rows == half.grouped_rows);
        CHECK(back.total_bytes == half.total_bytes);
      }
}

TEST_CASE("moe across nodes: the cross-node regions in order, aligned, disjoint, sized by N, G, C and T") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int N = 2 + int(rng() % 7), G = 1 + int(rng() % 4), C = 1 + int(rng() % 8);
    weft::kernels::MoeShape s;
    s.world = N * G;
    s.tokens = 1 + int32_t(rng() % 5000);
    s.hidden = 8 * (1 + int32_t(rng() % 1024));
    s.ffn = 128 * (1 + int32_t(rng() % 16));
    s.experts = s.world * (1 + int32_t(rng() % 4));
    s.topk = 1 + int32_t(rng() % std::min<int32_t>(8, s.experts));
    const int64_t base = 4096 * int64_t(1 + rng() % 1000);
    weft::kernels::MoeNodesHeap h;
    const char* why = nullptr;
    REQUIRE_MESSAGE(weft::kernels::moe_nodes_heap(s, N, G, C, base, &h, &why), why);
    const int64_t T = s.tokens, row = int64_t(s.hidden) * 2;
    // A block holds the route (a count word and T int32) and T compact slots.
    CHECK(h.route_bytes >= 16 + 4 * T);
    CHECK(h.block_bytes >= h.route_bytes + T * weft::kernels::moe_slot_bytes(s.hidden));
    struct Region {
      int64_t at, bytes;
    };
    const std::vector<Region> regions = {{h.rail_out_offset, N * h.block_bytes},
                                         {h.rail_in_offset, N * h.block_bytes},
                                         {h.node_comb_offset, int64_t(N) * G * T * row},
                                         {h.comb_out_offset, N * T * row},
                                         {h.comb_in_offset, N * T * row},
                                         {h.flags_offset, h.flags_bytes}};
    int64_t end = base;
    for (const Region& r : regions) {
      CHECK(r.at % 256 == 0);
      CHECK(r.at >= end);  // in order, none overlapping the one before or the one-node layout
      end = r.at + r.bytes;
    }
    CHECK(h.flags_bytes == 2 * N * C * 8);  // [2 N][C]: dispatch and combine words per node and channel
    CHECK(h.total_bytes >= end);
    CHECK(h.total_bytes % 4096 == 0);
    // Laid out from 0, the regions' size is what any base adds (the op and the plan rely on it).
    weft::kernels::MoeNodesHeap h0;
    REQUIRE(weft::kernels::moe_nodes_heap(s, N, G, C, 0, &h0, &why));
    CHECK(h.total_bytes == base + h0.total_bytes);
  }
  weft::kernels::MoeShape s;
  s.world = 4, s.tokens = 64, s.hidden = 256, s.ffn = 128, s.experts = 8, s.topk = 2;
  weft::kernels::MoeNodesHeap h;
  const char* why = nullptr;
  CHECK(!weft::kernels::moe_nodes_heap(s, 1, 4, 1, 0, &h, &why));  // one node: not a cross-node layout
  CHECK(std::string(why).find("2 or more nodes") != std::string::npos);
  CHECK(!weft::kernels::moe_nodes_heap(s, 2, 3, 1, 0, &h, &why));  // 6 ranks for a world of 4
  CHECK(!weft::kernels::moe_nodes_heap(s, 2, 2, 0, 0, &h, &why));
  CHECK(std::string(why).find("1 to 8 proxy channels") != std::string::npos);
  CHECK(!weft::kernels::moe_nodes_heap(s, 2, 2, 9, 0, &h, &why));
  s.topk = 9;
  CHECK(!weft::kernels::moe_nodes_heap(s, 2, 2, 1, 0, &h, &why));  // the shape's own check
}

TEST_CASE("moe split over K: the most parts that fit one wave of the blocks") {
  // Down on 132 blocks, two slots per block, ffn 14336 (224 k-blocks).
  CHECK(moe_split_parts(64, 224, 132, 264) == 2);  // one wave of half-K units (3 parts: 192 units)
  CHECK(moe_split_parts(66, 224, 132, 264) == 2);  // 132 units: exactly one wave
  CHECK(moe_split_parts(67, 224, 132, 264) == 1);  // 134 units: two waves
  CHECK(moe_split_parts(80, 224, 132, 264) == 1);  // Mixtral-8x7B at 256 tokens on 4 ranks (5 row tiles x 16)
  CHECK(moe_split_parts(40, 224, 132, 264) == 3);  // 120 units
  CHECK(moe_split_parts(33, 224, 132, 264) == 4);  // 132 units
  CHECK(moe_split_parts(64, 224, 132, 100) == 1);  // 128 units do not fit the slots
  CHECK(moe_split_parts(1, 224, 132, 264) == 4);   // one pair: as many parts as allowed
  CHECK(moe_split_parts(1, 12, 132, 264) == 3);    // 4 k-blocks a part at least
  CHECK(moe_split_parts(64, 7, 132, 264) == 1);
  CHECK(moe_split_parts(132, 224, 132, 264) == 1);  // a full wave already
  CHECK(moe_split_parts(256, 12, 132, 264) == 1);   // Qwen3-30B-A3B at 256 tokens (32 row tiles x 8)
  CHECK(moe_split_parts(1024, 224, 132, 264) == 1);
  CHECK(moe_split_parts(0, 224, 132, 264) == 1);
  CHECK(moe_split_parts(-1, 224, 132, 264) == 1);
  CHECK(moe_split_parts(10, 224, 0, 264) == 1);
  // Properties over a range: the parts fit one wave, the slots and the k-blocks, and one more part
  // would not.
  for (int64_t tiles = 1; tiles < 400; ++tiles)
    for (int32_t k : {1, 7, 8, 12, 16, 224})
      for (int32_t slots : {100, 132, 264}) {
        const int32_t p = moe_split_parts(tiles, k, 132, slots);
        CAPTURE(tiles);
        CAPTURE(k);
        CAPTURE(slots);
        CHECK(p >= 1);
        CHECK(p <= kMoeMaxSplit);
        if (p > 1) {
          CHECK(tiles * p <= 132);
          CHECK(tiles * p <= slots);
          CHECK(k >= p * kMoeMinSplitIters);
        }
        if (p < kMoeMaxSplit) {
          const int32_t q = p == 1 ? 2 : p + 1;
          CHECK((tiles * q > 132 || tiles * q > slots || k < q * kMoeMinSplitIters));
        }
      }
}

TEST_CASE("moe split over K: gate/up's last, partial wave where every row tile is in one group") {
  int64_t first = -1;
  // Mixtral-8x7B at 256 tokens on 4 ranks: 5 row tiles x 112 column blocks = 560 units on 132
  // blocks, 32 of them in a fifth wave: 4 parts of 16 k-blocks (hidden 4096).
  CHECK(moe_up_tail_parts(560, 5, 16, 64, 132, 264, 4, &first) == 4);
  CHECK(first == 528);
  // 6 row tiles (672 units): 12 left over, 4 parts (the cap); the plan's split_k caps it.
  CHECK(moe_up_tail_parts(672, 6, 16, 64, 132, 264, 4, &first) == 4);
  CHECK(first == 660);
  CHECK(moe_up_tail_parts(672, 6, 16, 64, 132, 264, 2, &first) == 2);
  CHECK(moe_up_tail_parts(672, 6, 16, 64, 132, 264, 1, &first) == 1);
  CHECK(first == 672);
  // 4 row tiles (448 units): 52 left over, 2 parts.
  CHECK(moe_up_tail_parts(448, 4, 16, 64, 132, 264, 4, &first) == 2);
  CHECK(first == 396);
  // Qwen3-30B-A3B at 256 tokens on 4 ranks: 32 row tiles in two groups: down units of the first
  // group fill the last wave, nothing split.
  CHECK(moe_up_tail_parts(192, 32, 16, 32, 132, 264, 4, &first) == 1);
  CHECK(first == 192);
  // A whole number of waves, or a last wave too full for 2 parts: nothing split.
  CHECK(moe_up_tail_parts(528, 5, 16, 64, 132, 264, 4, &first) == 1);
  CHECK(moe_up_tail_parts(660, 6, 16, 64, 132, 264, 4, &first) == 1);  // 660 % 132 = 0
  CHECK(moe_up_tail_parts(600, 6, 16, 64, 132, 264, 4, &first) == 1);  // 72 left: 144 units
  CHECK(first == 600);
  // Fewer units than blocks: all of them are the last wave.
  CHECK(moe_up_tail_parts(60, 1, 16, 64, 132, 264, 4, &first) == 2);
  CHECK(first == 0);
  // The slots left over bound it; so do the k-blocks (4 a part at least).
  CHECK(moe_up_tail_parts(560, 5, 16, 64, 132, 100, 4, &first) == 3);
  CHECK(moe_up_tail_parts(560, 5, 16, 8, 132, 264, 4, &first) == 2);
  CHECK(moe_up_tail_parts(0, 0, 16, 64, 132, 264, 4, &first) == 1);
  CHECK(first == 0);
  CHECK(moe_up_tail_parts(560, 5, 16, 64, 0, 264, 4, &first) == 1);
  // Properties: the split units are the last ones, fewer than the blocks, and their parts fit one wave.
  for (int64_t units = 1; units < 1200; units += 7)
    for (int32_t blocks : {1, 2, 66, 132}) {
      const int32_t p = moe_up_tail_parts(units, 8, 16, 64, blocks, 2 * blocks, 4, &first);
      CAPTURE(units);
      CAPTURE(blocks);
      CHECK(p >= 1);
      CHECK(p <= 4);
      if (p == 1) {
        CHECK(first == units);
      } else {
        CHECK(first % blocks == 0);
        CHECK(units - first < blocks);
        CHECK((units - first) * p <= blocks);
      }
    }
}
