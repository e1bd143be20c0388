// AllGather+GEMM across nodes as a runtime op (the plan's "hierarchical" variant): created once from
// a Plan on a Context whose ranks span nodes, run many times on the caller's buffers and stream.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "base/status.h"
#include "kernels/ag_gemm_nodes.h"
#include "kernels/ag_gemm_nodes_plan.h"
#include "kernels/frame.h"
#include "runtime/exec/context.h"
#include "runtime/exec/launch_record.h"
#include "runtime/plan.h"

namespace weft::runtime {

// C_r = gather(A) · B_rᵀ: rank r holds A_r (m/W × k) and B_r (n/W × k) and gets C_r (m × n/W), all bf16
// row-major, C's rows in global order. The gathered A sits in the heap in this rank's order of
// positions (kernels/ag_gemm_nodes_plan.h): its own shard at position 0, then its node-mates', then
// every other node's. One call e on the caller's stream S (copy: the op's copy-engine stream):
//
//   S:    wait freed[q] >= e-1 for every node-mate and rail peer q (their run e-1 is over: they read
//         nothing of my position 0 any more, and my proxy has sent it) ─► A_r into position 0 ─►
//         my chunk flags = e ─► ready[r] = e in every node-mate
//   copy: for each node-mate q: wait ready[q] >= e ─► pull its position 0, chunk by chunk, each
//         followed by its flag = e
//   S:    the kernel (kernels/ag_gemm_nodes.h): inter_send puts A_r to the rail peers through the proxy,
//         intra_comm forwards what arrives to the node-mates over NVLink, compute runs the GEMM over
//         the positions, each chunk behind its flag ─► the end-of-run kernel: freed[r] = e in every
//         rail peer (a proxy signal) and node-mate (an NVLink store) ─► join copy
//
// The freed words are raised when a rank's kernel is done with the run, not at its start: waiting at
// the copy for words raised at the start deadlocks (each copy waits for the peers' next launch, which
// waits for their copies). tests/sim (AllGather+GEMM "as a runtime op") checks this protocol for races
// and deadlocks on 2x2 .. 4x8 layouts, back to back. The waits and writes carry the epoch: not
// capturable in a CUDA graph (run refuses under capture). Every rank calls run() the same number of
// times (it is collective). No allocation and no host synchronisation per call.
class AgGemmNodesOp {
 public:
  // Collective: the placement, the arena, the context's transport (made by the first such op).
  static Status create(Context& ctx, const Plan& plan, std::unique_ptr<AgGemmNodesOp>* out);
  ~AgGemmNodesOp();  // waits for this op's work, releases the arena (destroy ops in the same order everywhere)
  AgGemmNodesOp(const AgGemmNodesOp&) = delete;
  AgGemmNodesOp& operator=(const AgGemmNodesOp&) = delete;

  // a: this rank's shard (shard() skips the copy), b: n/W x k, c: m x n/W. Once S has passed the call,
  // a may be overwritten.
  Status run(const __nv_bfloat16* a, const __nv_bfloat16* b, __nv_bfloat16* c, cudaStream_t stream);

  __nv_bfloat16* shard() const { return position(0); }  // position 0, in the heap
  // The gathered A at `pos` (after a run has completed) and whose shard that position holds.
  __nv_bfloat16* position(int pos) const;
  int shard_at(int pos) const { return moves_.order[size_t(pos)]; }

  Status clear_launch_record();
  // The plan as the launches since clear_launch_record() ran it (read back from the kernel's record,
  // heap offsets from the op's allocation). Call after the runs have completed.
  Status executed_plan(Plan* out) const;
  // Releases every stream wait of this op (after a peer failed), so the streams drain.
  void unstick();

 private:
  AgGemmNodesOp() = default;
  Status make_gemm(const __nv_bfloat16* b);
  uint64_t* word(const char* region, int rank, int64_t index) const;  // a flag word of `rank`'s heap
  uint64_t offset_of(const char* region) const;                       // heap offset (arena included)
  // Destruction: every peer's freed word of the last call has landed (a rail peer's comes through its
  // proxy, after its kernel): an op made next on this arena, or the context's transport stopping,
  // meets none in flight. Bounded by WEFT_DEVICE_TIMEOUT; names the peers still missing.
  void await_last_freed() const;

  Context* ctx_ = nullptr;
  Plan plan_;
  kernels::AgNodesPlan moves_;
  int rank_ = 0, world_ = 1, chunks_ = 1;
  int64_t m_ = 0, n_ = 0, k_ = 0, m_loc_ = 0;  // n_: this rank's columns
  uint64_t shard_bytes_ = 0;
  uint64_t arena_ = 0, arena_bytes_ = 0;
  std::vector<HeapRegion> regions_;
  std::vector<int> mates_;  // node-mates (they pull my position 0; I pull theirs)
  uint64_t epoch_ = 0;
  const __nv_bfloat16* b_ = nullptr;  // the B the GEMM's tensor maps were made for
  kernels::AgNodesKernelParams kp_{};
  kernels::FrameHost frame_;
  OpLaunchRecord record_;
  transport::Transport* tp_ = nullptr;  // the context's
  int32_t* push_error_ = nullptr;       // host-mapped [status, peer]: a failed FIFO push
  cudaStream_t copy_ = nullptr, side_ = nullptr;
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
  int watch_ = -1;
};

}  // namespace weft::runtime
