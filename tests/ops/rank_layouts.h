// Rank placements over nodes for the multi-node plan tests (which node and local index each rank has).
#pragma once

#include <vector>

namespace weft::testing {

struct Layout {
  std::vector<int> node_of, local_of;
};

// Ranks placed node by node (weftrun --emulate-nodes, srun --distribution=block).
inline Layout block(int nodes, int per_node) {
  Layout l;
  for (int n = 0; n < nodes; ++n)
    for (int i = 0; i < per_node; ++i) l.node_of.push_back(n), l.local_of.push_back(i);
  return l;
}

// Ranks dealt round-robin over nodes (srun --distribution=cyclic).
inline Layout cyclic(int nodes, int per_node) {
  Layout l;
  for (int r = 0; r < nodes * per_node; ++r) l.node_of.push_back(r % nodes), l.local_of.push_back(r / nodes);
  return l;
}

}  // namespace weft::testing
