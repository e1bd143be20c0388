// The cuBLAS functions weftrun bench calls, forwarded to libcublas loaded on first use (bench_libs.h).
#include <cublas_v2.h>

#include "runtime/ops/bench_libs.h"

namespace {

#define WEFT_STR2(x) #x
#define WEFT_STR(x) WEFT_STR2(x)
constexpr const char* kSoname = "libcublas.so." WEFT_STR(CUBLAS_VER_MAJOR);

template <class F>
F* cublas_fn(const char* name) {
  void* lib = weft::runtime::ops::bench_library(kSoname, "cuBLAS");
  return reinterpret_cast<F*>(weft::runtime::ops::bench_symbol(lib, name, "cuBLAS"));
}

}  // namespace

extern "C" {

cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t* handle) {
  static auto* f = cublas_fn<decltype(cublasCreate_v2)>("cublasCreate_v2");
  return f ? f(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasDestroy_v2(cublasHandle_t handle) {
  static auto* f = cublas_fn<decltype(cublasDestroy_v2)>("cublasDestroy_v2");
  return f ? f(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  static auto* f = cublas_fn<decltype(cublasSetStream_v2)>("cublasSetStream_v2");
  return f ? f(handle, stream) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasSetSmCountTarget(cublasHandle_t handle, int sm_count) {
  static auto* f = cublas_fn<decltype(cublasSetSmCountTarget)>("cublasSetSmCountTarget");
  return f ? f(handle, sm_count) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const void* alpha, const void* a, cudaDataType atype,
                                         int lda, const void* b, cudaDataType btype, int ldb, const void* beta, void* c,
                                         cudaDataType ctype, int ldc, cublasComputeType_t compute,
                                         cublasGemmAlgo_t algo) {
  using Fn = cublasStatus_t(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                            const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                            cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  static auto* f = cublas_fn<Fn>("cublasGemmEx");
  return f ? f(handle, transa, transb, m, n, k, alpha, a, atype, lda, b, btype, ldb, beta, c, ctype, ldc, compute, algo)
           : CUBLAS_STATUS_NOT_INITIALIZED;
}

}  // extern "C"
