// GEMM+ReduceScatter and GEMM+AllReduce as runtime ops on one node: the plan's "peer" or "overlap" variant.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "kernels/frame.h"
#include "kernels/gemm_types.h"
#include "kernels/small_reduce_plan.h"
#include "runtime/call_clock.h"
#include "runtime/exec/context.h"
#include "runtime/exec/gemm_reduce_nodes_op.h"
#include "runtime/exec/launch_record.h"
#include "runtime/exec/reduce_overlap.h"
#include "runtime/plan.h"

namespace weft::runtime {

// Rank r holds A_r (m x k/W) and B_r (n x k/W); C = Σ_r A_r · B_rᵀ (m x n). ReduceScatter: rank r
// gets rows [r m/W, (r+1) m/W) of C; AllReduce: every rank gets all of C. bf16, row-major.
//
// peer:
//   S: GEMM on every compute SM: A_r · B_rᵀ into this rank's partial in the heap (two copies, by the
//      call's parity, so a call's GEMM never overwrites what a slow peer still reads of the last one)
//      reduction kernel (kernels/small_reduce_plan.h, launch_small_reduce), launched as a programmatic
//      dependent of the GEMM: one flag round (every rank's partial of this call is complete), then
//      every 16-byte vector of this rank's rows loaded from all W partials over NVLink and summed in
//      rank order (the same bits every run); AllReduce pushes the sum into every peer's C and ends
//      with a counted round. At most plan.reduce_blocks blocks of 512 threads.
//   The reduction starts after the GEMM.
// overlap (runtime/exec/reduce_overlap.h has the picture): the partial pieces move to their owners
//   while the GEMM runs, the own rows are reduced in its epilogue; AllReduce's C is gathered in the
//   heap and copied to the caller's c at the end.
//
// Across nodes the op is GemmReduceNodesOp (runtime/exec/gemm_reduce_nodes_op.h), which this one runs
// for a plan of more than one node.
//
// Both count calls in their flags (kernel arguments, stream waits): not capturable. No allocation
// and no host synchronisation per call; every rank calls run() alike.
class GemmReduceOp {
 public:
  static Status create(Context& ctx, const Plan& plan, std::unique_ptr<GemmReduceOp>* out);  // collective
  ~GemmReduceOp();
  GemmReduceOp(const GemmReduceOp&) = delete;
  GemmReduceOp& operator=(const GemmReduceOp&) = delete;

  // a: m x k/W, b: n x k/W, c: m/W x n (ReduceScatter) or m x n (AllReduce).
  Status run(const __nv_bfloat16* a, const __nv_bfloat16* b, __nv_bfloat16* c, cudaStream_t stream);
  bool all_reduce() const { return all_reduce_; }
  // AllReduce: C in the heap (run() copies it to c unless c is this); nullptr for ReduceScatter.
  __nv_bfloat16* heap_c() const { return nodes_ ? nodes_->heap_c() : all_reduce_ ? full_[size_t(rank_)] : nullptr; }
  Status clear_launch_record();
  Status executed_plan(Plan* out) const;  // as AgGemmOp::executed_plan
  void unstick();

 private:
  GemmReduceOp() = default;
  void* resolve(const std::string& name, int rank) const;  // creation only: looks the region up by name

  std::unique_ptr<GemmReduceNodesOp> nodes_;  // a plan across nodes: every call goes to it
  Context* ctx_ = nullptr;
  Plan plan_;
  bool all_reduce_ = false;
  int rank_ = 0, world_ = 1;
  int64_t m_ = 0, n_ = 0, k_loc_ = 0, m_loc_ = 0;
  uint64_t arena_ = 0, arena_bytes_ = 0;
  std::vector<HeapRegion> regions_;
  // Those regions in every rank's heap ([rank]; a peer's as mapped here), resolved once at creation.
  std::vector<__nv_bfloat16*> partial_, full_;  // full_: GEMM+AR's reduced C (empty for GEMM+RS)
  std::vector<uint64_t*> flags_;                // peer: the reduction's flag words
  kernels::SmallReducePlan small_{};            // peer: the reduction kernel's plan
  uint64_t gathered_ = 0;                       // peer, AllReduce: the pushes counted so far
  uint64_t epoch_ = 0;
  const __nv_bfloat16 *a_ = nullptr, *b_ = nullptr;  // what gemm_'s tensor maps were made for
  kernels::GemmParams gemm_{};
  kernels::FrameHost frame_;
  kernels::FrameParams frame_params_{};
  OpLaunchRecord record_;
  std::unique_ptr<ReduceOverlap> overlap_;  // the overlap variant's engine; null for peer
  OpLaunchRecord mover_record_;             // overlap with mover SMs: their launches'
  OpLaunchRecord reduce_record_;            // peer: the reduction kernel's launches
  Status create_overlap();                  // create(): the overlap variant's views, config and engine
  // Overlap: [0] the last call that started on the device, [1] the last that finished (host-mapped,
  // written by the stream); watch_stalled: whether one has been on the device longer than the clock's
  // timeout (runtime/call_clock.h).
  uint64_t* progress_host_ = nullptr;
  const volatile uint64_t* progress_ = nullptr;
  uint64_t* progress_dev_ = nullptr;
  uint64_t overlap_calls_ = 0;
  bool watch_stalled(CallClock* clock, std::string* why) const;
  cudaEvent_t done_ = nullptr;
  cudaStream_t side_ = nullptr;
  cudaStream_t clock_ = nullptr;   // writes the overlap call's start mark (never waits on a peer)
  cudaEvent_t started_ = nullptr;  // the overlap call's start, for clock_'s write
  int watch_ = -1;
};

}  // namespace weft::runtime
