// GEMM+ReduceScatter / GEMM+AllReduce across nodes: which rows each rank computes when, where each
// partial goes, which arrivals open which tiles. CUDA-free (host tests, the runner); the kernel and
// the streams get the result as offsets and flag lists.
//
//   2 nodes x 2 GPUs; rank (node, local); rail peer = same local index on the other node:
//
//     node 0: rank 0 ══NVLink══ rank 1          node 1: rank 2 ══NVLink══ rank 3        rails 0<->2, 1<->3
//
//   K is split over the ranks; every rank computes a partial of all M rows; owner o gets the sum of
//   its m/W rows. Rank 0's tile order (positions, one owner's rows each), and where each goes:
//
//     pos 0  owner 3  (g1: other node, not the rail)  partial ─NVLink (copy engine)─► rank 1 (3's rail rank)
//     pos 1  owner 2  (g2: the rail peer)  + rank 1's partial (gate) = node sum ─proxy─► rank 2
//     pos 2  owner 1  (g3: node-mate)      partial ─NVLink (copy engine)─► rank 1
//     pos 3  owner 0  (g4: own rows)       + rank 1's partial + rank 2's node sum (gate) = the result
//
//   so each owner's rows cross the node boundary once per other node, already reduced inside the
//   node (m/W x n per rank and other node), and NVLink carries the rest.
//
// The GEMM's reduction epilogue (EpiReduceSlots) reduces one contiguous row range [lo, W) of
// positions: g2, g3 and g4. Slot i is a buffer over that range (position p's rows at p - lo); a
// slot has data only where its source sends (mates: g2 and g4, rails: g4), the rest stays zero, so
// g3 rows come out as this rank's own partial (stored in `out`, then copied to the mate) and g2 rows
// as the node sum. Every sum is over slots in a fixed order: the same bits on every run.
//
// AllReduce: then every owner's reduced rows go to every rank: to node-mates over NVLink, to rail
// peers through the proxy, and each rank forwards what its rail peers sent to its node-mates.
//
// Flags (value = the run's epoch, rising, never reset), in each rank's symmetric heap:
//   arrived[slot][pos][piece]  a slot's piece of a position is in (NVLink stream write or proxy signal)
//   mate_freed[rank]           node-mate `rank` has consumed this rank's slots of that epoch
//   rail_freed[rank]           rail peer `rank` has consumed this rank's sends of that epoch (proxy)
//   c_arrived[owner][piece]    AllReduce: owner's reduced piece is in this rank's C
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace weft::kernels {

// The four groups of positions, in tile order.
enum class RsNodesGroup : int { kToMate = 1, kRail = 2, kMate = 3, kOwn = 4 };

inline const char* to_string(RsNodesGroup g) {
  switch (g) {
    case RsNodesGroup::kToMate:
      return "another node's row block, sent to its rail rank on this node";
    case RsNodesGroup::kRail:
      return "the rail peer's row block, node-reduced";
    case RsNodesGroup::kMate:
      return "a node-mate's row block";
    case RsNodesGroup::kOwn:
      return "this rank's own row block";
  }
  return "?";
}

struct RsNodesSlot {
  int source = -1;    // the rank whose partials land in this slot
  bool rail = false;  // through the proxy (node sums of the own rows), else NVLink (mate's partials)
};

// One NVLink copy of a position's rows (all pieces, one after another) by this rank's copy engines.
struct RsNodesCopy {
  int pos = 0;            // this rank's position (its rows of the GEMM)
  bool from_out = false;  // the rows sit in `out` (reduce range), else in `partial`
  int target = -1;        // node-mate receiving them
  int slot = 0;           // this rank's slot at the target
  int target_pos = 0;     // the target's position of the same rows
};

// One proxy message stream: a position's rows (piece by piece) to a rail peer's slot.
struct RsNodesSend {
  int pos = 0;       // this rank's position (in `out`)
  int peer = -1;     // rail peer (the rows' owner)
  int slot = 0;      // this rank's slot at the peer
  int peer_pos = 0;  // the peer's position of the rows (its own: world - 1)
};

// AllReduce: how owner o's reduced rows reach this rank's C.
enum class RsNodesPath : int { kOwn = 0, kMateNvlink = 1, kRailProxy = 2, kForward = 3 };

inline const char* to_string(RsNodesPath p) {
  switch (p) {
    case RsNodesPath::kOwn:
      return "this rank's own reduction";
    case RsNodesPath::kMateNvlink:
      return "the node-mate's copy over NVLink";
    case RsNodesPath::kRailProxy:
      return "the rail peer's put through the proxy";
    case RsNodesPath::kForward:
      return "a node-mate's NVLink forward of what its rail peer sent";
  }
  return "?";
}

struct RsNodesPlan {
  int rank = 0, world = 0, nodes = 0, per_node = 0, node = 0, local = 0;
  std::vector<int> order;                    // position -> owner
  std::vector<int> pos_of;                   // owner -> position
  std::vector<RsNodesGroup> group;           // per position
  int lo = 0;                                // first position of the reduce range [lo, world)
  std::vector<int> mates;                    // node-mates, local index l+1, l+2, ...
  std::vector<int> rails;                    // rail peers, node n+1, n+2, ...
  std::vector<RsNodesSlot> slots;            // mates' slots first, then the rails'
  std::vector<std::vector<int>> gate_slots;  // per position: slots whose arrival opens it (empty: never waits)
  std::vector<int> rail_freed_gate;          // per position: rail peer whose "freed" must be seen (-1: none)
  std::vector<RsNodesCopy> copies;           // issue order = tile order
  std::vector<RsNodesSend> sends;            // issue order = tile order
  // AllReduce.
  std::vector<RsNodesPath> path;                  // per owner
  std::vector<int> path_rank;                     // per owner: the rank whose action delivers it (messages)
  std::vector<int> forwards;                      // rail peers whose rows this rank forwards to every mate
  int reduce_rows() const { return world - lo; }  // positions in the reduce range (out, slots)
};

// The rank at (node, local), or -1. node_of / local_of: per rank of the job.
inline int rs_nodes_rank_at(const std::vector<int>& node_of, const std::vector<int>& local_of, int node, int local) {
  for (size_t r = 0; r < node_of.size(); ++r)
    if (node_of[r] == node && local_of[r] == local) return int(r);
  return -1;
}

// The position order of `rank` (position -> owner): g1 node by node (n+1, n+2, ...), each node's
// ranks by local index (l+1, l+2, ...); then g2 (rail peers, node n+1, n+2, ...); g3 (mates, l+1,
// ...); g4 (itself).
inline std::vector<int> rs_nodes_order(const std::vector<int>& node_of, const std::vector<int>& local_of, int nodes,
                                       int per_node, int rank) {
  const int n = node_of[rank], l = local_of[rank];
  std::vector<int> order;
  for (int j = 1; j < nodes; ++j)
    for (int i = 1; i < per_node; ++i)
      order.push_back(rs_nodes_rank_at(node_of, local_of, (n + j) % nodes, (l + i) % per_node));
  for (int j = 1; j < nodes; ++j) order.push_back(rs_nodes_rank_at(node_of, local_of, (n + j) % nodes, l));
  for (int i = 1; i < per_node; ++i) order.push_back(rs_nodes_rank_at(node_of, local_of, n, (l + i) % per_node));
  order.push_back(rank);
  return order;
}

// True when the job is `nodes` x `per_node` with local indices 0..per_node-1 on every node.
inline bool rs_nodes_layout_ok(const std::vector<int>& node_of, const std::vector<int>& local_of, int* nodes,
                               int* per_node, std::string* why) {
  const int world = int(node_of.size());
  if (world == 0 || local_of.size() != node_of.size()) return *why = "no ranks, or node and local lists differ", false;
  int n = 0;
  for (int v : node_of) {
    if (v < 0) return *why = "negative node index", false;
    n = v + 1 > n ? v + 1 : n;
  }
  if (world % n)
    return *why = std::to_string(world) + " ranks do not split evenly over " + std::to_string(n) + " nodes", false;
  const int g = world / n;
  for (int node = 0; node < n; ++node)
    for (int l = 0; l < g; ++l)
      if (rs_nodes_rank_at(node_of, local_of, node, l) < 0)
        return *why = "node " + std::to_string(node) + " has no rank with local index " + std::to_string(l) +
                      " (every node needs the same number of GPUs)",
               false;
  *nodes = n;
  *per_node = g;
  return true;
}

// This rank's slot index at `target` (a node-mate or a rail peer of this rank), or -1.
inline int rs_nodes_slot_at(const std::vector<int>& node_of, const std::vector<int>& local_of, int nodes, int per_node,
                            int rank, int target) {
  const int n = node_of[rank], l = local_of[rank], nt = node_of[target], lt = local_of[target];
  if (target == rank) return -1;
  if (nt == n) return (l - lt - 1 + per_node) % per_node;           // target's mate l_t + 1 + i
  if (lt == l) return per_node - 1 + (n - nt - 1 + nodes) % nodes;  // target's rail n_t + 1 + j
  return -1;
}

// Staged partials per row of the reduce range: one slot per node-mate and one per rail peer. The
// plan's structures are bounded by these (G - 1 NVLink peers, N - 1 rail peers), never by the world.
inline int rs_nodes_slots_needed(int nodes, int per_node) { return per_node - 1 + nodes - 1; }

// max_slots: what the epilogue can sum (the op passes EpiReduceSlots::kMaxSlots; a host model may
// pass rs_nodes_slots_needed to plan any even layout).
inline bool make_rs_nodes_plan(const std::vector<int>& node_of, const std::vector<int>& local_of, int rank,
                               int max_slots, RsNodesPlan* out, std::string* why) {
  RsNodesPlan p;
  if (!rs_nodes_layout_ok(node_of, local_of, &p.nodes, &p.per_node, why)) return false;
  p.world = int(node_of.size());
  if (rank < 0 || rank >= p.world) return *why = "rank " + std::to_string(rank) + " outside the job", false;
  const int G = p.per_node, N = p.nodes, W = p.world;
  if (rs_nodes_slots_needed(N, G) > max_slots)
    return *why = std::to_string(N) + " nodes x " + std::to_string(G) + " GPUs need " +
                  std::to_string(rs_nodes_slots_needed(N, G)) + " staged partials per row, the epilogue sums at most " +
                  std::to_string(max_slots),
           false;
  p.rank = rank;
  p.node = node_of[rank];
  p.local = local_of[rank];
  const int n = p.node, l = p.local;
  auto order_of = [&](int r) { return rs_nodes_order(node_of, local_of, N, G, r); };
  auto pos_in = [&](int r, int owner) {
    const std::vector<int> o = order_of(r);
    for (int i = 0; i < W; ++i)
      if (o[i] == owner) return i;
    return -1;
  };
  auto slot_at = [&](int target) { return rs_nodes_slot_at(node_of, local_of, N, G, rank, target); };
  p.order = order_of(rank);
  p.pos_of.assign(W, -1);
  for (int i = 0; i < W; ++i) p.pos_of[p.order[i]] = i;
  p.lo = (N - 1) * (G - 1);
  p.group.assign(W, RsNodesGroup::kOwn);
  for (int i = 0; i < W; ++i)
    p.group[i] = i < p.lo           ? RsNodesGroup::kToMate
                 : i < p.lo + N - 1 ? RsNodesGroup::kRail
                 : i < W - 1        ? RsNodesGroup::kMate
                                    : RsNodesGroup::kOwn;
  for (int i = 1; i < G; ++i) p.mates.push_back(rs_nodes_rank_at(node_of, local_of, n, (l + i) % G));
  for (int j = 1; j < N; ++j) p.rails.push_back(rs_nodes_rank_at(node_of, local_of, (n + j) % N, l));
  for (int m : p.mates) p.slots.push_back({m, false});
  for (int r : p.rails) p.slots.push_back({r, true});
  p.gate_slots.assign(W, {});
  p.rail_freed_gate.assign(W, -1);
  for (int pos = 0; pos < W; ++pos) {
    const int owner = p.order[pos];
    switch (p.group[pos]) {
      case RsNodesGroup::kToMate: {
        const int target = rs_nodes_rank_at(node_of, local_of, n, local_of[owner]);
        p.copies.push_back({pos, false, target, slot_at(target), pos_in(target, owner)});
        break;
      }
      case RsNodesGroup::kRail:
        for (int i = 0; i < G - 1; ++i) p.gate_slots[pos].push_back(i);
        p.rail_freed_gate[pos] = owner;  // its slot of the last run is free before this run's sum replaces it
        p.sends.push_back({pos, owner, slot_at(owner), W - 1});
        break;
      case RsNodesGroup::kMate:
        p.copies.push_back({pos, true, owner, slot_at(owner), W - 1});
        break;
      case RsNodesGroup::kOwn:
        for (int i = 0; i < int(p.slots.size()); ++i) p.gate_slots[pos].push_back(i);
        break;
    }
  }
  p.path.assign(W, RsNodesPath::kOwn);
  p.path_rank.assign(W, rank);
  for (int o = 0; o < W; ++o) {
    if (o == rank) continue;
    if (node_of[o] == n) {
      p.path[o] = RsNodesPath::kMateNvlink;
      p.path_rank[o] = o;
    } else if (local_of[o] == l) {
      p.path[o] = RsNodesPath::kRailProxy;
      p.path_rank[o] = o;
    } else {
      p.path[o] = RsNodesPath::kForward;
      p.path_rank[o] = rs_nodes_rank_at(node_of, local_of, n, local_of[o]);
    }
  }
  if (G > 1) p.forwards = p.rails;
  *out = std::move(p);
  return true;
}

// Pieces per owner's row block: `want` if it cuts the block into whole tiles (0: the most, up to 8,
// of at least `min_piece_bytes` each); 0 when `want` does not fit.
inline int rs_nodes_pieces(int64_t rows_per_owner, int64_t row_bytes, int tile_m, int want,
                           int64_t min_piece_bytes = int64_t(2) << 20) {
  const int64_t tiles = rows_per_owner / tile_m;
  if (tiles < 1 || rows_per_owner % tile_m) return 0;
  if (want > 0) return (want <= 64 && tiles % want == 0) ? want : 0;
  int best = 1;
  for (int s = 1; s <= 8 && s <= tiles; ++s)
    if (tiles % s == 0 && rows_per_owner / s * row_bytes >= min_piece_bytes) best = s;
  return best;
}

}  // namespace weft::kernels
