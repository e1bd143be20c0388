// The MoE layer's dispatch and combine across nodes (diagram in moe_nodes.h): warp-per-row kernels
// for the NVLink moves and the relay's forward and sums, one-block kernels for the proxy's puts and
// the bounded waits (ranks that share a GPU never hold its SMs while they wait).
#include <cstdio>

#include "base/log.h"
#include "kernels/frame.cuh"
#include "kernels/moe_nodes.h"
#include "kernels/moe_rows.cuh"
#include "transport/fifo_device.cuh"

namespace weft::kernels {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 256;

__device__ __forceinline__ int32_t owner_node(const MoeNodesArgs& a, int32_t id) {
  const int32_t q = id >= 0 ? id / a.ex.local_experts : -1;
  return q >= 0 && q < a.ex.world ? a.node_of[q] : -1;
}

// A block's route: the count word, then T int32 (compact slot or -1); the slots after route_bytes.
__device__ __forceinline__ int32_t* route_of(uint8_t* block) { return reinterpret_cast<int32_t*>(block + 16); }
__device__ __forceinline__ uint8_t* compact_slot(const MoeNodesArgs& a, uint8_t* block, int32_t c) {
  return block + a.route_bytes + int64_t(c) * moe_slot_bytes(a.ex.hidden);
}

// Warp per (token, target): targets [0, G) the node's ranks by local index (the one-node slot), then
// [G, G + N) the nodes (a compact slot in rail_out[m] with the token's k global ids, where one of its
// experts is on node m; the route says -1 otherwise).
__global__ void __launch_bounds__(kThreads) dispatch_kernel(MoeNodesArgs a) {
  const MoeExchangeArgs& x = a.ex;
  const int32_t lane = threadIdx.x % 32, G = a.per_node, targets = G + a.nodes;
  const int64_t slot_bytes = moe_slot_bytes(x.hidden);
  for (int64_t i = moe_warp(); i < int64_t(x.tokens) * targets; i += moe_warps()) {
    const int32_t t = int32_t(i / targets), k = int32_t(i % targets);
    int32_t ids[kMoeMaxTopk];
    float w[kMoeMaxTopk];
    moe_load_pairs(x.topk_ids, x.topk_weights, t, x.topk, x.local_experts, x.world, ids, w);
    const bf16* row = x.x + int64_t(t) * x.hidden;
    if (k < G) {
      const int32_t d = a.rank_at[a.node * G + k];
      const MoeDispatchMeta meta = moe_dispatch_meta(x.rank, t, ids, w, x.topk, x.local_experts, d);
      moe_write_slot(x.recv[d] + (int64_t(x.rank) * x.tokens + t) * slot_bytes, meta, row, x.hidden, lane);
      continue;
    }
    const int32_t m = k - G;
    if (m == a.node) continue;
    MoeDispatchMeta meta{};
    meta.src_rank = x.rank, meta.src_token = t;
    for (int32_t j = 0; j < kMoeMaxTopk; ++j) {
      meta.local_expert[j] = j < x.topk ? ids[j] : -1;  // global ids: the relay makes each owner's header
      meta.weight[j] = j < x.topk ? w[j] : 0.f;
      meta.pairs += j < x.topk && owner_node(a, ids[j]) == m ? 1 : 0;
    }
    uint8_t* block = a.rail_out + int64_t(m) * a.block_bytes;
    int32_t c = -1;
    if (meta.pairs > 0 && lane == 0) c = atomicAdd(a.rail_counts + m, 1);
    c = __shfl_sync(0xffffffffu, c, 0);
    if (lane == 0) route_of(block)[t] = c;
    if (c >= 0) moe_write_slot(compact_slot(a, block, c), meta, row, x.hidden, lane);
  }
}

// Thread i < G: flag `index` of the node's rank with local index i = epoch, after this rank's writes
// (the kernel before this one has completed; the fence orders them before the flag).
__global__ void signal_node_kernel(MoeNodesArgs a, int32_t index) {
  const int32_t i = threadIdx.x;
  if (i >= a.per_node) return;
  __threadfence_system();
  flag_store_release(a.ex.flags[a.rank_at[a.node * a.per_node + i]] + index, *a.ex.epoch);
}

// Thread (m, ch) = (threadIdx.x / C, threadIdx.x % C), m != node: piece ch of this call's block to
// node m's relay (phase 0), or of the relay's sums to node m's home (phase 1), as a put + signal on
// channel ch (pieces of whole 4 KiB, the last shorter; a piece may be empty, its signal still goes).
// The combine push (the call's last) notes the nodes it served in the launch record (shards), what
// `weftrun run` reads back as the hierarchical variant. The first failed push is recorded in
// push_error as one word (its peer and status together, so the host never reads half of it).
__global__ void rail_push_kernel(FrameParams f, MoeNodesArgs a, int32_t phase) {
  if (phase == 1) frame_note_schedule(f, a.nodes, 0, 0);
  const int32_t C = a.channels, m = int32_t(threadIdx.x) / C, ch = int32_t(threadIdx.x) % C;
  if (m >= a.nodes || m == a.node) return;
  const int32_t peer = a.rank_at[m * a.per_node + a.local];
  const uint64_t epoch = *a.ex.epoch;
  uint64_t src, dst, bytes, flag;
  if (phase == 0) {
    uint8_t* block = a.rail_out + int64_t(m) * a.block_bytes;
    const int32_t count = a.rail_counts[m];
    if (ch == 0) *reinterpret_cast<int32_t*>(block) = count;  // in piece 0, which this thread puts
    src = a.rail_out_off + uint64_t(m) * a.block_bytes;
    dst = a.rail_in_off + uint64_t(a.node) * a.block_bytes;
    bytes = uint64_t(a.route_bytes) + uint64_t(count) * uint64_t(moe_slot_bytes(a.ex.hidden));
    flag = a.rail_flags_off + (uint64_t(a.node) * C + ch) * 8;
  } else {
    int32_t count = *reinterpret_cast<const int32_t*>(a.rail_in + int64_t(m) * a.block_bytes);
    count = count < 0 ? 0 : count > a.ex.tokens ? a.ex.tokens : count;  // a corrupt count stays in the region
    const uint64_t rows = uint64_t(a.ex.tokens) * a.ex.hidden * 2;
    src = a.comb_out_off + uint64_t(m) * rows;
    dst = a.comb_in_off + uint64_t(a.node) * rows;
    bytes = uint64_t(count) * a.ex.hidden * 2;
    flag = a.rail_flags_off + ((uint64_t(a.nodes) + a.node) * C + ch) * 8;
  }
  const uint64_t piece = ((bytes + C - 1) / C + 4095) & ~uint64_t(4095);
  const uint64_t lo = piece * ch < bytes ? piece * ch : bytes, hi = lo + piece < bytes ? lo + piece : bytes;
  __threadfence_system();
  const int rc = transport::device::push_put_signal<false>(a.fifo[ch], peer, src + lo, dst + lo, hi - lo, flag, epoch);
  if (rc != transport::device::kOk) {
    atomicCAS(a.push_error, 0ull, uint64_t(uint32_t(peer)) << 32 | uint32_t(rc));
    __threadfence_system();
  }
}

// Thread (m, ch), m != node: waits (bounded) for node m's rail flag of this phase (0 dispatch, 1
// combine) on channel ch.
__global__ void rail_wait_kernel(FrameParams f, MoeNodesArgs a, int32_t phase) {
  const int32_t C = a.channels, m = int32_t(threadIdx.x) / C, ch = int32_t(threadIdx.x) % C;
  if (m >= a.nodes || m == a.node) return;
  const int32_t i = (phase * a.nodes + m) * C + ch;
  frame_wait_flag(f, a.rail_flags + i, *a.ex.epoch, Role::kInterSend, phase, a.rank_at[m * a.per_node + a.local],
                  kMoeRailFlag + i);
}

// Thread i < G: waits (bounded) for the combine flag of the node's rank with local index i.
__global__ void node_combine_wait_kernel(FrameParams f, MoeNodesArgs a) {
  const int32_t i = threadIdx.x;
  if (i >= a.per_node) return;
  const int32_t q = a.rank_at[a.node * a.per_node + i];
  const int32_t index = moe_combine_flag(a.ex.world, q);
  frame_wait_flag(f, a.ex.flags[a.ex.rank] + index, *a.ex.epoch, Role::kIntraComm, -1, q, index);
}

// Warp per (node m, token t), m != node: the relay writes remote home h = (m, local)'s token t into
// every node rank's receive slot [h][t]: the header that rank's experts make of it (pairs 0 where it
// owns none, or where h sent nothing for t) and the row where it has pairs. A compact index outside
// the block (a corrupt message) counts as nothing sent.
__global__ void __launch_bounds__(kThreads) forward_kernel(MoeNodesArgs a) {
  const MoeExchangeArgs& x = a.ex;
  const int32_t lane = threadIdx.x % 32, G = a.per_node;
  const int64_t slot_bytes = moe_slot_bytes(x.hidden);
  for (int64_t i = moe_warp(); i < int64_t(a.nodes) * x.tokens; i += moe_warps()) {
    const int32_t m = int32_t(i / x.tokens), t = int32_t(i % x.tokens);
    if (m == a.node) continue;
    const int32_t h = a.rank_at[m * G + a.local];
    uint8_t* block = a.rail_in + int64_t(m) * a.block_bytes;
    const int32_t count = *reinterpret_cast<const int32_t*>(block);
    int32_t c = route_of(block)[t];
    if (c >= count || c >= x.tokens) c = -1;
    int32_t ids[kMoeMaxTopk];
    float w[kMoeMaxTopk] = {};
    const uint8_t* slot = c >= 0 ? compact_slot(a, block, c) : nullptr;
    for (int32_t j = 0; j < x.topk; ++j) {
      ids[j] = slot ? moe_slot_meta(slot, x.hidden)->local_expert[j] : -1;
      w[j] = slot ? moe_slot_meta(slot, x.hidden)->weight[j] : 0.f;
      if (ids[j] < 0 || ids[j] >= x.local_experts * x.world) ids[j] = -x.local_experts * (x.world + 1);
    }
    for (int32_t l = 0; l < G; ++l) {
      const int32_t d = a.rank_at[a.node * G + l];
      const MoeDispatchMeta meta = moe_dispatch_meta(h, t, ids, w, x.topk, x.local_experts, d);
      moe_write_slot(x.recv[d] + (int64_t(h) * x.tokens + t) * slot_bytes, meta, reinterpret_cast<const bf16*>(slot),
                     x.hidden, lane);
    }
  }
}

// Thread q < N G: after the forward, dispatch flag h (remote home (m, local)) on the node's rank with
// local index l (q = m G + l), m != node.
__global__ void signal_forwarded_kernel(MoeNodesArgs a) {
  const int32_t q = threadIdx.x, G = a.per_node;
  if (q >= a.nodes * G || q / G == a.node) return;
  __threadfence_system();
  const int32_t h = a.rank_at[(q / G) * G + a.local];
  flag_store_release(a.ex.flags[a.rank_at[a.node * G + q % G]] + moe_dispatch_flag(h), *a.ex.epoch);
}

// Warp per received slot with pairs: the pre-sum of its local experts' rows (moe_sum_pairs) to the
// home's combine row (home on this node) or to the relay's node_comb row of the home's node and this
// rank's local index (home elsewhere; the relay is this node's rank with the home's local index).
__global__ void __launch_bounds__(kThreads) combine_kernel(MoeNodesArgs a) {
  const MoeExchangeArgs& x = a.ex;
  const int32_t lane = threadIdx.x % 32, G = a.per_node;
  const int64_t slots = int64_t(x.world) * x.tokens, slot_bytes = moe_slot_bytes(x.hidden);
  for (int64_t s = moe_warp(); s < slots; s += moe_warps()) {
    const MoeDispatchMeta* m = moe_slot_meta(x.recv[x.rank] + s * slot_bytes, x.hidden);
    if (m->pairs == 0) continue;
    const MoeSlotPairs pairs = moe_slot_pairs(m, x.slot_pos + s * x.topk, x.topk);
    const int32_t src = int32_t(s / x.tokens), t = int32_t(s % x.tokens), n = a.node_of[src];
    bf16* dst = n == a.node ? x.comb[src] + (int64_t(x.rank) * x.tokens + t) * x.hidden
                            : a.node_comb[a.rank_at[a.node * G + a.local_of[src]]] +
                                  ((int64_t(n) * G + a.local) * x.tokens + t) * x.hidden;
    moe_sum_pairs(pairs, x.grouped_y, x.hidden, dst, lane);
  }
}

// Warp per (node m, token t) that home (m, local) sent here: Σ over the node's ranks in local order
// that own one of t's experts of their node_comb rows (fp32, rounded once), into comb_out[m][c].
__global__ void __launch_bounds__(kThreads) relay_sum_kernel(MoeNodesArgs a, const bf16* node_comb) {
  const MoeExchangeArgs& x = a.ex;
  const int32_t lane = threadIdx.x % 32, G = a.per_node;
  const int64_t vecs = x.hidden / 8;
  for (int64_t i = moe_warp(); i < int64_t(a.nodes) * x.tokens; i += moe_warps()) {
    const int32_t m = int32_t(i / x.tokens), t = int32_t(i % x.tokens);
    if (m == a.node) continue;
    uint8_t* block = a.rail_in + int64_t(m) * a.block_bytes;
    const int32_t count = *reinterpret_cast<const int32_t*>(block), c = route_of(block)[t];
    if (c < 0 || c >= count || c >= x.tokens) continue;
    const MoeDispatchMeta* meta = moe_slot_meta(compact_slot(a, block, c), x.hidden);
    uint32_t owners = 0;  // local indexes of the node's ranks that own one of t's experts
    for (int32_t j = 0; j < x.topk; ++j) {
      const int32_t id = meta->local_expert[j];
      if (id >= 0 && id < x.local_experts * x.world && a.node_of[id / x.local_experts] == a.node)
        owners |= 1u << a.local_of[id / x.local_experts];
    }
    int4* dst = reinterpret_cast<int4*>(a.comb_out + (int64_t(m) * x.tokens + c) * x.hidden);
    for (int64_t v = lane; v < vecs; v += 32) {
      float acc[8] = {};
      for (int32_t l = 0; l < G; ++l)
        if (owners >> l & 1u)
          add_scaled(
              acc, reinterpret_cast<const int4*>(node_comb + ((int64_t(m) * G + l) * x.tokens + t) * x.hidden)[v], 1.f);
      dst[v] = to_bf16x8(acc);
    }
  }
}

// Warp per token: out[t] = Σ in node order of the own node's combine rows (local-index order) and each
// remote node's summed row (comb_in at the token's compact slot there, rounded to bf16 by its relay),
// in fp32, rounded once.
__global__ void __launch_bounds__(kThreads) home_reduce_kernel(MoeNodesArgs a) {
  const MoeExchangeArgs& x = a.ex;
  const int32_t lane = threadIdx.x % 32, G = a.per_node;
  const int64_t vecs = x.hidden / 8;
  for (int64_t t = moe_warp(); t < x.tokens; t += moe_warps()) {
    const uint32_t dests = moe_token_dests(x.topk_ids, int32_t(t), x.topk, x.local_experts, x.world);
    int4* dst = reinterpret_cast<int4*>(x.out + t * x.hidden);
    for (int64_t v = lane; v < vecs; v += 32) {
      float acc[8] = {};
      for (int32_t m = 0; m < a.nodes; ++m) {
        if (m == a.node) {
          for (int32_t l = 0; l < G; ++l) {
            const int32_t q = a.rank_at[m * G + l];
            if (dests >> q & 1u)
              add_scaled(acc, reinterpret_cast<const int4*>(x.comb[x.rank] + (int64_t(q) * x.tokens + t) * x.hidden)[v],
                         1.f);
          }
          continue;
        }
        const int32_t c = route_of(a.rail_out + int64_t(m) * a.block_bytes)[t];
        if (c >= 0)
          add_scaled(acc, reinterpret_cast<const int4*>(a.comb_in + (int64_t(m) * x.tokens + c) * x.hidden)[v], 1.f);
      }
      dst[v] = to_bf16x8(acc);
    }
  }
}

Status check(const MoeNodesArgs& a) {
  const MoeExchangeArgs& x = a.ex;
  bool ok = a.nodes >= 2 && a.per_node >= 1 && a.nodes * a.per_node == x.world && x.world <= MoeNodesArgs::kMaxRanks &&
            a.node >= 0 && a.node < a.nodes && a.local >= 0 && a.local < a.per_node && a.rail_out && a.rail_in &&
            a.comb_out && a.comb_in && a.rail_flags && a.rail_counts && a.push_error && a.block_bytes > 0 &&
            a.route_bytes >= 16 + 4 * int64_t(x.tokens) && x.epoch && x.recv[x.rank] && x.flags[x.rank] && x.x &&
            x.out && x.topk_ids && x.topk_weights && x.slot_pos && x.grouped_y && a.channels >= 1 &&
            a.channels <= MoeNodesArgs::kMaxChannels;
  for (int ch = 0; ok && ch < a.channels; ++ch) ok = a.fifo[ch].slots != nullptr;
  for (int m = 0; ok && m < a.nodes; ++m)
    for (int l = 0; ok && l < a.per_node; ++l) {
      const int q = a.rank_at[m * a.per_node + l];
      ok = q >= 0 && q < x.world && a.node_of[q] == m && a.local_of[q] == l &&
           (m != a.node || (x.recv[q] && x.comb[q] && x.flags[q] && a.node_comb[q]));
    }
  if (!ok) {
    WEFT_WARN(kKernel, "rank %d: moe across nodes: invalid arguments (%d nodes x %d, node %d local %d)", x.rank,
              a.nodes, a.per_node, a.node, a.local);
    return Status::kInvalidArgument;
  }
  return Status::kOk;
}

Status launched(const char* what, int rank) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return Status::kOk;
  WEFT_WARN(kKernel, "rank %d: moe across nodes: %s: launch failed: %s", rank, what, cudaGetErrorString(e));
  return Status::kCudaError;
}

}  // namespace

Status launch_moe_nodes_dispatch(const MoeNodesArgs& a, const FrameParams& frame, cudaStream_t s) {
  WEFT_CHECK(check(a));
  const int rank = a.ex.rank;
  if (cudaMemsetAsync(a.rail_counts, 0, sizeof(int32_t) * a.nodes, s) != cudaSuccess)
    return launched("counts memset", rank);
  dispatch_kernel<<<moe_grid_for(int64_t(a.ex.tokens) * (a.per_node + a.nodes), kThreads), kThreads, 0, s>>>(a);
  WEFT_CHECK(launched("dispatch", rank));
  signal_node_kernel<<<1, 32, 0, s>>>(a, moe_dispatch_flag(rank));
  WEFT_CHECK(launched("dispatch signal", rank));
  rail_push_kernel<<<1, a.nodes * a.channels, 0, s>>>(frame, a, 0);
  WEFT_CHECK(launched("dispatch push", rank));
  rail_wait_kernel<<<1, a.nodes * a.channels, 0, s>>>(frame, a, 0);
  WEFT_CHECK(launched("dispatch rail wait", rank));
  forward_kernel<<<moe_grid_for(int64_t(a.nodes) * a.ex.tokens, kThreads), kThreads, 0, s>>>(a);
  WEFT_CHECK(launched("forward", rank));
  signal_forwarded_kernel<<<1, 32, 0, s>>>(a);
  return launched("forward signal", rank);
}

Status launch_moe_nodes_combine(const MoeNodesArgs& a, const FrameParams& frame, cudaStream_t s) {
  WEFT_CHECK(check(a));
  const int rank = a.ex.rank;
  combine_kernel<<<moe_grid_for(int64_t(a.ex.world) * a.ex.tokens, kThreads), kThreads, 0, s>>>(a);
  WEFT_CHECK(launched("combine", rank));
  signal_node_kernel<<<1, 32, 0, s>>>(a, moe_combine_flag(a.ex.world, rank));
  WEFT_CHECK(launched("combine signal", rank));
  node_combine_wait_kernel<<<1, 32, 0, s>>>(frame, a);
  WEFT_CHECK(launched("combine wait", rank));
  relay_sum_kernel<<<moe_grid_for(int64_t(a.nodes) * a.ex.tokens, kThreads), kThreads, 0, s>>>(a, a.node_comb[rank]);
  WEFT_CHECK(launched("relay sum", rank));
  rail_push_kernel<<<1, a.nodes * a.channels, 0, s>>>(frame, a, 1);
  WEFT_CHECK(launched("combine push", rank));
  rail_wait_kernel<<<1, a.nodes * a.channels, 0, s>>>(frame, a, 1);
  WEFT_CHECK(launched("combine rail wait", rank));
  home_reduce_kernel<<<moe_grid_for(a.ex.tokens, kThreads), kThreads, 0, s>>>(a);
  return launched("home reduce", rank);
}

}  // namespace weft::kernels
