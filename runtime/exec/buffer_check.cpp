#include "runtime/exec/buffer_check.h"

#include <cuda.h>
#include <cuda_runtime.h>

namespace weft::runtime {

namespace {

using AddressRangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);

AddressRangeFn address_range() {
  static AddressRangeFn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      p = nullptr;
    return reinterpret_cast<AddressRangeFn>(p);
  }();
  return fn;
}

std::string hex(const void* p) {
  char b[32];
  snprintf(b, sizeof b, "%p", p);
  return b;
}

}  // namespace

Status check_device_buffer(const void* p, uint64_t bytes, int device, const std::string& what, std::string* error,
                           bool pieces) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (!p) {
    *error = what + " is null";
    return Status::kInvalidArgument;
  }
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();
    *error = what + " (" + hex(p) + ") is not memory CUDA knows";
    return Status::kInvalidArgument;
  }
  if (attr.type == cudaMemoryTypeUnregistered || attr.type == cudaMemoryTypeHost) {
    *error = what + " (" + hex(p) + ") is host memory" +
             (attr.type == cudaMemoryTypeHost ? " (pinned)" : " (not registered with CUDA)") +
             ": weft's ops read and write device memory of the rank's GPU (" + std::to_string(device) +
             "): allocate it there (cudaMalloc, or weft::Context::alloc from the symmetric heap)";
    return Status::kInvalidArgument;
  }
  if (attr.type == cudaMemoryTypeDevice && attr.device != device) {
    *error = what + " (" + hex(p) + ") is memory of GPU " + std::to_string(attr.device) + ", not of this rank's GPU " +
             std::to_string(device);
    return Status::kInvalidArgument;
  }
  CUdeviceptr base = 0;
  size_t size = 0;
  const AddressRangeFn fn = address_range();
  if (fn && fn(&base, &size, CUdeviceptr(a)) == CUDA_SUCCESS) {
    const uintptr_t end = uintptr_t(base) + size;
    // A range from a virtual-memory allocator (cuMemMap: PyTorch's expandable segments) may be mapped
    // as several pieces, and the lookup gives only the piece that holds `p`. Registered buffers
    // (`pieces`) need only their last byte to be this GPU's memory too; the caller vouches for the rest.
    cudaPointerAttributes last{};
    const bool last_here =
        pieces && bytes > end - a &&
        cudaPointerGetAttributes(&last, reinterpret_cast<const char*>(p) + (bytes - 1)) == cudaSuccess &&
        last.type == cudaMemoryTypeDevice && last.device == device;
    if (pieces && !last_here) cudaGetLastError();
    if (bytes > end - a && !last_here) {
      *error =
          what + " (" + hex(p) + ") needs " + std::to_string(bytes) + " bytes, but its allocation ends " +
          std::to_string(end - a) + " bytes after it" +
          (pieces ? "" : " (memory mapped in pieces, such as PyTorch's expandable segments: register_buffer() it)");
      return Status::kInvalidArgument;
    }
  }
  return Status::kOk;
}

}  // namespace weft::runtime
