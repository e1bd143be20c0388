// Bytes per link, three ways: the simulator's tally of what moved, the pure function of the plans
// (kernels/nodes_plan_traffic.h), and the tuner's per-rank traffic model (runtime/tuner.cpp). The
// first two must agree link by link; the tuner's NVLink / NIC bytes per rank must agree with the
// plans' busiest rank.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "kernels/nodes_plan_traffic.h"
#include "runtime/tuner.h"
#include "runtime/workload.h"
#include "tests/ops/rank_layouts.h"
#include "tests/sim/ag_nodes_model.h"
#include "tests/sim/moe_nodes_model.h"
#include "tests/sim/rs_nodes_model.h"

using namespace weft::kernels;
using weft::Status;
using weft::sim::Link;
using weft::sim::LinkBytes;
using weft::testing::block;
using weft::testing::cyclic;
using weft::testing::Layout;
namespace rt = weft::runtime;

namespace {

const std::vector<std::pair<int, int>> kLayouts = {{1, 2}, {1, 8}, {2, 4}, {2, 8}, {4, 8}, {4, 1}, {3, 2}};

// The simulator's tally of one run, split by link kind.
PlanTraffic from_sim(const LinkBytes& b, int runs) {
  PlanTraffic t;
  for (const auto& [k, v] : b) {
    const auto [link, from, to] = k;
    (link == Link::kNic ? t.nic : t.nvlink)[{from, to}] += v / runs;
  }
  return t;
}

void check_same(const PlanTraffic& sim, const PlanTraffic& plan) {
  CHECK(sim.nvlink == plan.nvlink);
  CHECK(sim.nic == plan.nic);
}

// The tuner's demand for this op on an nodes x gpus layout.
rt::Demand demand_of(const std::string& op, const std::string& shape, int nodes, int gpus) {
  const std::string text = "op: " + op + "\nshape: " + shape + "\nlayout: {nodes: " + std::to_string(nodes) +
                           ", gpus_per_node: " + std::to_string(gpus) + "}\n";
  rt::Workload w;
  std::string err;
  REQUIRE_MESSAGE(rt::parse_workload(text, "t.yaml", &w, &err) == Status::kOk, err);
  return rt::compute_demand(w, w.layout, rt::machine_model_h200(), rt::Plan{});
}

rt::Demand demand(const std::string& op, int64_t m, int64_t n, int64_t k, int nodes, int gpus) {
  return demand_of(op, "{m: " + std::to_string(m) + ", n: " + std::to_string(n) + ", k: " + std::to_string(k) + "}",
                   nodes, gpus);
}

int64_t max_over(const std::map<std::pair<int, int>, int64_t>& m, int world, bool out) {
  int64_t best = 0;
  for (int r = 0; r < world; ++r) best = std::max(best, out ? PlanTraffic::out_of(m, r) : PlanTraffic::into(m, r));
  return best;
}

}  // namespace

TEST_CASE("AllGather+GEMM: simulated bytes per link = the plan's = the tuner's per rank") {
  const int64_t m = 24576, kk = 12288, e = 2;  // m and k divisible by every world below
  for (auto [nn, g] : kLayouts)
    for (int placement = 0; placement < 2; ++placement) {
      CAPTURE(nn);
      CAPTURE(g);
      CAPTURE(placement);
      const Layout l = placement ? cyclic(nn, g) : block(nn, g);
      const int W = nn * g;
      const int64_t shard = m / W * kk * e;
      std::vector<AgNodesPlan> plans(static_cast<size_t>(W));
      PlanTraffic plan;
      for (int r = 0; r < W; ++r) {
        std::string why;
        REQUIRE(make_ag_nodes_plan(l.node_of, l.local_of, r, &plans[size_t(r)], &why));
        plan.add(ag_nodes_traffic(plans[size_t(r)], shard));
      }
      weft::sim::AgNodesSimOptions opt;
      opt.shard_bytes = shard;
      const weft::sim::Result res = weft::sim::simulate_ag_nodes(plans, l.node_of, l.local_of, opt);
      REQUIRE_MESSAGE(res.ok(), res.text());
      check_same(from_sim(res.link_bytes, opt.runs), plan);
      const rt::Demand d = demand("ag_gemm", m, 12288, kk, nn, g);
      // Every rank moves the same bytes, so the busiest is every rank.
      CHECK(double(max_over(plan.nic, W, true)) == doctest::Approx(d.nic_out));
      CHECK(double(max_over(plan.nic, W, false)) == doctest::Approx(d.nic_in));
      CHECK(double(max_over(plan.nvlink, W, true)) == doctest::Approx(d.nvlink_out));
      CHECK(double(max_over(plan.nvlink, W, false)) == doctest::Approx(d.nvlink_in));
    }
}

TEST_CASE("GEMM+RS / GEMM+AR: simulated bytes per link = the plan's = the tuner's per rank") {
  const int64_t m = 24576, n = 4096, e = 2;
  for (auto [nn, g] : kLayouts)
    for (int ar = 0; ar < 2; ++ar) {
      CAPTURE(nn);
      CAPTURE(g);
      CAPTURE(ar);
      const Layout l = cyclic(nn, g);
      const int W = nn * g;
      const int64_t blk = m / W * n * e;
      std::vector<RsNodesPlan> plans(static_cast<size_t>(W));
      PlanTraffic plan;
      for (int r = 0; r < W; ++r) {
        std::string why;
        REQUIRE(make_rs_nodes_plan(l.node_of, l.local_of, r, rs_nodes_slots_needed(nn, g), &plans[size_t(r)], &why));
        plan.add(rs_nodes_traffic(plans[size_t(r)], blk, ar == 1));
      }
      weft::sim::RsNodesSimOptions opt;
      opt.all_reduce = ar == 1;
      opt.block_bytes = blk;
      const weft::sim::Result res = weft::sim::simulate_rs_nodes(plans, l.node_of, l.local_of, opt);
      REQUIRE_MESSAGE(res.ok(), res.text());
      check_same(from_sim(res.link_bytes, opt.runs), plan);
      const rt::Demand d = demand(ar ? "gemm_ar" : "gemm_rs", m, n, 12288, nn, g);
      CHECK(double(max_over(plan.nic, W, true)) == doctest::Approx(d.nic_out));
      CHECK(double(max_over(plan.nic, W, false)) == doctest::Approx(d.nic_in));
      CHECK(double(max_over(plan.nvlink, W, true)) == doctest::Approx(d.nvlink_out));
      CHECK(double(max_over(plan.nvlink, W, false)) == doctest::Approx(d.nvlink_in));
    }
}

// The MoE routes against the tuner's expectation under uniform routing (moe_group_hit): NIC and
// NVLink bytes per rank agree; NVLink includes the relays' forwards and gathers (the rows that
// crossed the NIC, moved on to the other destination ranks of that node and back): N (G - 1) rows
// per rank and token hit.
TEST_CASE("MoE across nodes: the plan's bytes per rank against the tuner's traffic model") {
  for (auto [nn, g] : std::vector<std::pair<int, int>>{{2, 8}, {4, 8}}) {
    CAPTURE(nn);
    CAPTURE(g);
    const int W = nn * g, tokens = 512, topk = 8, experts = 2 * W, hidden = 7168;
    const int64_t row = int64_t(hidden) * 2 + 80;
    const Layout l = block(nn, g);
    MoeNodesPlacement pl;
    std::string why;
    REQUIRE(pl.make(l.node_of, l.local_of, &why));
    const auto dests = weft::sim::moe_routing(W, tokens, topk, experts, 11);
    const PlanTraffic t = moe_nodes_traffic(pl, dests, tokens, row);
    double nic = 0, nvlink = 0;
    for (int r = 0; r < W; ++r) {
      nic += double(PlanTraffic::out_of(t.nic, r)) / W;
      nvlink += double(PlanTraffic::out_of(t.nvlink, r)) / W;
    }
    const rt::Demand d =
        demand_of("moe",
                  "{tokens: " + std::to_string(tokens * W) + ", hidden: " + std::to_string(hidden) +
                      ", ffn: 2048, experts: " + std::to_string(experts) + ", topk: " + std::to_string(topk) + "}",
                  nn, g);
    CHECK(nic == doctest::Approx(d.nic_out).epsilon(0.03));
    CHECK(nvlink == doctest::Approx(d.nvlink_out).epsilon(0.03));
    MESSAGE(nn << " x " << g << ": NVLink bytes per rank, routes " << nvlink << ", tuner " << d.nvlink_out
               << "; NIC routes " << nic << ", tuner " << d.nic_out);
  }
}
