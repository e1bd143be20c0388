// Where a rank's transport channels go: the topology mapping's NIC, port and proxy CPUs for the rank's GPU.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "bootstrap/bootstrap.h"
#include "topology/topology.h"

namespace weft::transport {

// The GPU this process bound (launcher/rank.cpp records it when a rank starts); "" = none recorded.
void set_bound_gpu(const std::string& pci_bus_id);
std::string bound_gpu();

// The placement of this rank's `channels` channels from the topology (WEFT_TOPO_FILE, else the live
// machine; loaded once per process and file), for the GPU at `gpu_bus_id` ("" = bound_gpu(), else
// local rank % GPUs). A topology that does not load gives a placement with no NIC and a note.
topology::RankPlacement rank_placement(const bootstrap::RankInfo& me, const std::string& gpu_bus_id, int channels);

// The CPUs of `wanted` (hwloc list string) this process may run on (its affinity mask), as a list
// string; "" when none are (a topology from another machine, or a narrower cgroup) or wanted is "".
std::string usable_cpus(const std::string& wanted);

// What one channel ended up using, for `weftrun check` and logs.
struct ChannelUse {
  std::string nic;          // "mlx5_0", "" = none
  int port = 0;             // 0 = none
  int port_state = 0;       // as the topology saw it (topology::NicPort::state; 0 unknown)
  std::string cpus_wanted;  // from the mapping
  std::string cpus_used;    // what the proxy was pinned to ("" = not pinned)
  bool nic_used = false;    // the backend opened this NIC (ibverbs); false for socket / loopback
};
// "GPU 0000:03:00.0, NIC mlx5_0 port 1 (ibverbs), proxy CPUs 18-23,66-71": one line per rank.
std::string describe_placement(const topology::RankPlacement& p, const std::vector<ChannelUse>& channels,
                               const std::string& backend);

}  // namespace weft::transport
