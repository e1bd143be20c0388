// Host-side reporting of the device error record (kernels/device_error.h).
#include "kernels/device_error.h"

#include "base/log.h"
#include "base/roles.h"

namespace weft::kernels {

Status report_device_error(const DeviceError& e, const char* what) {
  if (e.status == 0) return Status::kOk;
  const char* role = to_string(static_cast<Role>(e.role));
  const double waited = double(e.waited_ns) * 1e-9;
  if (!e.committed) {
    WEFT_WARN(kKernel, "%s: a device wait timed out on rank %d but its record is incomplete", what, e.rank);
  } else if (e.kind == int32_t(DeviceErrorKind::kFlagTimeout)) {
    WEFT_WARN(kKernel,
              "%s: rank %d %s block %d timed out after %.3f s (WEFT_DEVICE_TIMEOUT) waiting before tile "
              "(m_block %d, n_block %d) for flag[%d] at 0x%llx to reach >= %llu; last value seen %llu",
              what, e.rank, role, e.block, waited, e.tile_m, e.tile_n, e.flag_index,
              static_cast<unsigned long long>(e.flag_addr), static_cast<unsigned long long>(e.expected),
              static_cast<unsigned long long>(e.seen));
  } else if (e.kind == int32_t(DeviceErrorKind::kCapacity)) {
    WEFT_WARN(kKernel, "%s: rank %d: the routed tokens need %llu rows, %llu are reserved; the call is refused", what,
              e.rank, static_cast<unsigned long long>(e.expected), static_cast<unsigned long long>(e.seen));
    return Status::kInvalidArgument;
  } else {
    WEFT_WARN(kKernel,
              "%s: rank %d %s block %d timed out after %.3f s (WEFT_DEVICE_TIMEOUT) on an in-block pipeline "
              "barrier at smem 0x%llx (tile m_block %d, n_block %d, phase %llu)",
              what, e.rank, role, e.block, waited, static_cast<unsigned long long>(e.flag_addr), e.tile_m, e.tile_n,
              static_cast<unsigned long long>(e.expected));
  }
  return Status::kTimeout;
}

}  // namespace weft::kernels
