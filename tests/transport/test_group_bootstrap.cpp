// Rank groups over the test bootstraps: each group exchanges among its members only, concurrently with
// the others, and no payload (naming its source rank and group) crosses groups; block placement checks.
#include <doctest/doctest.h>

#include <atomic>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "bootstrap/blob.h"
#include "bootstrap/group_bootstrap.h"
#include "bootstrap/placement.h"
#include "local_bootstrap.h"

using weft::Status;
using namespace weft::bootstrap;
using weft::testing::ForkBootstrap;
using weft::testing::ForkResult;
using weft::testing::make_rank_info;
using weft::testing::run_forked;
using weft::testing::run_threads;

namespace {

Blob payload(int group, int job_rank, int iter) {
  BlobWriter w;
  w.u32(static_cast<uint32_t>(group));
  w.u32(static_cast<uint32_t>(job_rank));
  w.u32(static_cast<uint32_t>(iter));
  return w.blob();
}

// Runs `iters` exchanges in this rank's group and checks every entry names the right member of the right
// group; returns a description of the first problem ("" when none).
std::string exchange_and_check(GroupBootstrap& g, int iters) {
  for (int it = 0; it < iters; ++it) {
    std::vector<Blob> all;
    const Status s =
        g.allgather("round." + std::to_string(it), payload(g.group(), g.members()[g.info().rank], it), &all);
    if (s != Status::kOk) return "allgather " + std::to_string(it) + ": " + weft::to_string(s);
    if (all.size() != g.members().size()) return "allgather returned " + std::to_string(all.size()) + " entries";
    for (size_t i = 0; i < all.size(); ++i) {
      BlobReader r(all[i]);
      uint32_t group = 0, rank = 0, iter = 0;
      if (!r.u32(&group) || !r.u32(&rank) || !r.u32(&iter) || !r.done()) return "malformed entry";
      if (static_cast<int>(group) != g.group() || static_cast<int>(rank) != g.members()[i] ||
          static_cast<int>(iter) != it)
        return "entry " + std::to_string(i) + " of group " + std::to_string(g.group()) + " came from group " +
               std::to_string(group) + ", job rank " + std::to_string(rank) + ", iteration " + std::to_string(iter);
    }
    if (g.barrier("round." + std::to_string(it)) != Status::kOk) return "barrier failed";
  }
  return "";
}

}  // namespace

TEST_CASE("threads: four 1 x 4 groups in a 2 x 8 job exchange among their members only, each at its own pace") {
  const GroupShape shape{2, 8, 1, 4};
  std::atomic<int> problems{0};
  std::mutex m;
  std::string first;  // doctest's macros are not for other threads: the body keeps its first problem here
  auto note = [&](const std::string& what) {
    std::lock_guard<std::mutex> lock(m);
    if (first.empty()) first = what;
    ++problems;
  };
  auto st = run_threads(
      16, 8,
      [&](Bootstrap& job) -> Status {
        std::unique_ptr<GroupBootstrap> g;
        std::string err;
        if (GroupBootstrap::create(&job, shape, &g, &err) != Status::kOk) {
          note(err);
          return Status::kInvalidArgument;
        }
        const RankInfo& i = g->info();
        const GroupPosition p = group_position(shape, job.info().rank);
        if (!g->subset_exchange() || i.size != 4 || i.rank != p.rank || i.num_nodes != 1 || i.local_size != 4 ||
            i.local_rank != job.info().rank % 4 ||
            i.nspace.find("/group" + std::to_string(p.group)) == std::string::npos)
          note("job rank " + std::to_string(job.info().rank) + ": wrong group identity");
        // Groups run different numbers of exchanges: with a job-wide exchange this would hang.
        const std::string why = exchange_and_check(*g, 2 + g->group());
        if (!why.empty()) note("job rank " + std::to_string(job.info().rank) + ": " + why);
        return Status::kOk;
      },
      30);
  for (Status s : st) CHECK(s == Status::kOk);
  CHECK_MESSAGE(problems.load() == 0, first);
}

TEST_CASE("threads: 2 x 4 groups in a 4 x 8 job (the issue's shapes) see the right members") {
  for (auto [n, gpn] : std::vector<std::pair<int, int>>{{1, 2}, {1, 8}, {2, 4}, {2, 8}, {4, 8}}) {
    const GroupShape shape{4, 8, n, gpn};
    std::atomic<int> problems{0};
    auto st = run_threads(
        32, 8,
        [&](Bootstrap& job) -> Status {
          std::unique_ptr<GroupBootstrap> g;
          std::string err;
          WEFT_CHECK(GroupBootstrap::create(&job, shape, &g, &err));
          if (g->info().node != job.info().node % n) ++problems;
          if (!exchange_and_check(*g, 2).empty()) ++problems;
          return Status::kOk;
        },
        30);
    INFO(n, " x ", gpn);
    for (Status s : st) CHECK(s == Status::kOk);
    CHECK(problems.load() == 0);
  }
}

TEST_CASE("forked ranks: a parent without subset exchange frames one job-wide exchange per group exchange") {
  const GroupShape shape{2, 4, 1, 2};  // 4 groups of 2
  auto results = run_forked(
      8, 4,
      [&](ForkBootstrap& job) -> int {
        std::unique_ptr<GroupBootstrap> g;
        std::string err;
        if (GroupBootstrap::create(&job, shape, &g, &err) != Status::kOk) {
          job.report(err);
          return 2;
        }
        if (g->subset_exchange()) {
          job.report("a fork bootstrap claims a subset exchange");
          return 3;
        }
        const std::string why = exchange_and_check(*g, 3);
        if (!why.empty()) {
          job.report(why);
          return 4;
        }
        return 0;
      },
      60);
  REQUIRE(results.size() == 8);
  for (const ForkResult& r : results) {
    INFO("rank ", r.rank, ": ", r.report);
    CHECK(r.exited);
    CHECK(r.exit_code == 0);
  }
}

namespace {

// One rank of a 2-rank job whose allgather hands back a peer entry forged by the test.
class ForgingBootstrap final : public Bootstrap {
 public:
  explicit ForgingBootstrap(Blob peer) : peer_(std::move(peer)) { info_ = make_rank_info(0, 2, 2); }
  const RankInfo& info() const override { return info_; }
  Status allgather(const std::string&, const Blob& mine, std::vector<Blob>* all) override {
    *all = {mine, peer_};
    return Status::kOk;
  }
  Status barrier(const std::string&) override { return Status::kOk; }
  void abort(const std::string&) override {}

 private:
  RankInfo info_;
  Blob peer_;
};

Blob group_entry(uint32_t group, uint32_t rank, const Blob& data) {
  BlobWriter w;
  w.u32(group);
  w.u32(rank);
  w.bytes(data);
  return seal_blob(24, 1, w.blob());
}

}  // namespace

TEST_CASE("a job-wide entry that claims another group or rank is refused, not used") {
  const GroupShape shape{1, 2, 1, 2};  // one group of both ranks
  for (auto [group, rank, ok] :
       std::vector<std::tuple<uint32_t, uint32_t, bool>>{{0, 1, true}, {1, 1, false}, {0, 0, false}}) {
    ForgingBootstrap parent(group_entry(group, rank, Blob{7}));
    std::unique_ptr<GroupBootstrap> g;
    std::string err;
    REQUIRE(GroupBootstrap::create(&parent, shape, &g, &err) == Status::kOk);
    std::vector<Blob> all;
    const Status s = g->allgather("k", Blob{1}, &all);
    INFO("group ", group, " rank ", rank);
    CHECK((s == Status::kOk) == ok);
    if (ok) CHECK(all == std::vector<Blob>{Blob{1}, Blob{7}});
  }
}

TEST_CASE("a rank whose launcher did not place it in blocks cannot build a group bootstrap") {
  RankInfo i = make_rank_info(1, 4, 2);  // block: node 0, local rank 1
  i.node = 1, i.local_rank = 0;          // cyclic: rank 1 on node 1
  struct Cyclic final : public Bootstrap {
    RankInfo info_;
    const RankInfo& info() const override { return info_; }
    Status allgather(const std::string&, const Blob&, std::vector<Blob>*) override { return Status::kOk; }
    Status barrier(const std::string&) override { return Status::kOk; }
    void abort(const std::string&) override {}
  } cyclic;
  cyclic.info_ = i;
  std::unique_ptr<GroupBootstrap> g;
  std::string err;
  CHECK(GroupBootstrap::create(&cyclic, GroupShape{2, 2, 1, 2}, &g, &err) == Status::kInvalidArgument);
  CHECK_MESSAGE(err.find("expected local rank 1 of node 0 (block placement)") != std::string::npos, err);
  CHECK(GroupBootstrap::create(&cyclic, GroupShape{2, 2, 3, 2}, &g, &err) == Status::kInvalidArgument);
}

TEST_CASE("placement: uneven and non-block placements are refused naming the srun option that fixes them") {
  std::string why;
  CHECK(check_block_placement({0, 0, 1, 1}, 2, &why) == Status::kOk);
  CHECK(check_block_placement({0, 0, 0, 0, 1, 1, 1, 1}, 0, &why) == Status::kOk);
  CHECK(check_block_placement({0}, 1, &why) == Status::kOk);
  // srun -n 4 on two nodes: 3 + 1.
  CHECK(check_block_placement({0, 0, 0, 1}, 2, &why) == Status::kInvalidArgument);
  CHECK_MESSAGE(why.find("uneven placement: 3 + 1 ranks on 2 nodes") != std::string::npos, why);
  CHECK_MESSAGE(why.find("srun --ntasks-per-node=2") != std::string::npos, why);
  CHECK(check_block_placement({0, 0, 0, 1}, 0, &why) == Status::kInvalidArgument);  // 2 per node from 4 / 2
  CHECK_MESSAGE(why.find("--ntasks-per-node=2") != std::string::npos, why);
  // Even, but not the layout's count: 8 ranks as 4 + 4 when the workload wants 8 per node.
  CHECK(check_block_placement({0, 0, 0, 0, 1, 1, 1, 1}, 8, &why) == Status::kInvalidArgument);
  CHECK_MESSAGE(why.find("4 + 4 ranks on 2 nodes; fused ops need 8 ranks on every node: launch with srun "
                         "--ntasks-per-node=8 --nodes=1") != std::string::npos,
                why);
  // srun --distribution=cyclic: node 0 holds ranks 0 and 2.
  CHECK(check_block_placement({0, 1, 0, 1}, 2, &why) == Status::kInvalidArgument);
  CHECK_MESSAGE(why.find("node 0 holds ranks 0, 2") != std::string::npos, why);
  CHECK_MESSAGE(why.find("srun --distribution=block") != std::string::npos, why);
  // Blocks, but the nodes in reverse order.
  CHECK(check_block_placement({1, 1, 0, 0}, 2, &why) == Status::kInvalidArgument);
  CHECK_MESSAGE(why.find("ranks 0 to 1 are on node 1, expected node 0") != std::string::npos, why);
  CHECK(check_block_placement({0, 5}, 1, &why) == Status::kInvalidArgument);  // a node index out of range
}

TEST_CASE("placement: every rank gathers the job's placement and reaches the same verdict") {
  auto st = run_threads(8, 4, [](Bootstrap& b) -> Status {
    std::string why;
    return require_block_placement(b, 4, "ag_gemm", &why);
  });
  for (Status s : st) CHECK(s == Status::kOk);
  st = run_threads(8, 4, [](Bootstrap& b) -> Status {
    std::string why;
    const Status s = require_block_placement(b, 8, "ag_gemm", &why);
    if (why.find("ag_gemm refused before any work: uneven placement: 4 + 4 ranks on 2 nodes") == std::string::npos)
      return Status::kInternal;
    return s;
  });
  for (Status s : st) CHECK(s == Status::kInvalidArgument);
}
