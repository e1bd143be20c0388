// AllGather+GEMM across nodes: which rank moves which A shard where, and in which order each rank
// computes on them. CUDA-free (host tests, the runner); the kernel gets the result as a POD.
//
//   2 nodes x 2 GPUs, rail pairs (same local index) 0<->2 and 1<->3:
//
//     node 0: rank 0 ══NVLink══ rank 1          node 1: rank 2 ══NVLink══ rank 3
//               ║ rail (proxy)    ║ rail (proxy)          ║                 ║
//               ╚═════════════════╬═════════════════════════╝                 ║
//                                 ╚═══════════════════════════════════════════╝
//
//   rank r's shard A_r crosses each node boundary once: the inter_send role pushes it, chunk by chunk,
//   to its rail peer on every other node (device FIFO -> proxy -> NIC). The rail peer forwards each
//   chunk over NVLink to its node-mates (intra_comm role) as soon as the chunk's flag arrives. Shards
//   of node-mates are pulled over NVLink by the copy engines.
//
// Each rank stores A in its own shard order, the order it computes in ("positions"):
//   position 0: its own shard; then its node-mates' (rotated by local index); then, node by node
//   (rotated), the rail peer's shard (it arrives first, directly) and the rest of that node (they
//   arrive forwarded by this rank's node-mates). The GEMM walks positions 0, 1, ... and its epilogue
//   writes each position's rows back to their global place in C (EpiScatterBf16), so C is in the
//   usual row order while every rank computes local, same-node, then remote rows.
//
// Flags: one per (position, chunk) in each rank's heap: index position * chunks + chunk, value = the
// run's epoch (rising, never reset).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace weft::kernels {

// How a rank's position gets its shard.
enum class AgNodesSource : int { kOwn = 0, kPull = 1, kNet = 2, kForward = 3 };

struct AgNodesSend {
  int peer = -1;    // rail peer on another node
  int dst_pos = 0;  // where my shard goes in the peer's order
};
struct AgNodesPull {
  int mate = -1;    // node-mate whose own shard (its position 0) I pull
  int dst_pos = 0;  // my position of that shard
};
struct AgNodesForward {
  int src_pos = 0;  // my position of a shard that reaches me over the net
  int shard = -1;
  std::vector<std::pair<int, int>> to;  // (node-mate, that mate's position of the shard)
};

struct AgNodesPlan {
  int rank = 0, world = 0, nodes = 0, per_node = 0;
  std::vector<int> order;             // position -> shard (the rank whose rows of A it holds)
  std::vector<int> pos_of;            // shard -> position
  std::vector<AgNodesSource> source;  // per position
  std::vector<int> source_rank;       // per position: the rank whose action fills it (messages)
  std::vector<AgNodesSend> sends;
  std::vector<AgNodesPull> pulls;
  std::vector<AgNodesForward> forwards;
};

// The rank at (node, local), or -1. node_of / local_of: per rank of the job.
inline int ag_nodes_rank_at(const std::vector<int>& node_of, const std::vector<int>& local_of, int node, int local) {
  for (size_t r = 0; r < node_of.size(); ++r)
    if (node_of[r] == node && local_of[r] == local) return int(r);
  return -1;
}

// True when every node has the same number of ranks with local indices 0..per_node-1 (a rail peer
// exists for every rank on every node); *why says what is wrong otherwise.
inline bool ag_nodes_layout_ok(const std::vector<int>& node_of, const std::vector<int>& local_of, int* nodes,
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
      if (ag_nodes_rank_at(node_of, local_of, node, l) < 0)
        return *why = "node " + std::to_string(node) + " has no rank with local index " + std::to_string(l) +
                      " (every node needs the same number of GPUs, local indices 0.." + std::to_string(g - 1) + ")",
               false;
  *nodes = n;
  *per_node = g;
  return true;
}

// The order (position -> shard) in which `rank` holds and computes A. Layout must be ok.
inline std::vector<int> ag_nodes_order(const std::vector<int>& node_of, const std::vector<int>& local_of, int nodes,
                                       int per_node, int rank) {
  const int n = node_of[rank], l = local_of[rank];
  std::vector<int> order;
  for (int j = 0; j < nodes; ++j) {
    const int node = (n + j) % nodes;
    for (int i = 0; i < per_node; ++i) order.push_back(ag_nodes_rank_at(node_of, local_of, node, (l + i) % per_node));
  }
  return order;
}

inline bool make_ag_nodes_plan(const std::vector<int>& node_of, const std::vector<int>& local_of, int rank,
                               AgNodesPlan* out, std::string* why) {
  AgNodesPlan p;
  if (!ag_nodes_layout_ok(node_of, local_of, &p.nodes, &p.per_node, why)) return false;
  p.world = int(node_of.size());
  if (rank < 0 || rank >= p.world) return *why = "rank " + std::to_string(rank) + " outside the job", false;
  p.rank = rank;
  auto order_of = [&](int r) { return ag_nodes_order(node_of, local_of, p.nodes, p.per_node, r); };
  auto pos_in = [&](int r, int shard) {
    const std::vector<int> o = order_of(r);
    for (int i = 0; i < p.world; ++i)
      if (o[i] == shard) return i;
    return -1;
  };
  p.order = order_of(rank);
  p.pos_of.assign(p.world, -1);
  for (int i = 0; i < p.world; ++i) p.pos_of[p.order[i]] = i;
  const int n = node_of[rank], l = local_of[rank];
  p.source.assign(p.world, AgNodesSource::kOwn);
  p.source_rank.assign(p.world, rank);
  for (int pos = 1; pos < p.world; ++pos) {
    const int s = p.order[pos];
    if (node_of[s] == n) {
      p.source[pos] = AgNodesSource::kPull;
      p.source_rank[pos] = rank;  // my copy engines pull it
      p.pulls.push_back({s, pos});
    } else if (local_of[s] == l) {
      p.source[pos] = AgNodesSource::kNet;
      p.source_rank[pos] = s;  // my rail peer sends it
      AgNodesForward f;
      f.src_pos = pos;
      f.shard = s;
      for (int i = 1; i < p.per_node; ++i) {
        const int mate = ag_nodes_rank_at(node_of, local_of, n, (l + i) % p.per_node);
        f.to.push_back({mate, pos_in(mate, s)});
      }
      if (!f.to.empty()) p.forwards.push_back(f);
    } else {
      p.source[pos] = AgNodesSource::kForward;
      p.source_rank[pos] = ag_nodes_rank_at(node_of, local_of, n, local_of[s]);  // the mate on s's rail
    }
  }
  for (int j = 1; j < p.nodes; ++j) {
    const int peer = ag_nodes_rank_at(node_of, local_of, (n + j) % p.nodes, l);
    p.sends.push_back({peer, pos_in(peer, rank)});
  }
  *out = std::move(p);
  return true;
}

// Chunks per shard: the largest count <= max_chunks that cuts the shard's rows into whole tiles of
// tile_m rows (every chunk gates whole GEMM tiles); 1 when max_chunks < 1.
inline int ag_nodes_chunks(int64_t rows_per_shard, int tile_m, int max_chunks) {
  const int64_t tiles = rows_per_shard / tile_m;
  int best = 1;
  for (int c = 1; c <= max_chunks && c <= tiles; ++c)
    if (tiles % c == 0) best = c;
  return best;
}

}  // namespace weft::kernels
