// AllGather+GEMM as a runtime op: created once from a Plan on a Context, run many times on the
// caller's buffers and stream.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "base/status.h"
#include "kernels/frame.h"
#include "kernels/gemm_types.h"
#include "runtime/exec/ag_gemm_nodes.h"
#include "runtime/exec/context.h"
#include "runtime/exec/launch_record.h"
#include "runtime/plan.h"

namespace weft::runtime {

class CallClock;

// C_r = gather(A) · B_rᵀ on one node: rank r holds A_r (m/W × k) and B_r (n/W × k) and gets C_r
// (m × n/W), all bf16 row-major. The words between ranks are tokens: set to 1 by one side, reset to 0
// by the other before it lets the first side set them again. One call on the caller's stream S
// (copy engines):
//
//   S:    A_r into the heap (unless the caller wrote it there: shard())
//   copy: for q = r-1, r-2, ... (the order the peers' GEMMs need A_r): wait consumed[q] = 1 (q's last
//         GEMM is done with A_r's rows), reset it ─► push A_r into q's gathered A ─► gate[r] = 1 in q
//   S:    GEMM on every compute SM, shard r first, each peer's shard behind its gate ─► gates to 0 ─►
//         consumed[r] = 1 in every peer ─► join the copy stream
//
// No wait depends on a peer's current call: a call's pushes start as soon as it starts.
// Across nodes the op is AgGemmNodesOp (runtime/exec/ag_gemm_nodes.h), which this one runs for a
// plan of more than one node.
//
// Every value is a constant, so a call can be captured in a CUDA graph and replayed. SM movers: the
// peers' shards are pulled by the plan's intra_comm blocks inside the GEMM's launch
// (kernels/ag_gemm_fused.h, whose per-tile flags count launches: not capturable) once every peer's
// ready token is up (ready[q] = 1, then consumed as above). No allocation and no host
// synchronisation per call. Every rank calls run() the same number of times (it is collective).
class AgGemmOp {
 public:
  // Collective: reserves the plan's heap arena, clears its words and waits for every rank.
  static Status create(Context& ctx, const Plan& plan, std::unique_ptr<AgGemmOp>* out);
  ~AgGemmOp();  // waits for this op's work, releases the arena (destroy ops in the same order on every rank)
  AgGemmOp(const AgGemmOp&) = delete;
  AgGemmOp& operator=(const AgGemmOp&) = delete;

  // a: this rank's shard (any device buffer; shard() skips the copy), b: n/W x k, c: m x n/W.
  // Once S has passed the call, a may be overwritten.
  Status run(const __nv_bfloat16* a, const __nv_bfloat16* b, __nv_bfloat16* c, cudaStream_t stream);

  __nv_bfloat16* shard() const;  // this rank's rows of the gathered A, in the heap
  // All of A, shard_at(0) first: after a run has completed and until any rank's next call (the copy
  // engines' peers push their next shards into it as soon as this rank's GEMM is done).
  const __nv_bfloat16* gathered() const;
  int shard_at(int position) const;  // whose rows of A the gathered A holds at `position`
  int64_t shard_rows() const { return plan_.gemm.m / plan_.world_size; }

  // Starts counting launches afresh (synchronizes the device; not for the hot path).
  Status clear_launch_record();
  // The plan as the launches since clear_launch_record() ran it: roles, grid, cluster and variant
  // read back from the record the kernel writes, heap offsets from the op's allocation. Call after
  // the runs have completed.
  Status executed_plan(Plan* out) const;
  // Releases every stream wait of this op (after a peer failed), so the streams drain.
  void unstick();

 private:
  AgGemmOp() = default;
  Status make_gemm(const __nv_bfloat16* b);
  Status announce_shard(cudaStream_t s);  // ready[rank] = 1 in every peer, from `s`
  Status push_and_join(cudaStream_t s);   // the copy-engine call past its GEMM's launch
  Status run_copy_engines(const __nv_bfloat16* b, __nv_bfloat16* c, cudaStream_t s);
  Status run_sm_movers(const __nv_bfloat16* b, __nv_bfloat16* c, cudaStream_t s);
  void* resolve(const std::string& region, int rank) const;  // creation only: looks the region up by name

  std::unique_ptr<AgGemmNodesOp> nodes_;  // a plan across nodes: every call goes to it
  Context* ctx_ = nullptr;
  Plan plan_;
  int rank_ = 0, world_ = 1;
  int64_t m_ = 0, n_ = 0, k_ = 0;  // n_: this rank's columns
  uint64_t arena_ = 0, arena_bytes_ = 0;
  std::vector<HeapRegion> regions_;  // where the op put its buffers (offsets from the arena)
  // Those buffers in every rank's heap ([rank]; a peer's as mapped here), resolved once at creation:
  // a: the gathered A; gate (copy engines) or flags (SM movers), ready, consumed: the words.
  std::vector<__nv_bfloat16*> a_;
  std::vector<uint64_t*> gate_, flags_, ready_, consumed_;
  uint64_t epoch_ = 0;                // launches so far (the SM movers' per-tile flags)
  const __nv_bfloat16* b_ = nullptr;  // the B the GEMM's tensor maps were made for
  kernels::GemmParams gemm_{};
  kernels::FrameHost frame_;
  kernels::FrameParams frame_params_{};
  OpLaunchRecord record_;
  cudaStream_t copy_ = nullptr, side_ = nullptr;
  cudaStream_t clock_ = nullptr;  // the copy engines' start mark: off the pushes' path, never waits on a peer
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
  int watch_ = -1;  // the context's watchdog id
  // Calls started and finished on the device ([0], [1]; host-mapped, the start written by clock_ (the
  // copy engines) or the call's stream (SM movers), the finish by the call's stream; not during a capture): the
  // watchdog's clock for a call that waits without any device wait running, such as a kernel whose blocks cannot get
  // their SMs (watch_stalled).
  uint64_t* progress_host_ = nullptr;
  uint64_t* progress_dev_ = nullptr;
  uint64_t calls_ = 0;
  bool clocked_ = false;  // this call writes the words (not during a capture)
  Status clock_write(cudaStream_t s, bool finished);
  bool watch_stalled(CallClock* clock, std::string* why) const;
};

}  // namespace weft::runtime
