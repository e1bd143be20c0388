// The fused MoE launch (kernels/moe_fused_plan.h) on the data-flow simulator: a rank's tickets taken
// in order by its blocks, calls back to back. Every token reaches each destination once, each of its
// (token, local expert) pairs is one row of X in its expert's tile, every home sums each of the
// token's experts once; no deadlock, no race across calls; each wait left out fails.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "kernels/moe_fused_plan.h"
#include "tests/sim/moe_fused_model.h"

using namespace weft::kernels;
using namespace weft::sim;

namespace {

MoeFusedRun make_run(int world, int tokens, int experts, int topk, int blocks, MoeRouting how, int calls,
                     uint64_t seed) {
  MoeFusedRun run;
  run.shape.world = world;
  run.shape.tokens = tokens;
  run.shape.experts = experts;
  run.shape.topk = topk;
  run.shape.up_cols = 2;
  run.shape.down_cols = 2;
  run.shape.chunk = 64;
  run.blocks = blocks;
  for (int c = 0; c < calls; ++c)
    run.calls.push_back(moe_choices(world, tokens, experts, topk, how, seed + uint64_t(c) * 7919));
  return run;
}

}  // namespace

TEST_CASE("the fused launch's tickets: phases in order, every unit once, the worst case bounds the tiles") {
  MoeFusedShape s;
  s.world = 4, s.tokens = 333, s.experts = 16, s.topk = 2, s.up_cols = 3, s.down_cols = 2, s.chunk = 100;
  REQUIRE(s.invalid() == nullptr);
  CHECK(s.token_tiles() == 3);
  CHECK(s.slot_chunks() == 4);
  const int64_t n = moe_fused_first(s, MoePhase::kEnd);
  int64_t seen[kMoePhases] = {};
  MoePhase last = MoePhase::kRoute;
  for (int64_t t = 0; t < n; ++t) {
    const MoeUnit u = moe_fused_unit(s, t);
    REQUIRE(u.phase != MoePhase::kEnd);
    CHECK(int(u.phase) >= int(last));  // phases never go back
    last = u.phase;
    ++seen[int(u.phase)];
  }
  for (int p = 0; p < kMoePhases; ++p) CHECK(seen[p] == moe_fused_units(s, MoePhase(p)));
  CHECK(moe_fused_unit(s, n).phase == MoePhase::kEnd);
  CHECK(moe_fused_units(s, MoePhase::kArrange) == 4 * 4);
  CHECK(moe_fused_units(s, MoePhase::kRelease) == 1);
  CHECK(moe_fused_units(s, MoePhase::kUp) == int64_t(s.worst_tiles()) * 3);
  // All of every rank's 333 tokens to one local expert: 4 x 333 rows, 11 tiles of 128 at most.
  CHECK(s.worst_tiles() >= 11);
  MoeFusedShape bad = s;
  bad.experts = 15;
  CHECK(bad.invalid() != nullptr);
  bad = s;
  bad.world = 9;
  CHECK(bad.invalid() != nullptr);
}

TEST_CASE("the words: two sets that do not overlap, the epoch words after them") {
  MoeFusedShape s;
  s.world = 4, s.tokens = 4096, s.experts = 64, s.topk = 8, s.up_cols = 12, s.down_cols = 16;
  REQUIRE(s.invalid() == nullptr);
  const MoeFusedWords w = moe_fused_words(s);
  const int64_t G = s.worst_tiles();
  // Each array's words inside one set, none shared.
  std::vector<int> used(size_t(w.total), 0);
  auto mark = [&](int64_t at, int64_t n) {
    for (int64_t i = at; i < at + n; ++i) ++used[size_t(i)];
  };
  for (uint64_t epoch : {1, 2}) {
    mark(w.in_set(w.ticket, epoch), 1);
    mark(w.in_set(w.routed, epoch), 1);
    mark(w.in_set(w.counts_in, epoch), 1);
    mark(w.in_set(w.arranged, epoch), 1);
    mark(w.in_set(w.sent, epoch), s.world);
    mark(w.in_set(w.combined, epoch), s.world);
    mark(w.in_set(w.rows, epoch), G);
    mark(w.in_set(w.up_done, epoch), G);
    mark(w.in_set(w.down_done, epoch), G);
  }
  mark(w.freed, s.world);
  for (size_t i = 0; i < used.size(); ++i) REQUIRE_MESSAGE(used[i] == 1, "word " << i);
  CHECK(w.in_set(w.ticket, 3) == w.in_set(w.ticket, 1));  // calls 1 and 3 share a set
  CHECK(w.in_set(w.ticket, 1) == w.per_set);              // call e uses set e % 2
  CHECK(w.in_set(w.ticket, 2) == 0);
  // 4096 tokens x 4 sources x min(8, 16) experts: at most 4096 x 4 x 8 rows, in tiles of 128.
  CHECK(G <= 4096 * 4 * 8 / 128 + 16);
}

TEST_CASE("tile rows and X rows from the counts") {
  // 2 local experts; source 0 sends 130 rows for expert 0 and 5 for expert 1; source 1 sends 3 and 0.
  const int32_t L = 2, counts[4] = {130, 5, 3, 0}, totals[2] = {133, 5};
  int32_t offsets[3];
  moe_expert_offsets(totals, L, kMoeTileRows, offsets);
  CHECK(offsets[1] == 256);
  CHECK(offsets[2] == 384);
  CHECK(moe_fused_tile_rows(offsets, totals, L, 0) == 128);
  CHECK(moe_fused_tile_rows(offsets, totals, L, 1) == 5);
  CHECK(moe_fused_tile_rows(offsets, totals, L, 2) == 5);
  CHECK(moe_fused_tile_rows(offsets, totals, L, 3) == 0);
  CHECK(moe_fused_row(offsets, counts, L, 0, 0, 0) == 0);
  CHECK(moe_fused_row(offsets, counts, L, 1, 0, 2) == 132);  // after source 0's 130
  CHECK(moe_fused_row(offsets, counts, L, 0, 1, 4) == 260);
}

TEST_CASE("every token once to each destination and back summed once, no deadlock, no race") {
  struct Case {
    int world, tokens, experts, topk, blocks;
    MoeRouting how;
  };
  const Case cases[] = {
      {1, 200, 4, 2, 3, MoeRouting::kUniform},   {2, 100, 8, 2, 2, MoeRouting::kUniform},
      {2, 257, 4, 1, 5, MoeRouting::kSkewed},    {4, 96, 16, 4, 3, MoeRouting::kUniform},
      {4, 333, 8, 2, 7, MoeRouting::kSkewed},    {4, 300, 8, 8, 4, MoeRouting::kOne},
      {4, 64, 32, 2, 1, MoeRouting::kUniform},   {8, 40, 16, 2, 6, MoeRouting::kUniform},
      {4, 200, 16, 4, 132, MoeRouting::kSkewed}, {4, 150, 8, 2, 3, MoeRouting::kByHome},
      {2, 129, 8, 1, 2, MoeRouting::kByHome},
  };
  for (const Case& c : cases) {
    CAPTURE(c.world);
    CAPTURE(c.tokens);
    CAPTURE(c.topk);
    CAPTURE(c.blocks);
    MoeFusedRun run = make_run(c.world, c.tokens, c.experts, c.topk, c.blocks, c.how, 2, 17);
    for (uint64_t seed : {0, 1, 2, 3}) {  // the blocks' interleavings
      CAPTURE(seed);
      run.schedule = seed;
      const Result r = simulate_moe_fused(run);
      CHECK_MESSAGE(r.ok(), r.text());
      CHECK(r.fired > 0);
    }
  }
}

TEST_CASE("each wait left out is caught in some interleaving: a race, data of another call, missing data or a hang") {
  using M = MoeRouting;
  struct Drop {
    MoeFusedDrop drop;
    const char* name;
    std::vector<MoeRouting> calls;  // one routing per call: what it takes for the wait to matter
    int blocks;
  };
  const std::vector<M> uniform(4, M::kUniform);
  const Drop drops[] = {
      {MoeFusedDrop::kRouted, "routed", uniform, 3},
      {MoeFusedDrop::kSent, "sent", uniform, 3},
      {MoeFusedDrop::kCountsIn, "counts_in", uniform, 3},
      {MoeFusedDrop::kRows, "rows", uniform, 3},
      {MoeFusedDrop::kUpDone, "up_done", uniform, 3},
      // a block whose first ticket is a combine: nothing else of it orders the headers' read
      {MoeFusedDrop::kArrangedCombine, "combine's arranged", uniform, 96},
      {MoeFusedDrop::kDownDone, "down_done", uniform, 3},
      {MoeFusedDrop::kCombined, "combined", uniform, 3},
      // a source that sends an owner nothing in one call and something in the next
      {MoeFusedDrop::kFreed, "freed", {M::kByHome, M::kUniform, M::kUniform, M::kByHome, M::kUniform}, 3},
      // Not here: the release's counts_in (kReleaseCounts). It keeps a source's late add of the last
      // call out of the set being zeroed; no interleaving of 1500 tried with its calls' routings (a
      // source sending an owner nothing for two calls, then something) showed the late add, so its
      // need rests on the argument in kernels/moe_fused_plan.h.
  };
  for (const Drop& d : drops) {
    const std::string which = d.name;
    CAPTURE(which);
    int caught = 0;
    for (uint64_t seed = 0; seed < 120 && caught == 0; ++seed) {
      MoeFusedRun run = make_run(4, 150, 8, 2, d.blocks, M::kUniform, 0, 0);
      for (size_t c = 0; c < d.calls.size(); ++c)
        run.calls.push_back(moe_choices(4, 150, 8, 2, d.calls[c], 5 + seed * 31 + c));
      run.schedule = seed;
      REQUIRE_MESSAGE(simulate_moe_fused(run).ok(), "with every wait, seed " << seed);
      run.drop = d.drop;
      const Result r = simulate_moe_fused(run);
      if (!r.ok()) {
        ++caught;
        CHECK_MESSAGE(
            (r.mentions("race") || r.mentions("wrong data") || r.mentions("missing data") || r.mentions("deadlock")),
            r.text());
      }
    }
    CHECK_MESSAGE(caught > 0, "no interleaving of 120 showed it");
  }
}
