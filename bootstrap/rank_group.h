// Rank groups: which group of an N x G tiling of the job a rank belongs to, and its place in it (pure math).
#pragma once

#include <vector>

namespace weft::bootstrap {

// The job's ranks are numbered in block placement: rank = node * gpus_per_node + local_rank. A group
// of group_nodes x group_gpus takes group_gpus consecutive local ranks on each of group_nodes
// consecutive nodes; the groups tile the job (the job's sides are multiples of the group's):
//
//   job 2 nodes x 8, group 1 x 4          job 4 nodes x 8, group 2 x 8
//   node 0: ranks 0-3 g0 | ranks 4-7 g1   nodes 0,1: ranks 0-15  g0
//   node 1: ranks 8-11 g2| ranks 12-15 g3 nodes 2,3: ranks 16-31 g1
//
// Groups are numbered node-block major: group = (node / group_nodes) * (gpus_per_node / group_gpus)
// + local_rank / group_gpus. Inside a group, ranks are numbered the same way as in the job: group
// rank = (node % group_nodes) * group_gpus + local_rank % group_gpus, so a group is itself a job in
// block placement.
struct GroupShape {
  int nodes = 1;          // the job's nodes
  int gpus_per_node = 1;  // the job's ranks per node
  int group_nodes = 1;    // nodes of one group
  int group_gpus = 1;     // ranks per node of one group

  int world_size() const { return nodes * gpus_per_node; }
  int group_size() const { return group_nodes * group_gpus; }
  int groups_per_node_block() const { return group_gpus > 0 ? gpus_per_node / group_gpus : 0; }
  int num_groups() const {
    return group_nodes > 0 && group_gpus > 0 ? (nodes / group_nodes) * (gpus_per_node / group_gpus) : 0;
  }
  // Every side at least 1 and the job's sides multiples of the group's.
  bool valid() const {
    return nodes >= 1 && gpus_per_node >= 1 && group_nodes >= 1 && group_gpus >= 1 && nodes % group_nodes == 0 &&
           gpus_per_node % group_gpus == 0;
  }
};

// Where one job rank sits: its group and its identity inside it (node and local rank within the group).
struct GroupPosition {
  int group = 0;
  int rank = 0;        // within the group
  int node = 0;        // within the group, 0..group_nodes-1
  int local_rank = 0;  // within the group's share of the node, 0..group_gpus-1
};

// Position of job rank `rank` (0..world_size-1) under a valid shape.
inline GroupPosition group_position(const GroupShape& s, int rank) {
  const int node = rank / s.gpus_per_node, local = rank % s.gpus_per_node;
  GroupPosition p;
  p.group = (node / s.group_nodes) * s.groups_per_node_block() + local / s.group_gpus;
  p.node = node % s.group_nodes;
  p.local_rank = local % s.group_gpus;
  p.rank = p.node * s.group_gpus + p.local_rank;
  return p;
}

// The job rank of rank `group_rank` of group `group` (the inverse of group_position).
inline int job_rank(const GroupShape& s, int group, int group_rank) {
  const int per_block = s.groups_per_node_block();
  const int node = (group / per_block) * s.group_nodes + group_rank / s.group_gpus;
  const int local = (group % per_block) * s.group_gpus + group_rank % s.group_gpus;
  return node * s.gpus_per_node + local;
}

// The job ranks of one group, in group-rank order.
inline std::vector<int> group_members(const GroupShape& s, int group) {
  std::vector<int> out;
  out.reserve(static_cast<size_t>(s.group_size()));
  for (int r = 0; r < s.group_size(); ++r) out.push_back(job_rank(s, group, r));
  return out;
}

}  // namespace weft::bootstrap
