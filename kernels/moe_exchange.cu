// The MoE layer's dispatch, scatter and combine kernels on one node (diagram in moe_exchange.h).
// Warp-per-row kernels: a row of hidden bf16 moves as 16-byte vectors, lane i taking vectors
// i, i + 32, ...; peers' buffers are CUDA-IPC mapped, so a store to them goes over NVLink.
#include <cstdio>

#include "base/log.h"
#include "kernels/frame.cuh"
#include "kernels/moe_exchange.h"
#include "kernels/moe_nodes.h"
#include "kernels/moe_router.h"
#include "kernels/moe_rows.cuh"

namespace weft::kernels {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 256;

struct Peers {
  uint64_t* flags[MoeExchangeArgs::kMaxRanks];
};

__global__ void __launch_bounds__(kThreads) dispatch_kernel(MoeExchangeArgs a) {
  const int32_t lane = threadIdx.x % 32, W = a.world;
  const int64_t slot_bytes = moe_slot_bytes(a.hidden);
  for (int64_t i = moe_warp(); i < int64_t(a.tokens) * W; i += moe_warps()) {
    const int32_t t = int32_t(i / W), d = int32_t(i % W);
    int32_t ids[kMoeMaxTopk];
    float w[kMoeMaxTopk];
    moe_load_pairs(a.topk_ids, a.topk_weights, t, a.topk, a.local_experts, W, ids, w);
    const MoeDispatchMeta meta = moe_dispatch_meta(a.rank, t, ids, w, a.topk, a.local_experts, d);
    moe_write_slot(a.recv[d] + (int64_t(a.rank) * a.tokens + t) * slot_bytes, meta, a.x + int64_t(t) * a.hidden,
                   a.hidden, lane);
  }
}

// Thread q < world: flag `index` of rank q = epoch, after this rank's earlier writes (the kernel
// before this one on the stream has completed; the fence orders them before the flag).
__global__ void signal_kernel(Peers p, int32_t world, int32_t index, const uint64_t* epoch) {
  const int32_t q = threadIdx.x;
  if (q >= world) return;
  __threadfence_system();
  flag_store_release(p.flags[q] + index, *epoch);
}

// Thread q < world: waits (bounded) until this rank's flag first + q reached epoch.
__global__ void wait_kernel(FrameParams f, const uint64_t* flags, int32_t first, int32_t world, const uint64_t* epoch) {
  const int32_t q = threadIdx.x;
  if (q >= world) return;
  frame_wait_flag(f, flags + first + q, *epoch, Role::kIntraComm, -1, q, first + q);
}

__global__ void begin_kernel(uint64_t* epoch) { *epoch += 1; }

// Thread per received slot: (slot, pair) counts per local expert.
__global__ void __launch_bounds__(kThreads) count_kernel(MoeExchangeArgs a) {
  const int64_t slots = int64_t(a.world) * a.tokens, slot_bytes = moe_slot_bytes(a.hidden);
  for (int64_t s = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; s < slots; s += int64_t(gridDim.x) * blockDim.x) {
    const MoeDispatchMeta* m = moe_slot_meta(a.recv[a.rank] + s * slot_bytes, a.hidden);
    if (m->pairs == 0) continue;
    for (int32_t j = 0; j < a.topk; ++j) {
      const int32_t e = m->local_expert[j];
      if (e >= 0 && e < a.local_experts) atomicAdd(a.counts + e, 1);
    }
  }
}

// One thread: the routed rows against the reservation (counts first). Past it the scatter counts
// rows as dropped and the grouped GEMM stops at the capacity; the record makes the call fail.
__global__ void capacity_kernel(FrameParams f, const int32_t* offsets, int32_t experts, int64_t capacity) {
  const int64_t need = offsets[experts];
  if (need > capacity)
    frame_record_error(f, DeviceErrorKind::kCapacity, Role::kCompute, -1, -1, -1, offsets + experts, uint64_t(need),
                       uint64_t(capacity), 0);
}

// Warp per received slot: each local pair gets a row of grouped_x (its expert's next row) and the
// token's row is copied there. The order of rows inside an expert does not change any value: each
// row's GEMM is its own.
__global__ void __launch_bounds__(kThreads) scatter_kernel(MoeExchangeArgs a) {
  const int32_t lane = threadIdx.x % 32;
  const int64_t slots = int64_t(a.world) * a.tokens, slot_bytes = moe_slot_bytes(a.hidden), vecs = a.hidden / 8;
  for (int64_t s = moe_warp(); s < slots; s += moe_warps()) {
    const uint8_t* slot = a.recv[a.rank] + s * slot_bytes;
    const MoeDispatchMeta* m = moe_slot_meta(slot, a.hidden);
    const int32_t pairs = m->pairs;
    for (int32_t j = 0; j < a.topk; ++j) {
      const int32_t e = pairs == 0 ? -1 : m->local_expert[j];
      int32_t pos = -1;
      if (e >= 0 && e < a.local_experts && lane == 0) {
        pos = a.offsets[e] + atomicAdd(a.cursor + e, 1);
        if (pos >= a.capacity_rows) {
          atomicAdd(a.dropped, 1);
          pos = -1;
        }
      }
      pos = __shfl_sync(0xffffffffu, pos, 0);
      if (lane == 0) a.slot_pos[s * a.topk + j] = pos;
      if (pos < 0) continue;
      moe_copy_row(reinterpret_cast<int4*>(a.grouped_x + int64_t(pos) * a.hidden), reinterpret_cast<const int4*>(slot),
                   vecs, lane);
    }
  }
}

// Warp per received slot with pairs: Σ weight_j * Y[slot_pos[j]] over the slot's local experts in
// increasing expert order (fp32, rounded once), stored in the home's combine row for this rank.
__global__ void __launch_bounds__(kThreads) combine_kernel(MoeExchangeArgs a) {
  const int32_t lane = threadIdx.x % 32;
  const int64_t slots = int64_t(a.world) * a.tokens, slot_bytes = moe_slot_bytes(a.hidden);
  for (int64_t s = moe_warp(); s < slots; s += moe_warps()) {
    const MoeDispatchMeta* m = moe_slot_meta(a.recv[a.rank] + s * slot_bytes, a.hidden);
    if (m->pairs == 0) continue;
    const MoeSlotPairs pairs = moe_slot_pairs(m, a.slot_pos + s * a.topk, a.topk);
    const int32_t src = int32_t(s / a.tokens), t = int32_t(s % a.tokens);
    moe_sum_pairs(pairs, a.grouped_y, a.hidden, a.comb[src] + (int64_t(a.rank) * a.tokens + t) * a.hidden, lane);
  }
}

// Warp per token: out[t] = Σ over t's destination ranks in rank order of their combine rows.
__global__ void __launch_bounds__(kThreads) home_reduce_kernel(MoeExchangeArgs a) {
  const int32_t lane = threadIdx.x % 32;
  for (int64_t t = moe_warp(); t < a.tokens; t += moe_warps())
    moe_sum_home(a.comb[a.rank], a.tokens, a.hidden, a.world, int32_t(t),
                 moe_token_dests(a.topk_ids, int32_t(t), a.topk, a.local_experts, a.world), a.out, lane);
}

// peers: the launch reaches every rank's buffers (dispatch, combine); else only this rank's (the
// cross-node op maps only its node's ranks and moves the rest itself: kernels/moe_nodes.h).
Status check_args(const MoeExchangeArgs& a, bool peers) {
  bool ok = a.world >= 1 && a.world <= MoeExchangeArgs::kMaxRanks && a.rank >= 0 && a.rank < a.world && a.tokens >= 1 &&
            a.hidden >= 8 && a.hidden % 8 == 0 && a.topk >= 1 && a.topk <= kMoeMaxTopk && a.local_experts >= 1 &&
            a.local_experts * a.world <= kMoeMaxExperts && a.x && a.topk_ids && a.topk_weights && a.counts &&
            a.offsets && a.cursor && a.slot_pos && a.dropped && a.grouped_x && a.grouped_y && a.out &&
            a.capacity_rows > 0 && a.epoch;
  for (int q = 0; ok && q < a.world; ++q) ok = (!peers && q != a.rank) || (a.recv[q] && a.comb[q] && a.flags[q]);
  if (!ok) {
    WEFT_WARN(kKernel,
              "rank %d: moe exchange: invalid arguments (world %d, tokens %d, hidden %d, topk %d, experts/rank %d)",
              a.rank, a.world, a.tokens, a.hidden, a.topk, a.local_experts);
    return Status::kInvalidArgument;
  }
  return Status::kOk;
}

int grid_for(int64_t warps_needed) { return moe_grid_for(warps_needed, kThreads); }

Peers peers_of(const MoeExchangeArgs& a) {
  Peers p{};
  for (int q = 0; q < a.world; ++q) p.flags[q] = a.flags[q];
  return p;
}

Status launched(const char* what, int rank) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return Status::kOk;
  WEFT_WARN(kKernel, "rank %d: moe %s: launch failed: %s", rank, what, cudaGetErrorString(e));
  return Status::kCudaError;
}

}  // namespace

std::string describe_moe_wait(const DeviceError& e, int32_t world) {
  if (e.status != 0 && e.kind == int32_t(DeviceErrorKind::kCapacity)) {
    char line[256];
    snprintf(line, sizeof line,
             "rank %d: the routed tokens need %llu grouped rows and %llu are reserved (counts first: raise "
             "WEFT_HEAP_BYTES); the call is refused",
             e.rank, (unsigned long long)e.expected, (unsigned long long)e.seen);
    return line;
  }
  if (e.status == 0 || e.kind != int32_t(DeviceErrorKind::kFlagTimeout) || e.flag_index < 0) return "";
  if (e.flag_index >= kMoeRailFlag) {  // across nodes (kernels/moe_nodes.cu): tile_m the phase, tile_n the peer
    char line[256];
    snprintf(line, sizeof line, "rank %d waited %.1f s for rank %d's %s over the network (saw %llu, expected %llu)",
             e.rank, double(e.waited_ns) * 1e-9, e.tile_n,
             e.tile_m == 0 ? "tokens for this node" : "summed combine rows of its node", (unsigned long long)e.seen,
             (unsigned long long)e.expected);
    return line;
  }
  if (e.flag_index >= 2 * world) {  // the fused launch's comb_done (kernels/moe_ffn_combine.h): tile, owner
    char line[256];
    snprintf(line, sizeof line,
             "rank %d waited %.1f s for rank %d's combine rows of its token tile %d (comb_done: saw %llu, expected "
             "%llu)",
             e.rank, double(e.waited_ns) * 1e-9, e.tile_n, e.tile_m, (unsigned long long)e.seen,
             (unsigned long long)e.expected);
    return line;
  }
  const bool dispatch = e.flag_index < world;
  const int32_t peer = dispatch ? e.flag_index : e.flag_index - world;
  char line[256];
  snprintf(line, sizeof line, "rank %d waited %.1f s for rank %d's %s (flag %d: saw %llu, expected %llu)", e.rank,
           double(e.waited_ns) * 1e-9, peer, dispatch ? "dispatched tokens" : "combine rows", e.flag_index,
           (unsigned long long)e.seen, (unsigned long long)e.expected);
  return line;
}

Status launch_moe_begin(const MoeExchangeArgs& a, cudaStream_t s) {
  WEFT_CHECK(check_args(a, false));
  begin_kernel<<<1, 1, 0, s>>>(a.epoch);
  return launched("begin", a.rank);
}

Status launch_moe_dispatch(const MoeExchangeArgs& a, cudaStream_t s) {
  WEFT_CHECK(check_args(a, true));
  dispatch_kernel<<<grid_for(int64_t(a.tokens) * a.world), kThreads, 0, s>>>(a);
  WEFT_CHECK(launched("dispatch", a.rank));
  signal_kernel<<<1, 32, 0, s>>>(peers_of(a), a.world, moe_dispatch_flag(a.rank), a.epoch);
  return launched("dispatch signal", a.rank);
}

Status launch_moe_arrange(const MoeExchangeArgs& a, const FrameParams& frame, cudaStream_t s) {
  WEFT_CHECK(check_args(a, false));
  wait_kernel<<<1, 32, 0, s>>>(frame, a.flags[a.rank], moe_dispatch_flag(0), a.world, a.epoch);
  WEFT_CHECK(launched("dispatch wait", a.rank));
  if (cudaMemsetAsync(a.counts, 0, sizeof(int32_t) * a.local_experts, s) != cudaSuccess ||
      cudaMemsetAsync(a.cursor, 0, sizeof(int32_t) * a.local_experts, s) != cudaSuccess)
    return launched("arrange memset", a.rank);
  const int64_t slots = int64_t(a.world) * a.tokens;
  count_kernel<<<grid_for((slots + 31) / 32), kThreads, 0, s>>>(a);
  WEFT_CHECK(launched("count", a.rank));
  WEFT_CHECK(launch_moe_offsets(a.counts, a.local_experts, a.offsets, s));
  if (!a.capacity_after) {
    capacity_kernel<<<1, 1, 0, s>>>(frame, a.offsets, a.local_experts, a.capacity_rows);
    WEFT_CHECK(launched("capacity", a.rank));
  }
  scatter_kernel<<<grid_for(slots), kThreads, 0, s>>>(a);
  return launched("scatter", a.rank);
}

Status launch_moe_capacity(const MoeExchangeArgs& a, const FrameParams& frame, cudaStream_t s) {
  WEFT_CHECK(check_args(a, false));
  capacity_kernel<<<1, 1, 0, s>>>(frame, a.offsets, a.local_experts, a.capacity_rows);
  return launched("capacity", a.rank);
}

Status launch_moe_combine(const MoeExchangeArgs& a, const FrameParams& frame, cudaStream_t s) {
  WEFT_CHECK(check_args(a, true));
  combine_kernel<<<grid_for(int64_t(a.world) * a.tokens), kThreads, 0, s>>>(a);
  WEFT_CHECK(launched("combine", a.rank));
  signal_kernel<<<1, 32, 0, s>>>(peers_of(a), a.world, moe_combine_flag(a.world, a.rank), a.epoch);
  WEFT_CHECK(launched("combine signal", a.rank));
  wait_kernel<<<1, 32, 0, s>>>(frame, a.flags[a.rank], moe_combine_flag(a.world, 0), a.world, a.epoch);
  WEFT_CHECK(launched("combine wait", a.rank));
  home_reduce_kernel<<<grid_for(a.tokens), kThreads, 0, s>>>(a);
  return launched("home reduce", a.rank);
}

}  // namespace weft::kernels
