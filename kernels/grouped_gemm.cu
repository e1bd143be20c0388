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
//
// The expert FFN in one launch (launch_grouped_ffn): the gate/up units, then the down units of the
// same row tiles; a block's producer waits (bounded) until tile_done[m] counts every consumer warp
// of every gate/up unit of row tile m (any SM; each raises it after its stores) before it loads H. The
// down GEMM starts on a tile as soon as its H is complete, with no gap between two launches.
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
  int64_t unit[Cfg::kStages];  // the unit whose first k-block a stage holds (-1: no more units)
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

// The units of one launch: the plain GEMM's (one phase), or the expert FFN's gate/up units then its
// down units (two phases over the same row tiles). A down unit of row tile m is gated on
// tile_done[m], which each gate/up unit of tile m raises by one after its H columns are stored.
struct Phases {
  const GroupedGemmParams* p[2] = {};
  int64_t units0 = 0, units = 0;  // phase 0's units, both phases' units
  int32_t m_tiles = 0;
  uint64_t* tile_done = nullptr;  // two phases only: capacity_tiles words, zero at launch
  // Two phases: the units are claimed in order from this word (zero at launch), so every unit a
  // down unit waits for was claimed earlier by a running block, which finishes it without waiting;
  // one phase: block b takes b, b + grid, ...
  unsigned long long* claims = nullptr;
};

__device__ __forceinline__ Phases phases_of(const GroupedGemmParams& p0, const GroupedGemmParams* p1,
                                            uint64_t* tile_done) {
  Phases ph;
  const Walk w = walk_of(p0);  // both phases walk the same row tiles (the same offsets)
  ph.p[0] = &p0;
  ph.p[1] = p1;
  ph.m_tiles = w.m_tiles;
  ph.units0 = w.units;
  ph.units = w.units + (p1 ? int64_t(w.m_tiles) * p1->n_blocks : 0);
  ph.tile_done = tile_done;
  if (p1) ph.claims = reinterpret_cast<unsigned long long*>(tile_done + p0.capacity_tiles);
  return ph;
}

// Unit u of the launch: its phase, parameters, tile and expert.
__device__ __forceinline__ const GroupedGemmParams& unit_at(const Phases& ph, int64_t u, int32_t* phase, TileCoord* c,
                                                            int32_t* e) {
  *phase = u < ph.units0 ? 0 : 1;
  const GroupedGemmParams& p = *ph.p[*phase];
  Walk w;
  w.m_tiles = ph.m_tiles;
  w.units = int64_t(ph.m_tiles) * p.n_blocks;
  *c = coord_of(p, w, *phase ? u - ph.units0 : u, e);
  return p;
}

__device__ __forceinline__ int64_t next_unit(const Phases& ph, int64_t u) {
  if (ph.claims) return int64_t(atomicAdd(ph.claims, 1ull));
  return u < 0 ? int64_t(blockIdx.x) : u + gridDim.x;
}

// The producer passes each unit to the consumers in the stage of its first k-block, and -1 in one
// more stage when it has no more.
__device__ __forceinline__ void producer(const Phases& ph, const FrameParams& f, GroupedShared& s) {
  constexpr uint32_t kStageBytes = (Cfg::kTileM + Cfg::kTileN) * Cfg::kTileK * sizeof(__nv_bfloat16);
  uint32_t it = 0;
  for (int64_t u = next_unit(ph, -1); u < ph.units; u = next_unit(ph, u)) {
    int32_t e, phase;
    TileCoord c;
    const GroupedGemmParams& p = unit_at(ph, u, &phase, &c, &e);
    if (phase == 1) {
      // Every consumer warp of every gate/up unit of this row tile has stored its H columns; H is read
      // by TMA (async proxy) next.
      const uint64_t* flag = ph.tile_done + c.m_block;
      const uint64_t all = uint64_t(ph.p[0]->n_blocks) * Cfg::kConsumers * 4;
      if (!frame_wait_flag(f, flag, all, Role::kCompute, c.m_block, c.n_block, c.m_block))
        return;  // the consumers see the launch abandoned at their next barrier wait
      asm volatile("fence.proxy.async.global;" ::: "memory");
    }
    const int32_t row_a = c.m_block * Cfg::kTileM;
    const int32_t row_b = e * p.n + c.n_block * Cfg::kTileN;
    for (int32_t kb = 0; kb < p.k_iters; ++kb, ++it) {
      const uint32_t stage = it % Cfg::kStages, phase_bit = (it / Cfg::kStages) & 1;
      if (!gemm_detail::wait_barrier(&s.empty[stage], phase_bit ^ 1, f, c)) return;
      if (kb == 0) s.unit[stage] = u;
      sm90::mbar_arrive_expect_tx(&s.full[stage], kStageBytes);
      sm90::tma_load_2d(s.a[stage], &p.tmap_x, &s.full[stage], kb * Cfg::kTileK, row_a);
      sm90::tma_load_2d(s.b[stage], &p.tmap_w, &s.full[stage], kb * Cfg::kTileK, row_b);
    }
  }
  const uint32_t stage = it % Cfg::kStages, phase_bit = (it / Cfg::kStages) & 1;
  if (!gemm_detail::wait_barrier(&s.empty[stage], phase_bit ^ 1, f, TileCoord{})) return;
  s.unit[stage] = -1;
  sm90::mbar_arrive(&s.full[stage]);
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

__device__ __forceinline__ void consumer(const Phases& ph, const FrameParams& f, GroupedShared& s) {
  const int32_t half = threadIdx.x / 128 - 1;  // which 64-row half of the tile
  const int32_t t128 = threadIdx.x % 128, warp = t128 / 32, lane = t128 % 32;
  float acc[128];
  uint32_t it = 0;
  for (;;) {
    if (!gemm_detail::wait_barrier(&s.full[it % Cfg::kStages], (it / Cfg::kStages) & 1, f, TileCoord{})) return;
    const int64_t u = s.unit[it % Cfg::kStages];
    if (u < 0) return;
    int32_t e, phase;
    TileCoord c;
    const GroupedGemmParams& p = unit_at(ph, u, &phase, &c, &e);
    for (int32_t kb = 0; kb < p.k_iters; ++kb, ++it) {
      const uint32_t stage = it % Cfg::kStages, phase_bit = (it / Cfg::kStages) & 1;
      if (kb > 0 && !gemm_detail::wait_barrier(&s.full[stage], phase_bit, f, c)) {
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
    if (phase == 0 && ph.tile_done) {
      // Each consumer warp's stores of this unit, then one release per warp: the down units of the
      // tile (any SM) wait for every warp of every gate/up unit of it. Per warp, not a block-wide
      // barrier: a warp that left on an abandoned launch must not hold the others (its count is then
      // missing, and the waiting producer times out, bounded).
      __syncwarp();
      if (lane == 0) flag_add_release(ph.tile_done + c.m_block, 1);
    }
  }
}

__device__ __forceinline__ void grouped_body(const Phases& ph, const FrameParams& f) {
  extern __shared__ uint8_t smem_raw[];
  GroupedShared& s =
      *reinterpret_cast<GroupedShared*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const GroupedGemmParams& p = *ph.p[0];
  if (threadIdx.x == 0) {
    for (int32_t i = 0; i < Cfg::kStages; ++i) {
      sm90::mbar_init(&s.full[i], 1);
      sm90::mbar_init(&s.empty[i], Cfg::kConsumers * 4);  // one arrival per consumer warp
    }
    sm90::fence_barrier_init();
    sm90::tma_prefetch_desc(&p.tmap_x);
    sm90::tma_prefetch_desc(&p.tmap_w);
    if (ph.p[1]) {
      sm90::tma_prefetch_desc(&ph.p[1]->tmap_x);
      sm90::tma_prefetch_desc(&ph.p[1]->tmap_w);
    }
    // Rows routed beyond the reservation are not computed: counted, never silently lost.
    const int32_t rows = p.offsets[p.experts];
    if (blockIdx.x == 0 && p.dropped && rows > p.capacity_tiles * Cfg::kTileM)
      atomicAdd(p.dropped, rows - p.capacity_tiles * Cfg::kTileM);
  }
  __syncthreads();
  if (threadIdx.x < 128) {
    sm90::setmaxnreg_dec<40>();
    if (threadIdx.x == 0) producer(ph, f, s);
  } else {
    sm90::setmaxnreg_inc<232>();
    consumer(ph, f, s);
  }
}

__global__ void __launch_bounds__(Cfg::kThreads, 1)
    grouped_gemm_kernel(const __grid_constant__ GroupedGemmParams p, const FrameParams f) {
  grouped_body(phases_of(p, nullptr, nullptr), f);
}

// Deadlock-free: a down unit waits only on gate/up units, which all come before every down unit in
// the claim order and never wait. A block claims a down unit only after every gate/up unit has been
// claimed, each by a running block that finishes it (its earlier units are gate/up units too), so
// the wait ends even when not every block is resident (ranks sharing a GPU, a user kernel beside).
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    grouped_ffn_kernel(const __grid_constant__ GroupedGemmParams up, const __grid_constant__ GroupedGemmParams down,
                       uint64_t* tile_done, const FrameParams f) {
  grouped_body(phases_of(up, &down, tile_done), f);
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

namespace {

// The current device's SM count, read once per device (not on every call of a decode step); 0 when
// it cannot be read.
int current_sm_count() {
  static int counts[64] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return 0;
  if (!counts[device] && cudaDeviceGetAttribute(&counts[device], cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    return 0;
  return counts[device];
}

}  // namespace

Status launch_grouped_ffn(const GroupedGemmParams& up, const GroupedGemmParams& down, uint64_t* tile_done,
                          const FrameParams& frame, cudaStream_t stream) {
  const char* why = nullptr;
  const int sms = current_sm_count();
  if (sms <= 0)
    why = "the device's SM count cannot be read";
  else if (frame.roles.compute <= 0 || frame.roles.compute > sms)
    why = "the compute blocks must be between 1 and the GPU's SMs";
  else if (up.epilogue != int32_t(GroupedEpilogue::kSwiGlu) || down.epilogue != int32_t(GroupedEpilogue::kStore))
    why = "gate/up needs the SwiGLU epilogue and down the plain store";
  else if (up.counts != down.counts || up.offsets != down.offsets || up.experts != down.experts ||
           up.capacity_tiles != down.capacity_tiles || up.group_m != down.group_m)
    why = "gate/up and down must walk the same experts, counts, offsets, capacity and raster";
  else if (down.k != up.n / 2 || !tile_done)
    why = "down's k must be gate/up's output width (ffn), and tile_done is needed";
  if (why) {
    WEFT_WARN(kKernel, "grouped ffn: rank %d: %s", frame.rank, why);
    return Status::kInvalidArgument;
  }
  cudaError_t err = cudaMemsetAsync(tile_done, 0, size_t(up.capacity_tiles + 1) * sizeof(uint64_t), stream);
  if (err == cudaSuccess)
    err = cudaFuncSetAttribute(grouped_ffn_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemBytes));
  if (err == cudaSuccess) {
    grouped_ffn_kernel<<<frame.roles.compute, Cfg::kThreads, kSmemBytes, stream>>>(up, down, tile_done, frame);
    err = cudaGetLastError();
  }
  if (err != cudaSuccess) {
    WEFT_WARN(kKernel, "grouped ffn: rank %d launch failed: %s", frame.rank, cudaGetErrorString(err));
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
