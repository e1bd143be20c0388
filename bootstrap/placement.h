// Block placement: the check fused ops make before any work that the launcher put the same number of
// ranks on every node, numbered node by node, with the srun option that fixes each failure.
#pragma once

#include <string>
#include <vector>

#include "bootstrap/bootstrap.h"

namespace weft::bootstrap {

// Fused ops address peers as (node, local rank) = (rank / G, rank % G): they need G ranks on every
// node (srun --ntasks-per-node=G) and each node's ranks numbered consecutively (srun
// --distribution=block). `node_of_rank[r]` is the node the launcher put job rank r on;
// `gpus_per_node` the G expected (0: whatever every node holds, as long as it is the same).
// kOk, or kInvalidArgument with *why one line naming the placement seen ("3 + 1 ranks on 2 nodes",
// "node 0 holds ranks 0, 2") and the srun option that fixes it.
Status check_block_placement(const std::vector<int>& node_of_rank, int gpus_per_node, std::string* why);

// Gathers every rank's node (one job-wide allgather of 4 bytes per rank) and checks it as above; every
// rank reaches the same verdict. `what` names the op in the message ("ag_gemm").
Status require_block_placement(Bootstrap& boot, int gpus_per_node, const std::string& what, std::string* why);

// Collective: every rank's node and local index (*node_of, *local_of indexed by rank), for the plans of
// the ops across nodes (kernels/*_nodes_plan.h). kProtocolError, naming the rank, for a malformed entry.
Status gather_node_placement(Bootstrap& boot, std::vector<int>* node_of, std::vector<int>* local_of);

}  // namespace weft::bootstrap
