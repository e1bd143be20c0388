// AllGather+GEMM across nodes: the hierarchical runner (rail peers over the proxy, NVLink inside a node).
#include "launcher/op_registry.h"
#include "runtime/log.h"
#include "runtime/ops/ops.h"

namespace weft::runtime::ops {

Status run_ag_gemm_nodes(const launcher::RankContext&, const Workload&, bootstrap::Bootstrap& boot) {
  WEFT_WARN(kKernel, "rank %d: ag_gemm across %d nodes is not implemented yet; run it on one node (layout.nodes: 1)",
            boot.info().rank, boot.info().num_nodes);
  return Status::kUnsupported;
}

}  // namespace weft::runtime::ops
