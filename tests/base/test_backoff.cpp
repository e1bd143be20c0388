// Backoff: short waits spin and yield, long ones sleep, so a waiting thread leaves its core to others.
#include <doctest/doctest.h>
#include <time.h>

#include <chrono>

#include "base/backoff.h"
#include "tests/thread_clock.h"

namespace {

using weft::testing::thread_cpu_s;
using weft::testing::wall_s;

}  // namespace

TEST_CASE("a short wait only spins and yields: no nap before the yield phase has passed") {
  weft::Backoff b(10.0);  // a yield phase far longer than this test
  for (int i = 0; i < weft::Backoff::kSpins + 1000; ++i) b.pause();
  CHECK(b.naps() == 0);
}

TEST_CASE("a long wait naps, growing to the cap, and uses a small part of a core") {
  weft::Backoff b;
  const double c0 = thread_cpu_s(), t0 = wall_s();
  while (wall_s() - t0 < 0.5) b.pause();
  const double cpu = thread_cpu_s() - c0, wall = wall_s() - t0;
  INFO("cpu " << cpu << " s in " << wall << " s, " << b.naps() << " naps");
  // Yielding alone keeps the thread running: it would use the whole core (cpu ~ wall).
  CHECK(cpu < 0.1 * wall);
  CHECK(b.naps() > 0);
  // Capped naps of 1 ms: at least a few hundred in half a second, and at most one per 2 us.
  CHECK(b.naps() >= 100);
  CHECK(b.naps() <= static_cast<uint64_t>(wall / weft::Backoff::kFirstNapS));
}

TEST_CASE("reset starts over: the next pauses spin again") {
  weft::Backoff b(0.0);  // no yield phase: naps right after the spins
  for (int i = 0; i < weft::Backoff::kSpins + 3; ++i) b.pause();
  CHECK(b.naps() == 3);
  b.reset();
  for (int i = 0; i < weft::Backoff::kSpins; ++i) b.pause();
  CHECK(b.naps() == 3);
  b.pause();
  CHECK(b.naps() == 4);
}
