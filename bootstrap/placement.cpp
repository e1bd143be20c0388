// check_block_placement: how many ranks each node holds and in which order, against what fused ops need.
#include "bootstrap/placement.h"

#include <map>

#include "base/log.h"
#include "bootstrap/blob.h"

namespace weft::bootstrap {
namespace {

// "0, 2, 4" (at most 8 shown).
std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size() && i < 8; ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > 8) s += ", ... (" + std::to_string(ranks.size()) + " in all)";
  return s;
}

}  // namespace

Status check_block_placement(const std::vector<int>& node_of_rank, int gpus_per_node, std::string* why) {
  const int size = static_cast<int>(node_of_rank.size());
  std::map<int, std::vector<int>> ranks_of;  // node -> its ranks, ascending
  for (int r = 0; r < size; ++r) {
    if (node_of_rank[r] < 0 || node_of_rank[r] >= size) {
      *why = "rank " + std::to_string(r) + " reports node " + std::to_string(node_of_rank[r]) + " of a " +
             std::to_string(size) + "-rank job; expected 0 to " + std::to_string(size - 1);
      return Status::kInvalidArgument;
    }
    ranks_of[node_of_rank[r]].push_back(r);
  }
  if (size == 0) return Status::kOk;
  const int nodes = static_cast<int>(ranks_of.size());
  bool even = true;
  for (const auto& [node, ranks] : ranks_of) even = even && ranks.size() == ranks_of.begin()->second.size();
  const int per_node = static_cast<int>(ranks_of.begin()->second.size());
  const int want = gpus_per_node > 0 ? gpus_per_node : (size % nodes == 0 ? size / nodes : 0);
  if (!even || (gpus_per_node > 0 && per_node != gpus_per_node)) {
    std::string counts;
    for (const auto& [node, ranks] : ranks_of) counts += (counts.empty() ? "" : " + ") + std::to_string(ranks.size());
    *why = "uneven placement: " + counts + " ranks on " + std::to_string(nodes) + " node" + (nodes == 1 ? "" : "s") +
           "; fused ops need " + (want > 0 ? std::to_string(want) : std::string("the same number of")) +
           " ranks on every node: launch with srun --ntasks-per-node=" +
           (want > 0 ? std::to_string(want) : std::string("G")) +
           (want > 0 && size % want == 0 && size / want != nodes ? " --nodes=" + std::to_string(size / want)
                                                                 : std::string()) +
           " (or mpirun --map-by ppr:" + (want > 0 ? std::to_string(want) : std::string("G")) + ":node)";
    return Status::kInvalidArgument;
  }
  // Node k must hold ranks k*G .. k*G+G-1, and the nodes must be numbered in rank order.
  int expect_node = 0;
  for (int r = 0; r < size; r += per_node, ++expect_node) {
    const int node = node_of_rank[r];
    const std::vector<int>& ranks = ranks_of[node];
    const bool block = ranks.front() == r && ranks.back() == r + per_node - 1;
    if (!block) {
      *why = "ranks of a node are not numbered consecutively: node " + std::to_string(node) + " holds ranks " +
             rank_list(ranks) + "; fused ops need block placement (node k holds ranks k*" + std::to_string(per_node) +
             " to k*" + std::to_string(per_node) + "+" + std::to_string(per_node - 1) +
             "): launch with srun --distribution=block (or mpirun --map-by core)";
      return Status::kInvalidArgument;
    }
    if (node != expect_node) {
      *why = "nodes are not numbered in rank order: ranks " + std::to_string(r) + " to " +
             std::to_string(r + per_node - 1) + " are on node " + std::to_string(node) + ", expected node " +
             std::to_string(expect_node) + "; launch with srun --distribution=block";
      return Status::kInvalidArgument;
    }
  }
  return Status::kOk;
}

Status require_block_placement(Bootstrap& boot, int gpus_per_node, const std::string& what, std::string* why) {
  BlobWriter w;
  w.u32(static_cast<uint32_t>(boot.info().node));
  std::vector<Blob> all;
  const Status s = boot.allgather("weft.placement", w.blob(), &all);
  if (s != Status::kOk) {
    *why = "rank " + std::to_string(boot.info().rank) + ": the placement exchange failed (" + to_string(s) + ")";
    return s;
  }
  std::vector<int> node_of(all.size(), -1);
  for (size_t r = 0; r < all.size(); ++r) {
    BlobReader rd(all[r]);
    uint32_t node = 0;
    if (!rd.u32(&node) || !rd.done()) {
      *why = "rank " + std::to_string(r) + " sent a malformed placement entry";
      return Status::kProtocolError;
    }
    node_of[r] = static_cast<int>(node);
  }
  const Status c = check_block_placement(node_of, gpus_per_node, why);
  if (c != Status::kOk) *why = what + " refused before any work: " + *why;
  return c;
}

Status gather_node_placement(Bootstrap& boot, std::vector<int>* node_of, std::vector<int>* local_of) {
  BlobWriter w;
  w.u32(static_cast<uint32_t>(boot.info().node));
  w.u32(static_cast<uint32_t>(boot.info().local_rank));
  std::vector<Blob> all;
  WEFT_CHECK(boot.allgather("weft.node_placement." + std::to_string(boot.next_exchange_id()), w.blob(), &all));
  node_of->assign(all.size(), -1);
  local_of->assign(all.size(), -1);
  for (size_t r = 0; r < all.size(); ++r) {
    BlobReader rd(all[r]);
    uint32_t node = 0, local = 0;
    if (!rd.u32(&node) || !rd.u32(&local) || !rd.done()) {
      WEFT_WARN(kBoot, "rank %d: rank %zu sent a malformed placement entry", boot.info().rank, r);
      return Status::kProtocolError;
    }
    (*node_of)[r] = static_cast<int>(node);
    (*local_of)[r] = static_cast<int>(local);
  }
  return Status::kOk;
}

}  // namespace weft::bootstrap
