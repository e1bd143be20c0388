// The simulator itself, on hand-made flows: it fires actions when their flags are set, tallies
// bytes per link, and reports a deadlock (no setter, or a cycle), a race and a double write with
// the rank, the action and the flag or region involved.
#include <doctest/doctest.h>

#include <set>
#include <string>

#include "tests/sim/dataflow_sim.h"

using namespace weft::sim;

namespace {

Body copy_body(int n = 1) {
  return [n](const std::vector<const Payload*>& in, std::vector<Payload>* out, std::string* why) {
    if (!in[0]) return *why = "empty", false;
    out->assign(size_t(n), *in[0]);
    return true;
  };
}

struct TwoRanks {
  Sim sim;
  int k_data = sim.kind("data", "index");
  int k_flag = sim.kind("flag", "index");
  int s0 = sim.stream(0, "send");
  int s1 = sim.stream(1, "compute");
  TwoRanks() { sim.input({0, k_data, 0}, Payload{7, 0, {{0, 1}}, 0}); }
  // Rank 0 puts its data into rank 1 over the NIC and raises rank 1's flag.
  void put(bool set_flag = true) {
    Action a;
    a.stream = s0;
    a.what = "put";
    a.reads.push_back({{0, k_data, 0}});
    a.writes.push_back({{1, k_data, 0}, Link::kNic, 0, 4096});
    if (set_flag) a.sets.push_back({{1, k_flag, 0}, 1});
    a.body = copy_body();
    sim.add(a);
  }
  // Rank 1 waits for its flag (or not) and reads the data.
  void consume(bool wait = true) {
    Action a;
    a.stream = s1;
    a.what = "consume";
    if (wait) a.waits.push_back({{1, k_flag, 0}, 1});
    a.reads.push_back({{1, k_data, 0}});
    a.body = [](const std::vector<const Payload*>& in, std::vector<Payload>*, std::string* why) {
      if (!in[0] || in[0]->block != 7) return *why = "block 7 did not arrive", false;
      return true;
    };
    sim.add(a);
  }
};

}  // namespace

TEST_CASE("a put then a gated read: runs, and the NIC carries the bytes once") {
  TwoRanks t;
  t.consume();  // added first: it must still wait for the put
  t.put();
  const Result r = t.sim.run();
  CHECK_MESSAGE(r.ok(), r.text());
  CHECK(r.fired == 2);
  CHECK(r.link_bytes.at({Link::kNic, 0, 1}) == 4096);
  CHECK(r.link_bytes.size() == 1);
}

TEST_CASE("a wait nobody meets is a deadlock naming the rank, the action and the flag") {
  TwoRanks t;
  t.put(false);
  t.consume();
  const Result r = t.sim.run();
  REQUIRE_FALSE(r.ok());
  CHECK(
      r.mentions("deadlock: rank 1 (compute) 'consume' waits for rank 1's flag[index 0] >= 1 (it is 0), and no "
                 "action left sets it"));
}

TEST_CASE("two streams waiting on each other: a cycle of waits") {
  Sim sim;
  const int k = sim.kind("flag", "index");
  const int a = sim.stream(0, "a"), b = sim.stream(1, "b");
  Action x;
  x.stream = a;
  x.what = "x";
  x.waits.push_back({{0, k, 0}, 1});
  x.sets.push_back({{1, k, 0}, 1});
  Action y;
  y.stream = b;
  y.what = "y";
  y.waits.push_back({{1, k, 0}, 1});
  y.sets.push_back({{0, k, 0}, 1});
  sim.add(x);
  sim.add(y);
  const Result r = sim.run();
  REQUIRE_FALSE(r.ok());
  CHECK(r.mentions("a cycle of waits"));
  CHECK(r.mentions("rank 0 (a) 'x' waits for rank 0's flag[index 0] >= 1"));
}

TEST_CASE("a read no wait orders after its write is a race, even when the write happened first") {
  TwoRanks t;
  t.put();
  t.consume(false);
  const Result r = t.sim.run();
  REQUIRE_FALSE(r.ok());
  CHECK(r.mentions("race: rank 1 (compute) 'consume' reads rank 1's data[index 0] written by rank 0 (send) 'put'"));
}

TEST_CASE("a region written twice in one run is reported with both writers") {
  Sim sim;
  const int k = sim.kind("data", "index");
  const int s = sim.stream(0, "s");
  for (int i = 0; i < 2; ++i) {
    Action a;
    a.stream = s;
    a.what = "write " + std::to_string(i);
    a.writes.push_back({{0, k, 0}});
    a.body = [](const std::vector<const Payload*>&, std::vector<Payload>* out, std::string*) {
      out->push_back(Payload{1, 0, {{0, 1}}, 1});
      return true;
    };
    sim.add(a);
  }
  const Result r2 = sim.run();
  CHECK(
      r2.mentions("written twice: rank 0's data[index 0] in run 1, by rank 0 (s) 'write 0' and by rank 0 (s) "
                  "'write 1'"));
}

TEST_CASE("overwriting data another stream may still read is a race") {
  Sim sim;
  const int k = sim.kind("data", "index");
  const int reader = sim.stream(1, "reader"), writer = sim.stream(0, "writer");
  sim.input({1, k, 0}, Payload{1, 0, {{1, 1}}, 0});
  Action rd;
  rd.stream = reader;
  rd.what = "read";
  rd.reads.push_back({{1, k, 0}});
  sim.add(rd);
  Action wr;
  wr.stream = writer;
  wr.what = "overwrite";
  wr.writes.push_back({{1, k, 0}, Link::kNvlink, 0, 16});
  wr.body = [](const std::vector<const Payload*>&, std::vector<Payload>* out, std::string*) {
    out->push_back(Payload{2, 0, {{0, 1}}, 1});
    return true;
  };
  sim.add(wr);
  const Result r = sim.run();
  REQUIRE_FALSE(r.ok());
  CHECK(r.mentions(
      "race: rank 0 (writer) 'overwrite' writes rank 1's data[index 0], which rank 1 (reader) 'read' reads"));
}

TEST_CASE("a counter: a wait for the sum is ordered after every add up to it, a lower one after fewer") {
  // Two producers each write a region and add 1 to one counter; the consumer reads both regions.
  for (const uint64_t want : {2, 1}) {
    CAPTURE(want);
    Sim sim;
    const int k_data = sim.kind("data", "index"), k_count = sim.kind("count");
    const int p0 = sim.stream(0, "p0"), p1 = sim.stream(0, "p1"), c = sim.stream(0, "consumer");
    for (int i = 0; i < 2; ++i) {
      Action a;
      a.stream = i == 0 ? p0 : p1;
      a.what = "produce " + std::to_string(i);
      a.writes.push_back({{0, k_data, i}});
      a.sets.push_back({{0, k_count}, 1, true});
      a.body = [i](const std::vector<const Payload*>&, std::vector<Payload>* out, std::string*) {
        out->push_back(Payload{i, 0, {{0, 1}}, 1});
        return true;
      };
      sim.add(a);
    }
    Action r;
    r.stream = c;
    r.what = "consume";
    r.waits.push_back({{0, k_count}, want});
    r.reads = {{{0, k_data, 0}, true}, {{0, k_data, 1}, true}};
    sim.add(r);
    const Result res = sim.run();
    if (want == 2) {
      CHECK_MESSAGE(res.ok(), res.text());
    } else {
      // The simulator fires streams in order: p0's add meets the wait, p1's write is unordered.
      CHECK(res.mentions("race: rank 0 (consumer) 'consume' reads"));
    }
  }
}

TEST_CASE("a counter that never reaches the wait is a deadlock that names the pending adder") {
  Sim sim;
  const int k_count = sim.kind("count");
  const int p = sim.stream(0, "producer"), c = sim.stream(0, "consumer");
  Action a;
  a.stream = p;
  a.what = "add";
  a.waits.push_back({{0, sim.kind("never")}, 1});
  a.sets.push_back({{0, k_count}, 1, true});
  sim.add(a);
  Action w;
  w.stream = c;
  w.what = "wait";
  w.waits.push_back({{0, k_count}, 1});
  sim.add(w);
  const Result res = sim.run();
  REQUIRE_FALSE(res.ok());
  CHECK(res.mentions("it is set by rank 0 (producer) 'add'"));
}

TEST_CASE("a token: a reset after the set loses it, and the waiter is reported stuck; in order it passes") {
  for (const bool reset_first : {true, false}) {
    CAPTURE(reset_first);
    Sim sim;
    const int k_token = sim.kind("token"), k_go = sim.kind("go");
    const int a = sim.stream(0, "setter"), b = sim.stream(0, "resetter"), c = sim.stream(0, "waiter");
    Action reset;
    reset.stream = b;
    reset.what = "reset";
    if (!reset_first) reset.waits.push_back({{0, k_go}, 1});  // after the set
    reset.sets.push_back({{0, k_token}, 0, false, true});
    if (reset_first) reset.sets.push_back({{0, k_go}, 1});
    sim.add(reset);
    Action set;
    set.stream = a;
    set.what = "set";
    if (reset_first) set.waits.push_back({{0, k_go}, 1});  // after the reset
    set.sets.push_back({{0, k_token}, 1, false, true});
    if (!reset_first) set.sets.push_back({{0, k_go}, 1});
    sim.add(set);
    Action wait;
    wait.stream = c;
    wait.what = "wait";
    wait.waits.push_back({{0, k_token}, 1});
    wait.waits.push_back({{0, k_go}, 1});
    sim.add(wait);
    const Result r = sim.run();
    if (reset_first) {
      CHECK_MESSAGE(r.ok(), r.text());
    } else {
      CHECK(r.mentions("deadlock: rank 0 (waiter) 'wait' waits for rank 0's token"));
    }
  }
}

TEST_CASE("seeded schedules try different interleavings of independent streams") {
  // Two streams each write one region; which writes first differs between seeds.
  std::set<std::string> firsts;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    Sim sim;
    sim.schedule(seed);
    const int k_log = sim.kind("log");
    std::string first;
    for (int i = 0; i < 2; ++i) {
      Action a;
      a.stream = sim.stream(0, "s" + std::to_string(i));
      a.what = "write " + std::to_string(i);
      a.writes.push_back({{0, k_log, i}});
      a.body = [i, &first](const std::vector<const Payload*>&, std::vector<Payload>* out, std::string*) {
        if (first.empty()) first = std::to_string(i);
        out->push_back(Payload{i, 0, {}, 1});
        return true;
      };
      sim.add(a);
    }
    REQUIRE(sim.run().ok());
    firsts.insert(first);
  }
  CHECK(firsts.size() == 2);
}

TEST_CASE("a counter zeroed by a store: a wait for the sum is ordered after the store and the adds since") {
  // Producer p0 adds 1 (an old add), a store zeroes the counter, p1 and p2 add 1 each; the consumer
  // waits for 2 and reads what p1 and p2 wrote: ordered. Waiting for 1 leaves p2's write unordered.
  for (const uint64_t want : {2, 1}) {
    CAPTURE(want);
    Sim sim;
    const int k_data = sim.kind("data", "index"), k_count = sim.kind("count"), k_step = sim.kind("step");
    const int s0 = sim.stream(0, "old"), sz = sim.stream(0, "zero"), s1 = sim.stream(0, "p1"), s2 = sim.stream(0, "p2"),
              sc = sim.stream(0, "consumer");
    Action old;
    old.stream = s0;
    old.what = "old add";
    old.sets = {{{0, k_count}, 1, true}, {{0, k_step}, 1}};
    sim.add(old);
    Action zero;
    zero.stream = sz;
    zero.what = "zero";
    zero.waits.push_back({{0, k_step}, 1});
    zero.sets = {{{0, k_count}, 0, false, true}, {{0, k_step}, 2}};
    sim.add(zero);
    for (int i = 1; i <= 2; ++i) {
      Action a;
      a.stream = i == 1 ? s1 : s2;
      a.what = "produce " + std::to_string(i);
      a.waits.push_back({{0, k_step}, uint64_t(i + 1)});
      a.writes.push_back({{0, k_data, i}});
      a.sets = {{{0, k_count}, 1, true}, {{0, k_step}, uint64_t(i + 2)}};
      a.body = [i](const std::vector<const Payload*>&, std::vector<Payload>* out, std::string*) {
        out->push_back(Payload{i, 0, {}, 1});
        return true;
      };
      sim.add(a);
    }
    Action r;
    r.stream = sc;
    r.what = "consume";
    r.waits.push_back({{0, k_count}, want});
    r.reads = {{{0, k_data, 1}, true}, {{0, k_data, 2}, true}};
    sim.add(r);
    const Result res = sim.run();
    if (want == 2) {
      CHECK_MESSAGE(res.ok(), res.text());
    } else {
      CHECK(res.mentions("race: rank 0 (consumer) 'consume' reads rank 0's data[index 2]"));
    }
  }
}
