// The persistent grouped GEMM for sm_90a: one launch computes every expert's Y_e = X_e W_e^T, the
// tile list derived on the device from the padded per-expert offsets (kernels/moe_plan.h); the ring
// it runs on, with its diagram, is kernels/grouped_ring.cuh.
//
// The expert FFN in one launch (launch_grouped_ffn): the gate/up units, then the down units of the
// same row tiles; a block's producer waits (bounded) until tile_done[m] counts every consumer warp
// of every gate/up unit of row tile m (any SM; each raises it after its stores) before it loads H. The
// down GEMM starts on a tile as soon as its H is complete, with no gap between two launches.
#include <cuda.h>
#include <cuda_runtime.h>

#include "base/log.h"
#include "kernels/grouped_gemm.h"
#include "kernels/grouped_ring.cuh"

namespace weft::kernels {
namespace {

using grouped_ring::Cfg;
using grouped_ring::grouped_body;
using grouped_ring::kSmemBytes;
using grouped_ring::NoTail;
using grouped_ring::phases_of;

__global__ void __launch_bounds__(Cfg::kThreads, 1)
    grouped_gemm_kernel(const __grid_constant__ GroupedGemmParams p, const FrameParams f) {
  grouped_body(phases_of<NoTail>(p, nullptr, nullptr, nullptr), f);
}

// Deadlock-free: a down unit waits only on gate/up units, which all come before every down unit in
// the claim order and never wait. A block claims a down unit only after every gate/up unit has been
// claimed, each by a running block that finishes it (its earlier units are gate/up units too), so
// the wait ends even when not every block is resident (ranks sharing a GPU, a user kernel beside).
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    grouped_ffn_kernel(const __grid_constant__ GroupedGemmParams up, const __grid_constant__ GroupedGemmParams down,
                       uint64_t* tile_done, const FrameParams f) {
  grouped_body(phases_of<NoTail>(up, &down, tile_done, nullptr), f);
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
  const int64_t ldy = a.epilogue == GroupedEpilogue::kSwiGlu ? a.n / 2 : a.n;
  static_assert(Cfg::kTileK == Cfg::kStoreBox, "encode's box is kTileK columns wide: the store box's width");
  WEFT_CHECK(encode("Y", a.y, a.capacity_rows, ldy, Cfg::kStoreBox, &p.tmap_y));
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
  p.ldy = ldy;
  *out = p;
  return Status::kOk;
}

namespace {
constexpr int64_t kSplitSlotBytes = int64_t(Cfg::kTileM) * Cfg::kTileN * sizeof(float);  // one tile's fp32 sums
constexpr int64_t kSplitWordsPerSlot = 8;  // one arrival word per consumer warp of a tile
}  // namespace

int64_t grouped_split_bytes(int32_t slots) {
  return slots > 0 ? int64_t(slots) * (kSplitSlotBytes + kSplitWordsPerSlot * int64_t(sizeof(uint32_t))) : 0;
}

Status enable_grouped_split(GroupedGemmParams* down, void* mem, int32_t slots) {
  if (!down || !mem || slots <= 0 || down->epilogue != int32_t(GroupedEpilogue::kStore) ||
      reinterpret_cast<uintptr_t>(mem) % 16 != 0) {
    WEFT_WARN(kKernel,
              "grouped gemm: the K split needs the down projection (plain store), slots and 16-byte aligned "
              "memory (%d slots)",
              slots);
    return Status::kInvalidArgument;
  }
  uint8_t* base = static_cast<uint8_t*>(mem);
  down->split_ws = reinterpret_cast<float*>(base);
  down->split_cnt = reinterpret_cast<uint32_t*>(base + int64_t(slots) * kSplitSlotBytes);
  down->split_slots = slots;
  return Status::kOk;
}

// The down params a launch runs: its blocks as the split's wave, and the arrival words zeroed on the
// stream (a launch abandoned part-way, one part of a pair arrived, must not leave a word that would
// make the next launch's first part think it is the second).
Status grouped_split_for_launch(const GroupedGemmParams& up, const GroupedGemmParams& down, const FrameParams& frame,
                                cudaStream_t stream, GroupedGemmParams* out) {
  if (up.split_ws || (down.split_ws && (!down.split_cnt || down.split_slots <= 0))) {
    WEFT_WARN(kKernel,
              "grouped ffn: rank %d: only down splits over K, with its workspace, arrival words and slots "
              "(enable_grouped_split)",
              frame.rank);
    return Status::kInvalidArgument;
  }
  *out = down;
  if (!down.split_ws) return Status::kOk;
  out->split_sms = frame.roles.compute;
  const cudaError_t err =
      cudaMemsetAsync(down.split_cnt, 0, size_t(down.split_slots) * kSplitWordsPerSlot * sizeof(uint32_t), stream);
  if (err != cudaSuccess) {
    WEFT_WARN(kKernel, "grouped gemm: rank %d: zeroing the K split's arrival words failed: %s", frame.rank,
              cudaGetErrorString(err));
    return Status::kCudaError;
  }
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
  GroupedGemmParams d;
  WEFT_CHECK(grouped_split_for_launch(up, down, frame, stream, &d));
  cudaError_t err = cudaMemsetAsync(tile_done, 0, size_t(up.capacity_tiles + 1) * sizeof(uint64_t), stream);
  if (err == cudaSuccess)
    err = cudaFuncSetAttribute(grouped_ffn_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemBytes));
  if (err == cudaSuccess) {
    grouped_ffn_kernel<<<frame.roles.compute, Cfg::kThreads, kSmemBytes, stream>>>(up, d, tile_done, frame);
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
