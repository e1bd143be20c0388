// MoE across nodes on the simulator (moe_nodes_model.h).
#include "tests/sim/moe_nodes_model.h"

#include <algorithm>
#include <map>
#include <string>

#include "tests/sim/model_util.h"

namespace weft::sim {

namespace {

// Copies each read to its write, in order.
Body relay_all() {
  return [](const std::vector<const Payload*>& in, std::vector<Payload>* out, std::string* why) {
    for (size_t i = 0; i < in.size(); ++i) {
      if (!in[i]) return *why = "read " + num(int64_t(i)) + " holds nothing", false;
      out->push_back(*in[i]);
    }
    return true;
  };
}

// Sums groups of reads (sizes in `groups`) into one payload each; every read must be token `blocks[g]`.
Body sum_groups(std::vector<int> groups, std::vector<int> blocks) {
  return [groups, blocks](const std::vector<const Payload*>& in, std::vector<Payload>* out, std::string* why) {
    size_t i = 0;
    for (size_t g = 0; g < groups.size(); ++g) {
      Payload y;
      y.block = blocks[g];
      y.epoch = 1;
      for (int k = 0; k < groups[g]; ++k, ++i) {
        const Payload* x = in[i];
        if (!x) return *why = "a row of token " + num(blocks[g]) + " is missing", false;
        if (x->block != blocks[g])
          return *why = "token " + num(blocks[g]) + "'s sum got a row of token " + num(x->block), false;
        for (const auto& [q, n] : x->parts) y.parts[q] += n;
      }
      out->push_back(y);
    }
    return true;
  };
}

}  // namespace

std::vector<std::vector<int>> moe_routing(int world, int tokens, int topk, int experts, uint64_t seed) {
  std::vector<std::vector<int>> dests(size_t(world) * size_t(tokens));
  const int per_rank = experts / world;
  uint64_t s = seed;
  for (auto& d : dests) {
    std::vector<int> picked;
    while (int(picked.size()) < topk) {
      const int e = int(next_random(&s) % uint64_t(experts));
      if (std::find(picked.begin(), picked.end(), e) == picked.end()) picked.push_back(e);
    }
    for (int e : picked) d.push_back(e / per_rank);
    std::sort(d.begin(), d.end());
    d.erase(std::unique(d.begin(), d.end()), d.end());
  }
  return dests;
}

Result simulate_moe_nodes(const std::vector<kernels::MoeNodesPlan>& plans, const kernels::MoeNodesPlacement& pl,
                          const std::vector<std::vector<int>>& dests, int tokens, int64_t row_bytes, bool races) {
  Sim sim;
  sim.check_races(races);
  const int W = int(plans.size()), T = tokens;
  auto node = [&](int r) { return pl.node_of[size_t(r)]; };
  auto local = [&](int r) { return pl.local_of[size_t(r)]; };
  auto dest_of = [&](int h, int t) -> const std::vector<int>& { return dests[size_t(h) * size_t(T) + size_t(t)]; };
  auto has = [](const std::vector<int>& v, int x) { return std::binary_search(v.begin(), v.end(), x); };
  auto touches = [&](int h, int t, int n) {
    for (int d : dest_of(h, t))
      if (node(d) == n) return true;
    return false;
  };

  const int k_x = sim.kind("x", "token");
  const int k_relay = sim.kind("relay", "home", "token");
  const int k_recv = sim.kind("recv", "home", "token");
  const int k_y = sim.kind("y", "home", "token");
  const int k_comb_in = sim.kind("comb_in", "home", "token", "from local");
  const int k_comb_mate = sim.kind("comb_mate", "token", "from local");
  const int k_comb_node = sim.kind("comb_node", "token", "from node");
  const int k_out = sim.kind("out", "token");
  const int f_disp_rail = sim.kind("dispatch_rail", "from node");
  const int f_disp_nv = sim.kind("dispatch_nvlink", "from local");
  const int f_disp_fwd = sim.kind("dispatch_forward", "from local");
  const int f_comb_nv = sim.kind("combine_nvlink", "from local");
  const int f_comb_rail = sim.kind("combine_rail", "from node");
  const int f_expert = sim.kind("experts done");

  std::vector<std::vector<std::pair<int, int>>> received(static_cast<size_t>(W));  // per rank: (home, token)
  for (int h = 0; h < W; ++h)
    for (int t = 0; t < T; ++t) {
      Payload p;
      p.block = h * T + t;
      p.parts[h] = 1;
      sim.input({h, k_x, t}, p);
      for (int d : dest_of(h, t)) received[size_t(d)].push_back({h, t});
    }

  for (int r = 0; r < W; ++r) {
    const kernels::MoeNodesPlan& p = plans[size_t(r)];
    const int n = node(r), l = local(r);
    std::vector<int> near = p.mates;  // NVLink targets and myself
    near.push_back(r);
    const int s_disp = sim.stream(r, "dispatch"), s_fwd = sim.stream(r, "forward"), s_exp = sim.stream(r, "expert"),
              s_comb = sim.stream(r, "combine"), s_relay = sim.stream(r, "relay"), s_home = sim.stream(r, "home");

    // Dispatch: one NIC message per rail peer, one NVLink message per mate (and one to myself).
    for (int q : p.rails) {
      Action a;
      a.stream = s_disp;
      a.what = "dispatch to rail peer " + num(q);
      for (int t = 0; t < T; ++t)
        if (touches(r, t, node(q))) {
          a.reads.push_back({{r, k_x, t}});
          a.writes.push_back({{q, k_relay, r, t}, Link::kNic, r, row_bytes});
        }
      a.sets.push_back({{q, f_disp_rail, n}, 1});
      a.body = relay_all();
      sim.add(std::move(a));
    }
    for (int m : near) {
      Action a;
      a.stream = s_disp;
      a.what = "dispatch to " + (m == r ? std::string("myself") : "mate " + num(m));
      for (int t = 0; t < T; ++t)
        if (has(dest_of(r, t), m)) {
          a.reads.push_back({{r, k_x, t}});
          a.writes.push_back({{m, k_recv, r, t}, m == r ? Link::kLocal : Link::kNvlink, r, row_bytes});
        }
      a.sets.push_back({{m, f_disp_nv, l}, 1});
      a.body = relay_all();
      sim.add(std::move(a));
    }
    // Forward what my rail peers sent to the ranks of my node that need it.
    for (int m : near) {
      Action a;
      a.stream = s_fwd;
      a.what = "forward of the rail peers' tokens to " + (m == r ? std::string("myself") : "mate " + num(m));
      for (int q : p.rails) a.waits.push_back({{r, f_disp_rail, node(q)}, 1});
      for (int q : p.rails)
        for (int t = 0; t < T; ++t)
          if (has(dest_of(q, t), m)) {
            a.reads.push_back({{r, k_relay, q, t}});
            a.writes.push_back({{m, k_recv, q, t}, m == r ? Link::kLocal : Link::kNvlink, r, row_bytes});
          }
      a.sets.push_back({{m, f_disp_fwd, l}, 1});
      a.body = relay_all();
      sim.add(std::move(a));
    }
    // The experts: one pre-summed row per received token.
    {
      Action a;
      a.stream = s_exp;
      a.what = "expert rows of " + num(int64_t(received[size_t(r)].size())) + " received tokens";
      for (int m : near) {
        a.waits.push_back({{r, f_disp_nv, local(m)}, 1});
        a.waits.push_back({{r, f_disp_fwd, local(m)}, 1});
      }
      for (auto [h, t] : received[size_t(r)]) {
        a.reads.push_back({{r, k_recv, h, t}});
        a.writes.push_back({{r, k_y, h, t}});
      }
      a.sets.push_back({{r, f_expert}, 1});
      const std::vector<std::pair<int, int>> got = received[size_t(r)];
      a.body = [got, r, T](const std::vector<const Payload*>& in, std::vector<Payload>* out, std::string* why) {
        for (size_t i = 0; i < got.size(); ++i) {
          const auto [h, t] = got[i];
          const Payload* x = in[i];
          if (!x || x->block != h * T + t || x->parts.size() != 1 || x->parts.begin()->first != h)
            return *why = "token " + num(t) + " of rank " + num(h) + " did not arrive as itself", false;
          Payload y;
          y.block = x->block;
          y.epoch = 1;
          y.parts[r] = 1;
          out->push_back(y);
        }
        return true;
      };
      sim.add(std::move(a));
    }
    // Combine over NVLink: rows for homes on my node, and rows for the relay of homes elsewhere.
    for (int m : near) {
      Action a;
      a.stream = s_comb;
      a.what = "combine to " + (m == r ? std::string("myself") : "mate " + num(m));
      a.waits.push_back({{r, f_expert}, 1});
      for (auto [h, t] : received[size_t(r)]) {
        const bool home_here = node(h) == n;
        if (home_here ? h != m : local(h) != local(m)) continue;
        a.reads.push_back({{r, k_y, h, t}});
        const Key dst = home_here ? Key{m, k_comb_mate, t, l} : Key{m, k_comb_in, h, t, l};
        a.writes.push_back({dst, m == r ? Link::kLocal : Link::kNvlink, r, row_bytes});
      }
      a.sets.push_back({{m, f_comb_nv, l}, 1});
      a.body = relay_all();
      sim.add(std::move(a));
    }
    // Relay: every mate's rows of my rail peers' tokens, summed per token, one NIC message per peer.
    for (int q : p.rails) {
      Action a;
      a.stream = s_relay;
      a.what = "combine to rail peer " + num(q);
      for (int m : near) a.waits.push_back({{r, f_comb_nv, local(m)}, 1});
      std::vector<int> groups, blocks;
      for (int t = 0; t < T; ++t) {
        int k = 0;
        for (int d : dest_of(q, t))
          if (node(d) == n) {
            a.reads.push_back({{r, k_comb_in, q, t, local(d)}});
            ++k;
          }
        if (!k) continue;
        groups.push_back(k);
        blocks.push_back(q * T + t);
        a.writes.push_back({{q, k_comb_node, t, n}, Link::kNic, r, row_bytes});
      }
      a.sets.push_back({{q, f_comb_rail, n}, 1});
      a.body = sum_groups(groups, blocks);
      sim.add(std::move(a));
    }
    // Home: every destination's row of every token, once.
    {
      Action a;
      a.stream = s_home;
      a.what = "sum of the combined rows";
      for (int m : near) a.waits.push_back({{r, f_comb_nv, local(m)}, 1});
      for (int q : p.rails) a.waits.push_back({{r, f_comb_rail, node(q)}, 1});
      std::vector<int> groups, blocks;
      for (int t = 0; t < T; ++t) {
        int k = 0;
        std::vector<int> nodes_done;
        for (int d : dest_of(r, t)) {
          if (node(d) == n) {
            a.reads.push_back({{r, k_comb_mate, t, local(d)}});
            ++k;
          } else if (std::find(nodes_done.begin(), nodes_done.end(), node(d)) == nodes_done.end()) {
            nodes_done.push_back(node(d));
            a.reads.push_back({{r, k_comb_node, t, node(d)}});
            ++k;
          }
        }
        groups.push_back(k);
        blocks.push_back(r * T + t);
        a.writes.push_back({{r, k_out, t}});
      }
      Body sum = sum_groups(groups, blocks);
      std::vector<std::vector<int>> want;
      for (int t = 0; t < T; ++t) want.push_back(dest_of(r, t));
      a.body = [sum, want](const std::vector<const Payload*>& in, std::vector<Payload>* out, std::string* why) {
        if (!sum(in, out, why)) return false;
        for (size_t t = 0; t < want.size(); ++t) {
          std::map<int, int> exact;
          for (int d : want[t]) exact[d] = 1;
          if ((*out)[t].parts != exact)
            return *why = "token " + num(int64_t(t)) + "'s output does not hold each destination's row exactly once",
                   false;
        }
        return true;
      };
      sim.add(std::move(a));
    }
  }
  return sim.run();
}

}  // namespace weft::sim
