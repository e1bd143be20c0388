// The sequential MoE layer's kernels (moe_baseline.h): destinations, packing, grouping by expert,
// SiLU·up, the owner's weighted pre-sum and the home's sum. The GEMMs are cuBLAS's, the exchanges NCCL's.
#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/bf16x8.cuh"
#include "runtime/exec/cuda_check.h"
#include "runtime/ops/moe_baseline.h"

namespace weft::runtime::ops::moe_seq {
namespace {

constexpr int kScanThreads = 1024;  // the scans' blocks
constexpr int kWarpThreads = 256;   // the row kernels' blocks: a warp per row

// Exclusive prefix sum of `flag` over the block (every thread calls it); *total: the block's sum.
__device__ int32_t block_exclusive(int32_t flag, int32_t* total) {
  __shared__ int32_t sums[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  int32_t v = flag;
  for (int d = 1; d < 32; d <<= 1) {
    const int32_t n = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v += n;
  }
  if (lane == 31) sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int32_t w = lane < warps ? sums[lane] : 0;
    for (int d = 1; d < 32; d <<= 1) {
      const int32_t n = __shfl_up_sync(0xffffffffu, w, d);
      if (lane >= d) w += n;
    }
    sums[lane] = w;
  }
  __syncthreads();
  const int32_t before = (warp > 0 ? sums[warp - 1] : 0) + v - flag;
  *total = sums[warps - 1];
  __syncthreads();  // sums is written again by the next call
  return before;
}

__device__ __forceinline__ int64_t warp_index() { return (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; }
__device__ __forceinline__ int64_t warp_total() { return int64_t(gridDim.x) * blockDim.x / 32; }

using kernels::add_scaled;
using kernels::to_bf16x8;
__device__ __forceinline__ void copy_row(const bf16* src, bf16* dst, int32_t hidden, int lane) {
  const int4* s = reinterpret_cast<const int4*>(src);
  int4* d = reinterpret_cast<int4*>(dst);
  for (int32_t v = lane; v < hidden / 8; v += 32) d[v] = s[v];
}

__global__ void destinations_kernel(const int32_t* ids, int32_t tokens, int32_t topk, int32_t local, int32_t world,
                                    int32_t* tok_list, int32_t* pos, int32_t* counts) {
  const int32_t q = blockIdx.x, lo = q * local, hi = lo + local;
  int32_t base = 0;
  for (int32_t start = 0; start < tokens; start += blockDim.x) {
    const int32_t t = start + threadIdx.x;
    int32_t flag = 0;
    if (t < tokens)
      for (int32_t j = 0; j < topk; ++j) {
        const int32_t e = ids[int64_t(t) * topk + j];
        if (e >= lo && e < hi) flag = 1;
      }
    int32_t total = 0;
    const int32_t at = base + block_exclusive(flag, &total);
    if (t < tokens) {
      pos[int64_t(t) * world + q] = flag ? at : -1;
      if (flag) tok_list[int64_t(q) * tokens + at] = t;
    }
    base += total;
  }
  if (threadIdx.x == 0) counts[q] = base;
}

__global__ void pack_kernel(const bf16* x, const int32_t* ids, const float* weights, const int32_t* tok_list,
                            const int32_t* counts, int32_t tokens, int32_t hidden, int32_t topk, int32_t world,
                            bf16* rows, int32_t* meta) {
  const int lane = threadIdx.x & 31;
  for (int64_t v = warp_index(); v < int64_t(world) * tokens; v += warp_total()) {
    const int32_t q = int32_t(v / tokens), i = int32_t(v % tokens);
    if (i >= counts[q]) continue;
    int64_t at = i;
    for (int32_t p = 0; p < q; ++p) at += counts[p];
    const int32_t t = tok_list[v];
    copy_row(x + int64_t(t) * hidden, rows + at * hidden, hidden, lane);
    if (lane < topk) {
      meta[at * 2 * topk + lane] = ids[int64_t(t) * topk + lane];
      meta[at * 2 * topk + topk + lane] = __float_as_int(weights[int64_t(t) * topk + lane]);
    }
  }
}

__global__ void expert_rows_kernel(const int32_t* meta, int32_t rows, int32_t topk, int32_t first, int32_t local,
                                   int32_t stride, int32_t* list, int32_t* pair_pos, int32_t* counts) {
  const int32_t l = blockIdx.x, e = first + l;
  int32_t base = 0;
  for (int32_t start = 0; start < rows; start += blockDim.x) {
    const int32_t r = start + threadIdx.x;
    int32_t slot = -1;
    if (r < rows)
      for (int32_t j = 0; j < topk; ++j) {
        const int32_t id = meta[int64_t(r) * 2 * topk + j];
        if (id == e) slot = j;
        // Slots of other ranks' experts: -1, written once (by expert 0's block).
        if (l == 0 && (id < first || id >= first + local)) pair_pos[int64_t(r) * topk + j] = -1;
      }
    int32_t total = 0;
    const int32_t at = base + block_exclusive(slot >= 0 ? 1 : 0, &total);
    if (slot >= 0) {
      pair_pos[int64_t(r) * topk + slot] = at;
      list[int64_t(l) * stride + at] = r;
    }
    base += total;
  }
  if (threadIdx.x == 0) counts[l] = base;
}

__global__ void gather_kernel(const bf16* recv, const int32_t* list, const int32_t* offsets, int32_t local,
                              int32_t stride, int64_t pairs, int32_t hidden, bf16* xg) {
  const int lane = threadIdx.x & 31;
  for (int64_t p = warp_index(); p < pairs; p += warp_total()) {
    int32_t lo = 0, hi = local;  // the last l with offsets[l] <= p
    while (hi - lo > 1) {
      const int32_t mid = (lo + hi) / 2;
      if (offsets[mid] <= p)
        lo = mid;
      else
        hi = mid;
    }
    const int32_t r = list[int64_t(lo) * stride + (p - offsets[lo])];
    copy_row(recv + int64_t(r) * hidden, xg + p * hidden, hidden, lane);
  }
}

__global__ void silu_mul_kernel(const bf16* g, const bf16* u, int64_t vecs, bf16* h) {
  for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < vecs; v += int64_t(gridDim.x) * blockDim.x) {
    const int4 gv = reinterpret_cast<const int4*>(g)[v], uv = reinterpret_cast<const int4*>(u)[v];
    const __nv_bfloat162* g2 = reinterpret_cast<const __nv_bfloat162*>(&gv);
    const __nv_bfloat162* u2 = reinterpret_cast<const __nv_bfloat162*>(&uv);
    float acc[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 a = __bfloat1622float2(g2[i]), b = __bfloat1622float2(u2[i]);
      acc[2 * i] = a.x / (1.f + __expf(-a.x)) * b.x;
      acc[2 * i + 1] = a.y / (1.f + __expf(-a.y)) * b.y;
    }
    reinterpret_cast<int4*>(h)[v] = to_bf16x8(acc);
  }
}

constexpr int kMaxTopk = 32;

__global__ void owner_combine_kernel(const bf16* y, const int32_t* meta, const int32_t* pair_pos,
                                     const int32_t* offsets, int32_t rows, int32_t topk, int32_t first, int32_t hidden,
                                     bf16* part) {
  const int lane = threadIdx.x & 31;
  for (int64_t r = warp_index(); r < rows; r += warp_total()) {
    int32_t order[kMaxTopk];
    int64_t at[kMaxTopk];
    float w[kMaxTopk];
    int32_t n = 0;
    for (int32_t j = 0; j < topk; ++j) {  // insertion by local expert
      const int32_t p = pair_pos[r * topk + j];
      if (p < 0) continue;
      const int32_t l = meta[r * 2 * topk + j] - first;
      int32_t k = n++;
      while (k > 0 && order[k - 1] > l) {
        order[k] = order[k - 1], at[k] = at[k - 1], w[k] = w[k - 1];
        --k;
      }
      order[k] = l, at[k] = int64_t(offsets[l]) + p, w[k] = __int_as_float(meta[r * 2 * topk + topk + j]);
    }
    int4* dst = reinterpret_cast<int4*>(part + r * hidden);
    for (int32_t v = lane; v < hidden / 8; v += 32) {
      float acc[8] = {};
      for (int32_t i = 0; i < n; ++i) add_scaled(acc, reinterpret_cast<const int4*>(y + at[i] * hidden)[v], w[i]);
      dst[v] = to_bf16x8(acc);
    }
  }
}

__global__ void home_sum_kernel(const bf16* back, const int32_t* pos, const int32_t* counts, int32_t tokens,
                                int32_t world, int32_t hidden, bf16* out) {
  const int lane = threadIdx.x & 31;
  for (int64_t t = warp_index(); t < tokens; t += warp_total()) {
    int4* dst = reinterpret_cast<int4*>(out + t * hidden);
    for (int32_t v = lane; v < hidden / 8; v += 32) {
      float acc[8] = {};
      int64_t at = 0;
      for (int32_t q = 0; q < world; ++q) {
        const int32_t p = pos[t * world + q];
        if (p >= 0) add_scaled(acc, reinterpret_cast<const int4*>(back + (at + p) * hidden)[v], 1.f);
        at += counts[q];
      }
      dst[v] = to_bf16x8(acc);
    }
  }
}

// Blocks for a warp per item, at most a few per SM's worth.
unsigned warp_blocks(int64_t items) {
  const int64_t warps_per_block = kWarpThreads / 32;
  return unsigned(std::max<int64_t>(1, std::min<int64_t>((items + warps_per_block - 1) / warps_per_block, 8192)));
}

Status launched() {
  WEFT_CUDA_CHECK(cudaGetLastError());
  return Status::kOk;
}

}  // namespace

Status launch_destinations(const int32_t* ids, int32_t tokens, int32_t topk, int32_t local, int32_t world,
                           int32_t* tok_list, int32_t* pos, int32_t* counts, cudaStream_t s) {
  destinations_kernel<<<world, kScanThreads, 0, s>>>(ids, tokens, topk, local, world, tok_list, pos, counts);
  return launched();
}

Status launch_pack(const bf16* x, const int32_t* ids, const float* weights, const int32_t* tok_list,
                   const int32_t* counts, int32_t tokens, int32_t hidden, int32_t topk, int32_t world, bf16* rows,
                   int32_t* meta, cudaStream_t s) {
  pack_kernel<<<warp_blocks(int64_t(world) * tokens), kWarpThreads, 0, s>>>(x, ids, weights, tok_list, counts, tokens,
                                                                            hidden, topk, world, rows, meta);
  return launched();
}

Status launch_expert_rows(const int32_t* meta, int32_t rows, int32_t topk, int32_t first, int32_t local, int32_t stride,
                          int32_t* list, int32_t* pair_pos, int32_t* counts, cudaStream_t s) {
  expert_rows_kernel<<<local, kScanThreads, 0, s>>>(meta, rows, topk, first, local, stride, list, pair_pos, counts);
  return launched();
}

Status launch_gather(const bf16* recv, const int32_t* list, const int32_t* offsets, int32_t local, int32_t stride,
                     int64_t pairs, int32_t hidden, bf16* xg, cudaStream_t s) {
  if (pairs <= 0) return Status::kOk;
  gather_kernel<<<warp_blocks(pairs), kWarpThreads, 0, s>>>(recv, list, offsets, local, stride, pairs, hidden, xg);
  return launched();
}

Status launch_silu_mul(const bf16* g, const bf16* u, int64_t n, bf16* h, cudaStream_t s) {
  if (n <= 0) return Status::kOk;
  const int64_t vecs = n / 8;
  const unsigned blocks = unsigned(std::min<int64_t>((vecs + 255) / 256, 16384));
  silu_mul_kernel<<<blocks, 256, 0, s>>>(g, u, vecs, h);
  return launched();
}

Status launch_owner_combine(const bf16* y, const int32_t* meta, const int32_t* pair_pos, const int32_t* offsets,
                            int32_t rows, int32_t topk, int32_t first, int32_t hidden, bf16* part, cudaStream_t s) {
  if (rows <= 0) return Status::kOk;
  if (topk > kMaxTopk) return Status::kInvalidArgument;
  owner_combine_kernel<<<warp_blocks(rows), kWarpThreads, 0, s>>>(y, meta, pair_pos, offsets, rows, topk, first, hidden,
                                                                  part);
  return launched();
}

Status launch_home_sum(const bf16* back, const int32_t* pos, const int32_t* counts, int32_t tokens, int32_t world,
                       int32_t hidden, bf16* out, cudaStream_t s) {
  home_sum_kernel<<<warp_blocks(tokens), kWarpThreads, 0, s>>>(back, pos, counts, tokens, world, hidden, out);
  return launched();
}

}  // namespace weft::runtime::ops::moe_seq
