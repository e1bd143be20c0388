// The persistent grouped GEMM for sm_90a: one launch computes every expert's Y_e = X_e W_e^T, the
// tile list derived on the device from the padded per-expert offsets (kernels/moe_plan.h).
//
//   block (384 threads) = warpgroup 0: producer (one thread issues TMA loads)
//                         warpgroups 1, 2: consumers (wgmma m64n256k16, 64 rows of 128 each)
//   units u = blockIdx.x, + gridDim.x, ... < (offsets[E] / 128) x n_blocks
//   u ─moe_grouped_tile_at─► (row tile m, n block) ─moe_expert_of_tile─► expert e
//   X rows [128 m, +128) ──TMA──► smem ring {X 128x64, W 256x64} x 4 ──wgmma──► fp32 regs
//   W rows [e n + 256 nb, +256) ┘                                     │
//   epilogue from registers: rows below offsets[e] + counts[e], cols below n ◄─┘
//   (kSwiGlu: accumulator columns j and j + 128 are gate and up of one H column)
//
// The same warp-specialized ring as kernels/gemm_sm90.cuh (its bounded barrier wait is reused), but
// its own walk: the standalone core's TileSchedule needs M on the host, and here M is a device
// value. W's 256-row box may reach into the next expert's rows when n is not a multiple of 256:
// those columns are computed and never stored. Stores go straight from registers (no TMA store:
// the last tile of an expert is partial and its row bound is a device value).
#include <cuda.h>
#include <cuda_runtime.h>

#include "base/log.h"
#include "kernels/gemm_sm90.cuh"
#include "kernels/grouped_gemm.h"
#include "kernels/moe_plan.h"

namespace weft::kernels {
namespace {

using Cfg = GemmConfig;

struct __align__(1024) GroupedShared {
  __nv_bfloat16 a[Cfg::kStages][Cfg::kTileM * Cfg::kTileK];
  __nv_bfloat16 b[Cfg::kStages][Cfg::kTileN * Cfg::kTileK];
  uint64_t full[Cfg::kStages];
  uint64_t empty[Cfg::kStages];
};
static_assert(sizeof(GroupedShared) + 1024 <= 227 * 1024, "shared-memory budget of one H100/H200 block");
static_assert(Cfg::kTileM == kMoeTileRows, "the expert offsets are padded to the GEMM's row tile");
constexpr size_t kSmemBytes = sizeof(GroupedShared) + 1024;

struct Walk {
  int32_t m_tiles = 0;
  int64_t units = 0;
};

__device__ __forceinline__ Walk walk_of(const GroupedGemmParams& p) {
  Walk w;
  const int32_t rows = p.offsets[p.experts];
  w.m_tiles = min(rows / Cfg::kTileM, p.capacity_tiles);
  w.units = int64_t(w.m_tiles) * p.n_blocks;
  return w;
}

__device__ __forceinline__ TileCoord coord_of(const GroupedGemmParams& p, const Walk& w, int64_t u, int32_t* e) {
  TileCoord c;
  moe_grouped_tile_at(u, w.m_tiles, p.n_blocks, p.group_m, &c.m_block, &c.n_block);
  *e = moe_expert_of_tile(p.offsets, p.experts, Cfg::kTileM, c.m_block);
  return c;
}

__device__ __forceinline__ void producer(const GroupedGemmParams& p, const FrameParams& f, GroupedShared& s) {
  constexpr uint32_t kStageBytes = (Cfg::kTileM + Cfg::kTileN) * Cfg::kTileK * sizeof(__nv_bfloat16);
  const Walk w = walk_of(p);
  uint32_t it = 0;
  for (int64_t u = blockIdx.x; u < w.units; u += gridDim.x) {
    int32_t e;
    const TileCoord c = coord_of(p, w, u, &e);
    const int32_t row_a = c.m_block * Cfg::kTileM;
    const int32_t row_b = e * p.n + c.n_block * Cfg::kTileN;
    for (int32_t kb = 0; kb < p.k_iters; ++kb, ++it) {
      const uint32_t stage = it % Cfg::kStages, phase = (it / Cfg::kStages) & 1;
      if (!gemm_detail::wait_barrier(&s.empty[stage], phase ^ 1, f, c)) return;
      sm90::mbar_arrive_expect_tx(&s.full[stage], kStageBytes);
      sm90::tma_load_2d(s.a[stage], &p.tmap_x, &s.full[stage], kb * Cfg::kTileK, row_a);
      sm90::tma_load_2d(s.b[stage], &p.tmap_w, &s.full[stage], kb * Cfg::kTileK, row_b);
    }
  }
}

__device__ __forceinline__ float silu(float g) { return g / (1.f + __expf(-g)); }

__device__ __forceinline__ void store_tile(const GroupedGemmParams& p, const float (&acc)[128], int32_t row,
                                           int32_t row_end, int32_t n_block, int32_t lane) {
  if (p.epilogue == int32_t(GroupedEpilogue::kSwiGlu)) {
    // Accumulator columns 8j + q (j < 16) are gate, 128 + 8j + q the up of the same H column.
    const int32_t col0 = n_block * (Cfg::kTileN / 2) + 2 * (lane % 4);
#pragma unroll
    for (int32_t j = 0; j < 16; ++j) {
      const int32_t col = col0 + 8 * j;
      if (row < row_end)
        *reinterpret_cast<__nv_bfloat162*>(p.y + int64_t(row) * p.ldy + col) = __floats2bfloat162_rn(
            silu(acc[4 * j + 0]) * acc[4 * (j + 16) + 0], silu(acc[4 * j + 1]) * acc[4 * (j + 16) + 1]);
      if (row + 8 < row_end)
        *reinterpret_cast<__nv_bfloat162*>(p.y + int64_t(row + 8) * p.ldy + col) = __floats2bfloat162_rn(
            silu(acc[4 * j + 2]) * acc[4 * (j + 16) + 2], silu(acc[4 * j + 3]) * acc[4 * (j + 16) + 3]);
    }
    return;
  }
  const int32_t col0 = n_block * Cfg::kTileN + 2 * (lane % 4);
#pragma unroll
  for (int32_t j = 0; j < 32; ++j) {
    const int32_t col = col0 + 8 * j;
    if (col >= p.n) continue;  // n % 8 == 0: col + 1 < n too
    if (row < row_end)
      *reinterpret_cast<__nv_bfloat162*>(p.y + int64_t(row) * p.ldy + col) =
          __floats2bfloat162_rn(acc[4 * j + 0], acc[4 * j + 1]);
    if (row + 8 < row_end)
      *reinterpret_cast<__nv_bfloat162*>(p.y + int64_t(row + 8) * p.ldy + col) =
          __floats2bfloat162_rn(acc[4 * j + 2], acc[4 * j + 3]);
  }
}

__device__ __forceinline__ void consumer(const GroupedGemmParams& p, const FrameParams& f, GroupedShared& s) {
  const int32_t half = threadIdx.x / 128 - 1;  // which 64-row half of the tile
  const int32_t t128 = threadIdx.x % 128, warp = t128 / 32, lane = t128 % 32;
  const Walk w = walk_of(p);
  float acc[128];
  uint32_t it = 0;
  for (int64_t u = blockIdx.x; u < w.units; u += gridDim.x) {
    int32_t e;
    const TileCoord c = coord_of(p, w, u, &e);
    for (int32_t kb = 0; kb < p.k_iters; ++kb, ++it) {
      const uint32_t stage = it % Cfg::kStages, phase = (it / Cfg::kStages) & 1;
      if (!gemm_detail::wait_barrier(&s.full[stage], phase, f, c)) {
        sm90::wgmma_wait<0>();  // leave nothing in flight
        return;
      }
      const uint64_t desc_a = sm90::make_smem_desc_sw128(s.a[stage] + half * 64 * Cfg::kTileK);
      const uint64_t desc_b = sm90::make_smem_desc_sw128(s.b[stage]);
      sm90::wgmma_fence();
#pragma unroll
      for (int32_t k = 0; k < Cfg::kTileK / 16; ++k)  // +32 bytes per k16 step: +2 in the >>4 field
        sm90::wgmma_m64n256k16(acc, desc_a + 2 * k, desc_b + 2 * k, (kb > 0 || k > 0) ? 1 : 0);
      sm90::wgmma_commit();
      sm90::wgmma_wait<1>();  // the previous k-block's MMAs are done reading their stage
      if (kb > 0 && lane == 0) sm90::mbar_arrive(&s.empty[(it - 1) % Cfg::kStages]);
    }
    sm90::wgmma_wait<0>();
    if (lane == 0) sm90::mbar_arrive(&s.empty[(it - 1) % Cfg::kStages]);
    const int32_t row = c.m_block * Cfg::kTileM + half * 64 + warp * 16 + lane / 4;
    store_tile(p, acc, row, p.offsets[e] + p.counts[e], c.n_block, lane);
  }
}

__global__ void __launch_bounds__(Cfg::kThreads, 1)
    grouped_gemm_kernel(const __grid_constant__ GroupedGemmParams p, const FrameParams f) {
  extern __shared__ uint8_t smem_raw[];
  GroupedShared& s =
      *reinterpret_cast<GroupedShared*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  if (threadIdx.x == 0) {
    for (int32_t i = 0; i < Cfg::kStages; ++i) {
      sm90::mbar_init(&s.full[i], 1);
      sm90::mbar_init(&s.empty[i], Cfg::kConsumers * 4);  // one arrival per consumer warp
    }
    sm90::fence_barrier_init();
    sm90::tma_prefetch_desc(&p.tmap_x);
    sm90::tma_prefetch_desc(&p.tmap_w);
    // Rows routed beyond the reservation are not computed: counted, never silently lost.
    const int32_t rows = p.offsets[p.experts];
    if (blockIdx.x == 0 && p.dropped && rows > p.capacity_tiles * Cfg::kTileM)
      atomicAdd(p.dropped, rows - p.capacity_tiles * Cfg::kTileM);
  }
  __syncthreads();
  if (threadIdx.x < 128) {
    sm90::setmaxnreg_dec<40>();
    if (threadIdx.x == 0) producer(p, f, s);
  } else {
    sm90::setmaxnreg_inc<232>();
    consumer(p, f, s);
  }
}

__global__ void interleave_kernel(const __nv_bfloat16* gate, const __nv_bfloat16* up, int32_t experts, int32_t ffn,
                                  int32_t k, __nv_bfloat16* w13) {
  const int64_t vecs = int64_t(experts) * 2 * ffn * (k / 8);
  for (int64_t v = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; v < vecs; v += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = v / (k / 8), col = (v % (k / 8)) * 8;
    const int64_t e = row / (2 * ffn), r = row % (2 * ffn);  // r: row of w13[e]
    const int64_t blk = r / 256, in = r % 256;
    const int64_t src = blk * 128 + (in % 128);
    const __nv_bfloat16* from = in < 128 ? gate : up;
    *reinterpret_cast<uint4*>(w13 + row * k + col) =
        *reinterpret_cast<const uint4*>(from + (e * ffn + src) * int64_t(k) + col);
  }
}

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// rows x cols bf16 (row stride cols), boxes of box_rows x 64 with the ring's 128-byte swizzle.
Status encode(const char* name, const void* ptr, int64_t rows, int64_t cols, uint32_t box_rows, CUtensorMap* out) {
  static EncodeTiledFn fn = nullptr;
  if (!fn) {
    void* q = nullptr;
    cudaDriverEntryPointQueryResult r{};
    const cudaError_t err =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &q, 12000, cudaEnableDefault, &r);
    if (err != cudaSuccess || r != cudaDriverEntryPointSuccess || !q) {
      WEFT_WARN(kKernel, "grouped gemm: cuTensorMapEncodeTiled is not available (%s)", cudaGetErrorString(err));
      return Status::kCudaError;
    }
    fn = reinterpret_cast<EncodeTiledFn>(q);
  }
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(cols) * 2};
  const cuuint32_t box[2] = {uint32_t(Cfg::kTileK), box_rows};
  const cuuint32_t elem[2] = {1, 1};
  const CUresult res = fn(out, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(ptr), dims, strides, box, elem,
                          CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (res != CUDA_SUCCESS) {
    WEFT_WARN(kKernel, "grouped gemm: cannot encode the tensor map of %s (%lld x %lld): CUresult %d", name,
              (long long)rows, (long long)cols, int(res));
    return Status::kInvalidArgument;
  }
  return Status::kOk;
}

}  // namespace

Status make_grouped_gemm_params(const GroupedGemmArgs& a, GroupedGemmParams* out) {
  const char* why = nullptr;
  const auto misaligned = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 != 0; };
  if (a.experts <= 0 || a.experts > kMoeMaxExperts || a.n <= 0 || a.k <= 0)
    why = "experts must be in [1, 1024], n and k positive";
  else if (a.capacity_rows <= 0 || a.capacity_rows % Cfg::kTileM != 0 || a.capacity_rows >= (int64_t(1) << 31))
    why = "capacity_rows must be a positive multiple of 128 below 2^31";
  else if (a.k % 8 != 0 || a.n % 8 != 0)
    why = "n and k must be multiples of 8 (16-byte rows, paired stores)";
  else if (int64_t(a.experts) * a.n >= (int64_t(1) << 31))
    why = "experts x n must be below 2^31 (W's rows)";
  else if (a.epilogue == GroupedEpilogue::kSwiGlu && a.n % Cfg::kTileN != 0)
    why = "the SwiGLU epilogue needs n = 2 ffn a multiple of 256 (gate/up halves of one tile)";
  else if (!a.x || !a.w || !a.y || !a.counts || !a.offsets || misaligned(a.x) || misaligned(a.w) || misaligned(a.y))
    why = "x, w, y, counts and offsets must be non-null; x, w and y 16-byte aligned";
  else if (a.group_m <= 0)
    why = "group_m must be positive";
  if (why) {
    WEFT_WARN(kKernel, "grouped gemm (%d experts, n %d, k %d, %lld rows) rejected: %s", a.experts, a.n, a.k,
              (long long)a.capacity_rows, why);
    return Status::kInvalidArgument;
  }
  GroupedGemmParams p;
  WEFT_CHECK(encode("X", a.x, a.capacity_rows, a.k, Cfg::kTileM, &p.tmap_x));
  WEFT_CHECK(encode("W", a.w, int64_t(a.experts) * a.n, a.k, Cfg::kTileN, &p.tmap_w));
  p.counts = a.counts;
  p.offsets = a.offsets;
  p.y = a.y;
  p.dropped = a.dropped;
  p.experts = a.experts;
  p.n = a.n;
  p.k = a.k;
  p.k_iters = (a.k + Cfg::kTileK - 1) / Cfg::kTileK;
  p.n_blocks = (a.n + Cfg::kTileN - 1) / Cfg::kTileN;
  p.group_m = a.group_m;
  p.capacity_tiles = int32_t(a.capacity_rows / Cfg::kTileM);
  p.epilogue = int32_t(a.epilogue);
  p.ldy = a.epilogue == GroupedEpilogue::kSwiGlu ? a.n / 2 : a.n;
  *out = p;
  return Status::kOk;
}

Status launch_grouped_gemm(const GroupedGemmParams& p, const FrameParams& frame, cudaStream_t stream) {
  if (frame.roles.compute <= 0) {
    WEFT_WARN(kKernel, "grouped gemm: rank %d: no compute blocks", frame.rank);
    return Status::kInvalidArgument;
  }
  cudaError_t err =
      cudaFuncSetAttribute(grouped_gemm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemBytes));
  if (err == cudaSuccess) {
    grouped_gemm_kernel<<<frame.roles.compute, Cfg::kThreads, kSmemBytes, stream>>>(p, frame);
    err = cudaGetLastError();
  }
  if (err != cudaSuccess) {
    WEFT_WARN(kKernel, "grouped gemm: rank %d launch failed: %s", frame.rank, cudaGetErrorString(err));
    return Status::kCudaError;
  }
  return Status::kOk;
}

Status launch_interleave_gate_up(const __nv_bfloat16* gate, const __nv_bfloat16* up, int32_t experts, int32_t ffn,
                                 int32_t k, __nv_bfloat16* w13, cudaStream_t stream) {
  if (experts <= 0 || ffn <= 0 || ffn % 128 != 0 || k <= 0 || k % 8 != 0) {
    WEFT_WARN(kKernel, "interleave gate/up: ffn must be a positive multiple of 128 and k of 8 (ffn %d, k %d)", ffn, k);
    return Status::kInvalidArgument;
  }
  interleave_kernel<<<1024, 256, 0, stream>>>(gate, up, experts, ffn, k, w13);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    WEFT_WARN(kKernel, "interleave gate/up: launch failed: %s", cudaGetErrorString(err));
    return Status::kCudaError;
  }
  return Status::kOk;
}

}  // namespace weft::kernels
