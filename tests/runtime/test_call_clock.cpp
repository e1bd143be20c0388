// CallClock (runtime/call_clock.h): the watchdog's timeout for an op's call whose stream waits no
// kernel bounds, from the call's started and finished words.
#include <doctest/doctest.h>

#include <chrono>

#include "runtime/call_clock.h"

using std::chrono::milliseconds;
using weft::runtime::CallClock;

TEST_CASE("a call on the device is stalled once it has been there the timeout, not before") {
  CallClock c(1.0);
  const CallClock::Clock::time_point t0{};
  CHECK_FALSE(c.stalled(0, 0, t0));                       // nothing started
  CHECK_FALSE(c.stalled(1, 0, t0 + milliseconds(10)));    // call 1 seen: its clock starts
  CHECK_FALSE(c.stalled(1, 0, t0 + milliseconds(1009)));  // 0.999 s on the device
  CHECK(c.stalled(1, 0, t0 + milliseconds(1010)));        // 1 s
  CHECK(c.call() == 1);
}

TEST_CASE("each call gets its own clock; finished calls and idle time are never stalled") {
  CallClock c(1.0);
  const CallClock::Clock::time_point t0{};
  CHECK_FALSE(c.stalled(1, 0, t0));
  CHECK_FALSE(c.stalled(1, 1, t0 + milliseconds(5000)));  // finished: idle for any time
  CHECK_FALSE(c.stalled(2, 1, t0 + milliseconds(6000)));  // call 2 starts its own clock
  CHECK_FALSE(c.stalled(2, 1, t0 + milliseconds(6900)));
  CHECK_FALSE(c.stalled(3, 2, t0 + milliseconds(7500)));  // a queue of calls that each progress
  CHECK_FALSE(c.stalled(4, 3, t0 + milliseconds(8400)));
  CHECK(c.stalled(4, 3, t0 + milliseconds(9400)));  // call 4 stuck for 1 s
  CHECK(c.call() == 4);
}

TEST_CASE("a start mark that lands after the call's finish mark is not a call on the device") {
  CallClock c(1.0);
  const CallClock::Clock::time_point t0{};
  CHECK_FALSE(c.stalled(1, 2, t0));                       // call 2 finished, its start mark not yet seen
  CHECK_FALSE(c.stalled(1, 2, t0 + milliseconds(5000)));  // however long that takes
  CHECK_FALSE(c.stalled(2, 2, t0 + milliseconds(5001)));
  CHECK_FALSE(c.stalled(3, 2, t0 + milliseconds(6000)));  // call 3 on the device: timed from here
  CHECK(c.stalled(3, 2, t0 + milliseconds(7000)));
}
