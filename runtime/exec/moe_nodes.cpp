// MoeOp across nodes ("hierarchical"): the cross-node arguments over the arena's regions, the
// context's transport, and what the watchdog reads of the network.
#include "base/log.h"
#include "runtime/exec/cuda_check.h"
#include "runtime/exec/moe.h"
#include "transport/transport.h"

namespace weft::runtime {

Status MoeOp::create_nodes(const kernels::MoeNodesPlacement& pl, const kernels::MoeNodesHeap& h) {
  Context& ctx = *ctx_;
  const Plan& plan = plan_;
  std::unique_ptr<kernels::MoeNodesArgs> a(new kernels::MoeNodesArgs());
  a->nodes = pl.nodes, a->per_node = pl.per_node;
  a->node = pl.node_of[size_t(rank_)], a->local = pl.local_of[size_t(rank_)];
  for (int q = 0; q < world_; ++q) {
    a->node_of[q] = pl.node_of[size_t(q)], a->local_of[q] = pl.local_of[size_t(q)];
    a->rank_at[q] = pl.rank_at[size_t(q)];
    if (pl.node_of[size_t(q)] == a->node) {
      a->node_comb[q] = static_cast<__nv_bfloat16*>(ctx.peer(q, arena_ + uint64_t(h.node_comb_offset)));
      if (!a->node_comb[q]) {
        WEFT_WARN(kKernel, "rank %d: moe across nodes: node-mate %d's heap is not mapped here", rank_, q);
        return Status::kInvalidArgument;
      }
    }
  }
  auto at = [&](int64_t off) { return arena_ + uint64_t(off); };
  a->rail_out = static_cast<uint8_t*>(ctx.local(at(h.rail_out_offset)));
  a->rail_in = static_cast<uint8_t*>(ctx.local(at(h.rail_in_offset)));
  a->comb_out = static_cast<__nv_bfloat16*>(ctx.local(at(h.comb_out_offset)));
  a->comb_in = static_cast<__nv_bfloat16*>(ctx.local(at(h.comb_in_offset)));
  a->rail_flags = static_cast<uint64_t*>(ctx.local(at(h.flags_offset)));
  a->rail_out_off = at(h.rail_out_offset), a->rail_in_off = at(h.rail_in_offset);
  a->comb_out_off = at(h.comb_out_offset), a->comb_in_off = at(h.comb_in_offset);
  a->rail_flags_off = at(h.flags_offset);
  a->route_bytes = h.route_bytes, a->block_bytes = h.block_bytes;
  void* p = nullptr;
  WEFT_CHECK(alloc(&p, size_t(pl.nodes) * sizeof(int32_t)));
  a->rail_counts = static_cast<int32_t*>(p);
  WEFT_CUDA_CHECK(cudaHostAlloc(&push_error_, sizeof *push_error_, cudaHostAllocMapped));
  *push_error_ = 0;
  WEFT_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&a->push_error), push_error_, 0));
  // The transport between the nodes (collective on the context's first ask); a block moves in one
  // piece per channel.
  if (plan.exec.channels < 1 || plan.exec.channels > kernels::MoeNodesArgs::kMaxChannels) {
    WEFT_WARN(kKernel, "rank %d: moe across nodes: the plan's %d proxy channels (expected 1 to %d)", rank_,
              plan.exec.channels, kernels::MoeNodesArgs::kMaxChannels);
    return Status::kInvalidArgument;
  }
  WEFT_CHECK(ctx.transport(plan.exec.channels, plan.inter_backend, plan.exec.signal_mode, &tp_));
  a->channels = plan.exec.channels;
  for (int ch = 0; ch < a->channels; ++ch) a->fifo[ch] = ctx.fifo(ch);
  nodes_ = std::move(a);
  return Status::kOk;
}

bool MoeOp::network_failed(std::string* why) const {
  if (!nodes_) return false;
  const unsigned long long push = *reinterpret_cast<const volatile unsigned long long*>(push_error_);
  if (push != 0) {
    *why = "moe across nodes: rank " + std::to_string(rank_) + "'s FIFO push for rank " +
           std::to_string(int(push >> 32)) + " failed (" + to_string(static_cast<Status>(int32_t(push & 0xffffffffu))) +
           "): the proxy did not drain within WEFT_PROXY_TIMEOUT; " + tp_->error_message();
    return true;
  }
  if (tp_->status() != Status::kOk) {
    *why = "moe across nodes: rank " + std::to_string(rank_) + "'s transport failed: " + tp_->error_message();
    return true;
  }
  return false;
}

}  // namespace weft::runtime
