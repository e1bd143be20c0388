// reference_moe_expert / reference_moe_gather: a block per sampled token, dot products in a fixed order.
#include "base/log.h"
#include "runtime/exec/cuda_check.h"
#include "runtime/exec/device_data.h"
#include "runtime/exec/reference_moe.h"

namespace weft::runtime {
namespace {

using bf16 = __nv_bfloat16;

__global__ void expert_kernel(const bf16* x, const int32_t* rows, const int32_t* ids, const float* weights,
                              int32_t topk, int32_t expert, const bf16* gate, const bf16* up, const bf16* down,
                              int32_t hidden, int32_t ffn, float* acc) {
  extern __shared__ float h[];  // ffn
  const int32_t i = blockIdx.x, t = rows[i];
  const bf16* xt = x + int64_t(t) * hidden;
  for (int32_t j = 0; j < topk; ++j) {
    if (ids[int64_t(t) * topk + j] != expert) continue;
    const float w = weights[int64_t(t) * topk + j];
    __syncthreads();
    for (int32_t f = threadIdx.x; f < ffn; f += blockDim.x) {
      float g = 0.f, u = 0.f;
      for (int32_t k = 0; k < hidden; ++k) {
        const float xv = __bfloat162float(xt[k]);
        g += xv * __bfloat162float(gate[int64_t(f) * hidden + k]);
        u += xv * __bfloat162float(up[int64_t(f) * hidden + k]);
      }
      h[f] = __bfloat162float(__float2bfloat16_rn(g / (1.f + expf(-g)) * u));
    }
    __syncthreads();
    for (int32_t c = threadIdx.x; c < hidden; c += blockDim.x) {
      float y = 0.f;
      for (int32_t f = 0; f < ffn; ++f) y += h[f] * __bfloat162float(down[int64_t(c) * ffn + f]);
      acc[int64_t(i) * hidden + c] += w * __bfloat162float(__float2bfloat16_rn(y));
    }
  }
}

__global__ void gather_kernel(const float* acc, const bf16* y, const int32_t* rows, int32_t samples, int32_t hidden,
                              bf16* ref, bf16* got) {
  const int64_t n = int64_t(samples) * hidden;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e / hidden, c = e % hidden;
    ref[e] = __float2bfloat16_rn(acc[e]);
    got[e] = y[int64_t(rows[i]) * hidden + c];
  }
}

}  // namespace

Status reference_moe_expert(const bf16* x, const int32_t* rows, int32_t samples, const int32_t* ids,
                            const float* weights, int32_t topk, int32_t expert, const bf16* gate, const bf16* up,
                            const bf16* down, int32_t hidden, int32_t ffn, float* acc, cudaStream_t s) {
  if (samples <= 0 || hidden <= 0 || ffn <= 0 || ffn > 16384 || topk <= 0) {
    WEFT_WARN(kKernel, "reference moe: invalid arguments (%d samples, hidden %d, ffn %d, top-%d)", samples, hidden, ffn,
              topk);
    return Status::kInvalidArgument;
  }
  const size_t smem = size_t(ffn) * sizeof(float);
  if (smem > 48 * 1024)
    WEFT_CUDA_CHECK(cudaFuncSetAttribute(expert_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  expert_kernel<<<samples, 256, size_t(ffn) * sizeof(float), s>>>(x, rows, ids, weights, topk, expert, gate, up, down,
                                                                  hidden, ffn, acc);
  WEFT_CUDA_CHECK(cudaGetLastError());
  return Status::kOk;
}

Status reference_moe_gather(const float* acc, const bf16* y, const int32_t* rows, int32_t samples, int32_t hidden,
                            bf16* ref, bf16* got, cudaStream_t s) {
  gather_kernel<<<256, 256, 0, s>>>(acc, y, rows, samples, hidden, ref, got);
  WEFT_CUDA_CHECK(cudaGetLastError());
  return Status::kOk;
}

Status fill_moe_expert(uint64_t seed, int64_t e, int64_t hidden, int64_t ffn, __nv_bfloat16* gate, __nv_bfloat16* up,
                       __nv_bfloat16* down, cudaStream_t s) {
  const float sh = 1.f / sqrtf(float(hidden)), sf = 1.f / sqrtf(float(ffn));
  WEFT_CHECK(fill_random_bf16(gate, ffn * hidden, seed + 16 + 3 * uint64_t(e), 0, sh, s));
  WEFT_CHECK(fill_random_bf16(up, ffn * hidden, seed + 17 + 3 * uint64_t(e), 0, sh, s));
  return fill_random_bf16(down, hidden * ffn, seed + 18 + 3 * uint64_t(e), 0, sf, s);
}

}  // namespace weft::runtime
