// GEMM+RS / GEMM+AR across nodes on the simulator (rs_nodes_model.h).
#include "tests/sim/rs_nodes_model.h"

#include <algorithm>
#include <map>
#include <string>

#include "tests/sim/model_util.h"
#include "tests/sim/run_model.h"

namespace weft::sim {

namespace {

// Ranks whose partial is not in `parts` exactly once.
std::string parts_text(const std::map<int, int>& parts, int world) {
  std::string s;
  for (int x = 0; x < world; ++x) {
    auto it = parts.find(x);
    const int n = it == parts.end() ? 0 : it->second;
    if (n != 1) s += " rank " + num(x) + " x" + num(n);
  }
  return s;
}

}  // namespace

Result simulate_rs_nodes(const std::vector<kernels::RsNodesPlan>& plans, const std::vector<int>& node_of,
                         const std::vector<int>& local_of, const RsNodesSimOptions& opt) {
  Sim sim;
  const int W = int(plans.size()), S = opt.pieces;
  const int64_t piece_bytes = opt.block_bytes / S;
  Result bad;
  auto plan_error = [&](const std::string& m) { bad.errors.push_back("plan error: " + m); };
  auto in_job = [&](int q) { return q >= 0 && q < W; };
  auto mate = [&](int a, int b) { return in_job(b) && a != b && node_of[size_t(a)] == node_of[size_t(b)]; };
  auto rail = [&](int a, int b) {
    return in_job(b) && node_of[size_t(a)] != node_of[size_t(b)] && local_of[size_t(a)] == local_of[size_t(b)];
  };
  for (int r = 0; r < W; ++r) {
    const kernels::RsNodesPlan& p = plans[size_t(r)];
    if (p.rank != r || p.world != W || int(p.order.size()) != W || int(p.gate_slots.size()) != W)
      plan_error("rank " + num(r) + "'s plan is for rank " + num(p.rank) + " of " + num(p.world));
    for (const kernels::RsNodesCopy& c : p.copies)
      if (!mate(r, c.target) || c.slot < 0 || c.slot >= int(plans[size_t(c.target)].slots.size()) ||
          plans[size_t(c.target)].slots[size_t(c.slot)].source != r)
        plan_error("rank " + num(r) + " copies position " + num(c.pos) + " to rank " + num(c.target) + " slot " +
                   num(c.slot) + ", not a node-mate's slot of this rank");
    for (const kernels::RsNodesSend& s : p.sends)
      if (!rail(r, s.peer) || s.slot < 0 || s.slot >= int(plans[size_t(s.peer)].slots.size()) ||
          plans[size_t(s.peer)].slots[size_t(s.slot)].source != r)
        plan_error("rank " + num(r) + " sends position " + num(s.pos) + " to rank " + num(s.peer) + " slot " +
                   num(s.slot) + ", not a rail peer's slot of this rank");
    for (int q : p.mates)
      if (!mate(r, q)) plan_error("rank " + num(r) + " lists rank " + num(q) + " as a node-mate");
    for (int q : p.rails)
      if (!rail(r, q)) plan_error("rank " + num(r) + " lists rank " + num(q) + " as a rail peer");
  }
  if (!bad.ok()) return bad;

  const int k_partial = sim.kind("partial", "position", "piece");
  const int k_out = sim.kind("out", "position", "piece");
  const int k_slot = sim.kind("slot", "slot", "position", "piece");
  const int k_c = sim.kind("C", "owner", "piece");
  const int k_tiles = sim.kind("tiles", "position", "piece");
  const int k_gate = sim.kind("gate", "position", "piece");
  const int k_arrived = sim.kind("arrived", "slot", "position", "piece");
  const int k_mate_freed = sim.kind("mate_freed", "rank");
  const int k_rail_freed = sim.kind("rail_freed", "rank");
  const int k_c_arrived = sim.kind("c_arrived", "owner", "piece");

  RunModel run(&sim, W, opt.barrier);
  struct Streams {
    std::vector<int> compute, send;
    int copy = -1, gates = -1, ag = -1, fwd = -1;
  };
  std::vector<Streams> st(static_cast<size_t>(W));
  for (int r = 0; r < W; ++r) {
    Streams& s = st[size_t(r)];
    for (int b = 0; b < opt.compute_blocks; ++b) s.compute.push_back(run.stream(r, "compute block " + num(b)));
    for (int ch = 0; ch < opt.channels; ++ch) s.send.push_back(run.stream(r, "inter_send channel " + num(ch)));
    s.copy = run.stream(r, "copy engine");
    s.gates = run.stream(r, "gates");
    if (opt.all_reduce) {
      s.ag = run.stream(r, "ag");
      s.fwd = run.stream(r, "fwd");
    }
  }

  for (int e = 1; e <= opt.runs; ++e) {
    const uint64_t ue = uint64_t(e);
    run.begin_run(ue);
    for (int r = 0; r < W; ++r) {
      const kernels::RsNodesPlan& p = plans[size_t(r)];
      const Streams& s = st[size_t(r)];
      const int nslots = int(p.slots.size());
      // The GEMM, unit (pos, j) = shard pos * S + j, block b takes units b, b + B, ...
      for (int pos = 0; pos < W; ++pos)
        for (int j = 0; j < S; ++j) {
          const int owner = p.order[size_t(pos)];
          Action a;
          a.stream = s.compute[size_t((pos * S + j) % opt.compute_blocks)];
          a.what = "GEMM tiles of position " + num(pos) + " (owner " + num(owner) + ") piece " + num(j);
          if (!p.gate_slots[size_t(pos)].empty() || p.rail_freed_gate[size_t(pos)] >= 0)
            a.waits.push_back({{r, k_gate, pos, j}, ue});
          const bool reduce = pos >= p.lo;
          if (reduce)
            for (int sl = 0; sl < nslots; ++sl) a.reads.push_back({{r, k_slot, sl, pos, j}, true});
          a.writes.push_back({{r, reduce ? k_out : k_partial, pos, j}});
          a.sets.push_back({{r, k_tiles, pos, j}, ue});
          a.body = [=](const std::vector<const Payload*>& in, std::vector<Payload>* out, std::string* why) {
            Payload y;
            y.block = owner;
            y.piece = j;
            y.epoch = ue;
            y.parts[r] = 1;
            for (size_t sl = 0; sl < in.size(); ++sl) {
              const Payload* x = in[sl];
              if (!x) continue;
              if (x->block != owner || x->piece != j || x->epoch != ue)
                return *why = "slot " + num(int64_t(sl)) + " holds owner " + num(x->block) + " piece " + num(x->piece) +
                              " of run " + num(int64_t(x->epoch)) + ", the tile wants owner " + num(owner) + " piece " +
                              num(j) + " of run " + num(e),
                       false;
              for (const auto& [q, n] : x->parts) y.parts[q] += n;
            }
            out->push_back(y);
            return true;
          };
          run.add(std::move(a));
        }
      for (int b : s.compute) run.finish(b);

      // inter_send: the rail peers' "freed" first (channel 0), then the messages round-robin.
      {
        Action a;
        a.stream = s.send[0];
        a.what = "rail peers: my sends of run " + num(e - 1) + " consumed";
        for (int q : p.rails) a.sets.push_back({{q, k_rail_freed, r}, ue - 1});
        run.add(std::move(a));
      }
      int m = 0;
      for (const kernels::RsNodesSend& sd : p.sends)
        for (int j = 0; j < S; ++j, ++m) {
          Action a;
          a.stream = s.send[size_t(m % opt.channels)];
          a.what = "put of position " + num(sd.pos) + " piece " + num(j) + " to rank " + num(sd.peer) + " slot " +
                   num(sd.slot);
          a.waits.push_back({{r, k_tiles, sd.pos, j}, ue});
          a.waits.push_back({{r, k_rail_freed, sd.peer}, ue - 1});
          a.reads.push_back({{r, k_out, sd.pos, j}});
          a.writes.push_back({{sd.peer, k_slot, sd.slot, sd.peer_pos, j}, Link::kNic, r, piece_bytes});
          a.sets.push_back({{sd.peer, k_arrived, sd.slot, sd.peer_pos, j}, ue});
          a.body = [](const std::vector<const Payload*>& in, std::vector<Payload>* out, std::string* why) {
            if (!in[0]) return *why = "nothing to send", false;
            out->push_back(*in[0]);
            return true;
          };
          run.add(std::move(a));
        }
      if (opt.all_reduce)
        for (int j = 0; j < S; ++j)
          for (int q : p.rails) {
            Action a;
            a.stream = s.send[size_t(m++ % opt.channels)];
            a.what = "put of my reduced piece " + num(j) + " to rank " + num(q) + "'s C";
            a.waits.push_back({{r, k_tiles, W - 1, j}, ue});
            a.reads.push_back({{r, k_out, W - 1, j}});
            a.writes.push_back({{q, k_c, r, j}, Link::kNic, r, piece_bytes});
            a.sets.push_back({{q, k_c_arrived, r, j}, ue});
            a.body = [](const std::vector<const Payload*>& in, std::vector<Payload>* out, std::string* why) {
              if (!in[0]) return *why = "nothing to send", false;
              out->push_back(*in[0]);
              return true;
            };
            run.add(std::move(a));
          }
      for (int ch : s.send) run.finish(ch);

      // Copy engine: the targets freed my slots of the last run, then every copy piece by piece.
      {
        Action a;
        a.stream = s.copy;
        a.what = "wait for the copy targets to free my slots of run " + num(e - 1);
        std::vector<int> targets;
        for (const kernels::RsNodesCopy& c : p.copies)
          if (std::find(targets.begin(), targets.end(), c.target) == targets.end()) targets.push_back(c.target);
        for (int t : targets) a.waits.push_back({{r, k_mate_freed, t}, ue - 1});
        run.add(std::move(a));
      }
      for (const kernels::RsNodesCopy& c : p.copies)
        for (int j = 0; j < S; ++j) {
          Action a;
          a.stream = s.copy;
          a.what = "copy of position " + num(c.pos) + " piece " + num(j) + " to rank " + num(c.target) + " slot " +
                   num(c.slot) + " position " + num(c.target_pos);
          a.waits.push_back({{r, k_tiles, c.pos, j}, ue});
          a.reads.push_back({{r, c.from_out ? k_out : k_partial, c.pos, j}});
          a.writes.push_back({{c.target, k_slot, c.slot, c.target_pos, j}, Link::kNvlink, r, piece_bytes});
          a.sets.push_back({{c.target, k_arrived, c.slot, c.target_pos, j}, ue});
          a.body = [](const std::vector<const Payload*>& in, std::vector<Payload>* out, std::string* why) {
            if (!in[0]) return *why = "nothing to copy", false;
            out->push_back(*in[0]);
            return true;
          };
          run.add(std::move(a));
        }

      // Gates.
      for (int pos = 0; pos < W; ++pos) {
        const int freed_by = p.rail_freed_gate[size_t(pos)];
        if (p.gate_slots[size_t(pos)].empty() && freed_by < 0) continue;
        for (int j = 0; j < S; ++j) {
          Action a;
          a.stream = s.gates;
          a.what = "gate of position " + num(pos) + " piece " + num(j);
          if (freed_by >= 0) a.waits.push_back({{r, k_rail_freed, freed_by}, ue - 1});
          for (int sl : p.gate_slots[size_t(pos)]) a.waits.push_back({{r, k_arrived, sl, pos, j}, ue});
          a.sets.push_back({{r, k_gate, pos, j}, ue});
          run.add(std::move(a));
        }
      }

      if (opt.all_reduce) {
        for (int j = 0; j < S; ++j) {
          Action a;
          a.stream = s.ag;
          a.what = "my reduced piece " + num(j) + " into my C and the mates' C";
          a.waits.push_back({{r, k_tiles, W - 1, j}, ue});
          a.reads.push_back({{r, k_out, W - 1, j}});
          a.writes.push_back({{r, k_c, r, j}});
          for (int t : p.mates) {
            a.writes.push_back({{t, k_c, r, j}, Link::kNvlink, r, piece_bytes});
            a.sets.push_back({{t, k_c_arrived, r, j}, ue});
          }
          const int n = 1 + int(p.mates.size());
          a.body = [n](const std::vector<const Payload*>& in, std::vector<Payload>* out, std::string* why) {
            if (!in[0]) return *why = "nothing reduced", false;
            out->assign(size_t(n), *in[0]);
            return true;
          };
          run.add(std::move(a));
        }
        if (!p.mates.empty())
          for (int j = 0; j < S; ++j)
            for (int f : p.forwards) {
              Action a;
              a.stream = s.fwd;
              a.what = "forward of rank " + num(f) + "'s reduced piece " + num(j) + " to the mates";
              a.waits.push_back({{r, k_c_arrived, f, j}, ue});
              a.reads.push_back({{r, k_c, f, j}});
              for (int t : p.mates) {
                a.writes.push_back({{t, k_c, f, j}, Link::kNvlink, r, piece_bytes});
                a.sets.push_back({{t, k_c_arrived, f, j}, ue});
              }
              const int n = int(p.mates.size());
              a.body = [n](const std::vector<const Payload*>& in, std::vector<Payload>* out, std::string* why) {
                if (!in[0]) return *why = "nothing arrived", false;
                out->assign(size_t(n), *in[0]);
                return true;
              };
              run.add(std::move(a));
            }
      }

      // Main, behind the kernel: my slots of this run are read; AllReduce: every owner's rows are here.
      {
        Action a;
        a.stream = run.main_stream(r);
        a.what = "after the kernel: mates may reuse my slots";
        for (int b : s.compute) a.waits.push_back(run.finished(b));
        for (int ch : s.send) a.waits.push_back(run.finished(ch));
        for (int t : p.mates) a.sets.push_back({{t, k_mate_freed, r}, ue});
        run.add(std::move(a));
      }
      if (opt.all_reduce) {
        Action a;
        a.stream = run.main_stream(r);
        a.what = "wait for every owner's rows";
        for (int o = 0; o < W; ++o)
          if (o != r)
            for (int j = 0; j < S; ++j) a.waits.push_back({{r, k_c_arrived, o, j}, ue});
        run.add(std::move(a));
      }
    }
    run.end_run();
    // After the run: the owner's rows hold every partial once; AllReduce: every rank has every owner's.
    for (int r = 0; r < W; ++r) {
      Action a;
      a.stream = run.main_stream(r);
      a.what = "check the result of run " + num(e);
      for (int o = 0; o < W; ++o) {
        if (!opt.all_reduce && o != r) continue;
        for (int j = 0; j < S; ++j)
          a.reads.push_back(opt.all_reduce ? Read{{r, k_c, o, j}, true} : Read{{r, k_out, W - 1, j}, true});
      }
      const bool ar = opt.all_reduce;
      a.body = [=](const std::vector<const Payload*>& in, std::vector<Payload>*, std::string* why) {
        size_t i = 0;
        for (int o = 0; o < W; ++o) {
          if (!ar && o != r) continue;
          for (int j = 0; j < S; ++j, ++i) {
            const Payload* x = in[i];
            const std::string what = "owner " + num(o) + "'s rows, piece " + num(j);
            if (!x || x->epoch != ue) return *why = what + ": nothing of run " + num(e), false;
            if (x->block != o || x->piece != j)
              return *why = what + " hold owner " + num(x->block) + " piece " + num(x->piece), false;
            const std::string off = parts_text(x->parts, W);
            if (!off.empty()) return *why = what + ": partials not summed exactly once:" + off, false;
          }
        }
        return true;
      };
      run.add(std::move(a));
    }
  }
  return sim.run();
}

}  // namespace weft::sim
