// The one-node overlap path on the simulator (overlap_model.h).
#include "tests/sim/overlap_model.h"

#include <map>
#include <string>

#include "kernels/tile_scheduler.h"
#include "tests/sim/model_util.h"
#include "tests/sim/run_model.h"

namespace weft::sim {

namespace {

using kernels::OverlapStep;
using kernels::OverlapWord;
using kernels::OverlapWordKind;

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

bool pass_on(const std::vector<const Payload*>& in, std::vector<Payload>* out, std::string* why) {
  if (!in[0]) return *why = "nothing to copy", false;
  out->push_back(*in[0]);
  return true;
}

}  // namespace

kernels::OverlapShape overlap_shape(const OverlapSimOptions& o, int rank) {
  kernels::OverlapShape s;
  s.world = o.world, s.rank = rank, s.pieces = o.pieces, s.lag = o.lag;
  s.all_reduce = o.all_reduce, s.sm_send = o.sm_send, s.sm_gather = o.sm_gather;
  s.movers = o.movers;
  return s;
}

std::vector<int> overlap_order(const OverlapSimOptions& o, int rank) {
  const int W = o.world, S = o.pieces;
  kernels::TileSchedule t;
  const char* why = "";
  std::vector<int> order;
  if (!kernels::TileSchedule::make(int64_t(W) * S * 128, 256, 128, 256, 16, W * S, ((rank + 1) % W) * S, &t, &why) ||
      !t.set_piece_major(W, S, rank, o.lag, &why))
    return order;
  for (int step = 0; step < W * S; ++step) order.push_back(t.shard_at(uint32_t(step)));
  return order;
}

Result simulate_overlap(const OverlapSimOptions& opt) {
  Sim sim;
  const int W = opt.world, S = opt.pieces;
  const uint64_t tpp = opt.tiles_per_piece;
  const int k_partial = sim.kind("partial", "owner", "piece");
  const int k_slot = sim.kind("slot", "sender", "piece");
  const int k_out = sim.kind("out", "piece");
  const int k_c = sim.kind("C", "owner", "piece");
  std::map<OverlapWordKind, int> k_word;
  for (OverlapWordKind k :
       {OverlapWordKind::kArrived, OverlapWordKind::kLanded, OverlapWordKind::kMoved, OverlapWordKind::kTiles,
        OverlapWordKind::kGate, OverlapWordKind::kFreed, OverlapWordKind::kGathered, OverlapWordKind::kBcast})
    k_word[k] = sim.kind(kernels::to_string(k), "index", "contributor");
  auto key = [&](const OverlapWord& w, int contributor = 0) {
    return Key{w.rank, k_word[w.kind], int(w.index), contributor};
  };

  RunModel run(&sim, W, false);
  struct Streams {
    std::vector<int> send, push;
    int gates = -1, movers = -1;
  };
  std::vector<Streams> st(static_cast<size_t>(W));
  std::vector<std::vector<int>> orders(static_cast<size_t>(W));
  for (int r = 0; r < W; ++r) {
    orders[size_t(r)] = overlap_order(opt, r);
    if (orders[size_t(r)].size() != size_t(W * S)) {
      Result bad;
      bad.errors.push_back("rank " + num(r) + ": no piece-major order for " + num(W) + " x " + num(S) + " lag " +
                           num(opt.lag));
      return bad;
    }
    Streams& s = st[size_t(r)];
    for (int q = 0; q < W; ++q) {
      s.send.push_back(q == r ? -1 : run.stream(r, "send to " + num(q)));
      s.push.push_back(q == r ? -1 : run.stream(r, "push to " + num(q)));
    }
    s.gates = run.stream(r, "gates");
    s.movers = run.stream(r, "movers");
  }

  kernels::OverlapCounts n;
  for (int e = 1; e <= opt.runs; ++e) {
    const uint64_t ue = uint64_t(e);
    n.epoch = ue;
    n.landed_runs += opt.sm_send ? 1 : 0;
    n.bcast_runs += opt.sm_gather ? 1 : 0;
    n.mover_runs += overlap_shape(opt, 0).movers_on() ? 1 : 0;  // every rank alike
    run.begin_run(ue);
    for (int r = 0; r < W; ++r) {
      const kernels::OverlapShape shape = overlap_shape(opt, r);
      kernels::OverlapCall call = kernels::overlap_call(shape, orders[size_t(r)], tpp, n);
      if (opt.mutate) opt.mutate(r, &call);
      const Streams& s = st[size_t(r)];
      // One action per step: waits, writes and copies in stream order.
      auto steps = [&](int stream, const std::vector<OverlapStep>& list, const std::string& where) {
        for (const OverlapStep& x : list) {
          Action a;
          a.stream = stream;
          if (x.kind == OverlapStep::kWait) {
            a.what = where + ": wait " + kernels::to_string(x.word.kind) + "[" + num(x.word.index) + "] on rank " +
                     num(x.word.rank) + " >= " + num(int64_t(x.value));
            a.waits.push_back({key(x.word), x.value});
          } else if (x.kind == OverlapStep::kWrite) {
            a.what = where + ": " + kernels::to_string(x.word.kind) + "[" + num(x.word.index) + "] on rank " +
                     num(x.word.rank) + " = " + num(int64_t(x.value));
            a.sets.push_back({key(x.word), x.value});
          } else if (x.kind == OverlapStep::kCopyPiece) {
            a.what = where + ": copy of owner " + num(x.owner) + "'s piece " + num(x.piece) + " to rank " + num(x.to);
            a.reads.push_back({{r, k_partial, x.owner, x.piece}});
            a.writes.push_back(
                {{x.to, k_slot, r, x.piece}, x.to == r ? Link::kLocal : Link::kNvlink, r, opt.piece_bytes});
            a.body = pass_on;
          } else {
            a.what = where + ": copy of my reduced piece " + num(x.piece) + " to rank " + num(x.to);
            a.reads.push_back({{r, k_c, r, x.piece}});
            a.writes.push_back({{x.to, k_c, r, x.piece}, Link::kNvlink, r, opt.piece_bytes});
            a.body = pass_on;
          }
          run.add(std::move(a));
        }
      };
      const int main = run.main_stream(r);
      steps(main, call.before, "before the GEMM");
      // The GEMM, shard by shard.
      for (int step = 0; step < W * S; ++step) {
        const int shard = orders[size_t(r)][size_t(step)], o = shard / S, j = shard % S;
        Action a;
        a.stream = main;
        a.what = "GEMM tiles of owner " + num(o) + " piece " + num(j);
        OverlapWord tiles = call.tiles;
        tiles.index += shard;
        a.sets.push_back({key(tiles), ue * tpp});
        if (o == r) {
          OverlapWord gate = call.gate;
          gate.index += r * S + j;
          if (gate.kind == OverlapWordKind::kLanded) {  // every peer's count (each adds tpp a call)
            for (int p = 0; p < W; ++p)
              if (p != r) a.waits.push_back({key(gate, p), call.gate_at / uint64_t(W - 1)});
          } else {
            a.waits.push_back({key(gate), call.gate_at});
          }
          for (int p = 0; p < W; ++p)
            if (p != r) a.reads.push_back({{r, k_slot, p, j}});
          a.writes.push_back({opt.all_reduce ? Key{r, k_c, r, j} : Key{r, k_out, j}});
          for (const OverlapWord& w : call.bcast_counts) {
            a.writes.push_back({{w.rank, k_c, r, j}, Link::kNvlink, r, opt.piece_bytes});
            a.sets.push_back({key(w), (n.bcast_runs - 1) * tpp * uint64_t(S) + uint64_t(j + 1) * tpp});
          }
          const size_t copies = 1 + call.bcast_counts.size();
          a.body = [=](const std::vector<const Payload*>& in, std::vector<Payload>* out, std::string* why) {
            Payload y;
            y.block = r, y.piece = j, y.epoch = ue;
            y.parts[r] = 1;
            for (const Payload* x : in) {
              if (!x || x->block != r || x->piece != j || x->epoch != ue)
                return *why = "a slot of piece " + num(j) + " holds " +
                              (x ? "owner " + num(x->block) + " piece " + num(x->piece) + " of call " +
                                       num(int64_t(x->epoch))
                                 : std::string("nothing")) +
                              " (wanted call " + num(e) + ")",
                       false;
              for (const auto& [q, c] : x->parts) y.parts[q] += c;
            }
            out->assign(copies, y);
            return true;
          };
        } else {
          const OverlapWord& base = call.part_counts[size_t(o)];
          if (opt.sm_send) {
            OverlapWord landed = base;
            landed.index += j;
            a.writes.push_back({{o, k_slot, r, j}, Link::kNvlink, r, opt.piece_bytes});
            a.sets.push_back({key(landed, r), n.landed_runs * tpp});
          } else {
            a.writes.push_back({{r, k_partial, o, j}});
          }
          a.body = [=](const std::vector<const Payload*>&, std::vector<Payload>* out, std::string*) {
            Payload y;
            y.block = o, y.piece = j, y.epoch = ue;
            y.parts[r] = 1;
            out->push_back(y);
            return true;
          };
        }
        run.add(std::move(a));
      }
      steps(main, call.after, "after the GEMM");
      for (int q = 0; q < W; ++q)
        if (q != r) {
          steps(s.send[size_t(q)], call.sends[size_t(q)], "send to " + num(q));
          steps(s.push[size_t(q)], call.push[size_t(q)], "push to " + num(q));
        }
      steps(s.gates, call.gates, "gates");
      for (const kernels::OverlapMove& m : call.moves) {
        Action a;
        a.stream = s.movers;
        a.what = "movers: owner " + num(m.owner) + "'s piece " + num(m.piece);
        a.waits.push_back({key(m.clear), m.clear_at});
        a.waits.push_back({key(m.ready), m.ready_at});
        a.reads.push_back({{r, k_partial, m.owner, m.piece}});
        a.writes.push_back({{m.owner, k_slot, r, m.piece}, Link::kNvlink, r, opt.piece_bytes});
        a.sets.push_back({key(m.landed), n.mover_runs * uint64_t(opt.movers)});
        a.body = pass_on;
        run.add(std::move(a));
      }
    }
    run.end_run();
    // What the call left: RS, this rank's rows; AR, every owner's rows (what the caller copies out).
    for (int r = 0; r < W; ++r) {
      Action a;
      a.stream = run.main_stream(r);
      a.what = "check the result of call " + num(e);
      for (int o = 0; o < W; ++o) {
        if (!opt.all_reduce && o != r) continue;
        for (int j = 0; j < S; ++j) a.reads.push_back({opt.all_reduce ? Key{r, k_c, o, j} : Key{r, k_out, j}, true});
      }
      const bool ar = opt.all_reduce;
      a.body = [=](const std::vector<const Payload*>& in, std::vector<Payload>*, std::string* why) {
        size_t i = 0;
        for (int o = 0; o < W; ++o) {
          if (!ar && o != r) continue;
          for (int j = 0; j < S; ++j, ++i) {
            const Payload* x = in[i];
            const std::string what = "owner " + num(o) + "'s rows, piece " + num(j);
            if (!x || x->epoch != ue) return *why = what + ": nothing of call " + num(e), false;
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
