// The fused MoE launch on the simulator (moe_fused_model.h).
#include "tests/sim/moe_fused_model.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "tests/sim/model_util.h"

namespace weft::sim {

namespace {

using kernels::MoeFusedShape;
using kernels::MoePhase;
using kernels::MoeUnit;

// What every rank knows of one call once the counts are in (the model computes it for all ranks).
struct CallView {
  int W = 0, T = 0, L = 0;
  const MoeChoices* choices = nullptr;
  // slot[(h * W + q) * T + t]: token t of home h's slot at owner q (-1: t does not go to q)
  std::vector<int> slot;
  std::vector<int> nslots;                                    // [h * W + q]
  std::vector<std::vector<int>> slot_tok;                     // [h * W + q][slot] -> token
  std::vector<std::vector<int32_t>> counts, offsets, totals;  // per owner q: [s * L + l], [L + 1], [L]
  // row[(q, s, slot, l)] -> X row at q
  std::map<std::tuple<int, int, int, int>, int> row;
  std::vector<std::vector<std::pair<int, int>>> row_of;  // per owner q: X row -> (home * T + token, local expert)

  const std::vector<int>& experts(int h, int t) const { return (*choices)[size_t(h) * size_t(T) + size_t(t)]; }
  bool goes(int h, int t, int q) const {
    for (int e : experts(h, t))
      if (e / L == q) return true;
    return false;
  }

  void make(const MoeFusedShape& s, const MoeChoices& c) {
    W = s.world, T = s.tokens, L = s.local_experts();
    choices = &c;
    slot.assign(size_t(W) * W * T, -1);
    nslots.assign(size_t(W) * W, 0);
    slot_tok.assign(size_t(W) * W, {});
    for (int h = 0; h < W; ++h)
      for (int t = 0; t < T; ++t)
        for (int q = 0; q < W; ++q)
          if (goes(h, t, q)) {
            const size_t hq = size_t(h) * W + size_t(q);
            slot[hq * T + size_t(t)] = nslots[hq]++;
            slot_tok[hq].push_back(t);
          }
    counts.assign(size_t(W), std::vector<int32_t>(size_t(W) * L, 0));
    totals.assign(size_t(W), std::vector<int32_t>(size_t(L), 0));
    offsets.assign(size_t(W), std::vector<int32_t>(size_t(L) + 1, 0));
    row_of.assign(size_t(W), {});
    for (int q = 0; q < W; ++q) {
      for (int h = 0; h < W; ++h)
        for (int t : slot_tok[size_t(h) * W + size_t(q)])
          for (int e : experts(h, t))
            if (e / L == q) ++counts[size_t(q)][size_t(h) * L + size_t(e % L)];
      for (int l = 0; l < L; ++l)
        for (int h = 0; h < W; ++h) totals[size_t(q)][size_t(l)] += counts[size_t(q)][size_t(h) * L + size_t(l)];
      kernels::moe_expert_offsets(totals[size_t(q)].data(), L, kernels::kMoeTileRows, offsets[size_t(q)].data());
      row_of[size_t(q)].assign(size_t(offsets[size_t(q)][size_t(L)]), {-1, -1});
      for (int h = 0; h < W; ++h) {
        std::vector<int32_t> nth(size_t(L), 0);
        const size_t hq = size_t(h) * W + size_t(q);
        for (int sl = 0; sl < nslots[hq]; ++sl) {
          const int t = slot_tok[hq][size_t(sl)];
          std::vector<int> mine;
          for (int e : experts(h, t))
            if (e / L == q) mine.push_back(e % L);
          std::sort(mine.begin(), mine.end());
          for (int l : mine) {
            const int r =
                kernels::moe_fused_row(offsets[size_t(q)].data(), counts[size_t(q)].data(), L, h, l, nth[size_t(l)]++);
            row[{q, h, sl, l}] = r;
            row_of[size_t(q)][size_t(r)] = {h * T + t, l};
          }
        }
      }
    }
  }
  int tiles(int q) const { return offsets[size_t(q)][size_t(L)] / kernels::kMoeTileRows; }
  int tile_rows(int q, int g) const {
    return kernels::moe_fused_tile_rows(offsets[size_t(q)].data(), totals[size_t(q)].data(), L, g);
  }
};

struct Model {
  Sim sim;
  MoeFusedShape shape;
  int W, T, L, R, B, C;
  MoeFusedDrop drop;
  // data
  int k_tok = sim.kind("token", "token");
  int k_topk = sim.kind("top-k", "tile");
  int k_counts = sim.kind("count table", "source");
  int k_recv = sim.kind("receive slot", "source", "slot");
  int k_info = sim.kind("slot header", "source", "slot");
  int k_x = sim.kind("X row", "row");
  int k_h = sim.kind("H row", "row", "column block");
  int k_y = sim.kind("Y row", "row", "column block");
  int k_comb = sim.kind("combine row", "owner", "slot");
  int k_out = sim.kind("out", "token");
  // words (a: call, where the word is per call: the kernel's parity sets, zeroed before reuse)
  int w_routed = sim.kind("routed", "call");
  int w_counts_in = sim.kind("counts_in", "call");
  int w_sent = sim.kind("sent", "call", "source");
  int w_rows = sim.kind("rows", "call", "tile");
  int w_arranged = sim.kind("arranged", "call");
  int w_up = sim.kind("up_done", "call", "tile");
  int w_down = sim.kind("down_done", "call", "tile");
  int w_combined = sim.kind("combined", "call", "owner");
  int w_freed = sim.kind("freed", "owner");  // = the call whose arranges are done (epoch word)
  int w_ended = sim.kind("launch ended", "call");
  std::vector<std::vector<int>> block_stream;    // [rank][block]
  std::vector<std::vector<bool>> first_of_call;  // [rank][block]: the block's next action opens a call

  explicit Model(const MoeFusedRun& run)
      : shape(run.shape),
        W(run.shape.world),
        T(run.shape.tokens),
        L(run.shape.local_experts()),
        R(run.shape.token_tiles()),
        B(run.blocks),
        C(run.shape.slot_chunks()),
        drop(run.drop) {
    sim.check_races(run.races);
    sim.schedule(run.schedule);
    block_stream.assign(size_t(W), {});
    first_of_call.assign(size_t(W), std::vector<bool>(size_t(B), false));
    for (int r = 0; r < W; ++r) {
      for (int b = 0; b < B; ++b) block_stream[size_t(r)].push_back(sim.stream(r, "block " + num(b)));
      for (int t = 0; t < T; ++t) sim.input({r, k_tok, t}, Payload{r * T + t, 0, {}, 0});
    }
  }

  // The words every block of a launch adds to once its call is over: the next launch of the rank
  // starts after all of them.
  int launch_parties() const { return B; }

  void add(int r, int b, int call, Action a) {
    a.stream = block_stream[size_t(r)][size_t(b)];
    if (first_of_call[size_t(r)][size_t(b)] && call > 1)
      a.waits.push_back({{r, w_ended, call - 1}, uint64_t(launch_parties())});
    first_of_call[size_t(r)][size_t(b)] = false;
    sim.add(std::move(a));
  }

  void call(int e, const MoeChoices& choices) {
    CallView v;
    v.make(shape, choices);
    for (int r = 0; r < W; ++r)
      for (int b = 0; b < B; ++b) first_of_call[size_t(r)][size_t(b)] = true;
    for (int r = 0; r < W; ++r) {
      MoeFusedShape s = shape;
      s.rank = r;
      const int64_t tickets = kernels::moe_fused_first(s, MoePhase::kEnd);
      for (int64_t t = 0; t < tickets; ++t) unit(e, v, r, int(t % B), kernels::moe_fused_unit(s, t));
      for (int b = 0; b < B; ++b) {
        Action end;
        end.what = "call " + num(e) + " ends";
        end.sets.push_back({{r, w_ended, e}, 1, true});
        add(r, b, e, std::move(end));
      }
    }
  }

  void unit(int e, const CallView& v, int r, int b, const MoeUnit& u) {
    Action a;
    switch (u.phase) {
      case MoePhase::kRoute: {
        a.what = "route tile " + num(u.a) + " (call " + num(e) + ")";
        for (int t = u.a * 128; t < std::min(T, (u.a + 1) * 128); ++t) a.reads.push_back({{r, k_tok, t}});
        a.writes.push_back({{r, k_topk, u.a}});
        a.body = [u, e](const std::vector<const Payload*>&, std::vector<Payload>* out, std::string*) {
          out->push_back(Payload{u.a, 0, {}, uint64_t(e)});
          return true;
        };
        a.sets.push_back({{r, w_routed, e}, 1, true});
        break;
      }
      case MoePhase::kDispatch: {
        a.what = "dispatch tile " + num(u.a) + " (call " + num(e) + ")";
        if (drop != MoeFusedDrop::kRouted) a.waits.push_back({{r, w_routed, e}, uint64_t(R)});
        for (int q = 0; q < W; ++q)
          if (e > 1 && drop != MoeFusedDrop::kFreed) a.waits.push_back({{r, w_freed, q}, uint64_t(e - 1)});
        for (int i = 0; i <= u.a; ++i) a.reads.push_back({{r, k_topk, i}});  // the slot prefix
        std::vector<int> blocks;
        std::vector<std::map<int, int>> parts;
        if (u.a == 0)
          for (int q = 0; q < W; ++q) {
            a.writes.push_back({{q, k_counts, r}, q == r ? Link::kLocal : Link::kNvlink, r, int64_t(C) * L * 4});
            blocks.push_back(-1 - r);
            parts.push_back({});
          }
        for (int t = u.a * 128; t < std::min(T, (u.a + 1) * 128); ++t)
          for (int q = 0; q < W; ++q) {
            const int sl = v.slot[(size_t(r) * W + size_t(q)) * T + size_t(t)];
            if (sl < 0) continue;
            a.reads.push_back({{r, k_tok, t}});
            a.writes.push_back({{q, k_recv, r, sl}, q == r ? Link::kLocal : Link::kNvlink, r, 0});
            blocks.push_back(r * T + t);
            std::map<int, int> p;
            for (int x : v.experts(r, t))
              if (x / L == q) p[x] = 1;
            parts.push_back(p);
          }
        const int reads_topk = u.a + 1;
        a.body = [blocks, parts, e, reads_topk](const std::vector<const Payload*>& in, std::vector<Payload>* out,
                                                std::string* why) {
          for (int i = 0; i < reads_topk; ++i)
            if (!in[size_t(i)] || in[size_t(i)]->epoch != uint64_t(e))
              return *why = "the top-k of tile " + num(i) + " of this call is not there", false;
          size_t at = size_t(reads_topk);
          for (size_t i = 0; i < blocks.size(); ++i) {
            if (blocks[i] >= 0 && (!in[at] || in[at]->block != blocks[i]))
              return *why = "token " + num(blocks[i]) + "'s row is not the one read", false;
            if (blocks[i] >= 0) ++at;
            out->push_back(Payload{blocks[i], 0, parts[i], uint64_t(e)});
          }
          return true;
        };
        if (u.a == 0)
          for (int q = 0; q < W; ++q) a.sets.push_back({{q, w_counts_in, e}, 1, true});
        for (int q = 0; q < W; ++q) a.sets.push_back({{q, w_sent, e, r}, 1, true});
        break;
      }
      case MoePhase::kArrange: {
        const int src = u.a, c = u.b, n = v.nslots[size_t(src) * W + size_t(r)];
        if (c * shape.chunk >= n) return;  // an empty unit
        a.what = "arrange source " + num(src) + " chunk " + num(c) + " (call " + num(e) + ")";
        a.waits.push_back({{r, w_sent, e, src}, uint64_t(R)});
        if (drop != MoeFusedDrop::kCountsIn) a.waits.push_back({{r, w_counts_in, e}, uint64_t(W)});
        for (int q = 0; q < W; ++q) a.reads.push_back({{r, k_counts, q}});
        std::vector<std::pair<int, int>> rows;  // (token gid, local expert) per X row written
        std::map<int, int> per_tile;
        const int lo = c * shape.chunk, hi = std::min(n, (c + 1) * shape.chunk);
        for (int sl = lo; sl < hi; ++sl) {
          a.reads.push_back({{r, k_recv, src, sl}});
          a.writes.push_back({{r, k_info, src, sl}});
        }
        for (int sl = lo; sl < hi; ++sl) {
          const int t = v.slot_tok[size_t(src) * W + size_t(r)][size_t(sl)];
          for (int x : v.experts(src, t))
            if (x / L == r) {
              const int row = v.row.at({r, src, sl, x % L});
              a.writes.push_back({{r, k_x, row}});
              rows.push_back({src * T + t, x % L});
              ++per_tile[row / kernels::kMoeTileRows];
            }
        }
        const int W_ = W, e_ = e, nslot = hi - lo;
        a.body = [W_, e_, nslot, rows](const std::vector<const Payload*>& in, std::vector<Payload>* out,
                                       std::string* why) {
          for (int q = 0; q < W_; ++q)
            if (!in[size_t(q)] || in[size_t(q)]->epoch != uint64_t(e_))
              return *why = "source " + num(q) + "'s count table of this call is not there", false;
          for (int i = 0; i < nslot; ++i) {
            const Payload* p = in[size_t(W_ + i)];
            if (!p || p->epoch != uint64_t(e_)) return *why = "a receive slot of this call is empty", false;
            out->push_back(*p);  // the slot's header, kept beside X
          }
          for (const auto& [gid, l] : rows) out->push_back(Payload{gid, l, {}, uint64_t(e_)});
          return true;
        };
        for (const auto& [g, cnt] : per_tile) a.sets.push_back({{r, w_rows, e, g}, uint64_t(cnt), true});
        a.sets.push_back({{r, w_arranged, e}, 1, true});
        break;
      }
      case MoePhase::kRelease: {
        int chunks = 0;
        for (int src = 0; src < W; ++src)
          chunks += kernels::moe_fused_chunks(shape, v.nslots[size_t(src) * W + size_t(r)]);
        a.what = "release (call " + num(e) + ")";
        if (chunks > 0) a.waits.push_back({{r, w_arranged, e}, uint64_t(chunks)});
        for (int src = 0; src < W; ++src) a.sets.push_back({{src, w_freed, r}, uint64_t(e)});
        break;
      }
      case MoePhase::kUp:
      case MoePhase::kDown: {
        const bool up = u.phase == MoePhase::kUp;
        const int g = u.a, col = u.b, rows = v.tile_rows(r, g);
        if (rows == 0) return;
        a.what =
            std::string(up ? "up" : "down") + " tile " + num(g) + " columns " + num(col) + " (call " + num(e) + ")";
        if (up && drop != MoeFusedDrop::kRows) a.waits.push_back({{r, w_rows, e, g}, uint64_t(rows)});
        if (!up) a.waits.push_back({{r, w_up, e, g}, uint64_t(shape.up_cols)});
        const int first = g * kernels::kMoeTileRows;
        const int in_cols = up ? 1 : shape.up_cols;
        for (int i = first; i < first + rows; ++i)
          for (int b2 = 0; b2 < in_cols; ++b2) a.reads.push_back({up ? Key{r, k_x, i} : Key{r, k_h, i, b2}});
        for (int i = first; i < first + rows; ++i) a.writes.push_back({{r, up ? k_h : k_y, i, col}});
        std::vector<std::pair<int, int>> want;
        for (int i = first; i < first + rows; ++i) want.push_back(v.row_of[size_t(r)][size_t(i)]);
        const uint64_t e_ = uint64_t(e);
        a.body = [want, in_cols, e_](const std::vector<const Payload*>& in, std::vector<Payload>* out,
                                     std::string* why) {
          for (size_t i = 0; i < want.size(); ++i) {
            for (int b2 = 0; b2 < in_cols; ++b2) {
              const Payload* p = in[i * size_t(in_cols) + size_t(b2)];
              if (!p || p->epoch != e_ || p->block != want[i].first || p->piece != want[i].second)
                return *why = "row " + num(int64_t(i)) + " of the tile is not token " + num(want[i].first) +
                              " for expert " + num(want[i].second) + " of this call",
                       false;
            }
            out->push_back(Payload{want[i].first, want[i].second, {}, e_});
          }
          return true;
        };
        a.sets.push_back({{r, up ? w_up : w_down, e, g}, 1, true});
        break;
      }
      case MoePhase::kCombine: {
        const int h = u.a, c = u.b, n = v.nslots[size_t(h) * W + size_t(r)];
        if (c * shape.chunk >= n) return;
        a.what = "combine for home " + num(h) + " chunk " + num(c) + " (call " + num(e) + ")";
        const int lo = c * shape.chunk, hi = std::min(n, (c + 1) * shape.chunk);
        std::set<int> tiles;
        std::vector<int> nrows, gids;
        std::vector<std::map<int, int>> parts;
        for (int sl = lo; sl < hi; ++sl) {
          const int t = v.slot_tok[size_t(h) * W + size_t(r)][size_t(sl)];
          a.reads.push_back({{r, k_info, h, sl}});
          std::vector<int> mine;
          for (int x : v.experts(h, t))
            if (x / L == r) mine.push_back(x);
          std::sort(mine.begin(), mine.end());  // expert order
          std::map<int, int> p;
          for (int x : mine) {
            const int row = v.row.at({r, h, sl, x % L});
            tiles.insert(row / kernels::kMoeTileRows);
            for (int col = 0; col < shape.down_cols; ++col) a.reads.push_back({{r, k_y, row, col}});
            p[x] = 1;
          }
          nrows.push_back(int(mine.size()));
          gids.push_back(h * T + t);
          parts.push_back(p);
          a.writes.push_back({{h, k_comb, r, sl}, h == r ? Link::kLocal : Link::kNvlink, r, 0});
        }
        for (int g : tiles) a.waits.push_back({{r, w_down, e, g}, uint64_t(shape.down_cols)});
        const int cols = shape.down_cols;
        const uint64_t e_ = uint64_t(e);
        a.body = [nrows, gids, parts, cols, e_](const std::vector<const Payload*>& in, std::vector<Payload>* out,
                                                std::string* why) {
          size_t at = 0;
          for (size_t i = 0; i < gids.size(); ++i) {
            const Payload* hdr = in[at++];
            if (!hdr || hdr->block != gids[i] || hdr->epoch != e_)
              return *why = "slot header of token " + num(gids[i]) + " of this call is not there", false;
            for (int k = 0; k < nrows[i] * cols; ++k, ++at)
              if (!in[at] || in[at]->block != gids[i] || in[at]->epoch != e_)
                return *why = "a Y row of token " + num(gids[i]) + " of this call is missing or another's", false;
            out->push_back(Payload{gids[i], 0, parts[i], e_});
          }
          return true;
        };
        a.sets.push_back({{h, w_combined, e, r}, 1, true});
        break;
      }
      case MoePhase::kReduce: {
        a.what = "reduce tile " + num(u.a) + " (call " + num(e) + ")";
        for (int q = 0; q < W; ++q) {
          const int chunks = kernels::moe_fused_chunks(shape, v.nslots[size_t(r) * W + size_t(q)]);
          if (chunks > 0) a.waits.push_back({{r, w_combined, e, q}, uint64_t(chunks)});
        }
        std::vector<int> gids, nparts;
        std::vector<std::set<int>> want;
        for (int t = u.a * 128; t < std::min(T, (u.a + 1) * 128); ++t) {
          int k = 0;
          for (int q = 0; q < W; ++q) {
            const int sl = v.slot[(size_t(r) * W + size_t(q)) * T + size_t(t)];
            if (sl < 0) continue;
            a.reads.push_back({{r, k_comb, q, sl}});
            ++k;
          }
          a.writes.push_back({{r, k_out, t}});
          gids.push_back(r * T + t);
          nparts.push_back(k);
          const std::vector<int>& ex = v.experts(r, t);
          want.push_back(std::set<int>(ex.begin(), ex.end()));
        }
        const uint64_t e_ = uint64_t(e);
        a.body = [gids, nparts, want, e_](const std::vector<const Payload*>& in, std::vector<Payload>* out,
                                          std::string* why) {
          size_t at = 0;
          for (size_t i = 0; i < gids.size(); ++i) {
            Payload y{gids[i], 0, {}, e_};
            for (int k = 0; k < nparts[i]; ++k, ++at) {
              const Payload* p = in[at];
              if (!p || p->block != gids[i] || p->epoch != e_)
                return *why = "token " + num(gids[i]) + "'s sum got a row that is not its own of this call", false;
              for (const auto& [x, cnt] : p->parts) y.parts[x] += cnt;
            }
            std::set<int> got;
            for (const auto& [x, cnt] : y.parts) {
              if (cnt != 1)
                return *why = "token " + num(gids[i]) + " has expert " + num(x) + " summed " + num(cnt) + " times",
                       false;
              got.insert(x);
            }
            if (got != want[i]) return *why = "token " + num(gids[i]) + "'s sum is not over its top-k experts", false;
            out->push_back(y);
          }
          return true;
        };
        break;
      }
      default:
        return;
    }
    add(r, b, e, std::move(a));
  }
};

}  // namespace

MoeChoices moe_choices(int world, int tokens, int experts, int topk, MoeRouting how, uint64_t seed) {
  MoeChoices c(size_t(world) * size_t(tokens));
  uint64_t s = seed;
  double norm = 0;
  for (int e = 0; e < experts; ++e) norm += 1.0 / (e + 1);
  for (auto& pick : c) {
    while (int(pick.size()) < topk) {
      int e = 0;
      if (how == MoeRouting::kOne) {
        e = int(pick.size());
      } else if (how == MoeRouting::kByHome) {
        const int home = int(&pick - &c[0]) / tokens;
        e = (experts / world + home * topk + int(pick.size())) % experts;
      } else if (how == MoeRouting::kUniform) {
        e = int(next_random(&s) % uint64_t(experts));
      } else {
        double x = double(next_random(&s) >> 11) / double(1ull << 53) * norm;
        while (e < experts - 1 && (x -= 1.0 / (e + 1)) > 0) ++e;
      }
      if (std::find(pick.begin(), pick.end(), e) == pick.end()) pick.push_back(e);
    }
  }
  return c;
}

Result simulate_moe_fused(const MoeFusedRun& run) {
  Model m(run);
  for (size_t i = 0; i < run.calls.size(); ++i) m.call(int(i) + 1, run.calls[i]);
  return m.sim.run();
}

}  // namespace weft::sim
