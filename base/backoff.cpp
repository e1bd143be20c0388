// Implementation of backoff.h.
#include "base/backoff.h"

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <chrono>

namespace weft {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

Backoff::Backoff(double yield_s, double max_nap_s)
    : yield_s_(std::max(0.0, yield_s)), max_nap_s_(std::max(kFirstNapS, max_nap_s)) {}

void Backoff::pause() {
  if (spins_ < kSpins) {
    ++spins_;
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
    return;
  }
  if (nap_s_ == 0) {
    const double t = now_s();
    if (yield_since_ == 0) yield_since_ = t;
    if (t - yield_since_ < yield_s_) {
      sched_yield();
      return;
    }
    nap_s_ = kFirstNapS;
  }
  const timespec ts{0, static_cast<long>(nap_s_ * 1e9)};
  nanosleep(&ts, nullptr);
  ++naps_;
  nap_s_ = std::min(nap_s_ * 2, max_nap_s_);
}

void Backoff::reset() {
  spins_ = 0;
  yield_since_ = 0;
  nap_s_ = 0;
}

}  // namespace weft
