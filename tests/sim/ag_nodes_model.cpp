// AllGather+GEMM across nodes on the simulator (ag_nodes_model.h).
#include "tests/sim/ag_nodes_model.h"

#include <string>

#include "tests/sim/model_util.h"
#include "tests/sim/run_model.h"

namespace weft::sim {

namespace {

// A copy that keeps what it moves and stamps the run: the data check is the consumer's.
Body relay(uint64_t e, int targets) {
  return [e, targets](const std::vector<const Payload*>& in, std::vector<Payload>* out, std::string* why) {
    if (!in[0]) return *why = "its source holds nothing", false;
    Payload p = *in[0];
    p.epoch = e;
    out->assign(size_t(targets), p);
    return true;
  };
}

}  // namespace

Result simulate_ag_nodes(const std::vector<kernels::AgNodesPlan>& plans, const std::vector<int>& node_of,
                         const std::vector<int>& local_of, const AgNodesSimOptions& opt) {
  Sim sim;
  const int W = int(plans.size()), C = opt.chunks;
  std::vector<std::string> plan_errors;
  const int k_a = sim.kind("A", "position", "chunk");
  const int k_flag = sim.kind("flag", "position", "chunk");
  const int k_c = sim.kind("C", "shard", "chunk");
  const int k_rail_freed = sim.kind("rail_freed", "rank");
  const int k_mate_freed = sim.kind("mate_freed", "rank");
  const int64_t chunk_bytes = opt.shard_bytes / C;
  for (int r = 0; r < W; ++r)
    for (int c = 0; c < C; ++c) {
      Payload p;
      p.block = r;
      p.piece = c;
      p.parts[r] = 1;
      sim.input({r, k_a, 0, c}, p);
    }
  auto same_node = [&](int a, int b) { return node_of[size_t(a)] == node_of[size_t(b)]; };
  auto in_job = [&](int q) { return q >= 0 && q < W; };
  auto in_range = [&](int pos) { return pos >= 0 && pos < W; };

  RunModel run(&sim, W, opt.barrier);
  std::vector<int> copy(static_cast<size_t>(W)), last(static_cast<size_t>(W), -1);
  std::vector<std::vector<int>> compute(static_cast<size_t>(W)), send(static_cast<size_t>(W)),
      fwd(static_cast<size_t>(W));
  for (int r = 0; r < W; ++r) {
    copy[size_t(r)] = run.stream(r, "copy engine");
    for (int ch = 0; ch < opt.channels; ++ch)
      send[size_t(r)].push_back(run.stream(r, "inter_send channel " + std::to_string(ch)));
    for (int b = 0; b < opt.forward_blocks; ++b)
      fwd[size_t(r)].push_back(run.stream(r, "intra_comm block " + std::to_string(b)));
    for (int b = 0; b < opt.compute_blocks; ++b)
      compute[size_t(r)].push_back(run.stream(r, "compute block " + std::to_string(b)));
    if (opt.copy_in == AgNodesSimOptions::CopyIn::kFreedAtEnd) last[size_t(r)] = run.stream(r, "last compute block");
  }
  for (int r = 0; r < W; ++r) {
    const kernels::AgNodesPlan& p = plans[size_t(r)];
    if (p.rank != r || p.world != W || int(p.order.size()) != W)
      plan_errors.push_back("plan error: rank " + num(r) + "'s plan is for rank " + num(p.rank) + " of " +
                            num(p.world) + " with " + num(int64_t(p.order.size())) + " positions");
    for (const kernels::AgNodesPull& pl : p.pulls)
      if (!in_job(pl.mate) || !same_node(r, pl.mate) || !in_range(pl.dst_pos))
        plan_errors.push_back("plan error: rank " + num(r) + " pulls from rank " + num(pl.mate) +
                              ", not a node-mate (NVLink reaches only node-mates)");
    for (const kernels::AgNodesSend& s : p.sends)
      if (!in_job(s.peer) || same_node(r, s.peer) || local_of[size_t(s.peer)] != local_of[size_t(r)] ||
          !in_range(s.dst_pos))
        plan_errors.push_back("plan error: rank " + num(r) + " sends through the NIC to rank " + num(s.peer) +
                              ", which is not its rail peer on another node");
    for (const kernels::AgNodesForward& f : p.forwards)
      for (auto [mate, pos] : f.to)
        if (!in_job(mate) || !same_node(r, mate) || !in_range(pos))
          plan_errors.push_back("plan error: rank " + num(r) + " forwards shard " + num(f.shard) + " to rank " +
                                num(mate) + ", not a node-mate");
  }
  if (!plan_errors.empty()) {
    Result res;
    res.errors = plan_errors;
    return res;
  }

  using CopyIn = AgNodesSimOptions::CopyIn;
  const bool fresh = opt.copy_in != CopyIn::kFixedInput;
  const bool freed_at_start = opt.copy_in != CopyIn::kFreedAtEnd;
  // The ranks whose reads of my position 0 a copy-in must follow: node-mates (they pull it) and rail
  // peers (their puts read it on my side); each raises its freed word in my memory.
  // With a copy-in, the kernel and the copy stream start after it (the launch and the fork come
  // after it on the main stream): every action of theirs follows this rank's own flags of the run.
  auto launched = [&](int r, uint64_t e, Action* a) {
    if (fresh) a->waits.push_back({{r, k_flag, 0, C - 1}, e});
  };
  auto mates_of = [&](int r) {
    std::vector<int> m;
    for (int q = 0; q < W; ++q)
      if (q != r && same_node(r, q)) m.push_back(q);
    return m;
  };
  for (int e = 1; e <= opt.runs; ++e) {
    const uint64_t ue = uint64_t(e);
    run.begin_run(ue);
    for (int r = 0; r < W; ++r) {
      const kernels::AgNodesPlan& p = plans[size_t(r)];
      if (fresh)
        for (int c = 0; c < C; ++c) {
          Action a;
          a.stream = run.main_stream(r);
          a.what = "copy-in of the caller's shard, chunk " + num(c);
          if (opt.copy_in != CopyIn::kNone && e > 1) {
            for (int q : mates_of(r)) a.waits.push_back({{r, k_mate_freed, q}, ue - 1});
            for (const kernels::AgNodesSend& s : p.sends) a.waits.push_back({{r, k_rail_freed, s.peer}, ue - 1});
          }
          a.writes.push_back({{r, k_a, 0, c}, Link::kLocal, r, chunk_bytes});
          a.body = [r, c, ue](const std::vector<const Payload*>&, std::vector<Payload>* out, std::string*) {
            Payload x;
            x.block = r;
            x.piece = c;
            x.parts[r] = 1;
            x.epoch = ue;
            out->push_back(x);
            return true;
          };
          run.add(std::move(a));
        }
      for (int c = 0; c < C; ++c) {
        Action a;
        a.stream = run.main_stream(r);
        a.what = "own flag, chunk " + num(c);
        a.sets.push_back({{r, k_flag, 0, c}, ue});
        run.add(std::move(a));
      }
      for (const kernels::AgNodesPull& pl : p.pulls)
        for (int c = 0; c < C; ++c) {
          Action a;
          a.stream = copy[size_t(r)];
          launched(r, ue, &a);
          a.what = "pull of rank " + num(pl.mate) + "'s shard chunk " + num(c) + " into position " + num(pl.dst_pos);
          if (fresh) a.waits.push_back({{pl.mate, k_flag, 0, c}, ue});  // the mate's copy-in of this run
          a.reads.push_back({{pl.mate, k_a, 0, c}});
          a.writes.push_back({{r, k_a, pl.dst_pos, c}, Link::kNvlink, pl.mate, chunk_bytes});
          a.sets.push_back({{r, k_flag, pl.dst_pos, c}, ue});
          a.body = relay(ue, 1);
          run.add(std::move(a));
        }
      // inter_send: the rail peers' "freed" first (channel 0), then each put once its peer freed mine.
      if (!p.sends.empty() && freed_at_start) {
        Action a;
        a.stream = send[size_t(r)][0];
        launched(r, ue, &a);
        a.what = "rail peers: their puts of run " + num(e - 1) + " freed";
        for (const kernels::AgNodesSend& s : p.sends) a.sets.push_back({{s.peer, k_rail_freed, r}, ue - 1});
        run.add(std::move(a));
      }
      for (int c = 0; c < C; ++c)
        for (const kernels::AgNodesSend& s : p.sends) {
          Action a;
          a.stream = send[size_t(r)][size_t(c % opt.channels)];
          launched(r, ue, &a);
          a.what = "put of chunk " + num(c) + " to rank " + num(s.peer) + " position " + num(s.dst_pos);
          if (opt.freed) a.waits.push_back({{r, k_rail_freed, s.peer}, ue - 1});
          if (fresh) a.waits.push_back({{r, k_flag, 0, c}, ue});  // after the copy-in (the launch's stream order)
          a.reads.push_back({{r, k_a, 0, c}});
          a.writes.push_back({{s.peer, k_a, s.dst_pos, c}, Link::kNic, r, chunk_bytes});
          a.sets.push_back({{s.peer, k_flag, s.dst_pos, c}, ue});
          a.body = relay(ue, 1);
          run.add(std::move(a));
        }
      // intra_comm block 0: the node-mates' "freed" first, then each forward once its mates freed mine.
      if (!p.forwards.empty() && freed_at_start) {
        Action a;
        a.stream = fwd[size_t(r)][0];
        launched(r, ue, &a);
        a.what = "node-mates: their forwards of run " + num(e - 1) + " freed";
        for (auto [mate, pos] : p.forwards[0].to) a.sets.push_back({{mate, k_mate_freed, r}, ue - 1});
        run.add(std::move(a));
      }
      int item = 0;
      for (int c = 0; c < C; ++c)
        for (const kernels::AgNodesForward& f : p.forwards) {
          Action a;
          a.stream = fwd[size_t(r)][size_t(item++ % opt.forward_blocks)];
          launched(r, ue, &a);
          a.what = "forward of shard " + num(f.shard) + " chunk " + num(c) + " (position " + num(f.src_pos) + ")";
          a.waits.push_back({{r, k_flag, f.src_pos, c}, ue});
          if (opt.freed)
            for (auto [mate, pos] : f.to) a.waits.push_back({{r, k_mate_freed, mate}, ue - 1});
          a.reads.push_back({{r, k_a, f.src_pos, c}});
          for (auto [mate, pos] : f.to) {
            a.writes.push_back({{mate, k_a, pos, c}, Link::kNvlink, r, chunk_bytes});
            a.sets.push_back({{mate, k_flag, pos, c}, ue});
          }
          a.body = relay(ue, int(f.to.size()));
          run.add(std::move(a));
        }
      // The GEMM: unit (pos, c) = shard pos * C + c, block b takes units b, b + B, ...
      for (int pos = 0; pos < W; ++pos)
        for (int c = 0; c < C; ++c) {
          const int unit = pos * C + c, shard = p.order[size_t(pos)];
          Action a;
          a.stream = compute[size_t(r)][size_t(unit % opt.compute_blocks)];
          launched(r, ue, &a);
          a.what = "GEMM tiles of position " + num(pos) + " chunk " + num(c);
          a.waits.push_back({{r, k_flag, pos, c}, ue});
          a.reads.push_back({{r, k_a, pos, c}});
          a.writes.push_back({{r, k_c, shard, c}, Link::kLocal, r, 0});
          a.body = [=](const std::vector<const Payload*>& in, std::vector<Payload>* out, std::string* why) {
            const Payload* x = in[0];
            if (!x) return *why = "position " + num(pos) + " holds nothing", false;
            const uint64_t want = pos == 0 && !fresh ? 0 : ue;
            if (x->block != shard || x->piece != c)
              return *why = "position " + num(pos) + " chunk " + num(c) + " holds shard " + num(x->block) + " chunk " +
                            num(x->piece) + ", the order says shard " + num(shard),
                     false;
            if (x->epoch != want)
              return *why = "position " + num(pos) + " holds the data of run " + num(int64_t(x->epoch)), false;
            Payload y = *x;
            y.epoch = ue;
            out->push_back(y);
            return true;
          };
          run.add(std::move(a));
        }
      // Freed at the end: once every compute block is past its last tile of the run and every
      // intra_comm block past its last forward (the kernel's last block to finish, whatever its
      // role), this rank has read everything its mates and rail peers gave it.
      if (!freed_at_start) {
        std::vector<int> readers = compute[size_t(r)];
        readers.insert(readers.end(), fwd[size_t(r)].begin(), fwd[size_t(r)].end());
        Action a;
        a.stream = last[size_t(r)];
        launched(r, ue, &a);
        a.what = "run " + num(e) + " read: mates and rail peers freed";
        for (int st : readers) {
          run.finish(st);
          a.waits.push_back(run.finished(st));
        }
        for (int q : mates_of(r)) a.sets.push_back({{q, k_mate_freed, r}, ue});
        for (const kernels::AgNodesSend& s : p.sends) a.sets.push_back({{s.peer, k_rail_freed, r}, ue});
        run.add(std::move(a));
      }
    }
    run.end_run();
    // After the run: every rank's C holds every shard of this run.
    for (int r = 0; r < W; ++r) {
      Action a;
      a.stream = run.main_stream(r);
      a.what = "check C after run " + num(e);
      for (int s = 0; s < W; ++s)
        for (int c = 0; c < C; ++c) a.reads.push_back({{r, k_c, s, c}, true});
      a.body = [=](const std::vector<const Payload*>& in, std::vector<Payload>*, std::string* why) {
        for (int s = 0; s < W; ++s)
          for (int c = 0; c < C; ++c) {
            const Payload* x = in[size_t(s * C + c)];
            if (!x || x->epoch != ue)
              return *why = "C rows of shard " + num(s) + " chunk " + num(c) + " missing after run " + num(e), false;
          }
        return true;
      };
      run.add(std::move(a));
    }
  }
  return sim.run();
}

}  // namespace weft::sim
