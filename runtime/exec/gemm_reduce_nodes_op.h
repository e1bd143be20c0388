// GEMM+ReduceScatter and GEMM+AllReduce across nodes as a runtime op (the plan's "hierarchical"
// variant): RsNodes (runtime/exec/gemm_reduce_nodes.h) over a context's arena and transport.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <memory>

#include "base/status.h"
#include "runtime/exec/context.h"
#include "runtime/exec/gemm_reduce_nodes.h"
#include "runtime/exec/launch_record.h"
#include "runtime/plan.h"

namespace weft::runtime {

// A_r (m x k/W) and B_r (n x k/W) on every rank; C = Σ_r A_r · B_rᵀ. ReduceScatter: rank r gets rows
// [r m/W, (r+1) m/W); AllReduce: every rank all of C. One call on the caller's stream S: A_r into
// position order, the fused kernel (GEMM with staged partials, inter_send through the proxy), the
// copy engines' NVLink moves and gates on the op's streams (kernels/gemm_reduce_nodes_plan.h draws it;
// the "freed" words order every reuse, so calls run back to back), then the result copied to c.
// The flags carry the call's number: not capturable. Every rank calls run() alike.
class GemmReduceNodesOp {
 public:
  static Status create(Context& ctx, const Plan& plan, std::unique_ptr<GemmReduceNodesOp>* out);  // collective
  ~GemmReduceNodesOp();
  GemmReduceNodesOp(const GemmReduceNodesOp&) = delete;
  GemmReduceNodesOp& operator=(const GemmReduceNodesOp&) = delete;

  Status run(const __nv_bfloat16* a, const __nv_bfloat16* b, __nv_bfloat16* c, cudaStream_t stream);
  bool all_reduce() const { return core_.all_reduce; }
  __nv_bfloat16* heap_c() const { return core_.all_reduce ? core_.result() : nullptr; }
  Status clear_launch_record() { return record_.clear(); }
  Status executed_plan(Plan* out) const;
  void unstick() { core_.unstick(); }

 private:
  GemmReduceNodesOp() = default;
  Context* ctx_ = nullptr;
  Plan plan_;
  RsNodes core_;
  uint64_t arena_ = 0, arena_bytes_ = 0;
  OpLaunchRecord record_;
  cudaEvent_t done_ = nullptr;
  int watch_ = -1;
};

}  // namespace weft::runtime
