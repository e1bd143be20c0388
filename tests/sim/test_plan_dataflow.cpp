// The multi-node plans, executed on the data-flow simulator for every layout the tensor-parallel ops
// plan (1x2, 1x8, 2x4, 2x8, 4x8 and smaller ones), block and cyclic placements: every byte reaches
// every rank that needs it exactly once, no wait deadlocks, no read races its write. And the other
// way round: a plan missing one forward, send, copy or gate fails with a message naming it.
#include <doctest/doctest.h>

#include <string>
#include <utility>
#include <vector>

#include "kernels/ag_gemm_nodes_plan.h"
#include "kernels/gemm_reduce_nodes_plan.h"
#include "tests/ops/rank_layouts.h"
#include "tests/sim/ag_nodes_model.h"
#include "tests/sim/rs_nodes_model.h"

using namespace weft::kernels;
using namespace weft::sim;
using weft::testing::block;
using weft::testing::cyclic;
using weft::testing::Layout;

namespace {

const std::vector<std::pair<int, int>> kLayouts = {{1, 2}, {1, 8}, {2, 4}, {2, 8}, {4, 8},
                                                   {2, 1}, {4, 1}, {2, 2}, {3, 2}, {1, 4}};

std::vector<AgNodesPlan> ag_plans(const Layout& l) {
  std::vector<AgNodesPlan> plans(l.node_of.size());
  for (size_t r = 0; r < plans.size(); ++r) {
    std::string why;
    REQUIRE_MESSAGE(make_ag_nodes_plan(l.node_of, l.local_of, int(r), &plans[r], &why), why);
  }
  return plans;
}

// Planned with room for every staged partial the layout needs (G - 1 + N - 1); what the GPU
// epilogue sums today is a separate limit (EpiReduceSlots::kMaxSlots).
std::vector<RsNodesPlan> rs_plans(const Layout& l, int nodes, int per_node) {
  std::vector<RsNodesPlan> plans(l.node_of.size());
  for (size_t r = 0; r < plans.size(); ++r) {
    std::string why;
    REQUIRE_MESSAGE(
        make_rs_nodes_plan(l.node_of, l.local_of, int(r), rs_nodes_slots_needed(nodes, per_node), &plans[r], &why),
        why);
  }
  return plans;
}

}  // namespace

TEST_CASE("AllGather+GEMM: every shard reaches every rank once, for every layout and placement") {
  for (auto [n, g] : kLayouts)
    for (int placement = 0; placement < 2; ++placement) {
      const Layout l = placement ? cyclic(n, g) : block(n, g);
      CAPTURE(n);
      CAPTURE(g);
      CAPTURE(placement);
      const std::vector<AgNodesPlan> plans = ag_plans(l);
      AgNodesSimOptions opt;
      Result r = simulate_ag_nodes(plans, l.node_of, l.local_of, opt);
      CHECK_MESSAGE(r.ok(), r.text());
      CHECK(r.fired == r.actions);
      opt.compute_blocks = 3;  // tiles on three blocks: fewer orders the race check may lean on
      opt.chunks = 3;
      opt.channels = 2;
      opt.forward_blocks = 2;
      r = simulate_ag_nodes(plans, l.node_of, l.local_of, opt);
      CHECK_MESSAGE(r.ok(), r.text());
    }
}

TEST_CASE("GEMM+RS and GEMM+AR: every owner gets every partial once, for every layout and placement") {
  for (auto [n, g] : kLayouts)
    for (int placement = 0; placement < 2; ++placement)
      for (int ar = 0; ar < 2; ++ar) {
        const Layout l = placement ? cyclic(n, g) : block(n, g);
        CAPTURE(n);
        CAPTURE(g);
        CAPTURE(placement);
        CAPTURE(ar);
        const std::vector<RsNodesPlan> plans = rs_plans(l, n, g);
        RsNodesSimOptions opt;
        opt.all_reduce = ar == 1;
        Result r = simulate_rs_nodes(plans, l.node_of, l.local_of, opt);
        CHECK_MESSAGE(r.ok(), r.text());
        CHECK(r.fired == r.actions);
        opt.compute_blocks = 3;
        opt.channels = 2;
        opt.pieces = 3;
        r = simulate_rs_nodes(plans, l.node_of, l.local_of, opt);
        CHECK_MESSAGE(r.ok(), r.text());
      }
}

TEST_CASE("AllGather+GEMM: a plan missing one forward, one send, or with a forward twice, fails") {
  const Layout l = block(2, 4);
  SUBCASE("one forward target dropped: the mate waits forever, named with its position") {
    std::vector<AgNodesPlan> plans = ag_plans(l);
    AgNodesForward& f = plans[1].forwards[0];
    const auto [mate, pos] = f.to.back();
    f.to.pop_back();
    const Result r = simulate_ag_nodes(plans, l.node_of, l.local_of, {});
    REQUIRE_FALSE(r.ok());
    INFO(r.text());
    CHECK(r.mentions("deadlock: rank " + std::to_string(mate) + " (compute block 0) 'GEMM tiles of position " +
                     std::to_string(pos) + " chunk 0' waits for rank " + std::to_string(mate) + "'s flag[position " +
                     std::to_string(pos) + ", chunk 0] >= 1 (it is 0), and no action left sets it"));
  }
  SUBCASE("a whole forward dropped") {
    std::vector<AgNodesPlan> plans = ag_plans(l);
    plans[6].forwards.clear();
    const Result r = simulate_ag_nodes(plans, l.node_of, l.local_of, {});
    CHECK(r.mentions("no action left sets it"));
  }
  SUBCASE("one send dropped") {
    std::vector<AgNodesPlan> plans = ag_plans(l);
    plans[0].sends.clear();
    const Result r = simulate_ag_nodes(plans, l.node_of, l.local_of, {});
    CHECK(r.mentions("deadlock: rank 4 (compute block 0)"));
  }
  SUBCASE("a forward listed twice writes its targets twice") {
    std::vector<AgNodesPlan> plans = ag_plans(l);
    plans[2].forwards.push_back(plans[2].forwards[0]);
    const Result r = simulate_ag_nodes(plans, l.node_of, l.local_of, {});
    CHECK(r.mentions("written twice"));
  }
  SUBCASE("a forward into the wrong position delivers the wrong shard") {
    std::vector<AgNodesPlan> plans = ag_plans(l);
    std::swap(plans[2].forwards[0].to[0].second, plans[2].forwards[0].to[1].second);
    const Result r = simulate_ag_nodes(plans, l.node_of, l.local_of, {});
    CHECK(r.mentions("wrong data"));
  }
  SUBCASE("a send to a rank of the same node is refused as a plan error") {
    std::vector<AgNodesPlan> plans = ag_plans(l);
    plans[0].sends[0].peer = 1;
    const Result r = simulate_ag_nodes(plans, l.node_of, l.local_of, {});
    CHECK(r.mentions("plan error: rank 0 sends through the NIC to rank 1"));
  }
}

TEST_CASE("GEMM+RS/AR: a plan missing one send, copy, gate slot or forward fails") {
  const Layout l = block(2, 4);
  SUBCASE("one send dropped: the owner's last tile waits for the rail slot") {
    std::vector<RsNodesPlan> plans = rs_plans(l, 2, 4);
    const int peer = plans[0].sends[0].peer;
    plans[0].sends.clear();
    const Result r = simulate_rs_nodes(plans, l.node_of, l.local_of, {});
    REQUIRE_FALSE(r.ok());
    INFO(r.text());
    CHECK(r.mentions("deadlock: rank " + std::to_string(peer) +
                     " (gates) 'gate of position 7 piece 0' waits for rank " + std::to_string(peer) +
                     "'s arrived[slot 3, position 7, piece 0] >= 1 (it is 0), and no action "
                     "left sets it"));
  }
  SUBCASE("one copy dropped") {
    std::vector<RsNodesPlan> plans = rs_plans(l, 2, 4);
    plans[3].copies.pop_back();
    const Result r = simulate_rs_nodes(plans, l.node_of, l.local_of, {});
    CHECK(r.mentions("no action left sets it"));
  }
  SUBCASE("one gate slot dropped: the epilogue reads a slot nothing orders after its copy") {
    std::vector<RsNodesPlan> plans = rs_plans(l, 2, 4);
    plans[5].gate_slots[7].erase(plans[5].gate_slots[7].begin());
    RsNodesSimOptions opt;
    opt.compute_blocks = 3;
    const Result r = simulate_rs_nodes(plans, l.node_of, l.local_of, opt);
    REQUIRE_FALSE(r.ok());
    INFO(r.text());
    CHECK(r.mentions("race: rank 5 (compute block"));
    CHECK(r.mentions("reads rank 5's slot[slot 0, position 7"));
  }
  SUBCASE("AllReduce: one forward dropped leaves the mates without that owner's rows") {
    std::vector<RsNodesPlan> plans = rs_plans(l, 2, 4);
    const int f = plans[1].forwards.back();
    plans[1].forwards.pop_back();
    RsNodesSimOptions opt;
    opt.all_reduce = true;
    const Result r = simulate_rs_nodes(plans, l.node_of, l.local_of, opt);
    REQUIRE_FALSE(r.ok());
    INFO(r.text());
    CHECK(r.mentions("'wait for every owner's rows' waits for rank 0's c_arrived[owner " + std::to_string(f) +
                     ", piece 0] >= 1 (it is 0), and no action left sets it"));
  }
  SUBCASE("a copy of the wrong rows sums a partial twice or misses one") {
    std::vector<RsNodesPlan> plans = rs_plans(l, 2, 4);
    // Rank 0's copy of its own partial of a mate's rows, sent to another mate's slot instead.
    for (RsNodesCopy& c : plans[0].copies)
      if (c.from_out) {
        c.target_pos = plans[size_t(c.target)].world - 2;
        break;
      }
    const Result r = simulate_rs_nodes(plans, l.node_of, l.local_of, {});
    CHECK_FALSE(r.ok());
  }
}

TEST_CASE("layouts past 8 ranks plan; the epilogue's slot limit is separate and named") {
  for (auto [n, g] : std::vector<std::pair<int, int>>{{2, 8}, {4, 8}}) {
    const Layout l = block(n, g);
    CHECK(rs_nodes_slots_needed(n, g) == n + g - 2);
    RsNodesPlan p;
    std::string why;
    CHECK(make_rs_nodes_plan(l.node_of, l.local_of, 0, rs_nodes_slots_needed(n, g), &p, &why));
    CHECK(int(p.slots.size()) == n + g - 2);
    CHECK_FALSE(make_rs_nodes_plan(l.node_of, l.local_of, 0, 7, &p, &why));
    CHECK(why.find("staged partials") != std::string::npos);
    AgNodesPlan a;
    CHECK(make_ag_nodes_plan(l.node_of, l.local_of, n * g - 1, &a, &why));
    CHECK(int(a.order.size()) == n * g);
    // Per-rank structures grow with G and the rail peers, not with the world.
    CHECK(int(a.sends.size()) == n - 1);
    CHECK(int(a.forwards.size()) == (g > 1 ? n - 1 : 0));
    CHECK(int(a.pulls.size()) == g - 1);
  }
}

TEST_CASE("back to back without the harness's barrier: the freed flags suffice (without them AllGather's puts race)") {
  for (auto [n, g] : std::vector<std::pair<int, int>>{{2, 2}, {2, 4}, {1, 8}}) {
    CAPTURE(n);
    CAPTURE(g);
    const Layout l = cyclic(n, g);
    for (int ar = 0; ar < 2; ++ar) {
      RsNodesSimOptions opt;
      opt.barrier = false;
      opt.runs = 3;
      opt.compute_blocks = 2;
      opt.all_reduce = ar == 1;
      const Result r = simulate_rs_nodes(rs_plans(l, n, g), l.node_of, l.local_of, opt);
      CHECK_MESSAGE(r.ok(), r.text());
    }
    // AllGather+GEMM with its freed round: no race, no deadlock. Without it (the kernel before that
    // round), a rank's next run puts into a position its rail peer is still reading. On one node the
    // pulls read the mates' own shards only, which no run rewrites.
    AgNodesSimOptions opt;
    opt.barrier = false;
    opt.compute_blocks = 2;
    opt.runs = 3;
    const Result r = simulate_ag_nodes(ag_plans(l), l.node_of, l.local_of, opt);
    CHECK_MESSAGE(r.ok(), r.text());
    opt.freed = false;
    const Result raced = simulate_ag_nodes(ag_plans(l), l.node_of, l.local_of, opt);
    if (n == 1) {
      CHECK_MESSAGE(raced.ok(), raced.text());
    } else {
      CHECK(raced.mentions("race: rank"));
      CHECK(raced.mentions("(inter_send channel 0) 'put of chunk 0"));
    }
  }
}

TEST_CASE("AllGather+GEMM as a runtime op: a new shard each call needs the freed words raised at the end of a run") {
  using CopyIn = AgNodesSimOptions::CopyIn;
  for (auto [n, g] : std::vector<std::pair<int, int>>{{2, 2}, {4, 1}, {2, 4}, {1, 4}, {4, 8}}) {
    for (int placement = 0; placement < 2; ++placement) {
      const Layout l = placement ? cyclic(n, g) : block(n, g);
      CAPTURE(n);
      CAPTURE(g);
      CAPTURE(placement);
      AgNodesSimOptions opt;
      opt.barrier = false;
      opt.runs = 3;
      opt.compute_blocks = 2;
      opt.channels = 2;
      opt.forward_blocks = 2;
      // The caller's shard copied in with nothing to wait for: a node-mate's pull of run e - 1 may
      // still read position 0. (One GPU per node: the model joins this rank's proxy with its run, so
      // it cannot show the proxy's put of run e - 1 still reading; the real proxy is not joined.)
      opt.copy_in = CopyIn::kNone;
      const Result raced = simulate_ag_nodes(ag_plans(l), l.node_of, l.local_of, opt);
      if (g > 1) CHECK_MESSAGE(raced.mentions("race: rank"), raced.text());
      // Waiting for today's freed words, raised at the start of a run: each rank's copy-in waits for
      // its peers' next run, which waits for its own — no run after the first completes.
      opt.copy_in = CopyIn::kFreed;
      const Result stuck = simulate_ag_nodes(ag_plans(l), l.node_of, l.local_of, opt);
      CHECK_FALSE(stuck.ok());
      CHECK_MESSAGE(stuck.mentions("copy-in of the caller's shard"), stuck.text());
      // Freed raised once a rank's GEMM of the run is done: every byte once, no race, no deadlock,
      // each run's C from that run's shards.
      opt.copy_in = CopyIn::kFreedAtEnd;
      const Result r = simulate_ag_nodes(ag_plans(l), l.node_of, l.local_of, opt);
      CHECK_MESSAGE(r.ok(), r.text());
      CHECK(r.fired == r.actions);
      // The copy-in's waits, before the launch, already order this run's puts and forwards after
      // their targets' previous run: the kernel's own freed waits are implied (no race without them).
      opt.freed = false;
      const Result implied = simulate_ag_nodes(ag_plans(l), l.node_of, l.local_of, opt);
      CHECK_MESSAGE(implied.ok(), implied.text());
    }
  }
}
