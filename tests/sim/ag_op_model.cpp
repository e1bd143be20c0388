// The one-node AllGather+GEMM op's copy-engine protocol on the simulator (ag_op_model.h).
#include "tests/sim/ag_op_model.h"

#include <string>
#include <vector>

#include "tests/sim/model_util.h"

namespace weft::sim {

Result simulate_ag_op(int world, int calls, AgOpVariant variant, uint64_t seed) {
  Sim sim;
  sim.schedule(seed);
  const int W = world;
  const int k_a = sim.kind("gathered A", "shard"), k_c = sim.kind("C", "shard");
  const int f_gate = sim.kind("gate", "shard"), f_consumed = sim.kind("consumed", "peer");
  const int f_ready = sim.kind("created"), f_fork = sim.kind("fork", "call"), f_pushed = sim.kind("pushed", "call");
  std::vector<int> caller(size_t(W), -1), copier(size_t(W), -1);
  for (int r = 0; r < W; ++r) {
    caller[size_t(r)] = sim.stream(r, "caller's stream");
    copier[size_t(r)] = sim.stream(r, "copy stream");
    // Creation: consumed[q] = 1 (no peer holds a shard yet), the own shard's gate always open; then
    // a barrier (every rank's words set before any call).
    Action init;
    init.stream = caller[size_t(r)];
    init.what = "create";
    for (int q = 0; q < W; ++q)
      if (q != r) init.sets.push_back({{r, f_consumed, q}, 1, false, true});
    init.sets.push_back({{r, f_gate, r}, 1, false, true});
    init.sets.push_back({{r, f_ready}, 1});
    sim.add(init);
  }
  for (int e = 1; e <= calls; ++e) {
    const uint64_t call = uint64_t(e);
    for (int r = 0; r < W; ++r) {
      Action in;
      in.stream = caller[size_t(r)];
      in.what = "call " + num(e) + ": the caller's A into the shard";
      if (e == 1)
        for (int q = 0; q < W; ++q) in.waits.push_back({{q, f_ready}, 1});  // the creation's barrier
      in.writes.push_back({{r, k_a, r}});
      in.body = [r, call](const std::vector<const Payload*>&, std::vector<Payload>* out, std::string*) {
        out->push_back(Payload{r, 0, {{r, 1}}, call});
        return true;
      };
      in.sets.push_back({{r, f_fork, e}, 1});
      sim.add(in);
      // The pushes, r-1 first (the peer whose GEMM takes r's shard right after its own). Each stream
      // operation is an action of its own, so that other ranks' actions can come between them.
      for (int i = 1; i < W; ++i) {
        const int q = (r - i + W) % W;
        const std::string to = "call " + num(e) + ": push to rank " + num(q) + ": ";
        Action take;
        take.stream = copier[size_t(r)];
        take.what = to + "wait for its token, reset it";
        if (i == 1) take.waits.push_back({{r, f_fork, e}, 1});
        if (variant != AgOpVariant::kNoConsumedWait) take.waits.push_back({{r, f_consumed, q}, 1});
        if (variant != AgOpVariant::kResetLate) take.sets.push_back({{r, f_consumed, q}, 0, false, true});
        sim.add(take);
        Action p;
        p.stream = copier[size_t(r)];
        p.what = to + "the shard";
        p.reads.push_back({{r, k_a, r}});
        p.writes.push_back({{q, k_a, r}, Link::kNvlink, r, 1});
        p.body = [](const std::vector<const Payload*>& in, std::vector<Payload>* out, std::string* why) {
          if (!in[0]) return *why = "the own shard is not there", false;
          out->push_back(*in[0]);
          return true;
        };
        sim.add(p);
        Action open;
        open.stream = copier[size_t(r)];
        open.what = to + "open its gate";
        open.sets.push_back({{q, f_gate, r}, 1, false, true});
        if (i == W - 1 && variant != AgOpVariant::kResetLate) open.sets.push_back({{r, f_pushed, e}, 1});
        sim.add(open);
        if (variant == AgOpVariant::kResetLate) {
          Action late;
          late.stream = copier[size_t(r)];
          late.what = to + "reset its token (late)";
          late.sets.push_back({{r, f_consumed, q}, 0, false, true});
          if (i == W - 1) late.sets.push_back({{r, f_pushed, e}, 1});
          sim.add(late);
        }
      }
      // The GEMM, shard by shard in its order (its own first), each behind its gate.
      for (int i = 0; i < W; ++i) {
        const int q = (r + i) % W;
        Action g;
        g.stream = caller[size_t(r)];
        g.what = "call " + num(e) + ": GEMM of shard " + num(q);
        if (variant != AgOpVariant::kUngated) g.waits.push_back({{r, f_gate, q}, 1});
        g.reads.push_back({{r, k_a, q}, true});
        g.writes.push_back({{r, k_c, q}});
        g.body = [q, call](const std::vector<const Payload*>& in, std::vector<Payload>* out, std::string* why) {
          if (!in[0] || in[0]->block != q || in[0]->epoch != call)
            return *why = "shard " + num(q) + " of call " + num(int64_t(call)) + " is not what it read (" +
                          (in[0] ? "call " + num(int64_t(in[0]->epoch)) + "'s" : std::string("nothing")) + ")",
                   false;
          out->push_back(*in[0]);
          return true;
        };
        sim.add(g);
      }
      // S (one batch of stream writes, in order): the gates closed, every peer told this rank is done
      // with its shard; then the pushes joined.
      for (int q = 0; q < W; ++q)
        if (q != r) {
          Action close;
          close.stream = caller[size_t(r)];
          close.what = "call " + num(e) + ": close the gate of shard " + num(q);
          close.sets.push_back({{r, f_gate, q}, 0, false, true});
          sim.add(close);
        }
      for (int q = 0; q < W; ++q)
        if (q != r) {
          Action done;
          done.stream = caller[size_t(r)];
          done.what = "call " + num(e) + ": hand rank " + num(q) + " its token";
          done.sets.push_back({{q, f_consumed, r}, 1, false, true});
          sim.add(done);
        }
      Action join;
      join.stream = caller[size_t(r)];
      join.what = "call " + num(e) + ": join the copy stream";
      join.waits.push_back({{r, f_pushed, e}, 1});
      sim.add(join);
    }
  }
  return sim.run();
}

}  // namespace weft::sim
