// Host side of the kernel frame (kernels/frame.h).
#include <cuda_runtime.h>

#include <cstring>

#include "base/log.h"
#include "base/params.h"
#include "kernels/frame.h"

namespace weft::kernels {

FrameHost::~FrameHost() {
  if (host_record_) cudaFreeHost(host_record_);
  if (claim_) cudaFree(claim_);
}

Status FrameHost::create(int32_t rank) {
  rank_ = rank;
  double seconds = 0;
  WEFT_CHECK(get_param("WEFT_DEVICE_TIMEOUT", &seconds));
  set_timeout(seconds);
  cudaError_t err = cudaHostAlloc(reinterpret_cast<void**>(&host_record_), sizeof(DeviceError), cudaHostAllocMapped);
  if (err == cudaSuccess) err = cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev_record_), host_record_, 0);
  if (err == cudaSuccess) err = cudaMalloc(reinterpret_cast<void**>(&claim_), sizeof(int32_t));
  if (err != cudaSuccess) {
    WEFT_WARN(kKernel, "rank %d: cannot allocate the device error record: %s", rank, cudaGetErrorString(err));
    return Status::kCudaError;
  }
  memset(host_record_, 0, sizeof(DeviceError));
  return Status::kOk;
}

void FrameHost::set_timeout(double seconds) { timeout_ns_ = seconds <= 0 ? 1 : static_cast<uint64_t>(seconds * 1e9); }

Status FrameHost::params(const RoleCounts& roles, FrameParams* out) {
  if (!host_record_) return Status::kInternal;
  memset(host_record_, 0, sizeof(DeviceError));
  cudaError_t err = cudaMemset(claim_, 0, sizeof(int32_t));
  if (err != cudaSuccess) {
    WEFT_WARN(kKernel, "rank %d: cannot clear the device error claim: %s", rank_, cudaGetErrorString(err));
    return Status::kCudaError;
  }
  out->roles = roles;
  out->rank = rank_;
  out->timeout_ns = timeout_ns_;
  out->error = dev_record_;
  out->error_claim = claim_;
  return Status::kOk;
}

Status FrameHost::check(const char* what) const {
  if (!host_record_) return Status::kInternal;
  DeviceError copy;
  memcpy(&copy, const_cast<const DeviceError*>(host_record_), sizeof(copy));
  return report_device_error(copy, what);
}

}  // namespace weft::kernels
