// Host side of the kernel frame: owns the host-mapped error record of a launch and reports it.
#pragma once

#include <cstdint>

#include "base/roles.h"
#include "base/status.h"
#include "kernels/device_error.h"
#include "kernels/frame.cuh"

namespace weft::kernels {

// One per rank (or per stream of launches). Not copyable; create() before use.
class FrameHost {
 public:
  FrameHost() = default;
  FrameHost(const FrameHost&) = delete;
  FrameHost& operator=(const FrameHost&) = delete;
  ~FrameHost();

  // Allocates the mapped record; the timeout is WEFT_DEVICE_TIMEOUT unless set_timeout() is called.
  Status create(int32_t rank);
  void set_timeout(double seconds);

  // Frame arguments for a launch with these role counts (clears any previous record first,
  // synchronously: call between launches, not while one is running).
  Status params(const RoleCounts& roles, FrameParams* out);

  // After the launch has completed (stream synchronized): kOk, or kTimeout with the record
  // reported through WEFT_WARN. `what` names the launch in the message.
  Status check(const char* what) const;
  const DeviceError& record() const { return *host_record_; }

 private:
  int32_t rank_ = 0;
  uint64_t timeout_ns_ = 0;
  DeviceError* host_record_ = nullptr;
  DeviceError* dev_record_ = nullptr;
  int32_t* claim_ = nullptr;
};

}  // namespace weft::kernels
