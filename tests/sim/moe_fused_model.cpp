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

// What the owner computes from the count tables it read: tables[s] holds source s's rows per
// (chunk, local expert) at key chunk * L + l.
struct Counts {
  std::vector<int32_t> counts, totals, offsets;  // [s * L + l], [L], [L + 1]
  bool make(const std::vector<const Payload*>& tables, int W, int L, uint64_t call, std::string* why) {
    counts.assign(size_t(W) * L, 0);
    totals.assign(size_t(L), 0);
    offsets.assign(size_t(L) + 1, 0);
    for (int s = 0; s < W; ++s) {
      const Payload* t = tables[size_t(s)];
      if (!t || t->epoch != call) return *why = "source " + num(s) + "'s count table of this call is not there", false;
      for (const auto& [key, n] : t->parts) counts[size_t(s) * L + size_t(key % L)] += n;
    }
    for (int s = 0; s < W; ++s)
      for (int l = 0; l < L; ++l) totals[size_t(l)] += counts[size_t(s) * L + size_t(l)];
    kernels::moe_expert_offsets(totals.data(), L, kernels::kMoeTileRows, offsets.data());
    return true;
  }
};

struct Model {
  Sim sim;
  MoeFusedShape shape;
  int W, T, L, R, B, C, G;
  MoeFusedDrop drop;
  // data
  int k_tok = sim.kind("token", "token");
  int k_topk = sim.kind("top-k", "tile");
  int k_counts = sim.kind("count table", "source", "slot (call % 2)");
  int k_recv = sim.kind("receive slot", "source", "slot");
  int k_info = sim.kind("slot header", "source", "slot");
  int k_x = sim.kind("X row", "row");
  int k_h = sim.kind("H row", "row", "column block");
  int k_y = sim.kind("Y row", "row", "column block");
  int k_comb = sim.kind("combine row", "owner", "slot");
  int k_out = sim.kind("out", "token");
  // Counters, in two sets (a: call % 2) zeroed by the release unit before their reuse, as the kernel's.
  int w_routed = sim.kind("routed", "set");
  int w_counts_in = sim.kind("counts_in", "set");
  int w_sent = sim.kind("sent", "set", "source");
  int w_rows = sim.kind("rows", "set", "tile");
  int w_arranged = sim.kind("arranged", "set");
  int w_up = sim.kind("up_done", "set", "tile");
  int w_down = sim.kind("down_done", "set", "tile");
  int w_combined = sim.kind("combined", "set", "owner");
  int w_freed = sim.kind("freed", "owner");        // = the call whose arranges are done (epoch word)
  int w_ended = sim.kind("launch ended", "call");  // the model's: a launch's blocks all done
  std::vector<std::vector<int>> block_stream;      // [rank][block]
  std::vector<std::vector<bool>> first_of_call;    // [rank][block]: the block's next action opens a call

  explicit Model(const MoeFusedRun& run)
      : shape(run.shape),
        W(run.shape.world),
        T(run.shape.tokens),
        L(run.shape.local_experts()),
        R(run.shape.token_tiles()),
        B(run.blocks),
        C(run.shape.slot_chunks()),
        G(run.shape.worst_tiles()),
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

  void add(int r, int b, int call, Action a) {
    a.stream = block_stream[size_t(r)][size_t(b)];
    if (first_of_call[size_t(r)][size_t(b)] && call > 1) a.waits.push_back({{r, w_ended, call - 1}, uint64_t(B)});
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

  // The rank's chunks of this call (what the release and the combine wait for in arranged).
  int chunks_at(const CallView& v, int r) const {
    int n = 0;
    for (int src = 0; src < W; ++src) n += kernels::moe_fused_chunks(shape, v.nslots[size_t(src) * W + size_t(r)]);
    return n;
  }
  void read_tables(Action* a, int r, int e) const {
    for (int q = 0; q < W; ++q) a->reads.push_back({{r, k_counts, q, e % 2}});
  }

  void unit(int e, const CallView& v, int r, int b, const MoeUnit& u) {
    const int set = e % 2;
    const uint64_t call = uint64_t(e);
    Action a;
    switch (u.phase) {
      case MoePhase::kRoute: {
        a.what = "route tile " + num(u.a) + " (call " + num(e) + ")";
        for (int t = u.a * 128; t < std::min(T, (u.a + 1) * 128); ++t) a.reads.push_back({{r, k_tok, t}});
        a.writes.push_back({{r, k_topk, u.a}});
        a.body = [u, call](const std::vector<const Payload*>&, std::vector<Payload>* out, std::string*) {
          out->push_back(Payload{u.a, 0, {}, call});
          return true;
        };
        a.sets.push_back({{r, w_routed, set}, 1, true});
        break;
      }
      case MoePhase::kDispatch: {
        // One action per destination, r + 1 first and r last (each a remote store and add of its
        // own: a destination seeing this tile's add says nothing of the others').
        for (int k = 1; k <= W; ++k) {
          const int q = (r + k) % W;
          Action d;
          d.what = "dispatch tile " + num(u.a) + " to rank " + num(q) + " (call " + num(e) + ")";
          if (drop != MoeFusedDrop::kRouted) d.waits.push_back({{r, w_routed, set}, uint64_t(R)});
          if (e > 1 && drop != MoeFusedDrop::kFreed) d.waits.push_back({{r, w_freed, q}, uint64_t(e - 1)});
          for (int i = 0; i <= u.a; ++i) d.reads.push_back({{r, k_topk, i}});  // the slot prefix
          std::vector<int> blocks;
          std::vector<std::map<int, int>> parts;
          const size_t rq = size_t(r) * W + size_t(q);
          if (u.a == 0) {  // this rank's count table at q: rows per (chunk, local expert), first
            d.writes.push_back({{q, k_counts, r, set}, q == r ? Link::kLocal : Link::kNvlink, r, int64_t(C) * L * 4});
            std::map<int, int> table;
            for (int sl = 0; sl < v.nslots[rq]; ++sl)
              for (int x : v.experts(r, v.slot_tok[rq][size_t(sl)]))
                if (x / L == q) ++table[(sl / shape.chunk) * L + x % L];
            blocks.push_back(-1 - r);
            parts.push_back(table);
          }
          for (int t = u.a * 128; t < std::min(T, (u.a + 1) * 128); ++t) {
            const int sl = v.slot[rq * T + size_t(t)];
            if (sl < 0) continue;
            d.reads.push_back({{r, k_tok, t}});
            d.writes.push_back({{q, k_recv, r, sl}, q == r ? Link::kLocal : Link::kNvlink, r, 0});
            blocks.push_back(r * T + t);
            std::map<int, int> p;
            for (int x : v.experts(r, t))
              if (x / L == q) p[x] = 1;
            parts.push_back(p);
          }
          const int reads_topk = u.a + 1;
          d.body = [blocks, parts, call, reads_topk](const std::vector<const Payload*>& in, std::vector<Payload>* out,
                                                     std::string* why) {
            for (int i = 0; i < reads_topk; ++i)
              if (!in[size_t(i)] || in[size_t(i)]->epoch != call)
                return *why = "the top-k of tile " + num(i) + " of this call is not there", false;
            size_t at = size_t(reads_topk);
            for (size_t i = 0; i < blocks.size(); ++i) {
              if (blocks[i] >= 0 && (!in[at] || in[at]->block != blocks[i]))
                return *why = "token " + num(blocks[i]) + "'s row is not the one read", false;
              if (blocks[i] >= 0) ++at;
              out->push_back(Payload{blocks[i], 0, parts[i], call});
            }
            return true;
          };
          if (u.a == 0) d.sets.push_back({{q, w_counts_in, set}, 1, true});
          d.sets.push_back({{q, w_sent, set, r}, 1, true});
          add(r, b, e, std::move(d));
        }
        return;
      }
      case MoePhase::kArrange: {
        const int src = u.a, c = u.b, n = v.nslots[size_t(src) * W + size_t(r)];
        if (c * shape.chunk >= n) return;  // an empty unit
        a.what = "arrange source " + num(src) + " chunk " + num(c) + " (call " + num(e) + ")";
        if (drop != MoeFusedDrop::kSent) a.waits.push_back({{r, w_sent, set, src}, uint64_t(R)});
        if (drop != MoeFusedDrop::kCountsIn) a.waits.push_back({{r, w_counts_in, set}, uint64_t(W)});
        read_tables(&a, r, e);
        const int lo = c * shape.chunk, hi = std::min(n, (c + 1) * shape.chunk);
        for (int sl = lo; sl < hi; ++sl) {
          a.reads.push_back({{r, k_recv, src, sl}});
          a.writes.push_back({{r, k_info, src, sl}});
        }
        // The rows it writes, in the order its body makes them (slot order, each slot's experts in
        // expert order), from the model's view; the body computes them again from what it read.
        std::vector<int> rows;
        std::map<int, int> per_tile;
        for (int sl = lo; sl < hi; ++sl) {
          std::vector<int> mine;
          for (int x : v.experts(src, v.slot_tok[size_t(src) * W + size_t(r)][size_t(sl)]))
            if (x / L == r) mine.push_back(x % L);
          std::sort(mine.begin(), mine.end());
          for (int l : mine) {
            const int row = v.row.at({r, src, sl, l});
            a.writes.push_back({{r, k_x, row}});
            rows.push_back(row);
            ++per_tile[row / kernels::kMoeTileRows];
          }
        }
        const int W_ = W, L_ = L, chunk = shape.chunk, nslot = hi - lo;
        a.body = [W_, L_, src, c, chunk, nslot, rows, call](const std::vector<const Payload*>& in,
                                                            std::vector<Payload>* out, std::string* why) {
          Counts k;
          if (!k.make(in, W_, L_, call, why)) return false;
          // nth[l]: src's rows for l in its earlier chunks (its table says how many per chunk)
          std::vector<int32_t> nth(size_t(L_), 0);
          for (const auto& [key, cnt] : in[size_t(src)]->parts)
            if (key / L_ < c) nth[size_t(key % L_)] += cnt;
          std::vector<Payload> xs;
          for (int i = 0; i < nslot; ++i) {
            const Payload* p = in[size_t(W_ + i)];
            if (!p || p->epoch != call) return *why = "a receive slot of this call is empty", false;
            out->push_back(*p);                      // the slot's header, kept beside X
            for (const auto& [x, one] : p->parts) {  // its experts here, in expert order
              const int l = x % L_;
              const int row = kernels::moe_fused_row(k.offsets.data(), k.counts.data(), L_, src, l, nth[size_t(l)]++);
              if (xs.size() >= rows.size() || row != rows[xs.size()])
                return *why = "token " + num(p->block) + " for expert " + num(x) + " goes to X row " + num(row) +
                              ", not where the counts put it",
                       false;
              xs.push_back(Payload{p->block, l, {}, call});
            }
          }
          (void)chunk;
          if (xs.size() != rows.size()) return *why = "the slots hold fewer rows than the counts", false;
          for (auto& x : xs) out->push_back(x);
          return true;
        };
        for (const auto& [g, cnt] : per_tile) a.sets.push_back({{r, w_rows, set, g}, uint64_t(cnt), true});
        a.sets.push_back({{r, w_arranged, set}, 1, true});
        break;
      }
      case MoePhase::kRelease: {
        a.what = "release (call " + num(e) + ")";
        if (drop != MoeFusedDrop::kReleaseCounts) a.waits.push_back({{r, w_counts_in, set}, uint64_t(W)});
        const int chunks = chunks_at(v, r);
        if (chunks > 0) a.waits.push_back({{r, w_arranged, set}, uint64_t(chunks)});
        const int next = 1 - set;  // zeroed for call e + 1
        for (int kind : {w_routed, w_counts_in, w_arranged}) a.sets.push_back({{r, kind, next}, 0, false, true});
        for (int q = 0; q < W; ++q)
          for (int kind : {w_sent, w_combined}) a.sets.push_back({{r, kind, next, q}, 0, false, true});
        for (int g = 0; g < G; ++g)
          for (int kind : {w_rows, w_up, w_down}) a.sets.push_back({{r, kind, next, g}, 0, false, true});
        for (int src = 0; src < W; ++src) a.sets.push_back({{src, w_freed, r}, call});
        break;
      }
      case MoePhase::kUp:
      case MoePhase::kDown: {
        const bool up = u.phase == MoePhase::kUp;
        const int g = u.a, col = u.b, rows = v.tile_rows(r, g);
        if (rows == 0) return;
        a.what =
            std::string(up ? "up" : "down") + " tile " + num(g) + " columns " + num(col) + " (call " + num(e) + ")";
        if (up && drop != MoeFusedDrop::kRows) a.waits.push_back({{r, w_rows, set, g}, uint64_t(rows)});
        if (!up && drop != MoeFusedDrop::kUpDone) a.waits.push_back({{r, w_up, set, g}, uint64_t(shape.up_cols)});
        read_tables(&a, r, e);  // which expert the tile is, and its rows
        const int first = g * kernels::kMoeTileRows;
        const int in_cols = up ? 1 : shape.up_cols;
        for (int i = first; i < first + rows; ++i)
          for (int b2 = 0; b2 < in_cols; ++b2) a.reads.push_back({up ? Key{r, k_x, i} : Key{r, k_h, i, b2}});
        for (int i = first; i < first + rows; ++i) a.writes.push_back({{r, up ? k_h : k_y, i, col}});
        const int W_ = W, L_ = L;
        a.body = [W_, L_, g, rows, in_cols, call](const std::vector<const Payload*>& in, std::vector<Payload>* out,
                                                  std::string* why) {
          Counts k;
          if (!k.make(in, W_, L_, call, why)) return false;
          if (kernels::moe_fused_tile_rows(k.offsets.data(), k.totals.data(), L_, g) != rows)
            return *why = "the counts put another number of rows in tile " + num(g), false;
          const int expert = kernels::moe_expert_of_tile(k.offsets.data(), L_, kernels::kMoeTileRows, g);
          for (int i = 0; i < rows; ++i) {
            const Payload* p0 = in[size_t(W_ + i * in_cols)];
            for (int b2 = 0; b2 < in_cols; ++b2) {
              const Payload* p = in[size_t(W_ + i * in_cols + b2)];
              if (!p || p->epoch != call || p->piece != expert || p->block != p0->block)
                return *why = "row " + num(i) + " of tile " + num(g) + " is not a row of this call for local expert " +
                              num(expert),
                       false;
            }
            out->push_back(Payload{p0->block, expert, {}, call});
          }
          return true;
        };
        a.sets.push_back({{r, up ? w_up : w_down, set, g}, 1, true});
        break;
      }
      case MoePhase::kCombine: {
        const int h = u.a, c = u.b, n = v.nslots[size_t(h) * W + size_t(r)];
        if (c * shape.chunk >= n) return;
        a.what = "combine for home " + num(h) + " chunk " + num(c) + " (call " + num(e) + ")";
        const int lo = c * shape.chunk, hi = std::min(n, (c + 1) * shape.chunk);
        {
          // First the chunk's slot headers, once every arrange of the call is done: they say which
          // tiles the rows are in, so only then can the unit wait for those tiles.
          Action look;
          look.what = "combine for home " + num(h) + " chunk " + num(c) + ": its slot headers (call " + num(e) + ")";
          const int chunks = chunks_at(v, r);
          if (drop != MoeFusedDrop::kArrangedCombine) look.waits.push_back({{r, w_arranged, set}, uint64_t(chunks)});
          read_tables(&look, r, e);
          for (int sl = lo; sl < hi; ++sl) look.reads.push_back({{r, k_info, h, sl}});
          add(r, b, e, std::move(look));
        }
        std::set<int> tiles;
        std::vector<int> nrows, gids;
        for (int sl = lo; sl < hi; ++sl) {
          const int t = v.slot_tok[size_t(h) * W + size_t(r)][size_t(sl)];
          a.reads.push_back({{r, k_info, h, sl}});
          std::vector<int> mine;
          for (int x : v.experts(h, t))
            if (x / L == r) mine.push_back(x % L);
          std::sort(mine.begin(), mine.end());  // expert order
          for (int l : mine) {
            const int row = v.row.at({r, h, sl, l});
            tiles.insert(row / kernels::kMoeTileRows);
            for (int col = 0; col < shape.down_cols; ++col) a.reads.push_back({{r, k_y, row, col}});
          }
          nrows.push_back(int(mine.size()));
          gids.push_back(h * T + t);
          a.writes.push_back({{h, k_comb, r, sl}, h == r ? Link::kLocal : Link::kNvlink, r, 0});
        }
        if (drop != MoeFusedDrop::kDownDone)
          for (int g : tiles) a.waits.push_back({{r, w_down, set, g}, uint64_t(shape.down_cols)});
        const int cols = shape.down_cols, L_ = L, me = r;
        a.body = [nrows, gids, cols, L_, me, call](const std::vector<const Payload*>& in, std::vector<Payload>* out,
                                                   std::string* why) {
          size_t at = 0;
          for (size_t i = 0; i < gids.size(); ++i) {
            const Payload* hdr = in[at++];
            if (!hdr || hdr->block != gids[i] || hdr->epoch != call)
              return *why = "slot header of token " + num(gids[i]) + " of this call is not there", false;
            Payload row{gids[i], 0, {}, call};
            for (int k = 0; k < nrows[i]; ++k)
              for (int col = 0; col < cols; ++col, ++at) {
                const Payload* y = in[at];
                if (!y || y->block != gids[i] || y->epoch != call)
                  return *why = "a Y row of token " + num(gids[i]) + " of this call is missing or another's", false;
                if (col == 0) row.parts[me * L_ + y->piece] += 1;  // the expert this row is of
              }
            out->push_back(row);
          }
          return true;
        };
        a.sets.push_back({{h, w_combined, set, r}, 1, true});
        break;
      }
      case MoePhase::kReduce: {
        a.what = "reduce tile " + num(u.a) + " (call " + num(e) + ")";
        if (drop != MoeFusedDrop::kCombined)
          for (int q = 0; q < W; ++q) {
            const int chunks = kernels::moe_fused_chunks(shape, v.nslots[size_t(r) * W + size_t(q)]);
            if (chunks > 0) a.waits.push_back({{r, w_combined, set, q}, uint64_t(chunks)});
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
        a.body = [gids, nparts, want, call](const std::vector<const Payload*>& in, std::vector<Payload>* out,
                                            std::string* why) {
          size_t at = 0;
          for (size_t i = 0; i < gids.size(); ++i) {
            Payload y{gids[i], 0, {}, call};
            for (int k = 0; k < nparts[i]; ++k, ++at) {
              const Payload* p = in[at];
              if (!p || p->block != gids[i] || p->epoch != call)
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
