// Rank placement from the topology mapping: cached topology, the bound GPU, usable proxy CPUs.
#include "transport/nic_placement.h"

#include <sched.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "base/log.h"
#include "base/params.h"
#include "transport/proxy.h"

namespace weft::transport {
namespace {

std::mutex g_mutex;
std::string g_bound_gpu;

struct Loaded {
  Status status = Status::kOk;
  topology::Topology topo;
  topology::Mapping mapping;
};

// One load per topology source per process: hwloc discovery costs milliseconds, and every
// Transport::create asks.
const Loaded& cached_topology(const std::string& file) {
  static std::map<std::string, Loaded> cache;
  auto it = cache.find(file);
  if (it != cache.end()) return it->second;
  Loaded l;
  l.status = topology::load(file, &l.topo);
  if (l.status == Status::kOk) l.mapping = topology::map_gpus_to_nics(l.topo);
  return cache.emplace(file, std::move(l)).first->second;
}

}  // namespace

void set_bound_gpu(const std::string& pci_bus_id) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_bound_gpu = pci_bus_id;
}

std::string bound_gpu() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_bound_gpu;
}

topology::RankPlacement rank_placement(const bootstrap::RankInfo& me, const std::string& gpu_bus_id, int channels) {
  std::string file;
  if (get_param("WEFT_TOPO_FILE", &file) != Status::kOk) file.clear();
  std::string gpu = gpu_bus_id.empty() ? bound_gpu() : gpu_bus_id;
  std::lock_guard<std::mutex> lock(g_mutex);
  const Loaded& l = cached_topology(file);
  if (l.status != Status::kOk) {
    topology::RankPlacement p;
    p.channels.resize(channels < 1 ? 1 : channels);
    p.note =
        "topology did not load (" + std::string(file.empty() ? "live machine" : file) + "): " + to_string(l.status);
    return p;
  }
  return topology::place_rank(l.topo, l.mapping, gpu, me.local_rank, channels);
}

std::string usable_cpus(const std::string& wanted) {
  if (wanted.empty()) return "";
  std::vector<int> cpus;
  if (parse_cpu_list(wanted, &cpus) != Status::kOk) return "";
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return "";
  // Ranges back into list form ("0-3,8").
  std::string out;
  int start = -1, prev = -2;
  auto flush = [&] {
    if (start < 0) return;
    if (!out.empty()) out += ",";
    out += std::to_string(start);
    if (prev > start) out += "-" + std::to_string(prev);
  };
  for (int c : cpus) {
    if (c < 0 || c >= CPU_SETSIZE || !CPU_ISSET(c, &allowed)) continue;
    if (c != prev + 1) {
      flush();
      start = c;
    }
    prev = c;
  }
  flush();
  return out;
}

std::string describe_placement(const topology::RankPlacement& p, const std::vector<ChannelUse>& channels,
                               const std::string& backend) {
  std::string s = p.gpu >= 0 ? "GPU " + p.gpu_bus_id : std::string("no GPU in topology");
  for (size_t c = 0; c < channels.size(); ++c) {
    const ChannelUse& u = channels[c];
    s += channels.size() > 1 ? ", ch" + std::to_string(c) + " " : ", ";
    if (u.nic.empty())
      s += "NIC none";
    else
      s +=
          "NIC " + u.nic + " port " + std::to_string(u.port) +
          (u.port_state && u.port_state != 4 ? std::string(" (") + topology::port_state_name(u.port_state) + ")" : "") +
          (backend.empty() ? ""
           : u.nic_used    ? " (" + backend + ")"
                           : " (unused: " + backend + ")");
    s += ", proxy CPUs ";
    if (!u.cpus_used.empty())
      s += u.cpus_used;
    else if (!u.cpus_wanted.empty())
      s += "unpinned (mapping says " + u.cpus_wanted + ", not usable here)";
    else
      s += "unpinned";
  }
  if (!p.note.empty()) s += " [" + p.note + "]";
  return s;
}

}  // namespace weft::transport
