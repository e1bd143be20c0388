// A rank's placement: its GPU, and per channel the NIC, port and proxy CPUs the mapping gives it.
#include <algorithm>

#include "topology/topology.h"

namespace weft::topology {
namespace {

constexpr int kPortActive = 4;  // IBV_PORT_ACTIVE

// The proxy CPUs for traffic through `nic` on behalf of `gpu` (either may be null).
std::string proxy_cpus(const Topology& topo, const Nic* nic, const Gpu* gpu) {
  std::string cpus;
  if (nic && nic->numa_node >= 0) cpus = numa_cpuset(topo, nic->numa_node);
  if (cpus.empty() && gpu && gpu->numa_node >= 0) cpus = numa_cpuset(topo, gpu->numa_node);
  if (cpus.empty() && nic) cpus = nic->cpuset;
  if (cpus.empty() && gpu) cpus = gpu->cpuset;
  return cpus;
}

ChannelPlacement channel_on(const Topology& topo, int nic_index, const Gpu* gpu) {
  ChannelPlacement c;
  const Nic* nic = nic_index >= 0 ? &topo.nics[nic_index] : nullptr;
  if (nic) {
    c.nic = nic_index;
    c.nic_name = nic->name;
    c.port = pick_port(*nic, &c.port_state);
  }
  c.cpuset = proxy_cpus(topo, nic, gpu);
  return c;
}

}  // namespace

const char* port_state_name(int state) {
  switch (state) {
    case 1:
      return "DOWN";
    case 2:
      return "INIT";
    case 3:
      return "ARMED";
    case 4:
      return "ACTIVE";
    case 5:
      return "ACTIVE_DEFER";
    default:
      return "unknown";
  }
}

int pick_port(const Nic& nic, int* state) {
  for (const NicPort& p : nic.ports)
    if (p.state == kPortActive) {
      *state = p.state;
      return p.number;
    }
  if (!nic.ports.empty()) {
    *state = nic.ports.front().state;
    return nic.ports.front().number;
  }
  *state = 0;
  return 1;
}

RankPlacement place_rank(const Topology& topo, const Mapping& mapping, const std::string& gpu_bus_id, int local_rank,
                         int channels) {
  RankPlacement out;
  channels = std::max(1, channels);
  local_rank = std::max(0, local_rank);
  const int ngpu = static_cast<int>(topo.gpus.size());
  const int nnic = static_cast<int>(topo.nics.size());
  if (!gpu_bus_id.empty()) {
    out.gpu = find_gpu(topo, gpu_bus_id);
    if (out.gpu < 0)
      out.note = "GPU " + gpu_bus_id + " is not in the topology (" + topo.source + ")";
    else
      out.gpu_from = "bus id";
  } else if (ngpu > 0) {
    out.gpu = local_rank % ngpu;
    out.gpu_from = "local rank";
  }
  const Gpu* gpu = out.gpu >= 0 ? &topo.gpus[out.gpu] : nullptr;
  if (gpu) out.gpu_bus_id = gpu->pci_bus_id;
  if (nnic == 0 && out.note.empty()) out.note = "no RDMA NIC in the topology (" + topo.source + ")";

  for (int c = 0; c < channels; ++c) {
    int nic = -1;
    if (gpu && out.gpu < static_cast<int>(mapping.gpus.size())) {
      const GpuNicLink& link = mapping.gpus[out.gpu];
      const auto& near = link.nearest_nics;
      if (!near.empty()) {
        // Rotate the equally near NICs so that channel 0 is the primary.
        auto at = std::find(near.begin(), near.end(), link.primary_nic);
        size_t first = at == near.end() ? 0 : static_cast<size_t>(at - near.begin());
        nic = near[(first + c) % near.size()];
      }
    } else if (!gpu && nnic > 0 && out.note.empty()) {
      nic = (local_rank * channels + c) % nnic;  // a CPU node: local ranks spread over the NICs
    }
    out.channels.push_back(channel_on(topo, nic, gpu));
  }
  return out;
}

}  // namespace weft::topology
