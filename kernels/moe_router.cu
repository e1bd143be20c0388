// The MoE router on the GPU: logits (SIMT, fp32 accumulate), softmax + top-k + renormalised weights
// + per-expert counts (one warp per token), padded offsets (one thread).
//
//   tokens (T x hidden bf16) ─┐  logits kernel: a block takes 32 tokens, stages 256 hidden columns
//   weight (hidden x E bf16) ─┴► of them in shared memory (fp32), each thread owns one expert
//                                (coalesced weight loads) for 32 / (256 / E) of the tokens
//   logits (T x E fp32) ──► top-k kernel: max, sum of exp (fixed butterfly order), k rounds of a
//                           warp argmax (ties: lower index) ──► ids, weights, counts, dropped
//   counts ──► offsets kernel (moe_expert_offsets, padded to the GEMM tile)
//
// Every expert's dot product runs over hidden in the same order, so experts with equal weight
// columns get bitwise-equal logits and the tie rule decides (the tests force such ties). The
// logits kernel is the simple, host-checked path; the MoE op computes the logits on tensor cores with
// the GEMM core (on the weight transposed once, launch_moe_router_weight_t) and calls launch_moe_topk:
// with few tokens or many experts the SIMT kernel has too few blocks to fill the GPU (docs/moe.md).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "base/log.h"
#include "kernels/moe_plan.h"
#include "kernels/moe_router.h"

namespace weft::kernels {
namespace {

constexpr int32_t kThreads = 256;
constexpr int32_t kTokensPerBlock = 32;
constexpr int32_t kChunk = 256;          // hidden columns staged per step
constexpr int32_t kRowPad = kChunk + 4;  // float4 rows; 4 token rows of a warp land on distinct banks

__global__ void __launch_bounds__(kThreads) router_logits_kernel(const MoeRouterArgs a, float* logits) {
  __shared__ __align__(16) float xs[kTokensPerBlock][kRowPad];
  const int32_t t0 = blockIdx.x * kTokensPerBlock;
  const int32_t ntok = min(kTokensPerBlock, a.tokens_n - t0);
  const int32_t et = min(a.experts, kThreads);  // threads across experts
  const int32_t tg = kThreads / et;             // token groups
  const int32_t per = (kTokensPerBlock + tg - 1) / tg;
  const int32_t lane_e = threadIdx.x % et, g = threadIdx.x / et;
  for (int32_t e0 = 0; e0 < a.experts; e0 += et) {
    const int32_t e = e0 + lane_e;
    const bool active = g < tg && e < a.experts;
    float acc[kTokensPerBlock];
#pragma unroll
    for (int32_t i = 0; i < kTokensPerBlock; ++i) acc[i] = 0.f;
    for (int32_t h0 = 0; h0 < a.hidden; h0 += kChunk) {
      __syncthreads();  // the previous chunk is read by everyone
      for (int32_t v = threadIdx.x; v < kTokensPerBlock * kChunk / 8; v += kThreads) {
        const int32_t r = v / (kChunk / 8), c = (v % (kChunk / 8)) * 8;
        float f[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (r < ntok && h0 + c < a.hidden) {  // hidden % 8 == 0: a vector is all in or all out
          const uint4 raw = *reinterpret_cast<const uint4*>(a.tokens + int64_t(t0 + r) * a.hidden + h0 + c);
          const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
          for (int32_t q = 0; q < 4; ++q) {
            const float2 x = __bfloat1622float2(p[q]);
            f[2 * q] = x.x;
            f[2 * q + 1] = x.y;
          }
        }
#pragma unroll
        for (int32_t q = 0; q < 8; ++q) xs[r][c + q] = f[q];
      }
      __syncthreads();
      if (!active) continue;
      const int32_t hn = min(kChunk, a.hidden - h0);  // a multiple of 8
      const __nv_bfloat16* wp = a.weight + int64_t(h0) * a.experts + e;
      for (int32_t h = 0; h < hn; h += 4) {
        const float w0 = __bfloat162float(wp[int64_t(h) * a.experts]);
        const float w1 = __bfloat162float(wp[int64_t(h + 1) * a.experts]);
        const float w2 = __bfloat162float(wp[int64_t(h + 2) * a.experts]);
        const float w3 = __bfloat162float(wp[int64_t(h + 3) * a.experts]);
#pragma unroll
        for (int32_t i = 0; i < kTokensPerBlock; ++i) {
          const int32_t r = g + tg * i;
          if (i < per && r < kTokensPerBlock) {
            const float4 x = *reinterpret_cast<const float4*>(&xs[r][h]);
            // One fixed order for every (token, expert): equal columns give equal bits.
            acc[i] = fmaf(x.x, w0, acc[i]);
            acc[i] = fmaf(x.y, w1, acc[i]);
            acc[i] = fmaf(x.z, w2, acc[i]);
            acc[i] = fmaf(x.w, w3, acc[i]);
          }
        }
      }
    }
    if (active) {
#pragma unroll
      for (int32_t i = 0; i < kTokensPerBlock; ++i) {
        const int32_t r = g + tg * i;
        if (i < per && r < ntok) logits[int64_t(t0 + r) * a.experts + e] = acc[i];
      }
    }
  }
}

// (v, e) beats (bv, be): larger value, ties to the lower index; NaN never wins; be < 0 is "none".
__device__ __forceinline__ bool beats(float v, int32_t e, float bv, int32_t be) {
  if (e < 0 || isnan(v)) return false;
  if (be < 0) return true;
  return v > bv || (v == bv && e < be);
}

__global__ void __launch_bounds__(kThreads)
    router_topk_kernel(const float* logits, int32_t tokens_n, int32_t experts, int32_t topk, int32_t* ids,
                       float* weights, int32_t* counts, int32_t* dropped) {
  const int32_t t = int32_t((blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32), lane = threadIdx.x % 32;
  if (t >= tokens_n) return;
  const float* l = logits + int64_t(t) * experts;
  float mx = -INFINITY;
  for (int32_t e = lane; e < experts; e += 32) mx = fmaxf(mx, l[e]);
  for (int32_t off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  float sum = 0.f;
  for (int32_t e = lane; e < experts; e += 32) sum += expf(l[e] - mx);
  for (int32_t off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  int32_t chosen[kMoeMaxTopk];
  float prob[kMoeMaxTopk];
  float chosen_sum = 0.f;
  bool short_of_k = false;
#pragma unroll
  for (int32_t r = 0; r < kMoeMaxTopk; ++r) {
    chosen[r] = -1;
    prob[r] = 0.f;
    if (r >= topk) continue;
    float bv = 0.f;
    int32_t be = -1;
    for (int32_t e = lane; e < experts; e += 32) {
      bool taken = false;
#pragma unroll
      for (int32_t j = 0; j < kMoeMaxTopk; ++j) taken |= j < r && chosen[j] == e;
      const float v = l[e];
      if (!taken && beats(v, e, bv, be)) {
        bv = v;
        be = e;
      }
    }
    for (int32_t off = 16; off > 0; off /= 2) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
      const int32_t oe = __shfl_xor_sync(0xffffffffu, be, off);
      if (beats(ov, oe, bv, be)) {
        bv = ov;
        be = oe;
      }
    }
    chosen[r] = be;
    if (be >= 0) {
      prob[r] = expf(bv - mx) / sum;  // the softmax probability (fp32), as Mixtral computes it
      chosen_sum += prob[r];
    } else {
      short_of_k = true;
    }
  }
  if (lane != 0) return;
#pragma unroll
  for (int32_t r = 0; r < kMoeMaxTopk; ++r) {
    if (r >= topk) continue;
    ids[int64_t(t) * topk + r] = chosen[r];
    weights[int64_t(t) * topk + r] = chosen[r] >= 0 ? prob[r] / chosen_sum : 0.f;  // renormalised over the k
    if (chosen[r] >= 0) atomicAdd(counts + chosen[r], 1);
  }
  if (short_of_k) atomicAdd(dropped, 1);
}

__global__ void offsets_kernel(const int32_t* counts, int32_t experts, int32_t* offsets) {
  moe_expert_offsets(counts, experts, kMoeTileRows, offsets);
}

}  // namespace

Status launch_moe_offsets(const int32_t* counts, int32_t experts, int32_t* offsets, cudaStream_t stream) {
  offsets_kernel<<<1, 1, 0, stream>>>(counts, experts, offsets);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    WEFT_WARN(kKernel, "moe offsets: launch failed: %s", cudaGetErrorString(err));
    return Status::kCudaError;
  }
  return Status::kOk;
}

namespace {

// Why the router cannot run these arguments (nullptr: it can). `logits_given`: launch_moe_topk, no weight.
const char* router_refusal(const MoeRouterArgs& a, const MoeRouterOut& o, bool logits_given) {
  if (a.tokens_n <= 0 || a.hidden <= 0 || a.experts <= 0) return "tokens, hidden and experts must be positive";
  if (a.experts > kMoeMaxExperts) return "more than 1024 experts";
  if (a.topk < 1 || a.topk > kMoeMaxTopk || a.topk > a.experts) return "topk must be in [1, min(8, experts)]";
  if (!logits_given && (a.hidden % 8 != 0 || reinterpret_cast<uintptr_t>(a.tokens) % 16 != 0))
    return "hidden must be a multiple of 8 and the tokens 16-byte aligned";
  if ((!logits_given && (!a.tokens || !a.weight)) || !o.logits || !o.topk_ids || !o.topk_weights || !o.counts ||
      !o.dropped)
    return "null input or output";
  return nullptr;
}

// Zeroes the counters, runs the logits kernel unless the logits are given, then top-k and offsets.
Status route(const MoeRouterArgs& a, const MoeRouterOut& o, bool logits_given, cudaStream_t stream) {
  if (const char* why = router_refusal(a, o, logits_given)) {
    WEFT_WARN(kKernel, "moe router (%d tokens, hidden %d, %d experts, top-%d) rejected: %s", a.tokens_n, a.hidden,
              a.experts, a.topk, why);
    return Status::kInvalidArgument;
  }
  cudaError_t err = cudaMemsetAsync(o.counts, 0, size_t(a.experts) * sizeof(int32_t), stream);
  if (err == cudaSuccess) err = cudaMemsetAsync(o.dropped, 0, sizeof(int32_t), stream);
  if (err == cudaSuccess) {
    if (!logits_given)
      router_logits_kernel<<<(a.tokens_n + kTokensPerBlock - 1) / kTokensPerBlock, kThreads, 0, stream>>>(a, o.logits);
    router_topk_kernel<<<(a.tokens_n + kThreads / 32 - 1) / (kThreads / 32), kThreads, 0, stream>>>(
        o.logits, a.tokens_n, a.experts, a.topk, o.topk_ids, o.topk_weights, o.counts, o.dropped);
    err = cudaGetLastError();
  }
  if (err != cudaSuccess) {
    WEFT_WARN(kKernel, "moe router: launch failed: %s", cudaGetErrorString(err));
    return Status::kCudaError;
  }
  if (o.offsets) WEFT_CHECK(launch_moe_offsets(o.counts, a.experts, o.offsets, stream));
  return Status::kOk;
}

}  // namespace

__global__ void transpose_kernel(const __nv_bfloat16* w, int32_t hidden, int32_t experts, __nv_bfloat16* wt) {
  const int64_t n = int64_t(hidden) * experts;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t e = i / hidden, h = i % hidden;
    wt[i] = w[h * experts + e];
  }
}

Status launch_moe_router_weight_t(const __nv_bfloat16* weight, int32_t hidden, int32_t experts, __nv_bfloat16* weight_t,
                                  cudaStream_t stream) {
  if (!weight || !weight_t || hidden <= 0 || experts <= 0) {
    WEFT_WARN(kKernel, "moe router weight transpose: invalid arguments (hidden %d, %d experts)", hidden, experts);
    return Status::kInvalidArgument;
  }
  transpose_kernel<<<1024, 256, 0, stream>>>(weight, hidden, experts, weight_t);
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return Status::kOk;
  WEFT_WARN(kKernel, "moe router weight transpose: launch failed: %s", cudaGetErrorString(err));
  return Status::kCudaError;
}

Status launch_moe_router(const MoeRouterArgs& a, const MoeRouterOut& o, cudaStream_t stream) {
  return route(a, o, false, stream);
}

Status launch_moe_topk(const MoeRouterArgs& a, const MoeRouterOut& o, cudaStream_t stream) {
  return route(a, o, true, stream);
}

}  // namespace weft::kernels
