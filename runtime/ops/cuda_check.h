// NCCL / cuBLAS return codes turned into weft::Status (CUDA's: runtime/exec/cuda_check.h), logged once.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "base/log.h"
#include "base/status.h"
#include "runtime/exec/cuda_check.h"

#define WEFT_NCCL_CHECK(call)                                                                              \
  do {                                                                                                     \
    ncclResult_t weft_n_ = (call);                                                                         \
    if (weft_n_ != ncclSuccess) {                                                                          \
      WEFT_WARN(kKernel, "%s failed: %s (%s:%d)", #call, ncclGetErrorString(weft_n_), __FILE__, __LINE__); \
      return ::weft::Status::kCudaError;                                                                   \
    }                                                                                                      \
  } while (0)

#define WEFT_CUBLAS_CHECK(call)                                                                           \
  do {                                                                                                    \
    cublasStatus_t weft_b_ = (call);                                                                      \
    if (weft_b_ != CUBLAS_STATUS_SUCCESS) {                                                               \
      WEFT_WARN(kKernel, "%s failed: cuBLAS status %d (%s:%d)", #call, int(weft_b_), __FILE__, __LINE__); \
      return ::weft::Status::kCudaError;                                                                  \
    }                                                                                                     \
  } while (0)
