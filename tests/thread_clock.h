// Clocks for tests that check how a wait spends its time: this thread's CPU seconds and wall seconds.
#pragma once

#include <time.h>

#include <chrono>

namespace weft::testing {

inline double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

inline double wall_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace weft::testing
