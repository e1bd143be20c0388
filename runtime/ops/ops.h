// The fused-op runners weftrun registers by op name (launcher/op_registry.h).
#pragma once

#include "bootstrap/bootstrap.h"
#include "launcher/rank.h"
#include "runtime/status.h"
#include "runtime/workload.h"

namespace weft::runtime::ops {

Status run_ag_gemm(const launcher::RankContext& ctx, const Workload& wl, bootstrap::Bootstrap& boot);
// ag_gemm when the job spans several nodes (the shards cross nodes through the proxy).
Status run_ag_gemm_nodes(const launcher::RankContext& ctx, const Workload& wl, bootstrap::Bootstrap& boot);
Status run_gemm_rs(const launcher::RankContext& ctx, const Workload& wl, bootstrap::Bootstrap& boot);
Status run_gemm_ar(const launcher::RankContext& ctx, const Workload& wl, bootstrap::Bootstrap& boot);

}  // namespace weft::runtime::ops
