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

// GEMM+RS / GEMM+AR's reference: every rank r's A_r (m x k/W) and B_r (n x k/W) filled again from
// (seed, r) and (seed + 1, r), as each rank filled its own, side by side along K, and one reference GEMM
// over all of K into *c_ref (m x n, allocated from buf). A slice from the wrong rank differs.
Status reference_gemm_reduce(int64_t m, int64_t n, int64_t k, int world, uint64_t seed, DeviceBuffers* buf,
                             __nv_bfloat16** c_ref, cudaStream_t s);

}  // namespace weft::runtime
