// GEMM+ReduceScatter / GEMM+AllReduce across nodes for `weftrun bench`: the op's state and schedule
// are the runtime's (runtime/exec/gemm_reduce_nodes.h); the runner gives it a context of its own
// (heap, transport, rings), its random inputs and NCCL + cuBLAS's reference (gemm_reduce_nodes_op.cpp).
#pragma once

#include "bootstrap/bootstrap.h"
#include "bootstrap/rank_context.h"
#include "runtime/exec/gemm_reduce_nodes.h"
#include "runtime/workload.h"

namespace weft::runtime::ops {

using runtime::RsNodes;

// Collective: places the op (all_reduce, rank, world, m, n, k_loc, m_loc set), makes its own context
// (heap and transport: WEFT_GEMM_REDUCE_PIECES, WEFT_NET_CHANNELS, the workload's transport), the runner's
// buffers with random A and B, and the GEMM alone; `sms` compute + inter_send blocks.
Status setup_rs_nodes_bench(RsNodes& op, const Workload& wl, bootstrap::Bootstrap& boot, int sms);

}  // namespace weft::runtime::ops
