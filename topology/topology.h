// The machine as weft sees it: GPUs, NICs, NUMA nodes and the GPU->NIC mapping (no CUDA, no hwloc types).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace weft::topology {

// How near a NIC is to a GPU in the PCI tree; smaller is nearer.
enum class Proximity : int { kSameSwitch = 0, kSameHostBridge = 1, kSameNuma = 2, kOther = 3 };
const char* to_string(Proximity p);

struct Gpu {
  int index = 0;           // order in the topology (PCI bus id order), matched to CUDA ordinals by bus id
  std::string pci_bus_id;  // "0000:44:00.0", lower case
  std::string name;        // OS device name if hwloc has one ("cuda0", "nvml0"), else the PCI model string
  int numa_node = -1;      // OS index of the nearest NUMA node, -1 if unknown
  std::string cpuset;      // hwloc bitmap list string of the nearest CPUs ("0-15,32-47")
  std::string pci_id;      // "10de:20b0" (vendor:device), empty if unknown
  // The object's ancestors in the hwloc tree, root first, one stable label each ("Package#0",
  // "HostBridge 0000:[40-4f]", "PCIBridge 0000:41:00.0"). The mapping compares these to find the
  // nearest NIC; a hand-built Topology may leave them empty (then only NUMA nodes are compared).
  std::vector<std::string> ancestors;
};

// One port of an RDMA device as hwloc exports it ("Port1State" = 4); state is enum ibv_port_state
// (1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE), 0 when the export does not say.
struct NicPort {
  int number = 1;
  int state = 0;
};
const char* port_state_name(int state);

struct Nic {
  int index = 0;
  std::string name;            // OpenFabrics device name ("mlx5_0")
  std::vector<NicPort> ports;  // in port order; empty when the export lists none
  std::string pci_bus_id;
  int numa_node = -1;
  std::string cpuset;
  std::vector<std::string> ancestors;  // as in Gpu
};

struct NumaNode {
  int os_index = 0;
  std::string cpuset;
  uint64_t memory_bytes = 0;
};

struct Topology {
  std::string source;  // "live" or the XML path
  std::string hostname;
  int cores = 0;
  int pus = 0;
  std::vector<Gpu> gpus;
  std::vector<Nic> nics;
  std::vector<NumaNode> numa_nodes;
};

struct GpuNicLink {
  int gpu = 0;                    // index into Topology::gpus
  std::vector<int> nearest_nics;  // every NIC at the best proximity (two rails -> two entries)
  int primary_nic = -1;           // the one this GPU's proxy uses; -1: no NIC (socket backend)
  Proximity proximity = Proximity::kOther;
  std::string proxy_cpuset;  // CPUs for the proxy thread: the primary NIC's NUMA node, else the GPU's
};

struct Mapping {
  std::vector<GpuNicLink> gpus;  // one per Topology::gpus entry, same order
  bool socket_fallback = false;  // no NIC at all: inter-node traffic uses the socket backend
};

// Where one rank's traffic goes: per channel, the NIC and port it opens and the CPUs its proxy
// thread runs on. Derived from the mapping (map_gpus_to_nics) for the GPU the rank bound.
struct ChannelPlacement {
  int nic = -1;          // index into Topology::nics; -1: no NIC
  std::string nic_name;  // "mlx5_0"; "" without a NIC
  int port = 0;          // 1-based port number; 0 without a NIC
  int port_state = 0;    // NicPort::state of that port (0: unknown)
  std::string cpuset;    // proxy CPUs (hwloc list string); "" = not pinned
};
struct RankPlacement {
  int gpu = -1;                            // index into Topology::gpus; -1: none
  std::string gpu_bus_id;                  // that GPU's bus id
  std::string gpu_from;                    // "bus id", "local rank" (no bus id given), "" (no GPU)
  std::vector<ChannelPlacement> channels;  // one per channel
  std::string note;                        // why a part is missing ("" when GPU and NICs were found)
};

}  // namespace weft::topology

namespace weft::topology {

// The largest XML export accepted: a machine with hundreds of PCI devices exports a few MiB; more is
// not a topology, and is refused before it is read.
constexpr size_t kMaxTopologyXmlBytes = size_t{16} << 20;

// Implemented in topology/*.cpp.
// An hwloc v1/v2 XML export: a regular file of at most kMaxTopologyXmlBytes (at most that + 1 read).
Status load_xml(const std::string& path, Topology* out);
// The same from XML text in memory; `source` names it in messages and in Topology::source.
Status load_xml_buffer(const std::string& xml, const std::string& source, Topology* out);
Status discover_live(Topology* out);  // the machine weft runs on
// `path` if non-empty, else WEFT_TOPO_FILE if set, else the live machine.
Status load(const std::string& path, Topology* out);
// Nearest NIC per GPU (same switch > same host bridge > same NUMA > other), NICs shared evenly.
// Every NIC of the best class is listed in nearest_nics; the primary is chosen greedily, GPUs with
// the fewest candidates first, each taking its least loaded candidate (ties: the NIC that meets the
// GPU deeper in the tree, i.e. on its own socket; then the lowest NIC index). Deterministic.
Mapping map_gpus_to_nics(const Topology& topo);

// One NIC and the ranks of a node that send through it at the same time: local rank l drives GPU l
// (bus id order), so the ranks are the GPU indices among the first `gpus` whose primary NIC it is.
struct NicShare {
  int nic = -1;           // index into Topology::nics
  std::vector<int> gpus;  // ascending; their count divides the NIC's bandwidth
};
// The sharing among GPUs 0..gpus-1 (clamped to the mapping): one entry per NIC that is some GPU's
// primary, in NIC order; GPUs without a NIC appear in none. Deterministic.
std::vector<NicShare> nic_sharing(const Mapping& mapping, int gpus);
// How many of those GPUs share GPU g's primary NIC (g included); 0 when g has none or is out of range.
int nic_sharers(const std::vector<NicShare>& sharing, int g);

// The placement of a rank with `channels` channels. Its GPU: the one at `gpu_bus_id` when given
// (the bound CUDA device), else GPU `local_rank % GPUs` (CUDA's default order follows bus ids on the
// machines weft targets). Channel 0 uses the GPU's primary NIC, channel c the c-th of its equally
// near NICs after it (rails round-robin); a GPU-less node spreads local ranks over its NICs. The
// port is the NIC's first ACTIVE port, else its first port, else 1. Proxy CPUs: the NIC's NUMA
// node, else the GPU's (as Mapping::proxy_cpuset). Deterministic: a function of its arguments.
RankPlacement place_rank(const Topology& topo, const Mapping& mapping, const std::string& gpu_bus_id, int local_rank,
                         int channels);
// Port choice for one NIC (see place_rank); fills *state.
int pick_port(const Nic& nic, int* state);

// How near `nic` is to `gpu`: the deepest common ancestor in the PCI tree decides, NUMA otherwise.
Proximity nic_proximity(const Gpu& gpu, const Nic& nic);
// "0000:44:00.0" from any spelling CUDA, NVML or lspci use ("00000000:44:00.0", "44:00.0",
// upper case); empty if `id` is not a PCI bus id.
std::string normalize_pci_bus_id(const std::string& id);
// Index into topo.gpus of the GPU at `pci_bus_id` (any spelling), -1 if none: matches CUDA ordinals.
int find_gpu(const Topology& topo, const std::string& pci_bus_id);
// The cpuset of NUMA node `os_index`, empty if the topology has no such node.
std::string numa_cpuset(const Topology& topo, int os_index);

}  // namespace weft::topology
