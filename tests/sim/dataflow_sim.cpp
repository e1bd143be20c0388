// The event system of dataflow_sim.h: fire ready stream heads until none is left, then explain
// what is stuck.
#include "tests/sim/dataflow_sim.h"

#include <algorithm>
#include <set>

#include "tests/sim/model_util.h"

namespace weft::sim {

const char* to_string(Link l) {
  switch (l) {
    case Link::kLocal:
      return "local";
    case Link::kNvlink:
      return "NVLink";
    case Link::kNic:
      return "NIC";
  }
  return "?";
}

std::string Result::text() const {
  std::string s;
  for (const std::string& e : errors) s += e + "\n";
  return s;
}

bool Result::mentions(const std::string& needle) const {
  for (const std::string& e : errors)
    if (e.find(needle) != std::string::npos) return true;
  return false;
}

int Sim::kind(const std::string& name, const std::string& a_name, const std::string& b_name,
              const std::string& c_name) {
  for (size_t i = 0; i < kinds_.size(); ++i)
    if (kinds_[i].name == name) return int(i);
  kinds_.push_back({name, a_name, b_name, c_name});
  return int(kinds_.size()) - 1;
}

int Sim::stream(int rank, const std::string& name) {
  for (size_t i = 0; i < streams_.size(); ++i)
    if (streams_[i].rank == rank && streams_[i].name == name) return int(i);
  streams_.push_back({rank, name, {}});
  return int(streams_.size()) - 1;
}

void Sim::input(const Key& region, Payload p) { inputs_[region] = std::move(p); }

void Sim::add(Action a) {
  streams_[size_t(a.stream)].actions.push_back(int(actions_.size()));
  actions_.push_back(std::move(a));
}

int Sim::stream_kind(const std::string& name) {
  const int k = kind(name);
  kinds_[size_t(k)].by_stream = true;
  return k;
}

std::string Sim::describe(const Key& k) const {
  const KindInfo& info = kinds_[size_t(k.kind)];
  if (info.by_stream) return info.name + " of " + stream_name(k.a);
  std::string s = "rank " + std::to_string(k.rank) + "'s " + info.name;
  if (!info.a.empty()) {
    s += "[" + info.a + " " + std::to_string(k.a);
    if (!info.b.empty()) s += ", " + info.b + " " + std::to_string(k.b);
    if (!info.c.empty()) s += ", " + info.c + " " + std::to_string(k.c);
    s += "]";
  }
  return s;
}

std::string Sim::stream_name(int s) const {
  return "rank " + std::to_string(streams_[size_t(s)].rank) + " (" + streams_[size_t(s)].name + ")";
}

Result Sim::run() {
  Result res;
  res.actions = int(actions_.size());
  const size_t nstreams = streams_.size();
  std::vector<int> index(actions_.size(), 0);  // place in its stream
  for (const StreamInfo& s : streams_)
    for (size_t i = 0; i < s.actions.size(); ++i) index[size_t(s.actions[i])] = int(i);
  auto err = [&](const std::string& m) {
    if (int(res.errors.size()) < kMaxErrors) res.errors.push_back(m);
  };
  auto who = [&](int id) {
    if (id < 0) return std::string("the op's input");
    const Action& a = actions_[size_t(id)];
    return stream_name(a.stream) + " '" + a.what + "'";
  };

  struct FlagState {
    uint64_t value = 0;
    std::vector<std::pair<uint64_t, int>> history;  // (value, setter) in the order set; counters: the sum after it
    bool counter = false;                           // set by adds or stores (not only rising)
  };
  struct RegionState {
    bool written = false;
    int writer = -1;  // -1: the input
    Payload p;
    std::vector<int> reads;  // since the last write
  };
  std::map<Key, FlagState> flags;
  std::map<Key, RegionState> regions;
  for (const auto& [k, p] : inputs_) regions[k] = RegionState{true, -1, p, {}};
  // Vector clocks: clock[id][s] = how many actions of stream s happen before action id (itself included).
  std::vector<std::vector<int32_t>> clock(actions_.size());
  auto before = [&](int w, const std::vector<int32_t>& c) {
    return !races_ || w < 0 || c[size_t(actions_[size_t(w)].stream)] > index[size_t(w)];
  };
  auto value_of = [&](const Key& f) {
    auto it = flags.find(f);
    return it == flags.end() ? uint64_t(0) : it->second.value;
  };
  auto ready = [&](const Action& a) {
    for (const Wait& w : a.waits)
      if (value_of(w.flag) < w.value) return false;
    return true;
  };

  auto fire = [&](int id) {
    const Action& a = actions_[size_t(id)];
    const StreamInfo& st = streams_[size_t(a.stream)];
    const int at = index[size_t(id)];
    std::vector<int32_t> c;
    if (races_) c = at > 0 ? clock[size_t(st.actions[size_t(at - 1)])] : std::vector<int32_t>(nstreams, 0);
    for (const Wait& w : a.waits) {
      if (w.value == 0 || !races_) continue;
      const FlagState& fs = flags[w.flag];
      for (const auto& [v, setter] : fs.history) {
        // A counter's or token's wait is ordered after the last store and every add since, up to the
        // one that met it (a release sequence); a rising flag's after the first write that met it.
        if (!fs.counter && v < w.value) continue;
        const std::vector<int32_t>& o = clock[size_t(setter)];
        for (size_t s = 0; s < nstreams; ++s) c[s] = std::max(c[s], o[s]);
        if (v >= w.value) break;
      }
    }
    if (races_) {
      c[size_t(a.stream)] = at + 1;
      clock[size_t(id)] = c;
    }
    const std::string me = stream_name(a.stream) + " '" + a.what + "'";

    std::vector<const Payload*> in;
    for (const Read& r : a.reads) {
      RegionState& rs = regions[r.region];
      if (!rs.written) {
        if (!r.may_be_empty) err("missing data: " + me + " reads " + describe(r.region) + ", which nothing wrote");
        in.push_back(nullptr);
      } else {
        if (!before(rs.writer, c))
          err("race: " + me + " reads " + describe(r.region) + " written by " + who(rs.writer) +
              " with no wait ordering the two");
        in.push_back(&rs.p);
      }
      rs.reads.push_back(id);
    }
    std::vector<Payload> out;
    if (a.body) {
      std::string why;
      if (!a.body(in, &out, &why)) err("wrong data: " + me + ": " + why);
    }
    for (size_t i = 0; i < a.writes.size(); ++i) {
      const Write& w = a.writes[i];
      if (i >= out.size()) {
        err("model error: " + me + " has no payload for " + describe(w.region));
        break;
      }
      RegionState& rs = regions[w.region];
      if (rs.written && rs.writer >= 0) {
        if (!before(rs.writer, c))
          err("race: " + me + " overwrites " + describe(w.region) + " written by " + who(rs.writer) +
              " with no wait ordering the two");
        else if (rs.p.epoch == out[i].epoch && out[i].epoch != 0)
          err("written twice: " + describe(w.region) + " in run " + std::to_string(out[i].epoch) + ", by " +
              who(rs.writer) + " and by " + me);
      }
      for (int r : rs.reads)
        if (r != id && !before(r, c))
          err("race: " + me + " writes " + describe(w.region) + ", which " + who(r) +
              " reads with no wait ordering the two (it may see the old or the new bytes)");
      rs.reads.clear();
      rs.written = true;
      rs.writer = id;
      rs.p = std::move(out[i]);
      if (w.link != Link::kLocal) res.link_bytes[{w.link, w.from, w.region.rank}] += w.bytes;
    }
    for (const SetFlag& s : a.sets) {
      FlagState& f = flags[s.flag];
      if (s.store) {  // the value as is: what came before no longer counts
        f.counter = true;
        f.value = s.value;
        f.history.assign(1, {s.value, id});
      } else if (s.add) {
        f.counter = true;
        f.value += s.value;
        f.history.push_back({f.value, id});
      } else {
        f.history.push_back({s.value, id});
        f.value = std::max(f.value, s.value);
      }
    }
    ++res.fired;
  };

  std::vector<size_t> head(nstreams, 0);
  auto head_ready = [&](size_t s) {
    return head[s] < streams_[s].actions.size() && ready(actions_[size_t(streams_[s].actions[head[s]])]);
  };
  if (!seed_) {
    for (bool progress = true; progress;) {
      progress = false;
      for (size_t s = 0; s < nstreams; ++s)
        while (head_ready(s)) {
          fire(streams_[s].actions[head[s]]);
          ++head[s];
          progress = true;
        }
    }
  } else {
    // Each stream gets a pace from the seed (it takes a ready action in 1, 1/2, ... or 1/64 of the
    // turns), and the streams take turns in an order drawn anew each turn: slow streams let the
    // others run far ahead, as a stream stalled behind a busy engine does.
    uint64_t rng = seed_;
    std::vector<uint32_t> pace(nstreams);
    for (auto& p : pace) p = uint32_t(next_random(&rng) % 7);
    std::vector<size_t> order(nstreams);
    for (size_t s = 0; s < nstreams; ++s) order[s] = s;
    for (bool any = true; any;) {
      any = false;
      for (size_t i = nstreams; i > 1; --i) std::swap(order[i - 1], order[size_t(next_random(&rng) % i)]);
      for (size_t s : order) {
        if (!head_ready(s)) continue;
        any = true;
        if (next_random(&rng) % (1u << pace[s]) != 0) continue;
        fire(streams_[s].actions[head[s]]);
        ++head[s];
      }
    }
  }

  // What is stuck, and why: the first unmet wait of each stuck stream, and who could still meet it.
  std::map<Key, std::vector<int>> setters;  // pending actions by the flags they set
  for (size_t s = 0; s < nstreams; ++s)
    for (size_t i = head[s]; i < streams_[s].actions.size(); ++i)
      for (const SetFlag& f : actions_[size_t(streams_[s].actions[i])].sets)
        setters[f.flag].push_back(streams_[s].actions[i]);
  auto unmet = [&](const Action& a) -> const Wait* {
    for (const Wait& w : a.waits)
      if (value_of(w.flag) < w.value) return &w;
    return nullptr;
  };
  std::vector<std::string> roots, chained;
  for (size_t s = 0; s < nstreams; ++s) {
    if (head[s] == streams_[s].actions.size()) continue;
    const int id = streams_[s].actions[head[s]];
    const Wait* w = unmet(actions_[size_t(id)]);
    std::string m = "deadlock: " + who(id) + " waits for " + describe(w->flag) + " >= " + std::to_string(w->value) +
                    " (it is " + std::to_string(value_of(w->flag)) + ")";
    int setter = -1;
    for (int x : setters[w->flag]) {
      for (const SetFlag& f : actions_[size_t(x)].sets)
        if (f.flag == w->flag && (f.add || f.value >= w->value)) setter = x;  // a store may, too
      if (setter >= 0) break;
    }
    if (setter < 0) {
      roots.push_back(m + ", and no action left sets it");
      continue;
    }
    // Follow who waits on whom; a stream met twice closes a cycle.
    std::set<int> seen{int(s)};
    std::string chain = m + "; it is set by " + who(setter);
    int t = actions_[size_t(setter)].stream;
    for (int hops = 0; hops < 8; ++hops) {
      if (seen.count(t)) {
        chain += " — a cycle of waits";
        break;
      }
      seen.insert(t);
      const int h = streams_[size_t(t)].actions[head[size_t(t)]];
      const Wait* hw = unmet(actions_[size_t(h)]);
      chain += ", behind " + who(h) + " waiting for " + describe(hw->flag);
      int next = -1;
      for (int x : setters[hw->flag]) {
        for (const SetFlag& f : actions_[size_t(x)].sets)
          if (f.flag == hw->flag && (f.add || f.value >= hw->value)) next = x;
        if (next >= 0) break;
      }
      if (next < 0) break;
      t = actions_[size_t(next)].stream;
    }
    chained.push_back(chain);
  }
  // Deadlocks get their own room: a wrong move's first effects (missing data) must not hide them.
  int room = kMaxErrors;
  for (const std::vector<std::string>* list : {&roots, &chained})
    for (const std::string& m : *list)
      if (room-- > 0) res.errors.push_back(m);
  return res;
}

}  // namespace weft::sim
