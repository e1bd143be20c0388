// The one-node AllGather+GEMM op's copy-engine protocol (tests/sim/ag_op_model.h) on the simulator:
// calls back to back with no barrier, 2 to 8 ranks, many interleavings; each break of the protocol
// (no gate, no wait for the peer's token, the token reset after the gate opens) is caught.
#include <doctest/doctest.h>

#include <string>

#include "tests/sim/ag_op_model.h"

using namespace weft::sim;

TEST_CASE("AllGather+GEMM op, copy engines: every GEMM reads its call's shards, no race, no lost token") {
  for (int world : {2, 3, 4, 8})
    for (uint64_t seed = 0; seed < 40; ++seed) {
      CAPTURE(world);
      CAPTURE(seed);
      const Result r = simulate_ag_op(world, 6, AgOpVariant::kAsBuilt, seed);
      REQUIRE_MESSAGE(r.ok(), r.text());
    }
}

TEST_CASE("AllGather+GEMM op, copy engines: each break of the protocol is caught in some interleaving") {
  struct Case {
    AgOpVariant v;
    const char* name;
    const char* finding;  // what the simulator reports
  };
  const Case cases[] = {{AgOpVariant::kUngated, "GEMM without gates", "wrong data"},
                        {AgOpVariant::kNoConsumedWait, "push without the peer's token", "race"},
                        {AgOpVariant::kResetLate, "token reset after the gate", "deadlock"}};
  for (const Case& c : cases) {
    const std::string name = c.name;
    CAPTURE(name);
    int caught = 0;
    for (uint64_t seed = 0; seed < 200 && caught == 0; ++seed) {
      const Result r = simulate_ag_op(4, 6, c.v, seed);
      if (!r.ok()) {
        CHECK_MESSAGE(r.mentions(c.finding), r.text());
        ++caught;
      }
    }
    CHECK_MESSAGE(caught > 0, "no interleaving of 200 showed it");
  }
}
