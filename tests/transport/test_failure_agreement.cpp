// The wiring's job-wide exchanges: the failure agreement of Transport::create (every rank learns the
// lowest failing rank and why, reading its node-mates' and the node leaders' entries only: O(G + N),
// not O(world)) and the layout exchange (rank 0's entry only under block placement).
#include <doctest/doctest.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "local_bootstrap.h"
#include "transport/failure_agreement.h"
#include "transport/heap.h"
#include "transport/peer_set.h"
#include "transport/transport.h"

using weft::Status;
using namespace weft;
using namespace weft::transport;

namespace {

// Forwards to a rank's bootstrap and counts what it is asked to read.
class CountingBootstrap final : public bootstrap::Bootstrap {
 public:
  explicit CountingBootstrap(bootstrap::Bootstrap& inner) : inner_(inner), info_(inner.info()) {}
  // `info` in place of the inner bootstrap's (another placement of the same ranks).
  CountingBootstrap(bootstrap::Bootstrap& inner, const bootstrap::RankInfo& info) : inner_(inner), info_(info) {}
  const bootstrap::RankInfo& info() const override { return info_; }
  Status allgather(const std::string& key, const bootstrap::Blob& mine, std::vector<bootstrap::Blob>* all) override {
    ++full_gathers;
    return inner_.allgather(key, mine, all);
  }
  Status allgather_from(const std::string& key, const bootstrap::Blob& mine, const std::vector<int>& from,
                        std::vector<bootstrap::Blob>* some) override {
    ++rounds;
    reads += static_cast<int>(from.size());
    const std::set<int> asked(from.begin(), from.end());
    Status s = inner_.allgather_from(key, mine, from, some);
    // Leave only what was asked for, as a PMIx bootstrap does: a rank that looked elsewhere would see nothing.
    if (s == Status::kOk)
      for (size_t r = 0; r < some->size(); ++r)
        if (static_cast<int>(r) != info().rank && !asked.count(static_cast<int>(r))) (*some)[r].clear();
    return s;
  }
  Status barrier(const std::string& tag) override { return inner_.barrier(tag); }
  void abort(const std::string& why) override { inner_.abort(why); }

  int full_gathers = 0, rounds = 0, reads = 0;

 private:
  bootstrap::Bootstrap& inner_;
  bootstrap::RankInfo info_;
};

struct Outcome {
  std::vector<Status> status;
  std::vector<std::string> first;
  std::vector<int> reads, rounds, full_gathers;
};

Outcome agree_all(int nodes, int per_node, const std::vector<std::pair<int, std::string>>& failing) {
  const int world = nodes * per_node;
  Outcome o;
  o.first.assign(world, "?");
  o.reads.assign(world, -1);
  o.rounds.assign(world, -1);
  o.full_gathers.assign(world, -1);
  const RankLayout layout = block_layout(nodes, per_node);
  o.status = weft::testing::run_threads(world, per_node, [&](bootstrap::Bootstrap& inner) -> Status {
    CountingBootstrap boot(inner);
    const int me = boot.info().rank;
    std::string failure;
    for (const auto& f : failing)
      if (f.first == me) failure = f.second;
    Status s = agree_on_failure(boot, layout, "test.agree", failure, &o.first[me]);
    o.reads[me] = boot.reads;
    o.rounds[me] = boot.rounds;
    o.full_gathers[me] = boot.full_gathers;
    return s;
  });
  return o;
}

}  // namespace

TEST_CASE("failure agreement: every rank names the lowest failing rank and its cause") {
  struct Case {
    int nodes, per_node;
    std::vector<std::pair<int, std::string>> failing;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {3, 4, {}, ""},
      {3, 4, {{7, "NIC mlx5_3 did not open"}}, "rank 7: NIC mlx5_3 did not open"},
      {3, 4, {{10, "late"}, {3, "early"}}, "rank 3: early"},                  // lowest rank wins, across nodes
      {3, 4, {{0, "leader failed"}}, "rank 0: leader failed"},                // a node leader itself
      {3, 4, {{9, "rank 9 channel 1: ofi: x"}}, "rank 9 channel 1: ofi: x"},  // already named: kept
      {1, 6, {{4, "one node"}}, "rank 4: one node"},                          // round 1 alone
      {5, 1, {{3, "one per node"}}, "rank 3: one per node"},                  // round 2 alone
      {2, 2, {{1, "a"}, {2, "b"}}, "rank 1: a"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.nodes);
    CAPTURE(c.per_node);
    CAPTURE(c.expect);
    const Outcome o = agree_all(c.nodes, c.per_node, c.failing);
    const RankLayout layout = block_layout(c.nodes, c.per_node);
    for (int r = 0; r < c.nodes * c.per_node; ++r) {
      CAPTURE(r);
      CHECK(o.status[r] == Status::kOk);
      CHECK(o.first[r] == c.expect);
      CHECK(o.full_gathers[r] == 0);  // never an exchange that reads every rank
      CHECK(o.reads[r] == failure_agreement_reads(layout, r));
      CHECK(o.rounds[r] == (c.nodes == 1 || c.per_node == 1 ? 1 : 2));
    }
  }
}

TEST_CASE("failure agreement at 128 x 8 reads G - 1 + N - 1 entries per rank, not N x G - 1") {
  const RankLayout l = block_layout(128, 8);
  CHECK(failure_agreement_reads(l, 5) == 7 + 127);  // node-mates, and every other node's leader
  CHECK(failure_agreement_reads(l, 8) == 7 + 127);  // a leader alike
  CHECK(failure_agreement_reads(l, 1023) == 7 + 127);
  for (int r : {0, 5, 512, 1023}) CHECK(failure_agreement_reads(l, r) < 1023 / 7);
  CHECK(failure_agreement_reads(block_layout(1, 8), 3) == 7);
  CHECK(failure_agreement_reads(block_layout(64, 1), 3) == 63);
}

TEST_CASE("failure agreement: a layout that does not match the job is refused") {
  auto st = weft::testing::run_threads(4, 2, [&](bootstrap::Bootstrap& boot) -> Status {
    std::string first;
    return agree_on_failure(boot, block_layout(3, 2), "test.bad", "", &first);
  });
  for (Status s : st) CHECK(s == Status::kInvalidArgument);
}

TEST_CASE("Transport::create: block placement reads rank 0's layout entry only; cyclic placement reads every rank's") {
  const int W = 8, G = 4;
  // Transport::create numbers its exchanges per bootstrap object (by address): every rank's wrapper
  // stays alive to the end, so no run meets an address (and a count) left by the one before.
  std::vector<std::unique_ptr<CountingBootstrap>> keep(2 * W);
  for (bool cyclic : {false, true}) {
    CAPTURE(cyclic);
    std::vector<int> layout_reads(W, -1), exchange_reads(W, -1), full(W, -1);
    std::vector<std::vector<int>> net(W);
    auto st = weft::testing::run_threads(W, G, [&](bootstrap::Bootstrap& inner) -> Status {
      bootstrap::RankInfo info = inner.info();
      if (cyclic) {  // srun --distribution=cyclic: rank r on node r % 2
        info.node = info.rank % 2;
        info.local_rank = info.rank / 2;
      }
      const int me = info.rank;
      keep[(cyclic ? W : 0) + me] = std::make_unique<CountingBootstrap>(inner, info);
      CountingBootstrap& boot = *keep[(cyclic ? W : 0) + me];
      std::unique_ptr<HostHeap> heap;
      WEFT_CHECK(HostHeap::create(4096, &heap));
      TransportOptions opt;
      opt.backend = "loopback";
      opt.timeout_s = 20;
      opt.use_topology = false;
      std::unique_ptr<Transport> t;
      WEFT_CHECK(Transport::create(boot, heap->region(), opt, &t));
      layout_reads[me] = t->layout_exchange_reads();
      exchange_reads[me] = boot.reads;
      full[me] = boot.full_gathers;
      net[me] = t->peer_set().net;
      WEFT_CHECK(inner.barrier("counted"));
      return t->stop();
    });
    for (int r = 0; r < W; ++r) {
      CAPTURE(r);
      CHECK(st[r] == Status::kOk);
      CHECK(full[r] == 0);
      if (!cyclic) {
        CHECK(layout_reads[r] == (r == 0 ? 0 : 1));
        CHECK(net[r] == std::vector<int>{(r + G) % W});  // the rail peer of a 2 x 4 block layout
      } else {
        CHECK(layout_reads[r] == W - 1);
        CHECK(net[r] == std::vector<int>{r ^ 1});  // same local index, other node: r and r ^ 1
      }
    }
    if (!cyclic) {
      // Everything rank 5 read while wiring: three agreements (block placement, open, connect) of
      // 3 node-mates + the other node's leader each, rank 0's secret, its one rail peer's endpoint: 14, where
      // reading every rank in each job-wide round would be 3 x 7 + 1.
      CHECK(exchange_reads[5] == 3 * failure_agreement_reads(block_layout(2, G), 5) + 1 + 1);
    }
  }
}
