// GEMM+RS / GEMM+AR's one-node overlap path (kernels/reduce_overlap_plan.h, the schedule the runtime
// op enqueues) on the data-flow simulator, call after call with no barrier: for 2 to 8 ranks, 1 to
// 4 pieces, every lag, copy or epilogue sends, push or epilogue gathers and mover SMs, no wait
// deadlocks, no slot or C row is read before it is written or overwritten before it is read, and
// every owner's rows hold every rank's partial exactly once. And the other way round: a schedule
// that counts epilogue sends in the wrong word, or sends without waiting for the owner to have read
// its slots, fails, naming what.
#include <doctest/doctest.h>

#include <string>

#include "tests/sim/overlap_model.h"

using namespace weft::sim;
using weft::kernels::OverlapCall;
using weft::kernels::OverlapStep;
using weft::kernels::OverlapWordKind;

namespace {

std::string describe(const OverlapSimOptions& o) {
  return std::string(o.all_reduce ? "AR" : "RS") + " W " + std::to_string(o.world) + " S " + std::to_string(o.pieces) +
         " lag " + std::to_string(o.lag) + (o.sm_send ? " sm sends" : " copy sends") +
         (o.all_reduce ? (o.sm_gather ? ", sm gather" : ", push gather") : "") +
         (o.movers ? ", " + std::to_string(o.movers) + " movers" : "");
}

}  // namespace

TEST_CASE("overlap path: every way of moving pieces and rows, 2 to 8 ranks, calls back to back") {
  int cases = 0;
  for (int W : {2, 3, 4, 8})
    for (int S : {1, 2, 4})
      for (int lag = 1; lag <= S; ++lag)
        for (int way = 0; way < 6; ++way) {
          // RS: copy sends (mover SMs from 3 ranks), epilogue sends; AR: copy sends with pushes (and
          // movers) or the epilogue gather, epilogue sends with either gather.
          OverlapSimOptions o;
          o.world = W, o.pieces = S, o.lag = lag, o.runs = 3;
          o.all_reduce = way >= 2;
          o.sm_send = way == 1 || way >= 4;
          o.sm_gather = way == 3 || way == 4;
          o.movers = (way == 0 || way == 2) && W >= 3 ? 4 : 0;
          CAPTURE(describe(o));
          const Result r = simulate_overlap(o);
          CHECK_MESSAGE(r.ok(), r.text());
          CHECK(r.fired == r.actions);
          ++cases;
        }
  MESSAGE(cases << " configurations, 3 calls each");
}

TEST_CASE("overlap path: epilogue sends counted in the sender's word instead of the owner's deadlock, named") {
  // What the runtime op first did: each sender counted at landed[sender S + j] in the owner, which
  // no gate reads (the owner's own piece j waits at landed[owner S + j]).
  OverlapSimOptions o;
  o.world = 4, o.pieces = 2, o.lag = 1, o.sm_send = true;
  o.mutate = [&](int rank, OverlapCall* c) {
    for (size_t q = 0; q < c->part_counts.size(); ++q)
      if (int(q) != rank) c->part_counts[q].index = int64_t(rank) * o.pieces;
  };
  const Result r = simulate_overlap(o);
  REQUIRE_FALSE(r.ok());
  CHECK(r.mentions("landed"));
  MESSAGE(r.text());
}

TEST_CASE("overlap path: a copy send that does not wait for the owner to have read its slots races, named") {
  // ReduceScatter: only `freed` orders a sender's next call after the owner's reads. AllReduce:
  // the sender's call also waited for the owner's reduced rows (gathered or bcast), which the owner
  // produces after reading its slots, so the same schedule stays ordered there.
  for (bool all_reduce : {false, true}) {
    OverlapSimOptions o;
    o.world = 3, o.pieces = 2, o.lag = 2, o.all_reduce = all_reduce, o.runs = 3;
    o.mutate = [](int, OverlapCall* c) {
      for (auto& q : c->sends)
        for (size_t i = 0; i < q.size(); ++i)
          if (q[i].kind == OverlapStep::kWait && q[i].word.kind == OverlapWordKind::kFreed)
            q.erase(q.begin() + long(i--));
    };
    const Result r = simulate_overlap(o);
    CAPTURE(all_reduce);
    if (all_reduce) {
      CHECK_MESSAGE(r.ok(), r.text());
      continue;
    }
    REQUIRE_FALSE(r.ok());
    CHECK(r.mentions("slot"));
    MESSAGE(r.text());
  }
}

TEST_CASE("overlap path: a gate that opens without waiting for one peer's piece races, named") {
  OverlapSimOptions o;
  o.world = 4, o.pieces = 2, o.lag = 1;
  o.mutate = [](int, OverlapCall* c) {
    for (size_t i = 0; i < c->gates.size(); ++i)
      if (c->gates[i].kind == OverlapStep::kWait) {
        c->gates.erase(c->gates.begin() + long(i));  // each piece's first awaited peer
        i += 2;
      }
  };
  const Result r = simulate_overlap(o);
  REQUIRE_FALSE(r.ok());
  CHECK(r.mentions("slot"));
  MESSAGE(r.text());
}
