// Bytes per link of one run of the multi-node plans, read straight off the plan objects (CUDA-free):
// what `weftrun plan`-style reports and the data-flow simulator's tallies are checked against.
//
//   AllGather+GEMM (AgNodesPlan, a shard = one rank's rows of A):
//     pull     mate ─NVLink─► me      one shard per pull
//     send     me ─NIC─► rail peer    one shard per send
//     forward  me ─NVLink─► mate      one shard per (forward, target)
//   GEMM+RS / GEMM+AR (RsNodesPlan, a block = one owner's rows of C):
//     copy     me ─NVLink─► mate      one block per copy
//     send     me ─NIC─► rail peer    one block per send
//     AllReduce: my reduced block ─NVLink─► every mate and ─NIC─► every rail peer; every block a
//     rail peer sent me ─NVLink─► every mate (the forwards)
//   MoE (MoeNodesPlacement and a routing, a row = one token's hidden row and its header):
//     per token and destination on the home's node: one row each way over NVLink; per other node
//     it touches: one row each way over the NIC (home <-> its rail peer there, the relay), and one
//     row each way over NVLink between the relay and every destination there but itself
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "kernels/ag_gemm_nodes_plan.h"
#include "kernels/gemm_reduce_nodes_plan.h"
#include "kernels/moe_nodes_plan.h"

namespace weft::kernels {

// (from, to) -> bytes, per kind of link. Add the tallies of every rank's plan for the job's traffic.
struct PlanTraffic {
  std::map<std::pair<int, int>, int64_t> nvlink, nic;

  void add(const PlanTraffic& o) {
    for (const auto& [k, v] : o.nvlink) nvlink[k] += v;
    for (const auto& [k, v] : o.nic) nic[k] += v;
  }
  static int64_t out_of(const std::map<std::pair<int, int>, int64_t>& m, int rank) {
    int64_t s = 0;
    for (const auto& [k, v] : m) s += k.first == rank ? v : 0;
    return s;
  }
  static int64_t into(const std::map<std::pair<int, int>, int64_t>& m, int rank) {
    int64_t s = 0;
    for (const auto& [k, v] : m) s += k.second == rank ? v : 0;
    return s;
  }
};

// The moves rank p.rank's plan makes (pulls are counted on the link from the mate to p.rank).
inline PlanTraffic ag_nodes_traffic(const AgNodesPlan& p, int64_t shard_bytes) {
  PlanTraffic t;
  for (const AgNodesPull& pl : p.pulls) t.nvlink[{pl.mate, p.rank}] += shard_bytes;
  for (const AgNodesSend& s : p.sends) t.nic[{p.rank, s.peer}] += shard_bytes;
  for (const AgNodesForward& f : p.forwards)
    for (const auto& to : f.to) t.nvlink[{p.rank, to.first}] += shard_bytes;
  return t;
}

inline PlanTraffic rs_nodes_traffic(const RsNodesPlan& p, int64_t block_bytes, bool all_reduce) {
  PlanTraffic t;
  for (const RsNodesCopy& c : p.copies) t.nvlink[{p.rank, c.target}] += block_bytes;
  for (const RsNodesSend& s : p.sends) t.nic[{p.rank, s.peer}] += block_bytes;
  if (all_reduce) {
    for (int m : p.mates) t.nvlink[{p.rank, m}] += block_bytes;
    for (int r : p.rails) t.nic[{p.rank, r}] += block_bytes;
    for (size_t f = 0; f < p.forwards.size(); ++f)
      for (int m : p.mates) t.nvlink[{p.rank, m}] += block_bytes;
  }
  return t;
}

// dests[h * tokens + t]: the destination ranks of token t of home h (distinct).
inline PlanTraffic moe_nodes_traffic(const MoeNodesPlacement& pl, const std::vector<std::vector<int>>& dests,
                                     int tokens, int64_t row_bytes) {
  PlanTraffic tr;
  const int world = int(pl.node_of.size());
  for (int h = 0; h < world; ++h)
    for (int t = 0; t < tokens; ++t) {
      const std::vector<int>& d = dests[size_t(h) * size_t(tokens) + size_t(t)];
      std::vector<int> relays;
      for (int x : d) {
        const int q = moe_nodes_relay(pl, h, x);
        if (q < 0) {
          if (x != h) {
            tr.nvlink[{h, x}] += row_bytes;
            tr.nvlink[{x, h}] += row_bytes;
          }
          continue;
        }
        bool seen = false;
        for (int y : relays) seen = seen || y == q;
        if (!seen) {
          relays.push_back(q);
          tr.nic[{h, q}] += row_bytes;
          tr.nic[{q, h}] += row_bytes;
        }
        if (x != q) {
          tr.nvlink[{q, x}] += row_bytes;
          tr.nvlink[{x, q}] += row_bytes;
        }
      }
    }
  return tr;
}

}  // namespace weft::kernels
