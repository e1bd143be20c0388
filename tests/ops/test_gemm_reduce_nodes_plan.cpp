// The multi-node GEMM+RS/AR plan, run as a simulation of the data flow: every rank computes its
// positions in order, a position starts only when the arrivals its gate names are in, copies and
// sends deliver into the targets' slots. Every owner's result must contain every rank's partial
// exactly once, nothing may deadlock, no slot piece is written twice or read before it is written,
// and the AllReduce paths deliver every owner's rows to every rank exactly once.
#include <doctest/doctest.h>

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/gemm_reduce_nodes_plan.h"
#include "tests/ops/rank_layouts.h"

using namespace weft::kernels;
using weft::testing::block;
using weft::testing::cyclic;
using weft::testing::Layout;

namespace {

constexpr int kMaxSlots = 10;  // EpiReduceSlots::kMaxSlots: G - 1 + N - 1 for G <= 8, N <= 4

std::vector<RsNodesPlan> plans_for(const Layout& l) {
  const int world = int(l.node_of.size());
  std::vector<RsNodesPlan> plans(world);
  for (int r = 0; r < world; ++r) {
    std::string why;
    REQUIRE_MESSAGE(make_rs_nodes_plan(l.node_of, l.local_of, r, kMaxSlots, &plans[r], &why), why);
  }
  return plans;
}

// A partial sum: how many times each rank's partial is in it.
using Sum = std::vector<int>;

void simulate_reduce_scatter(const Layout& l) {
  const std::vector<RsNodesPlan> plans = plans_for(l);
  const int world = int(plans.size());
  const int slots = int(plans[0].slots.size());
  // slot[(rank, slot, pos)] = what arrived there (absent: nothing, i.e. the zero region).
  std::map<std::tuple<int, int, int>, Sum> slot;
  std::vector<int> next(world, 0);  // next position each rank computes
  std::vector<Sum> result(world);
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < world; ++r) {
      const RsNodesPlan& p = plans[r];
      if (next[r] == world) continue;
      const int pos = next[r];
      bool open = true;
      for (int s : p.gate_slots[pos]) open = open && slot.count({r, s, pos});
      if (!open) continue;
      Sum v(world, 0);
      v[r] = 1;
      if (pos >= p.lo) {
        for (int s = 0; s < slots; ++s) {
          auto it = slot.find({r, s, pos});
          if (it == slot.end()) continue;
          // Data in a slot that the gate does not wait for would be read unsynchronized.
          bool gated = false;
          for (int g : p.gate_slots[pos]) gated = gated || g == s;
          CHECK_MESSAGE(gated, "rank " << r << " pos " << pos << " reads slot " << s << " without waiting for it");
          for (int x = 0; x < world; ++x) v[x] += it->second[x];
        }
      } else {
        CHECK(p.gate_slots[pos].empty());
      }
      auto deliver = [&](int target, int s, int tpos) {
        const auto key = std::make_tuple(target, s, tpos);
        CHECK_MESSAGE(!slot.count(key), "slot " << s << " pos " << tpos << " of rank " << target << " written twice");
        CHECK(plans[target].slots[s].source == r);
        slot[key] = v;
      };
      for (const RsNodesCopy& c : p.copies)
        if (c.pos == pos) {
          CHECK(c.from_out == (pos >= p.lo));
          CHECK(l.node_of[c.target] == l.node_of[r]);
          CHECK_FALSE(plans[c.target].slots[c.slot].rail);
          deliver(c.target, c.slot, c.target_pos);
        }
      for (const RsNodesSend& s : p.sends)
        if (s.pos == pos) {
          CHECK(l.node_of[s.peer] != l.node_of[r]);
          CHECK(l.local_of[s.peer] == l.local_of[r]);
          CHECK(plans[s.peer].slots[s.slot].rail);
          CHECK(s.peer_pos == world - 1);
          deliver(s.peer, s.slot, s.peer_pos);
        }
      if (pos == world - 1) result[r] = v;
      ++next[r];
      progress = true;
    }
  }
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r);
    REQUIRE_MESSAGE(next[r] == world, "deadlock: rank " << r << " stuck at position " << next[r]);
    // The owner's rows hold every rank's partial exactly once.
    for (int x = 0; x < world; ++x) CHECK(result[r][x] == 1);
  }
  // Each rank sends m/W rows per other node through the proxy: its rail peers' node sums.
  for (const RsNodesPlan& p : plans) CHECK(int(p.sends.size()) == p.nodes - 1);
}

void check_all_gather(const Layout& l) {
  const std::vector<RsNodesPlan> plans = plans_for(l);
  const int world = int(plans.size());
  std::map<std::pair<int, int>, int> got;  // (receiver, owner) -> deliveries
  for (const RsNodesPlan& p : plans) {
    const int o = p.rank;
    got[{o, o}]++;
    for (int m : p.mates) got[{m, o}]++;  // NVLink
    for (int r : p.rails) got[{r, o}]++;  // proxy
    for (int f : p.forwards)              // f's rows, which arrived from f, forwarded to my mates
      for (int m : p.mates) got[{m, f}]++;
  }
  for (int x = 0; x < world; ++x)
    for (int o = 0; o < world; ++o) {
      INFO("rank " << x << " owner " << o);
      CHECK(got[{x, o}] == 1);
      const RsNodesPlan& p = plans[x];
      const int via = p.path_rank[o];
      switch (p.path[o]) {
        case RsNodesPath::kOwn:
          CHECK(o == x);
          break;
        case RsNodesPath::kMateNvlink:
          CHECK(l.node_of[o] == l.node_of[x]);
          break;
        case RsNodesPath::kRailProxy:
          CHECK(l.local_of[o] == l.local_of[x]);
          break;
        case RsNodesPath::kForward: {
          CHECK(l.node_of[via] == l.node_of[x]);
          bool fwd = false;
          for (int f : plans[via].forwards) fwd = fwd || f == o;
          CHECK(fwd);
          break;
        }
      }
    }
}

}  // namespace

TEST_CASE("2 x 2: the order, groups, slots and moves of the design") {
  const Layout l = block(2, 2);
  const std::vector<RsNodesPlan> plans = plans_for(l);
  const RsNodesPlan& p = plans[0];
  CHECK(p.order == std::vector<int>{3, 2, 1, 0});
  CHECK(p.lo == 1);
  CHECK(p.group ==
        std::vector<RsNodesGroup>{RsNodesGroup::kToMate, RsNodesGroup::kRail, RsNodesGroup::kMate, RsNodesGroup::kOwn});
  REQUIRE(p.slots.size() == 2);
  CHECK(p.slots[0].source == 1);
  CHECK_FALSE(p.slots[0].rail);
  CHECK(p.slots[1].source == 2);
  CHECK(p.slots[1].rail);
  // Owner 3's partial to rank 1 (3's rail rank on node 0), my partial of owner 1 from `out` to rank 1.
  REQUIRE(p.copies.size() == 2);
  CHECK(p.copies[0].target == 1);
  CHECK(plans[1].order[p.copies[0].target_pos] == 3);
  CHECK_FALSE(p.copies[0].from_out);
  CHECK(p.copies[1].target == 1);
  CHECK(p.copies[1].target_pos == 3);
  CHECK(p.copies[1].from_out);
  REQUIRE(p.sends.size() == 1);
  CHECK(p.sends[0].peer == 2);
  CHECK(p.sends[0].pos == 1);
  CHECK(plans[2].slots[p.sends[0].slot].source == 0);
  CHECK(p.gate_slots[0].empty());
  CHECK(p.gate_slots[1] == std::vector<int>{0});
  CHECK(p.gate_slots[2].empty());
  CHECK(p.gate_slots[3] == std::vector<int>{0, 1});
  CHECK(p.rail_freed_gate[1] == 2);
  CHECK(p.path[1] == RsNodesPath::kMateNvlink);
  CHECK(p.path[2] == RsNodesPath::kRailProxy);
  CHECK(p.path[3] == RsNodesPath::kForward);
  CHECK(p.path_rank[3] == 1);
  CHECK(p.forwards == std::vector<int>{2});
}

TEST_CASE("reduce-scatter delivers every partial exactly once, without deadlock") {
  for (auto [nodes, per_node] :
       {std::pair{2, 2}, {2, 4}, {4, 2}, {3, 2}, {2, 1}, {4, 1}, {2, 3}, {3, 3}, {4, 4}, {2, 8}, {4, 8}, {1, 8}}) {
    INFO(nodes << " x " << per_node);
    simulate_reduce_scatter(block(nodes, per_node));
    simulate_reduce_scatter(cyclic(nodes, per_node));
  }
}

TEST_CASE("all-gather paths deliver every owner's rows to every rank exactly once") {
  for (auto [nodes, per_node] : {std::pair{2, 2}, {2, 4}, {4, 2}, {3, 2}, {2, 1}, {3, 3}}) {
    INFO(nodes << " x " << per_node);
    check_all_gather(block(nodes, per_node));
    check_all_gather(cyclic(nodes, per_node));
  }
}

TEST_CASE("layouts the epilogue or the rails cannot serve are refused with a reason") {
  RsNodesPlan p;
  std::string why;
  const Layout big = block(5, 8);  // 8 + 5 - 2 = 11 staged partials per row
  CHECK_FALSE(make_rs_nodes_plan(big.node_of, big.local_of, 0, kMaxSlots, &p, &why));
  CHECK(why.find("staged partials") != std::string::npos);
  Layout uneven{{0, 0, 1}, {0, 1, 0}};
  CHECK_FALSE(make_rs_nodes_plan(uneven.node_of, uneven.local_of, 0, kMaxSlots, &p, &why));
  CHECK(why.find("split evenly") != std::string::npos);
  Layout gap{{0, 0, 1, 1}, {0, 2, 0, 1}};
  CHECK_FALSE(make_rs_nodes_plan(gap.node_of, gap.local_of, 0, kMaxSlots, &p, &why));
  CHECK(why.find("local index 1") != std::string::npos);
}

TEST_CASE("pieces cut an owner's rows into whole tiles") {
  const int64_t row = 8192 * 2;
  CHECK(rs_nodes_pieces(2048, row, 128, 0) == 8);  // 8 pieces of 4 MiB
  CHECK(rs_nodes_pieces(2048, row, 128, 4) == 4);
  CHECK(rs_nodes_pieces(2048, row, 128, 3) == 0);  // 16 tiles do not split in 3
  CHECK(rs_nodes_pieces(256, row, 128, 0) == 2);   // 2 tiles: at most 2 pieces
  CHECK(rs_nodes_pieces(128, 64, 128, 0) == 1);    // small: one piece
  CHECK(rs_nodes_pieces(100, row, 128, 0) == 0);   // not whole tiles
}
