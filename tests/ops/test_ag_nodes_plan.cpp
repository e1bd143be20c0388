// The multi-node AllGather+GEMM plan: every position of every rank is written exactly once, with the
// right shard, each shard crosses each node boundary once, and forwards only relay what came over the net.
#include <doctest/doctest.h>

#include <map>
#include <string>
#include <vector>

#include "kernels/ag_gemm_nodes_plan.h"
#include "tests/ops/rank_layouts.h"

using namespace weft::kernels;
using weft::testing::block;
using weft::testing::cyclic;
using weft::testing::Layout;

namespace {

void check_layout(const Layout& l) {
  const int world = int(l.node_of.size());
  std::vector<AgNodesPlan> plans(world);
  for (int r = 0; r < world; ++r) {
    std::string why;
    REQUIRE_MESSAGE(make_ag_nodes_plan(l.node_of, l.local_of, r, &plans[r], &why), why);
  }
  const int nodes = plans[0].nodes, per_node = plans[0].per_node;
  // Who writes position p of rank q, and with which shard.
  std::map<std::pair<int, int>, std::vector<int>> writes;  // (q, p) -> shards written there
  int net_sends = 0;
  for (int x = 0; x < world; ++x) {
    const AgNodesPlan& p = plans[x];
    // The order: a permutation, own shard first, node-mates before any other node's shards, and on each
    // other node the rail peer (same local index) first.
    std::vector<int> seen(world, 0);
    for (int s : p.order) seen[s]++;
    for (int s = 0; s < world; ++s) CHECK(seen[s] == 1);
    CHECK(p.order[0] == x);
    for (int i = 0; i < per_node; ++i) CHECK(l.node_of[p.order[i]] == l.node_of[x]);
    for (int j = 1; j < nodes; ++j) {
      CHECK(l.node_of[p.order[j * per_node]] != l.node_of[x]);
      CHECK(l.local_of[p.order[j * per_node]] == l.local_of[x]);
    }
    for (int pos = 0; pos < world; ++pos) CHECK(p.pos_of[p.order[pos]] == pos);
    for (const AgNodesPull& pl : p.pulls) {
      CHECK(l.node_of[pl.mate] == l.node_of[x]);
      writes[{x, pl.dst_pos}].push_back(pl.mate);
    }
    CHECK(int(p.sends.size()) == nodes - 1);
    for (const AgNodesSend& s : p.sends) {
      CHECK(l.node_of[s.peer] != l.node_of[x]);
      CHECK(l.local_of[s.peer] == l.local_of[x]);
      writes[{s.peer, s.dst_pos}].push_back(x);
      ++net_sends;
    }
    for (const AgNodesForward& f : p.forwards) {
      // Only what reached this rank over the net is relayed, to node-mates only.
      CHECK(p.source[f.src_pos] == AgNodesSource::kNet);
      CHECK(p.order[f.src_pos] == f.shard);
      CHECK(int(f.to.size()) == per_node - 1);
      for (auto [mate, pos] : f.to) {
        CHECK(l.node_of[mate] == l.node_of[x]);
        CHECK(mate != x);
        CHECK(plans.size() > size_t(mate));
        writes[{mate, pos}].push_back(f.shard);
      }
    }
  }
  // Every position but 0 of every rank: exactly one write, of the shard that position stands for.
  for (int q = 0; q < world; ++q)
    for (int pos = 0; pos < world; ++pos) {
      auto it = writes.find({q, pos});
      if (pos == 0) {
        CHECK(it == writes.end());
        continue;
      }
      REQUIRE_MESSAGE(it != writes.end(), "rank ", q, " position ", pos, " never written");
      REQUIRE(it->second.size() == 1);
      CHECK(it->second[0] == plans[q].order[pos]);
      // The plan names who fills it: a forward comes from the mate on that shard's rail.
      if (plans[q].source[pos] == AgNodesSource::kForward) {
        const int fwd = plans[q].source_rank[pos];
        CHECK(l.node_of[fwd] == l.node_of[q]);
        CHECK(l.local_of[fwd] == l.local_of[plans[q].order[pos]]);
      }
    }
  // Each shard crosses each node boundary once: world x (nodes - 1) transfers over the net.
  CHECK(net_sends == world * (nodes - 1));
}

}  // namespace

TEST_CASE("ag_gemm nodes plan: 2 nodes x 2 GPUs, the emulated layout") {
  Layout l = block(2, 2);
  check_layout(l);
  AgNodesPlan p;
  std::string why;
  REQUIRE(make_ag_nodes_plan(l.node_of, l.local_of, 1, &p, &why));
  // Rank 1: own, node-mate 0, rail peer 3 (direct), then 2 (forwarded by rank 0).
  CHECK(p.order == std::vector<int>{1, 0, 3, 2});
  CHECK(p.source[1] == AgNodesSource::kPull);
  CHECK(p.source[2] == AgNodesSource::kNet);
  CHECK(p.source_rank[2] == 3);
  CHECK(p.source[3] == AgNodesSource::kForward);
  CHECK(p.source_rank[3] == 0);
  REQUIRE(p.sends.size() == 1);
  CHECK(p.sends[0].peer == 3);
  CHECK(p.sends[0].dst_pos == 2);  // rank 3's order: 3, 2, 1, 0
  REQUIRE(p.forwards.size() == 1);
  CHECK(p.forwards[0].shard == 3);
  CHECK(p.forwards[0].to == std::vector<std::pair<int, int>>{{0, 3}});  // rank 0's order: 0, 1, 2, 3
}

TEST_CASE("ag_gemm nodes plan: other shapes and placements") {
  for (auto [n, g] : std::vector<std::pair<int, int>>{{2, 1}, {2, 4}, {4, 2}, {3, 2}, {4, 4}, {8, 1}, {2, 8}}) {
    CAPTURE(n);
    CAPTURE(g);
    check_layout(block(n, g));
    check_layout(cyclic(n, g));
  }
  // One node: nothing crosses a node, everything is pulled.
  Layout one = block(1, 4);
  AgNodesPlan p;
  std::string why;
  REQUIRE(make_ag_nodes_plan(one.node_of, one.local_of, 2, &p, &why));
  CHECK(p.sends.empty());
  CHECK(p.forwards.empty());
  CHECK(p.pulls.size() == 3);
}

TEST_CASE("ag_gemm nodes plan: uneven nodes are refused with the reason") {
  AgNodesPlan p;
  std::string why;
  CHECK_FALSE(make_ag_nodes_plan({0, 0, 1}, {0, 1, 0}, 0, &p, &why));
  CHECK(why.find("evenly") != std::string::npos);
  CHECK_FALSE(make_ag_nodes_plan({0, 0, 1, 1}, {0, 1, 0, 2}, 0, &p, &why));
  CHECK(why.find("local index 1") != std::string::npos);
  CHECK_FALSE(make_ag_nodes_plan({0, 0, 1, 1}, {0, 1, 0, 1}, 4, &p, &why));
}

TEST_CASE("ag_gemm nodes plan: chunks cut a shard into whole tiles") {
  CHECK(ag_nodes_chunks(2048, 128, 8) == 8);
  CHECK(ag_nodes_chunks(512, 128, 8) == 4);
  CHECK(ag_nodes_chunks(384, 128, 8) == 3);
  CHECK(ag_nodes_chunks(128, 128, 8) == 1);
  CHECK(ag_nodes_chunks(2048, 128, 3) == 2);
  CHECK(ag_nodes_chunks(2048, 128, 0) == 1);
  CHECK(ag_nodes_chunks(1280, 128, 8) == 5);
}
