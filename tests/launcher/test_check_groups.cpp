// `weftrun check --group` on one machine: each rank group runs its exchanges (and the socket transport
// check) among its own members, all groups at once; entries naming their source's group and job rank
// show that nothing crosses groups.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "tests/launcher/proc.h"

using weft::testing::ProcResult;

namespace {

const std::string kWeftrun = std::string(WEFT_BINARY_DIR) + "/bin/weftrun";
const std::string kEnv = "env -u WEFT_TEST_FAULT WEFT_BOOTSTRAP_TIMEOUT=30 WEFT_LAUNCH_KILL_GRACE=2 ";

ProcResult check(const std::string& args, double limit_s = 120) {
  return weft::testing::run("exec " + kEnv + kWeftrun + " check " + args, limit_s);
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("check -n 8 --group 4: two groups of 4 on one node, each exchanging among its members") {
  ProcResult r = check("-n 8 --group 4 --iters 3 --json");
  REQUIRE_MESSAGE(r.exit_code == 0, std::string(r.out + r.err));
  const nlohmann::json j = nlohmann::json::parse(r.out);
  CHECK(j["passed"] == true);
  CHECK(j["groups"]["count"] == 2);
  CHECK(j["groups"]["gpus_per_node"] == 4);
  REQUIRE(j["per_rank"].size() == 8);
  for (int rank = 0; rank < 8; ++rank) {
    CHECK(j["per_rank"][rank]["group"] == rank / 4);
    CHECK(j["per_rank"][rank]["group_rank"] == rank % 4);
  }
  CHECK(j["problems"].empty());
}

TEST_CASE("check --emulate-nodes 2 --group 1x2 --transport socket: four groups run the transport check at once") {
  ProcResult r = check("-n 8 --emulate-nodes 2 --group 1x2 --transport socket --iters 2");
  REQUIRE_MESSAGE(r.exit_code == 0, std::string(r.out + r.err));
  CHECK_MESSAGE(contains(r.out, "check passed: 8 ranks, 2 nodes, 4 groups of 1 x 2"), r.out);
  CHECK_MESSAGE(contains(r.out, "rank 5/8: node 1/2"), r.out);
  CHECK_MESSAGE(contains(r.out, "local rank 1/4, group 2 rank 1"), r.out);
  // Groups spanning the emulated nodes: 2 x 2.
  r = check("-n 8 --emulate-nodes 2 --group 2x2 --transport socket --iters 2");
  REQUIRE_MESSAGE(r.exit_code == 0, std::string(r.out + r.err));
  CHECK_MESSAGE(contains(r.out, "check passed: 8 ranks, 2 nodes, 2 groups of 2 x 2"), r.out);
}

TEST_CASE("check --group refuses a shape that does not tile the job, and a malformed one") {
  ProcResult r = check("-n 6 --group 4", 60);
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.err, "--group 4 does not tile the job's 1 node(s) x 6 ranks"), r.err);
  r = check("-n 4 --group 2y2", 30);
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.err, "--group 2y2: expected G or NxG"), r.err);
}
