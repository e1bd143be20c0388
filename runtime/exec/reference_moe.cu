// reference_moe_expert / reference_moe_gather: a block per sampled token, dot products in a fixed order.
#include <vector>

#include "base/log.h"
#include "base/params.h"
#include "runtime/exec/cuda_check.h"
#include "runtime/exec/device_data.h"
#include "runtime/exec/reference_moe.h"
#include "runtime/exec/stream_ops.h"

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

Status make_moe_inputs(DeviceBuffers* buf, uint64_t seed, int rank, int64_t tokens, int64_t hidden, int64_t ffn,
                       int64_t experts, int64_t local_experts, cudaStream_t s, MoeInputs* out) {
  const int64_t T = tokens, H = hidden, F = ffn, E = experts, L = local_experts;
  MoeInputs in;
  WEFT_CHECK(buf->alloc(H * E, &in.router));
  WEFT_CHECK(buf->alloc(L * F * H, &in.gate));
  WEFT_CHECK(buf->alloc(L * F * H, &in.up));
  WEFT_CHECK(buf->alloc(L * H * F, &in.down));
  WEFT_CHECK(buf->alloc(T * H, &in.x));
  WEFT_CHECK(fill_random_bf16(in.router, H * E, seed + 2, 0, 1.f / sqrtf(float(H)), s));
  for (int64_t i = 0; i < L; ++i)
    WEFT_CHECK(
        fill_moe_expert(seed, rank * L + i, H, F, in.gate + i * F * H, in.up + i * F * H, in.down + i * H * F, s));
  WEFT_CHECK(fill_random_bf16(in.x, T * H, seed + 1, rank, 1.0f, s));
  *out = in;
  return Status::kOk;
}

Status check_moe_sampled(const int32_t* ids_dev, const float* weights, uint64_t seed, const __nv_bfloat16* x,
                         const __nv_bfloat16* y, int64_t T, int64_t H, int64_t F, int64_t E, int64_t K, int32_t samples,
                         cudaStream_t s, Comparison* out) {
  using bf16 = __nv_bfloat16;
  DeviceBuffers buf;
  std::vector<int32_t> rows(static_cast<size_t>(samples)), ids(static_cast<size_t>(T * K));
  for (int32_t i = 0; i < samples; ++i) rows[size_t(i)] = int32_t(int64_t(i) * T / samples);
  int32_t* d_rows = nullptr;
  float* acc = nullptr;
  bf16 *g = nullptr, *u = nullptr, *d = nullptr, *ref = nullptr, *got = nullptr;
  WEFT_CHECK(buf.alloc(samples, &d_rows));
  WEFT_CHECK(buf.alloc(int64_t(samples) * H, &acc));
  WEFT_CHECK(buf.alloc(F * H, &g));
  WEFT_CHECK(buf.alloc(F * H, &u));
  WEFT_CHECK(buf.alloc(H * F, &d));
  WEFT_CHECK(buf.alloc(int64_t(samples) * H, &ref));
  WEFT_CHECK(buf.alloc(int64_t(samples) * H, &got));
  WEFT_CUDA_CHECK(cudaMemcpyAsync(d_rows, rows.data(), rows.size() * 4, cudaMemcpyHostToDevice, s));
  WEFT_CUDA_CHECK(cudaMemsetAsync(acc, 0, size_t(samples) * size_t(H) * 4, s));
  WEFT_CUDA_CHECK(cudaMemcpyAsync(ids.data(), ids_dev, ids.size() * 4, cudaMemcpyDeviceToHost, s));
  WEFT_CHECK(sync_bounded(s, param_double_or_default("WEFT_DEVICE_TIMEOUT"), "moe: the routing's ids", nullptr));
  std::vector<bool> used(size_t(E), false);  // only the experts the sampled tokens chose
  for (int32_t r : rows)
    for (int64_t j = 0; j < K; ++j) {
      const int32_t e = ids[size_t(r * K + j)];
      if (e >= 0 && e < E) used[size_t(e)] = true;
    }
  for (int64_t e = 0; e < E; ++e) {
    if (!used[size_t(e)]) continue;
    WEFT_CHECK(fill_moe_expert(seed, e, H, F, g, u, d, s));
    WEFT_CHECK(reference_moe_expert(x, d_rows, samples, ids_dev, weights, int32_t(K), int32_t(e), g, u, d, int32_t(H),
                                    int32_t(F), acc, s));
  }
  WEFT_CHECK(reference_moe_gather(acc, y, d_rows, samples, int32_t(H), ref, got, s));
  return compare_bf16(got, ref, int64_t(samples) * H, s, out);
}

}  // namespace weft::runtime
