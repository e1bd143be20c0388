// GEMM+ReduceScatter / GEMM+AllReduce across nodes.
#include "launcher/rank.h"
#include "runtime/log.h"
#include "runtime/ops/gemm_reduce.h"

namespace weft::runtime::ops {

Status run_gemm_reduce_nodes(const launcher::RankContext& ctx, const Workload& wl, bootstrap::Bootstrap& boot,
                             bool all_reduce) {
  (void)ctx;
  (void)wl;
  const auto& info = boot.info();
  WEFT_WARN(kKernel, "rank %d: %s across %d nodes needs the proxy path, which the fused kernel does not drive yet; "
            "run it on one node (layout.nodes: 1)", info.rank, all_reduce ? "gemm_ar" : "gemm_rs", info.num_nodes);
  return Status::kUnsupported;
}

}  // namespace weft::runtime::ops
