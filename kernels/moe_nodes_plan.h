// Expert-parallel MoE across nodes: which way a token's row travels between its home rank and the
// ranks owning its experts, and back (CUDA-free; the data-flow simulator executes it for groups up
// to 128 nodes x 8 GPUs). Rank (n, l) = node n, local index l; its rail peers are (n', l), n' != n.
//
//   dispatch, home h = (n, l), token t, destination ranks D(t):
//     d on node n           h ─NVLink─► d                        (one row per destination)
//     d on node n' != n     h ─NIC─► relay (n', l), once per node n' that D(t) touches,
//                           relay ─NVLink─► every d on n' other than itself
//   combine, the reverse: each d pre-sums its experts' rows of t (fixed expert order)
//     d on node n           d ─NVLink─► h
//     d on node n' != n     d ─NVLink─► relay (n', l) (itself: no move), the relay sums node n''s
//                           rows of t in local-index order and sends one row ─NIC─► h
//
// Messages, one per peer and round even when it carries no rows (so a rank's waits never depend
// on the routing): dispatch N - 1 over the NIC and G - 1 over NVLink from the home, G - 1 NVLink
// forwards from each relay; combine the same in reverse. Every per-rank structure is bounded by
// the rail peers (N - 1) and the NVLink peers (G - 1), never by the world.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "kernels/moe_plan.h"

namespace weft::kernels {

// Where ranks sit: the rank at (node, local), built once in O(world).
struct MoeNodesPlacement {
  int nodes = 0, per_node = 0;
  std::vector<int> node_of, local_of;
  std::vector<int> rank_at;  // node * per_node + local -> rank

  int at(int node, int local) const { return rank_at[size_t(node * per_node + local)]; }

  // False with *why unless every node has ranks with local indices 0..per_node-1, once each.
  bool make(const std::vector<int>& node, const std::vector<int>& local, std::string* why) {
    const int world = int(node.size());
    if (world == 0 || local.size() != node.size()) return *why = "no ranks, or node and local lists differ", false;
    int n = 0;
    for (int v : node) {
      if (v < 0 || v >= world) return *why = "a node index outside [0, world)", false;
      n = v + 1 > n ? v + 1 : n;
    }
    if (world % n)
      return *why = std::to_string(world) + " ranks do not split evenly over " + std::to_string(n) + " nodes", false;
    nodes = n;
    per_node = world / n;
    rank_at.assign(size_t(world), -1);
    for (int r = 0; r < world; ++r) {
      if (local[size_t(r)] < 0 || local[size_t(r)] >= per_node)
        return *why = "rank " + std::to_string(r) + " has local index " + std::to_string(local[size_t(r)]) +
                      " (every node needs local indices 0.." + std::to_string(per_node - 1) + ")",
               false;
      int& slot = rank_at[size_t(node[size_t(r)] * per_node + local[size_t(r)])];
      if (slot >= 0)
        return *why = "ranks " + std::to_string(slot) + " and " + std::to_string(r) + " share node " +
                      std::to_string(node[size_t(r)]) + " local index " + std::to_string(local[size_t(r)]),
               false;
      slot = r;
    }
    node_of = node;
    local_of = local;
    return true;
  }
};

struct MoeNodesPlan {
  int rank = 0, world = 0, nodes = 0, per_node = 0, node = 0, local = 0;
  std::vector<int> mates;  // NVLink peers: local l+1, l+2, ... on this node
  std::vector<int> rails;  // NIC peers: node n+1, n+2, ..., same local index
};

inline bool make_moe_nodes_plan(const MoeNodesPlacement& pl, int rank, MoeNodesPlan* out, std::string* why) {
  const int world = int(pl.node_of.size());
  if (rank < 0 || rank >= world) return *why = "rank " + std::to_string(rank) + " outside the job", false;
  MoeNodesPlan p;
  p.rank = rank;
  p.world = world;
  p.nodes = pl.nodes;
  p.per_node = pl.per_node;
  p.node = pl.node_of[size_t(rank)];
  p.local = pl.local_of[size_t(rank)];
  for (int i = 1; i < p.per_node; ++i) p.mates.push_back(pl.at(p.node, (p.local + i) % p.per_node));
  for (int j = 1; j < p.nodes; ++j) p.rails.push_back(pl.at((p.node + j) % p.nodes, p.local));
  *out = std::move(p);
  return true;
}

// The cross-node regions of the MoE op's arena (runtime/exec/moe.h, variant "hierarchical"), after the
// one-node layout (moe_heap_layout), offsets from the arena, 256-byte aligned; N nodes of G ranks, T
// tokens per rank. A rank is a home (its own tokens) and the relay of its rail peers' tokens:
//   rail_out[N]        home, per destination node: a block of the route (a count word, then T int32:
//                      the token's compact slot for that node, or -1) and the compact slots (the row
//                      and a header holding the token's k global expert ids and weights), which one
//                      put carries to the node's relay (route + count slots)
//   rail_in[N]         relay, per source node: the blocks that arrived
//   node_comb[N][G][T] relay: its node-mates' combine rows of remote tokens, per home node and mate
//   comb_out[N][T]     relay: the node's sum per remote token, in the home's compact slot order
//   comb_in[N][T]      home: the sums that arrived, per relay node
//   rail_flags[2N][C]  dispatch [0, N) by source node, combine [N, 2N) by relay node, one word per
//                      proxy channel (a block moves in C pieces, one per channel; call epochs)
// The own node's entries are unused. Every region is bounded by N, G and T, not by the world.
struct MoeNodesHeap {
  int64_t route_bytes = 0;  // a block's route: 16-byte head (the count) + T int32, 256-aligned
  int64_t slot_bytes = 0;   // moe_slot_bytes(hidden)
  int64_t block_bytes = 0;  // route_bytes + T slots, 256-aligned
  int64_t rail_out_offset = 0, rail_in_offset = 0, node_comb_offset = 0, comb_out_offset = 0, comb_in_offset = 0;
  int64_t flags_offset = 0, flags_bytes = 0;
  int64_t rail_bytes = 0, node_comb_bytes = 0, comb_bytes = 0;  // rail_out / rail_in, node_comb, comb_out / comb_in
  int64_t total_bytes = 0;                                      // the end, from the arena, 4 KiB-rounded

  // The regions by name, in order: what `weftrun plan` lists and MoeOp reserves.
  struct Region {
    const char* name;
    int64_t offset, bytes;
  };
  std::vector<Region> regions() const {
    return {{"moe.rail_out", rail_out_offset, rail_bytes},        {"moe.rail_in", rail_in_offset, rail_bytes},
            {"moe.node_comb", node_comb_offset, node_comb_bytes}, {"moe.comb_out", comb_out_offset, comb_bytes},
            {"moe.comb_in", comb_in_offset, comb_bytes},          {"moe.rail_flags", flags_offset, flags_bytes}};
  }
};

// `base`: where the regions start (the one-node layout's total_bytes). False with *why for an empty
// layout.
inline bool moe_nodes_heap(const MoeShape& s, int nodes, int per_node, int channels, int64_t base, MoeNodesHeap* out,
                           const char** why) {
  auto up = [](int64_t v, int64_t a) { return (v + a - 1) / a * a; };
  if ((*why = s.invalid())) return false;
  if (nodes < 2 || per_node < 1 || int64_t(nodes) * per_node != s.world)
    return *why = "the cross-node layout needs 2 or more nodes of equal ranks", false;
  if (channels < 1 || channels > 8) return *why = "the cross-node layout takes 1 to 8 proxy channels", false;
  MoeNodesHeap h;
  const int64_t T = s.tokens, N = nodes, G = per_node, row = int64_t(s.hidden) * 2;
  h.route_bytes = up(16 + 4 * T, 256);
  h.slot_bytes = moe_slot_bytes(s.hidden);
  h.block_bytes = up(h.route_bytes + T * h.slot_bytes, 256);
  h.rail_bytes = N * h.block_bytes;
  h.node_comb_bytes = N * G * T * row;
  h.comb_bytes = N * T * row;
  h.rail_out_offset = up(base, 256);
  h.rail_in_offset = h.rail_out_offset + h.rail_bytes;
  h.node_comb_offset = h.rail_in_offset + h.rail_bytes;
  h.comb_out_offset = up(h.node_comb_offset + h.node_comb_bytes, 256);
  h.comb_in_offset = up(h.comb_out_offset + h.comb_bytes, 256);
  h.flags_offset = up(h.comb_in_offset + h.comb_bytes, 256);
  h.flags_bytes = 2 * N * channels * 8;
  h.total_bytes = up(h.flags_offset + h.flags_bytes, 4096);
  *out = h;
  return true;
}

// The rank on destination `dest`'s node that takes a home's token over the NIC (the home's rail peer
// there), or -1 when `dest` shares the home's node (the row goes straight over NVLink).
inline int moe_nodes_relay(const MoeNodesPlacement& pl, int home, int dest) {
  const int n = pl.node_of[size_t(dest)];
  if (n == pl.node_of[size_t(home)]) return -1;
  return pl.at(n, pl.local_of[size_t(home)]);
}

}  // namespace weft::kernels
