// The MoE layer's per-row device steps shared by its staged kernels (kernels/moe_exchange.cu) and the
// fused FFN + combine launch (kernels/moe_ffn_combine.cu): a receive slot's header, a token's
// destination ranks, the owner's weighted pre-sum of one slot's expert rows and the home's sum of one
// token's rows. A warp per row: lane i takes 16-byte vectors i, i + 32, ... .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/bf16x8.cuh"
#include "kernels/moe_plan.h"

namespace weft::kernels {

// Warp-per-row kernels: this warp's index and the grid's warps; the host's grid for `warps` rows
// (at most four blocks per SM: their loops never wait, so a grid larger than what is resident is
// safe; four was faster than two and no slower than eight on 4 H200s, docs/moe.md).
__device__ __forceinline__ int64_t moe_warp() { return (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; }
__device__ __forceinline__ int64_t moe_warps() { return int64_t(gridDim.x) * blockDim.x / 32; }
inline int moe_grid_for(int64_t warps, int threads) {
  static int sms = [] {
    int dev = 0, n = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    return n > 0 ? n : 1;
  }();
  const int64_t per_block = threads / 32, blocks = (warps + per_block - 1) / per_block;
  return int(blocks < 4 * sms ? (blocks > 0 ? blocks : 1) : 4 * sms);
}

// A row's vectors, kRowBatch per lane at a time: a step issues all of its loads before its stores
// (or sums), so a warp keeps kRowBatch x 512 bytes in flight, not one vector's (the stores may go to
// a peer over NVLink, and a load after a store it might alias is not moved ahead of it).
constexpr int32_t kRowBatch = 4;

__device__ __forceinline__ void moe_copy_row(int4* dst, const int4* src, int64_t vecs, int32_t lane) {
  int64_t v = lane;
  for (; v + 32 * (kRowBatch - 1) < vecs; v += 32 * kRowBatch) {
    int4 r[kRowBatch];
#pragma unroll
    for (int32_t u = 0; u < kRowBatch; ++u) r[u] = src[v + 32 * u];
#pragma unroll
    for (int32_t u = 0; u < kRowBatch; ++u) dst[v + 32 * u] = r[u];
  }
  for (; v < vecs; v += 32) dst[v] = src[v];
}

__device__ __forceinline__ const MoeDispatchMeta* moe_slot_meta(const uint8_t* slot, int32_t hidden) {
  return reinterpret_cast<const MoeDispatchMeta*>(slot + (int64_t(hidden) * 2 + 15) / 16 * 16);
}

// Token t's k expert ids and weights; an id out of range (which the router never writes) becomes one
// whose owner, id / local_experts, is no rank (negative), so it is sent nowhere.
__device__ __forceinline__ void moe_load_pairs(const int32_t* topk_ids, const float* topk_weights, int32_t t,
                                               int32_t topk, int32_t local_experts, int32_t world, int32_t* ids,
                                               float* w) {
#pragma unroll
  for (int32_t j = 0; j < kMoeMaxTopk; ++j) {  // a constant bound: ids and w stay in registers
    if (j >= topk) break;
    ids[j] = topk_ids[int64_t(t) * topk + j];
    w[j] = topk_weights[int64_t(t) * topk + j];
    if (ids[j] < 0 || ids[j] >= local_experts * world) ids[j] = -local_experts * (world + 1);
  }
}

// A slot: the header (lanes 0.., one 16-byte vector each) and, where it has pairs, the row.
__device__ __forceinline__ void moe_write_slot(uint8_t* slot, const MoeDispatchMeta& meta, const __nv_bfloat16* row,
                                               int32_t hidden, int32_t lane) {
  if (lane < int32_t(sizeof(MoeDispatchMeta) / 16))
    reinterpret_cast<int4*>(slot + (int64_t(hidden) * 2 + 15) / 16 * 16)[lane] =
        reinterpret_cast<const int4*>(&meta)[lane];
  if (meta.pairs == 0) return;
  moe_copy_row(reinterpret_cast<int4*>(slot), reinterpret_cast<const int4*>(row), hidden / 8, lane);
}

// Destination ranks of token t, from its top-k ids (an id out of range, which the router never
// writes, sends nowhere).
__device__ __forceinline__ uint32_t moe_token_dests(const int32_t* topk_ids, int32_t t, int32_t topk,
                                                    int32_t local_experts, int32_t world) {
  uint32_t mask = 0;
  const int32_t experts = local_experts * world;
  for (int32_t j = 0; j < topk; ++j) {
    const int32_t id = topk_ids[int64_t(t) * topk + j];
    if (id >= 0 && id < experts) mask |= 1u << (id / local_experts);
  }
  return mask;
}

// dst = Σ_i w[i] × src[i] over the rows i < 8 that are not null, in order (fp32, rounded once). Each
// step issues the loads of kAtOnce rows before their sums, so a lane has that many vectors in flight
// rather than one (the indices are constants once unrolled: nothing goes to local memory). The
// exchange kernels take all 8 at once; the FFN + combine launch, which has fewer registers to spare
// beside its GEMM, 2.
template <int32_t kAtOnce = kMoeMaxTopk>
__device__ __forceinline__ void moe_sum_rows(const int4* const (&src)[kMoeMaxTopk], const float (&w)[kMoeMaxTopk],
                                             int64_t vecs, int4* dst, int32_t lane) {
  static_assert(kMoeMaxTopk % kAtOnce == 0, "whole groups of rows");
  for (int64_t v = lane; v < vecs; v += 32) {
    float acc[8] = {};
#pragma unroll
    for (int32_t g = 0; g < kMoeMaxTopk; g += kAtOnce) {
      int4 r[kAtOnce];
#pragma unroll
      for (int32_t i = 0; i < kAtOnce; ++i)
        if (src[g + i]) r[i] = src[g + i][v];
#pragma unroll
      for (int32_t i = 0; i < kAtOnce; ++i)
        if (src[g + i]) add_scaled(acc, r[i], w[g + i]);
    }
    dst[v] = to_bf16x8(acc);
  }
}

// A slot's local pairs in increasing local-expert order: their rows of Y (slot_pos, -1: not computed
// here) and weights.
struct MoeSlotPairs {
  int32_t n = 0;
  int32_t pos[kMoeMaxTopk];
  float w[kMoeMaxTopk];
};

__device__ __forceinline__ MoeSlotPairs moe_slot_pairs(const MoeDispatchMeta* m, const int32_t* slot_pos,
                                                       int32_t topk) {
  MoeSlotPairs p;
  int32_t order[kMoeMaxTopk];
  for (int32_t j = 0; j < topk; ++j) {  // insertion by local expert: at most 8 pairs
    const int32_t e = m->local_expert[j];
    if (e < 0) continue;
    int32_t at = p.n++;
    while (at > 0 && order[at - 1] > e) {
      order[at] = order[at - 1], p.pos[at] = p.pos[at - 1], p.w[at] = p.w[at - 1];
      --at;
    }
    order[at] = e, p.pos[at] = slot_pos[j], p.w[at] = m->weight[j];
  }
  return p;
}

// dst = Σ weight × Y[pos] over the pairs in their order (fp32, rounded once).
template <int32_t kAtOnce = kMoeMaxTopk>
__device__ __forceinline__ void moe_sum_pairs(const MoeSlotPairs& p, const __nv_bfloat16* y, int32_t hidden,
                                              __nv_bfloat16* dst_row, int32_t lane) {
  const int64_t vecs = hidden / 8;
  int4* dst = reinterpret_cast<int4*>(dst_row);
  const int4* src[kMoeMaxTopk];
  float w[kMoeMaxTopk];
#pragma unroll
  for (int32_t i = 0; i < kMoeMaxTopk; ++i) {
    const bool here = i < p.n && p.pos[i] >= 0;
    src[i] = here ? reinterpret_cast<const int4*>(y + int64_t(p.pos[i]) * hidden) : nullptr;
    w[i] = here ? p.w[i] : 0.f;
  }
  moe_sum_rows<kAtOnce>(src, w, vecs, dst, lane);
}

// out[t] = Σ over the ranks in mask (world <= 8, as every launch checks), in rank order, of the combine rows comb[q][t]
// (fp32, rounded once).
template <int32_t kAtOnce = kMoeMaxTopk>
__device__ __forceinline__ void moe_sum_home(const __nv_bfloat16* comb, int32_t tokens, int32_t hidden, int32_t world,
                                             int32_t t, uint32_t mask, __nv_bfloat16* out, int32_t lane) {
  const int4* src[kMoeMaxTopk];
  float w[kMoeMaxTopk];
#pragma unroll
  for (int32_t q = 0; q < kMoeMaxTopk; ++q) {
    src[q] = q < world && (mask >> q & 1u) ? reinterpret_cast<const int4*>(comb + (int64_t(q) * tokens + t) * hidden)
                                           : nullptr;
    w[q] = 1.f;
  }
  moe_sum_rows<kAtOnce>(src, w, hidden / 8, reinterpret_cast<int4*>(out + int64_t(t) * hidden), lane);
}

}  // namespace weft::kernels
