// Expert-parallel MoE routes across nodes (kernels/moe_nodes_plan.h) on the data-flow simulator,
// for groups of 1 x 8 up to 128 x 8 GPUs, block and cyclic placements: every token reaches every
// destination rank once and every home sums each destination's row once, without deadlock; the
// simulated bytes per link equal the plan's; a plan missing a rail peer fails, naming the wait.
#include <doctest/doctest.h>

#include <string>
#include <utility>
#include <vector>

#include "kernels/moe_nodes_plan.h"
#include "kernels/nodes_plan_traffic.h"
#include "tests/ops/rank_layouts.h"
#include "tests/sim/moe_nodes_model.h"

using namespace weft::kernels;
using namespace weft::sim;
using weft::testing::block;
using weft::testing::cyclic;
using weft::testing::Layout;

namespace {

struct Setup {
  MoeNodesPlacement pl;
  std::vector<MoeNodesPlan> plans;
};

Setup setup(const Layout& l) {
  Setup s;
  std::string why;
  REQUIRE_MESSAGE(s.pl.make(l.node_of, l.local_of, &why), why);
  s.plans.resize(l.node_of.size());
  for (size_t r = 0; r < s.plans.size(); ++r) REQUIRE(make_moe_nodes_plan(s.pl, int(r), &s.plans[r], &why));
  return s;
}

PlanTraffic from_sim(const LinkBytes& b) {
  PlanTraffic t;
  for (const auto& [k, v] : b) {
    const auto [link, from, to] = k;
    (link == Link::kNic ? t.nic : t.nvlink)[{from, to}] += v;
  }
  return t;
}

constexpr int64_t kRow = 7168 * 2 + 80;  // hidden 7168 bf16 + the dispatch header (topk 8)

}  // namespace

TEST_CASE("MoE across nodes: every token reaches its experts' ranks once and comes back summed once") {
  for (auto [n, g] : std::vector<std::pair<int, int>>{{1, 8}, {2, 4}, {2, 8}, {4, 8}, {16, 8}, {128, 8}})
    for (int placement = 0; placement < 2; ++placement) {
      CAPTURE(n);
      CAPTURE(g);
      CAPTURE(placement);
      const Layout l = placement ? cyclic(n, g) : block(n, g);
      const Setup s = setup(l);
      const int W = n * g, tokens = W >= 1024 ? 2 : 8, experts = 2 * W;
      const auto dests = moe_routing(W, tokens, 8, experts, 7 + uint64_t(W));
      const bool races = W <= 64;  // vector clocks of 6 K streams for 300 K actions: too big
      const Result r = simulate_moe_nodes(s.plans, s.pl, dests, tokens, kRow, races);
      REQUIRE_MESSAGE(r.ok(), r.text());
      CHECK(r.fired == r.actions);
      const PlanTraffic plan = moe_nodes_traffic(s.pl, dests, tokens, kRow);
      const PlanTraffic sim = from_sim(r.link_bytes);
      CHECK(sim.nvlink == plan.nvlink);
      CHECK(sim.nic == plan.nic);
      // Per-rank structures: G - 1 NVLink peers and N - 1 rail peers.
      for (const MoeNodesPlan& p : s.plans) {
        CHECK(int(p.mates.size()) == g - 1);
        CHECK(int(p.rails.size()) == n - 1);
      }
    }
}

TEST_CASE("MoE across nodes: a plan missing a rail peer or a mate deadlocks, naming the wait") {
  const Layout l = block(4, 8);
  const auto dests = moe_routing(32, 8, 8, 64, 3);
  SUBCASE("a rail peer dropped") {
    Setup s = setup(l);
    const int q = s.plans[9].rails.back();
    s.plans[9].rails.pop_back();
    const Result r = simulate_moe_nodes(s.plans, s.pl, dests, 8, kRow, true);
    REQUIRE_FALSE(r.ok());
    INFO(r.text());
    CHECK(r.mentions("deadlock: rank " + std::to_string(q) + " (forward)"));
    CHECK(r.mentions("dispatch_rail[from node 1] >= 1 (it is 0), and no action left sets it"));
  }
  SUBCASE("a mate dropped") {
    Setup s = setup(l);
    s.plans[0].mates.erase(s.plans[0].mates.begin());
    const Result r = simulate_moe_nodes(s.plans, s.pl, dests, 8, kRow, true);
    REQUIRE_FALSE(r.ok());
    CHECK(r.mentions("deadlock: rank 1 (expert)"));
  }
}

TEST_CASE("MoE placement: uneven or doubled local indices are refused with the reason") {
  MoeNodesPlacement pl;
  std::string why;
  CHECK_FALSE(pl.make({0, 0, 1}, {0, 1, 0}, &why));
  CHECK(why.find("evenly") != std::string::npos);
  CHECK_FALSE(pl.make({0, 0, 1, 1}, {0, 0, 0, 1}, &why));
  CHECK(why.find("share node 0 local index 0") != std::string::npos);
}
