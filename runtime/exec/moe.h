// The MoE layer as a runtime op on one node: routing, dispatch, expert FFN (grouped GEMM) and combine.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "kernels/frame.h"
#include "kernels/gemm_types.h"
#include "kernels/grouped_gemm.h"
#include "kernels/moe_exchange.h"
#include "kernels/moe_ffn_combine.h"
#include "kernels/moe_nodes.h"
#include "kernels/moe_nodes_plan.h"
#include "kernels/moe_plan.h"
#include "runtime/exec/context.h"
#include "runtime/exec/launch_record.h"
#include "runtime/plan.h"

namespace weft::runtime {

// The rank's weights, on its GPU, read at creation (router, gate and up are re-laid out into the
// op's own buffers); `down` is used in place and must outlive the op.
struct MoeWeights {
  const __nv_bfloat16* router = nullptr;  // hidden x experts, row-major (every rank holds all of it)
  const __nv_bfloat16* gate = nullptr;    // local experts x ffn x hidden (nn.Linear layout)
  const __nv_bfloat16* up = nullptr;      // local experts x ffn x hidden
  const __nv_bfloat16* down = nullptr;    // local experts x hidden x ffn
};

// Rank r holds T = tokens / W tokens and experts [r L, (r + 1) L), L = experts / W. One call:
//   router on this rank's tokens: logits on the GEMM core (fp32), softmax, top-k, weights
//   renormalised over the k;
//   dispatch, arrange, grouped gate/up with SiLU·up, grouped down, combine (kernels/moe_exchange.h);
//   the plan's variant "staged" runs the FFN and the combine as launches in sequence, "ffn_combine"
//   as one persistent launch (kernels/moe_ffn_combine.h: a combine row starts once its tiles are
//   done, a token tile's home reduction once every owner's combine of it is), a GPU per rank;
//   "hierarchical" (2 or more nodes) the staged phases with dispatch and combine across nodes
//   (kernels/moe_nodes.h: a token crosses the NIC once per destination node, through the context's
//   transport, and is forwarded over NVLink there);
//   out[t] = Σ over t's top-k experts of weight × expert(x[t]).
// Receive slots, combine rows and the grouped rows live in the op's arena of the symmetric heap, laid
// out by kernels::moe_heap_layout from the plan's heap bytes: the worst case (every token of every
// rank may come here) when the budget allows, so no routing can overflow; otherwise counts first:
// the grouped rows the budget leaves, and a call whose routed rows need more fails (the context is
// poisoned with the rows needed and reserved) instead of dropping tokens. Capturable in a CUDA graph:
// the call's epoch is a device word the call raises, so a replayed call is a new call. No allocation and no host
// synchronisation per call; every rank calls run() alike.
class MoeOp {
 public:
  static Status create(Context& ctx, const Plan& plan, const MoeWeights& weights,
                       std::unique_ptr<MoeOp>* out);  // collective
  ~MoeOp();
  MoeOp(const MoeOp&) = delete;
  MoeOp& operator=(const MoeOp&) = delete;

  // x: T x hidden, out: T x hidden (bf16, row-major, the caller's device memory).
  Status run(const __nv_bfloat16* x, __nv_bfloat16* out, cudaStream_t stream);

  // The last call's routing (device memory, valid until the next call): T x topk ids and weights.
  const int32_t* topk_ids() const { return ids_; }
  const float* topk_weights() const { return weights_; }
  // The last call's lost rows (synchronizes; the tests assert 0): tokens the router gave fewer than
  // k experts, rows past the grouped capacity at the scatter and at the grouped GEMM.
  Status dropped(int64_t* out);
  int64_t capacity_rows() const { return capacity_; }
  uint64_t heap_bytes() const { return arena_bytes_; }
  const std::vector<HeapRegion>& heap() const { return regions_; }
  void unstick();
  // The plan as the last call ran it: roles and grid from the router GEMM's launch record (the
  // grouped GEMMs run on the same frame), the heap from this op's allocation.
  Status clear_launch_record();
  Status executed_plan(Plan* out) const;
  // Benchmarks: record events[0..5] on the stream at the start, after routing, dispatch, arrange
  // (the wait for every rank's dispatch included), the grouped GEMMs, and the combine (its wait
  // included) of every later call; nullptr stops it. The events must outlive the calls.
  void record_phases(const cudaEvent_t* events) { phases_ = events; }
  static constexpr int kPhases = 5;

 private:
  MoeOp() = default;
  Status alloc(void** p, size_t bytes);
  // Across nodes (runtime/exec/moe_nodes.cpp): the cross-node arguments over the arena's regions and
  // the context's transport (collective); a failed push or transport, said in *why.
  Status create_nodes(const kernels::MoeNodesPlacement& placement, const kernels::MoeNodesHeap& heap);
  bool network_failed(std::string* why) const;

  Context* ctx_ = nullptr;
  Plan plan_;
  int rank_ = 0, world_ = 1;
  int32_t tokens_ = 0, hidden_ = 0, ffn_ = 0, experts_ = 0, topk_ = 0, local_ = 0;
  int64_t capacity_ = 0;
  uint64_t arena_ = 0, arena_bytes_ = 0, flags_off_ = 0;
  std::vector<HeapRegion> regions_;
  std::vector<void*> owned_;
  const __nv_bfloat16* router_x_ = nullptr;  // the tokens router_gemm_'s tensor map was made for
  __nv_bfloat16* router_wt_ = nullptr;       // experts x hidden
  kernels::GemmParams router_gemm_{};
  __nv_bfloat16 *w13_ = nullptr, *x_ = nullptr, *h_ = nullptr, *y_ = nullptr;
  float *logits_ = nullptr, *weights_ = nullptr;
  int32_t *ids_ = nullptr, *router_counts_ = nullptr, *drops_ = nullptr;  // drops_: router, arrange, gemm
  int32_t *counts_ = nullptr, *offsets_ = nullptr, *cursor_ = nullptr, *slot_pos_ = nullptr;
  kernels::GroupedGemmParams up_{}, down_{};
  uint64_t* tile_done_ = nullptr;           // the one-launch FFN's per-row-tile counters and claim counter
  bool fused_ = false;                      // the plan's variant ffn_combine (kernels/moe_ffn_combine.h)
  kernels::MoeFfnCombineArgs comb_done_{};  // every rank's comb_done words (ex is set per call)
  kernels::MoeExchangeArgs ex_{};
  std::unique_ptr<kernels::MoeNodesArgs> nodes_;  // "hierarchical": the cross-node moves
  transport::Transport* tp_ = nullptr;            // the context's, for the hierarchical variant
  unsigned long long* push_error_ = nullptr;      // host-mapped: a failed FIFO push, peer << 32 | status
  kernels::FrameHost frame_;
  kernels::FrameParams frame_params_{};
  OpLaunchRecord record_;
  cudaEvent_t done_ = nullptr;
  cudaStream_t side_ = nullptr;
  int watch_ = -1;
  const cudaEvent_t* phases_ = nullptr;
};

}  // namespace weft::runtime
