// The MoE layer's expert FFN, combine and home reduction in one persistent launch (design and the
// deadlock argument in moe_ffn_combine.h): the grouped ring (kernels/grouped_ring.cuh) with a tail of
// combine and reduce units run by the consumer warps.
#include <cuda_runtime.h>

#include "base/log.h"
#include "kernels/grouped_ring.cuh"
#include "kernels/moe_ffn_combine.h"
#include "kernels/moe_rows.cuh"

namespace weft::kernels {
namespace {

using grouped_ring::Cfg;
using bf16 = __nv_bfloat16;
constexpr int32_t kWarps = Cfg::kConsumers * 4;  // the consumer warps that run a tail unit
constexpr int32_t kSubs = 4;                     // combine units per 128-slot chunk (32 slots each)
constexpr int32_t kSubSlots = kMoeTileRows / kSubs;
constexpr int32_t kTailRows = 2;  // rows a tail warp's sums load at once (moe_sum_rows: no spill beside the GEMM)

struct CombineTail {
  static constexpr bool kHas = true;
  int64_t units = 0;  // world x chunks x kSubs combine units, then chunks reduce units
  int32_t world = 1, rank = 0, tokens = 0, hidden = 0, topk = 0, local_experts = 0, chunks = 0;
  uint64_t down_warps = 0;  // down_done[m] when every down unit of row tile m has stored
  const uint8_t* recv = nullptr;
  const int32_t* slot_pos = nullptr;
  const bf16* y = nullptr;
  const int32_t* topk_ids = nullptr;
  bf16* out = nullptr;
  const uint64_t* epoch = nullptr;
  const uint64_t* down_done = nullptr;
  bf16* comb[MoeExchangeArgs::kMaxRanks] = {};
  uint64_t* comb_done[MoeExchangeArgs::kMaxRanks] = {};

  // Combine unit (home h, chunk c, quarter q): warp w takes the quarter's slots w, w + 8, ... (4 each).
  __device__ bool combine(int64_t u, const FrameParams& f, int32_t warp, int32_t lane) const {
    const int64_t per_home = int64_t(chunks) * kSubs;
    const int32_t h = int32_t((rank + 1 + u / per_home) % world);  // each rank starts with another home
    const int32_t c = int32_t(u % per_home / kSubs), sub = int32_t(u % kSubs);
    const int64_t slot_bytes = moe_slot_bytes(hidden);
    for (int32_t i = sub * kSubSlots + warp; i < (sub + 1) * kSubSlots; i += kWarps) {
      const int32_t t = c * kMoeTileRows + i;
      if (t >= tokens) break;
      const int64_t s = int64_t(h) * tokens + t;
      const MoeDispatchMeta* m = moe_slot_meta(recv + s * slot_bytes, hidden);
      if (m->pairs == 0) continue;
      const MoeSlotPairs pairs = moe_slot_pairs(m, slot_pos + s * topk, topk);
      bool ok = true;
      if (lane == 0)
        for (int32_t j = 0; j < pairs.n && ok; ++j)
          if (pairs.pos[j] >= 0) {
            const int32_t tile = pairs.pos[j] / kMoeTileRows;
            ok = frame_wait_flag(f, down_done + tile, down_warps, Role::kCompute, tile, -1, -1);
          }
      if (!__shfl_sync(0xffffffffu, ok, 0)) return false;
      __syncwarp();  // lane 0's acquire before every lane's reads of Y
      moe_sum_pairs<kTailRows>(pairs, y, hidden, comb[h] + (int64_t(rank) * tokens + t) * hidden, lane);
    }
    __syncwarp();
    if (lane == 0) {
      __threadfence_system();  // the warp's rows at h before its count
      flag_add_release(comb_done[h] + rank * chunks + c, 1);
    }
    return true;
  }

  // Reduce unit (token tile i of this rank): every owner's chunk i complete, then warp w takes tokens
  // w, w + 8, ... of the tile.
  __device__ bool reduce(int32_t i, const FrameParams& f, int32_t warp, int32_t lane) const {
    bool ok = true;
    if (lane == 0) {
      const uint64_t all = uint64_t(kWarps) * kSubs * *epoch;
      for (int32_t q = 0; q < world && ok; ++q)
        ok = frame_wait_flag(f, comb_done[rank] + q * chunks + i, all, Role::kCompute, i, q,
                             moe_comb_done_flag(world, chunks, q, i));
    }
    if (!__shfl_sync(0xffffffffu, ok, 0)) return false;
    __syncwarp();  // lane 0's acquires before every lane's reads of the owners' rows
    for (int32_t tt = warp; tt < kMoeTileRows; tt += kWarps) {
      const int32_t t = i * kMoeTileRows + tt;
      if (t >= tokens) break;
      moe_sum_home<kTailRows>(comb[rank], tokens, hidden, world, t,
                              moe_token_dests(topk_ids, t, topk, local_experts, world), out, lane);
    }
    return true;
  }

  __device__ __forceinline__ bool run(int64_t u, const FrameParams& f, int32_t warp, int32_t lane) const {
    const int64_t combines = int64_t(world) * chunks * kSubs;
    return u < combines ? combine(u, f, warp, lane) : reduce(int32_t(u - combines), f, warp, lane);
  }
};

__global__ void __launch_bounds__(Cfg::kThreads, 1)
    moe_ffn_combine_kernel(const __grid_constant__ GroupedGemmParams up, const __grid_constant__ GroupedGemmParams down,
                           const __grid_constant__ CombineTail tail, uint64_t* work, const FrameParams f) {
  frame_note_launch(f, KernelKind::kMoeFfnCombine);
  grouped_ring::grouped_body(grouped_ring::phases_of<CombineTail>(up, &down, work, &tail), f);
}

int current_sms() {
  int device = 0, n = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    return 0;
  return n;
}

}  // namespace

Status launch_moe_ffn_combine(const GroupedGemmParams& up, const GroupedGemmParams& down, const MoeFfnCombineArgs& a,
                              uint64_t* work, const FrameParams& frame, cudaStream_t stream) {
  const MoeExchangeArgs* ex = a.ex;
  const char* why = nullptr;
  const int sms = current_sms();
  if (!ex || !work)
    why = "the exchange's arguments and the work words are needed";
  else if (sms <= 0 || frame.roles.compute <= 0 || frame.roles.compute > sms)
    why = "the compute blocks must be between 1 and the GPU's SMs";
  else if (up.epilogue != int32_t(GroupedEpilogue::kSwiGlu) || down.epilogue != int32_t(GroupedEpilogue::kStore) ||
           up.counts != down.counts || up.offsets != down.offsets || up.experts != down.experts ||
           up.capacity_tiles != down.capacity_tiles || up.group_m != down.group_m || down.k != up.n / 2)
    why = "gate/up and down must be the expert FFN's two GEMMs over the same rows";
  else if (ex->world < 1 || ex->world > MoeExchangeArgs::kMaxRanks || ex->rank < 0 || ex->rank >= ex->world ||
           ex->tokens < 1 || ex->hidden != down.n || ex->topk < 1 || ex->topk > kMoeMaxTopk || !ex->slot_pos ||
           ex->local_experts != up.experts || ex->grouped_y != down.y || !ex->topk_ids || !ex->out || !ex->epoch ||
           !ex->recv[ex->rank])
    why = "the exchange's arguments do not fit the FFN (hidden, ranks, buffers)";
  for (int q = 0; !why && ex && q < ex->world; ++q)
    if (!ex->comb[q] || !a.comb_done[q]) why = "every rank's combine rows and comb_done words must be mapped";
  if (why) {
    WEFT_WARN(kKernel, "moe ffn+combine: rank %d: %s", frame.rank, why);
    return Status::kInvalidArgument;
  }
  CombineTail t;
  t.world = ex->world, t.rank = ex->rank, t.tokens = ex->tokens, t.hidden = ex->hidden, t.topk = ex->topk;
  t.local_experts = ex->local_experts;
  t.chunks = moe_ffn_combine_chunks(ex->tokens);
  t.units = int64_t(t.world) * t.chunks * kSubs + t.chunks;
  t.down_warps = uint64_t(down.n_blocks) * kWarps;
  t.recv = ex->recv[ex->rank], t.slot_pos = ex->slot_pos, t.y = ex->grouped_y, t.topk_ids = ex->topk_ids;
  t.out = ex->out, t.epoch = ex->epoch;
  t.down_done = work + up.capacity_tiles;
  for (int q = 0; q < ex->world; ++q) t.comb[q] = ex->comb[q], t.comb_done[q] = a.comb_done[q];
  GroupedGemmParams d;
  WEFT_CHECK(grouped_split_for_launch(up, down, frame, stream, &d));
  cudaError_t err = cudaMemsetAsync(work, 0, size_t(2 * int64_t(up.capacity_tiles) + 1) * sizeof(uint64_t), stream);
  if (err == cudaSuccess)
    err = cudaFuncSetAttribute(moe_ffn_combine_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               int(grouped_ring::kSmemBytes));
  if (err == cudaSuccess) {
    moe_ffn_combine_kernel<<<frame.roles.compute, Cfg::kThreads, grouped_ring::kSmemBytes, stream>>>(up, d, t, work,
                                                                                                     frame);
    err = cudaGetLastError();
  }
  if (err != cudaSuccess) {
    WEFT_WARN(kKernel, "moe ffn+combine: rank %d launch failed: %s", frame.rank, cudaGetErrorString(err));
    return Status::kCudaError;
  }
  return Status::kOk;
}

}  // namespace weft::kernels
