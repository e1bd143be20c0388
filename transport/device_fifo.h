// The handle a kernel pushes FIFO commands through (POD, host and device); the push itself is in fifo_device.cuh.
#pragma once

#include <cstdint>

#include "transport/fifo_command.h"

namespace weft::transport {

struct DeviceFifo {
  FifoRingHeader* ring = nullptr;      // host-pinned, device-mapped
  FifoCommand* slots = nullptr;        // host-pinned, device-mapped
  FifoProducerState* state = nullptr;  // device memory: ticket counter, tail cache, stalls
  uint32_t mask = 0;                   // depth - 1
  int32_t rank = 0;
  int32_t channel = 0;
  uint64_t timeout_ns = 0;  // bound on a push waiting for space (WEFT_PROXY_TIMEOUT)
};

}  // namespace weft::transport
