// weft's own reference GEMM (plain CUDA cores, fp32 accumulate): what `weftrun run` validates against
// without cuBLAS.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"

namespace weft::runtime {

// C (m x n, row-major, ldc) = A (m x k, row-major, lda) * B (n x k, row-major, ldb)^T: the same "TN"
// problem as the GEMM core. bf16 in, fp32 accumulate in a fixed order (k ascending), bf16 out.
// Slow (tens of ms for 8192 x 2048 x 8192) and simple enough to trust.
Status reference_gemm_tn(int64_t m, int64_t n, int64_t k, const __nv_bfloat16* a, int64_t lda, const __nv_bfloat16* b,
                         int64_t ldb, __nv_bfloat16* c, int64_t ldc, cudaStream_t s);

}  // namespace weft::runtime
