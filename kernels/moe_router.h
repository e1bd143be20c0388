// Host API of the MoE router on the GPU: logits = tokens x router weights (fp32 accumulate), softmax
// in fp32, top-k with ties to the lower expert index, weights renormalised over the k chosen
// (Mixtral / Qwen3-MoE routing), per-expert counts, a dropped-token counter, padded offsets.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"

namespace weft::kernels {

struct MoeRouterArgs {
  const __nv_bfloat16* tokens = nullptr;  // tokens x hidden, row-major
  // hidden x experts, row-major (experts contiguous: a warp reads one hidden row of every expert
  // with coalesced loads; nn.Linear's weight is its transpose)
  const __nv_bfloat16* weight = nullptr;
  int32_t tokens_n = 0, hidden = 0, experts = 0, topk = 0;
};

struct MoeRouterOut {
  float* logits = nullptr;        // tokens x experts fp32 (kept: the tests check it apart from top-k)
  int32_t* topk_ids = nullptr;    // tokens x topk, in decreasing weight (ties: lower expert first)
  float* topk_weights = nullptr;  // tokens x topk, summing to 1 per token
  int32_t* counts = nullptr;      // experts: (token, expert) pairs per expert; zeroed by the launch
  int32_t* dropped = nullptr;     // 1 word: tokens that got fewer than topk experts (NaN logits); zeroed
  int32_t* offsets = nullptr;     // experts + 1 (optional): counts padded to kMoeTileRows, prefix-summed
};

// Enqueues the router on `stream` (three kernels: logits, softmax + top-k + counts, offsets).
// Refuses (kInvalidArgument, logged once) topk outside [1, min(8, experts)], more than 1024
// experts, hidden not a multiple of 8 or null pointers.
Status launch_moe_router(const MoeRouterArgs& args, const MoeRouterOut& out, cudaStream_t stream);

// The same from logits already in out.logits (e.g. the router GEMM on tensor cores): softmax, top-k,
// counts, dropped, offsets; args.tokens and args.weight are not read.
Status launch_moe_topk(const MoeRouterArgs& args, const MoeRouterOut& out, cudaStream_t stream);

// weight_t (experts x hidden) = the router weight (hidden x experts) transposed: the K-major B operand
// the GEMM core takes (done once, when the weights are loaded).
Status launch_moe_router_weight_t(const __nv_bfloat16* weight, int32_t hidden, int32_t experts, __nv_bfloat16* weight_t,
                                  cudaStream_t stream);

// offsets[0..experts] from counts (moe_expert_offsets, one thread) on `stream`.
Status launch_moe_offsets(const int32_t* counts, int32_t experts, int32_t* offsets, cudaStream_t stream);

}  // namespace weft::kernels
