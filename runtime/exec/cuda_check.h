// CUDA runtime return codes turned into weft::Status, logged once where they are decided.
#pragma once

#include <cuda_runtime.h>

#include "base/log.h"
#include "base/status.h"

#define WEFT_CUDA_CHECK(call)                                                                              \
  do {                                                                                                     \
    cudaError_t weft_e_ = (call);                                                                          \
    if (weft_e_ != cudaSuccess) {                                                                          \
      WEFT_WARN(kKernel, "%s failed: %s (%s:%d)", #call, cudaGetErrorString(weft_e_), __FILE__, __LINE__); \
      return ::weft::Status::kCudaError;                                                                   \
    }                                                                                                      \
  } while (0)
