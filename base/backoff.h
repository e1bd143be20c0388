// Waiting on the host without holding the CPU: a few spins, a short while of yields, then naps that grow.
#pragma once

#include <cstdint>

namespace weft {

// Call pause() between the checks of a wait that may last: a flag another rank sets, room in a full
// FIFO, the proxy's answer to a flush. It spins kSpins times, then yields the CPU until yield_s has
// passed since the first yield, then sleeps: each nap twice the one before, from kFirstNapS up to
// max_nap_s. A wait shorter than the spin and yield phases costs no added latency; a longer one
// notices its condition at most max_nap_s late.
//
// Why not only sched_yield: a yielding thread stays runnable. Where ranks and their threads
// outnumber the cores (two ranks per node on a 2-core machine), the scheduler kept running the
// yielding threads of the ranks of one node -- which share a session and so a scheduling group --
// and gave the ranks of the other node, whose data they waited for, next to no CPU for minutes
// (docs/transport.md, "Across the namespace cluster"). A sleeping thread gives its core away.
class Backoff {
 public:
  static constexpr int kSpins = 64;
  static constexpr double kYieldS = 50e-6;
  static constexpr double kFirstNapS = 2e-6;
  static constexpr double kMaxNapS = 1e-3;

  explicit Backoff(double yield_s = kYieldS, double max_nap_s = kMaxNapS);
  // One step of the wait (see above).
  void pause();
  // The condition moved: start over with spins.
  void reset();
  // How many naps this wait has taken (tests and diagnostics).
  uint64_t naps() const { return naps_; }

 private:
  double yield_s_, max_nap_s_;
  int spins_ = 0;
  double yield_since_ = 0;  // steady clock, seconds; 0 = not yielding yet
  double nap_s_ = 0;
  uint64_t naps_ = 0;
};

}  // namespace weft
