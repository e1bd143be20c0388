// Device-side test data for the ops: random fills that encode the source rank, poison, comparisons,
// and the buffers that hold them.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "base/log.h"
#include "base/status.h"

namespace weft::runtime {

// Random values from a counter hash of (seed, rank, index): a shard filled by rank r is different
// from one filled by any other rank, so a misrouted shard fails the comparison. Normal with standard
// deviation `scale` (what torch.randn gives the baselines), or with WEFT_OPS_INPUT=uniform uniform in
// [-scale, scale). Fails on an unknown WEFT_OPS_INPUT.
Status fill_random_bf16(__nv_bfloat16* p, int64_t n, uint64_t seed, int rank, float scale, cudaStream_t s);
// 0xFFFF in every element: a bf16 NaN, so an element nothing wrote fails every comparison.
Status poison_bf16(__nv_bfloat16* p, int64_t n, cudaStream_t s);

struct Comparison {
  double rel_err = 0;      // ||got - ref|| / ||ref|| over finite elements
  int64_t non_finite = 0;  // NaN / Inf in got (unwritten elements)
  int64_t mismatched = 0;  // elements with different bits (for exact comparisons)
  int64_t first_mismatch = -1;
};
// Compares two bf16 arrays element-wise on the device (synchronizes `s`).
Status compare_bf16(const __nv_bfloat16* got, const __nv_bfloat16* ref, int64_t n, cudaStream_t s, Comparison* out);

// Device buffers freed together when this goes out of scope (a harness's inputs and references).
struct DeviceBuffers {
  std::vector<void*> ptrs;
  DeviceBuffers() = default;
  DeviceBuffers(const DeviceBuffers&) = delete;
  DeviceBuffers& operator=(const DeviceBuffers&) = delete;
  ~DeviceBuffers() {
    for (void* p : ptrs) cudaFree(p);
  }
  template <class T>
  Status alloc(int64_t count, T** out) {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, size_t(count) * sizeof(T));
    if (e != cudaSuccess) {
      WEFT_WARN(kKernel, "cudaMalloc of %lld bytes: %s", static_cast<long long>(count) * int64_t(sizeof(T)),
                cudaGetErrorString(e));
      return Status::kCudaError;
    }
    ptrs.push_back(p);
    *out = static_cast<T*>(p);
    return Status::kOk;
  }
};

}  // namespace weft::runtime
