// How long an op's call has been on the device, from two words the call's stream writes as it
// starts and as it finishes (call numbers, rising): for ops whose stream waits no kernel bounds, the
// watchdog's timeout. CUDA-free; one reader (the watchdog thread).
//
//   started == finished        no call on the device: nothing to time
//   started  < finished        the same: the start mark comes from a stream of its own and may land
//                              after the call's finish mark
//   started  > finished        call `started` is on the device; its clock starts when it is first
//                              seen, and the call is stalled once it has been there timeout_s
#pragma once

#include <chrono>
#include <cstdint>

namespace weft::runtime {

class CallClock {
 public:
  using Clock = std::chrono::steady_clock;
  explicit CallClock(double timeout_s) : timeout_s_(timeout_s) {}
  // True once the call on the device has been there timeout_s or more (seen at `now`).
  bool stalled(uint64_t started, uint64_t finished, Clock::time_point now) {
    if (started <= finished) return false;
    if (!timing_ || call_ != started) {  // a new call started: its clock starts now
      timing_ = true;
      call_ = started;
      since_ = now;
      return false;
    }
    return std::chrono::duration<double>(now - since_).count() >= timeout_s_;
  }
  uint64_t call() const { return call_; }
  double timeout_s() const { return timeout_s_; }

 private:
  double timeout_s_;
  bool timing_ = false;
  uint64_t call_ = 0;
  Clock::time_point since_{};
};

}  // namespace weft::runtime
