// The error record a persistent kernel writes to host-mapped memory when a device wait times out.
#pragma once

#include <cstdint>

#include "base/status.h"

namespace weft::kernels {

enum class DeviceErrorKind : int32_t {
  kNone = 0,
  kFlagTimeout = 1,     // a readiness flag never reached the expected value
  kBarrierTimeout = 2,  // an in-block pipeline barrier (TMA / MMA ring) never completed
  kCapacity = 3,        // routed rows beyond a reserved buffer (expected: rows needed, seen: rows reserved)
};

// Written once per launch by the first block that times out (the `status` word is claimed with
// an atomic compare-and-swap, then the rest is filled and `committed` is set last). Other blocks
// poll `status` while they wait and leave early once it is set. Layout is shared by host and
// device; it lives in cudaHostAlloc(..., cudaHostAllocMapped) memory.
struct DeviceError {
  int32_t status;     // 0 = no error; != 0 claimed by the reporting block
  int32_t committed;  // 1 once the fields below are complete
  int32_t kind;       // DeviceErrorKind
  int32_t rank;
  int32_t role;    // weft::Role
  int32_t block;   // blockIdx.x
  int32_t tile_m;  // tile being worked on (-1 when none)
  int32_t tile_n;
  int32_t flag_index;  // index of the flag within its array (-1 when not a flag)
  int32_t pad;
  uint64_t flag_addr;  // device address of the awaited word
  uint64_t expected;   // awaited value (flag >= expected)
  uint64_t seen;       // last value read
  uint64_t waited_ns;  // how long the wait ran
};
static_assert(sizeof(DeviceError) == 72, "DeviceError layout is shared by host and device");

// Host side: turns a record into one WEFT_WARN line naming rank, role, block, tile and flag, and
// returns Status::kTimeout (kOk when the record is empty). `what` names the launch ("gemm").
Status report_device_error(const DeviceError& e, const char* what);

}  // namespace weft::kernels
