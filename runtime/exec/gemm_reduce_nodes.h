// GEMM+ReduceScatter / GEMM+AllReduce across nodes: the op's state and one call's schedule, over a
// symmetric heap and a transport it is given: the runtime op's (GemmReduceOp, a context's arena and
// transport) and the benchmark runner's (runtime/ops/gemm_reduce_nodes_bench.cpp, a context of its
// own). The design is drawn in kernels/gemm_reduce_nodes_plan.h.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/roles.h"
#include "base/status.h"
#include "bootstrap/bootstrap.h"
#include "kernels/gemm.h"
#include "kernels/gemm_reduce_nodes.h"
#include "kernels/gemm_reduce_nodes_plan.h"
#include "runtime/exec/context.h"
#include "runtime/plan.h"
#include "transport/cuda_transport.h"
#include "transport/transport.h"

namespace weft::runtime {

constexpr uint64_t kNeverFlag = ~0ull >> 1;  // a flag value no wait ever exceeds

struct RsNodes {
  using bf16 = __nv_bfloat16;
  bool all_reduce = false;
  int rank = 0, world = 1, pieces = 1, channels = 1;
  int64_t m = 0, n = 0, k_loc = 0, m_loc = 0, m_piece = 0;
  uint64_t tiles_per_piece = 0;
  uint64_t block_bytes = 0, piece_bytes = 0;  // one owner's rows of C, one piece of them
  kernels::RsNodesPlan plan;

  // Symmetric heap (offsets equal on every rank):
  //   partial  positions [0, lo) of this rank's partial (the rest of its M rows are never stored there)
  //   out      positions [lo, W): node sums of the rail rows, this rank's partial of its mates' rows,
  //            its own result (position W - 1)
  //   slots    nslots x positions [lo, W): staged partials (zero where the slot's source sends nothing)
  //   c        AllReduce: M x N in global row order
  //   flags    arrived[slot][pos][piece], mate_freed[W], rail_freed[W], c_arrived[W][piece]
  uint64_t partial_off = 0, out_off = 0, slots_off = 0, c_off = 0;
  uint64_t arrived_off = 0, mate_freed_off = 0, rail_freed_off = 0, c_arrived_off = 0;
  std::vector<HeapRegion> regions;  // the layout, offsets from the first region (size())
  char* heap_base = nullptr;        // this rank's heap (attach())
  std::vector<char*> heap_peers;    // every rank's heap as mapped here (nullptr on other nodes)
  transport::Transport* tp = nullptr;
  // The benchmark runner's own context (heap, transport and rings); the runtime op uses its caller's.
  std::unique_ptr<Context> own_ctx;

  bf16 *a = nullptr, *a_pos = nullptr, *b = nullptr;  // the runner's A (global row order), A in position order, B
  const bf16* gemm_b = nullptr;                       // the B kp.gemm's tensor maps were made for
  int32_t group_m = 16;
  bf16 *ref = nullptr, *ref_partial = nullptr, *scratch = nullptr;
  uint64_t *tiles = nullptr, *gate = nullptr;  // local, per shard (position x piece)
  kernels::RsNodesMessage* msgs = nullptr;     // device copy of the messages
  const uint64_t** waits = nullptr;            // device: the exchange-alone waits
  int num_msgs = 0, num_waits = 0;
  int32_t* push_err = nullptr;       // [status, peer], the device's view of push_err_host
  int32_t* push_err_host = nullptr;  // host-mapped: read without a CUDA call (the watchdog)
  // Written by the calling thread, read by the watchdog's (unstick): atomics.
  std::atomic<uint64_t> epoch{0}, tile_runs{0};
  std::atomic<bool> reported{false};  // unstick's report: once (the watchdog calls it every 100 ms)
  cudaStream_t main = nullptr, copy = nullptr, gates = nullptr, ag = nullptr, fwd = nullptr;
  cudaEvent_t fork = nullptr, joined[4] = {};
  kernels::GemmParams gemm_alone;  // weft's GEMM on A in global order, EpiStoreBf16 into scratch
  kernels::FrameHost frame;
  kernels::FrameParams frame_params;
  RoleCounts roles;
  kernels::RsNodesKernelParams kp;
  double host_us = 0;
  int64_t host_runs = 0;

  char* base() const { return heap_base; }
  char* peer_base(int r) const { return heap_peers[size_t(r)]; }
  template <typename T>
  T* at(uint64_t off) const {
    return reinterpret_cast<T*>(base() + off);
  }
  template <typename T>
  T* peer_at(int r, uint64_t off) const {
    return reinterpret_cast<T*>(peer_base(r) + off);
  }
  int nslots() const { return int(plan.slots.size()); }
  uint64_t out_region(int pos) const { return out_off + uint64_t(pos - plan.lo) * block_bytes; }
  uint64_t slot_region(int slot, int pos) const {
    return slots_off + (uint64_t(slot) * uint64_t(plan.reduce_rows()) + uint64_t(pos - plan.lo)) * block_bytes;
  }
  uint64_t arrived_flag(int slot, int pos, int j) const {
    return arrived_off + 8 * ((uint64_t(slot) * world + pos) * pieces + j);
  }
  uint64_t c_arrived_flag(int owner, int j) const { return c_arrived_off + 8 * (uint64_t(owner) * pieces + j); }
  int shard(int pos, int j) const { return pos * pieces + j; }
  // Whether slot `s` receives data at position `pos` (else its region there stays zero).
  bool slot_has_data(int s, int pos) const;
  bf16* result() const { return all_reduce ? at<bf16>(c_off) : at<bf16>(out_region(world - 1)); }
  int64_t result_elems() const { return all_reduce ? m * n : m_loc * n; }

  // Set all_reduce, rank, world, m, n, k_loc, m_loc first. Then, in order:
  // Collective: every rank's node and local index, this rank's plan.
  Status place(bootstrap::Bootstrap& boot);
  // Pieces (want 0: the most of at least 2 MiB each), channels and the heap layout from base_off on;
  // *end: where it ends. May be called again with another base_off (the same sizes).
  Status size(int want_pieces, int want_channels, uint64_t base_off, uint64_t* end);
  // The heap (this rank's base and every rank's as mapped here), the transport and its device rings.
  void attach(char* local, std::vector<char*> peers, transport::Transport* t,
              const std::vector<transport::DeviceFifo>& rings);
  // Streams, the local words and buffers, the kernel's arguments; `launch`: the record the kernel
  // writes (may be null). The op's heap region must be zeroed on every rank before the first call.
  Status prepare(const RoleCounts& roles, int32_t group_m, kernels::LaunchRecord* launch);
  // The GEMM's tensor maps for this B (again only when B changes).
  Status set_b(const bf16* b);
  // One run on `s`: the fused op (compute; A m x k_loc in global row order, B n x k_loc), or the
  // cross-node exchange alone (the same proxy messages, no GEMM, no NVLink moves). Host time accounted.
  Status enqueue(const bf16* a, const bf16* b, cudaStream_t s, bool compute);
  Status enqueue_gemm_alone();  // the benchmark runner's (runtime/ops/gemm_reduce_nodes_bench.cpp)
  // Poisons every buffer a run writes (results, staged data; the slots' zero regions stay zero).
  Status poison();
  // After a synchronized run: device timeouts (named), failed pushes, the proxies' first error.
  Status check(const char* what) const;
  // Reports (the first time) every flag this rank still waits for in the current epoch, then raises
  // the local ones so the streams drain (sync_bounded's unstick; the watchdog calls it again every
  // 100 ms while the context is poisoned).
  void unstick();
  Status sync(const char* what);

  RsNodes() = default;
  RsNodes(const RsNodes&) = delete;
  RsNodes& operator=(const RsNodes&) = delete;
  ~RsNodes();
};

}  // namespace weft::runtime
