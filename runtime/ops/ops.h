// The fused-op runners weftrun bench registers by op name (launcher/registrations.cpp).
#pragma once

#include <cstdint>

#include "base/status.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/rank_context.h"
#include "runtime/workload.h"

namespace weft::runtime::ops {

Status run_ag_gemm(const bootstrap::RankContext& ctx, const Workload& wl, bootstrap::Bootstrap& boot);
// ag_gemm when the job spans several nodes (the shards cross nodes through the proxy).
Status run_ag_gemm_nodes(const bootstrap::RankContext& ctx, const Workload& wl, bootstrap::Bootstrap& boot);
Status run_gemm_rs(const bootstrap::RankContext& ctx, const Workload& wl, bootstrap::Bootstrap& boot);
Status run_gemm_ar(const bootstrap::RankContext& ctx, const Workload& wl, bootstrap::Bootstrap& boot);
// The MoE layer on one node (moe_op.cpp): weft's op against NCCL all-to-all-v + cuBLAS and the bound.
Status run_moe(const bootstrap::RankContext& ctx, const Workload& wl, bootstrap::Bootstrap& boot);
// weftrun bench --seed: every runner's inputs from this seed instead of fresh ones (op_harness.cpp).
void set_bench_seed(uint64_t seed);

}  // namespace weft::runtime::ops
