// GPU -> NIC mapping: the nearest NIC in the PCI tree for each GPU, load spread evenly over equally near NICs.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "base/log.h"
#include "topology/topology.h"

namespace weft::topology {
namespace {

size_t common_prefix(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

bool parse_hex(const std::string& s, unsigned long max, unsigned long* out) {
  if (s.empty() || s.size() > 8) return false;
  for (char c : s)
    if (!isxdigit(static_cast<unsigned char>(c))) return false;
  *out = std::stoul(s, nullptr, 16);
  return *out <= max;
}

}  // namespace

const char* to_string(Proximity p) {
  switch (p) {
    case Proximity::kSameSwitch:
      return "same_switch";
    case Proximity::kSameHostBridge:
      return "same_host_bridge";
    case Proximity::kSameNuma:
      return "same_numa";
    case Proximity::kOther:
      return "other";
  }
  return "other";
}

Proximity nic_proximity(const Gpu& gpu, const Nic& nic) {
  size_t common = common_prefix(gpu.ancestors, nic.ancestors);
  if (common > 0) {
    const std::string& meet = gpu.ancestors[common - 1];
    if (starts_with(meet, "PCIBridge ")) return Proximity::kSameSwitch;
    if (starts_with(meet, "HostBridge ")) return Proximity::kSameHostBridge;
  }
  if (gpu.numa_node >= 0 && gpu.numa_node == nic.numa_node) return Proximity::kSameNuma;
  return Proximity::kOther;
}

std::string normalize_pci_bus_id(const std::string& id) {
  // [domain:]bus:device.function, hex; NVML writes an 8-digit domain, CUDA and hwloc 4 digits.
  size_t dot = id.rfind('.');
  if (dot == std::string::npos) return "";
  size_t c2 = id.rfind(':', dot);
  if (c2 == std::string::npos) return "";
  size_t c1 = c2 == 0 ? std::string::npos : id.rfind(':', c2 - 1);
  std::string domain_s = c1 == std::string::npos ? "0" : id.substr(0, c1);
  std::string bus_s = id.substr(c1 == std::string::npos ? 0 : c1 + 1, c2 - (c1 == std::string::npos ? 0 : c1 + 1));
  std::string dev_s = id.substr(c2 + 1, dot - c2 - 1);
  std::string fn_s = id.substr(dot + 1);
  unsigned long domain, bus, dev, fn;
  if (!parse_hex(domain_s, 0xffffffff, &domain) || !parse_hex(bus_s, 0xff, &bus) || !parse_hex(dev_s, 0x1f, &dev) ||
      !parse_hex(fn_s, 0x7, &fn))
    return "";
  char buf[32];
  snprintf(buf, sizeof buf, "%04lx:%02lx:%02lx.%lx", domain, bus, dev, fn);
  return buf;
}

int find_gpu(const Topology& topo, const std::string& pci_bus_id) {
  std::string want = normalize_pci_bus_id(pci_bus_id);
  if (want.empty()) return -1;
  for (const Gpu& g : topo.gpus)
    if (normalize_pci_bus_id(g.pci_bus_id) == want) return g.index;
  return -1;
}

std::string numa_cpuset(const Topology& topo, int os_index) {
  for (const NumaNode& n : topo.numa_nodes)
    if (n.os_index == os_index) return n.cpuset;
  return "";
}

Mapping map_gpus_to_nics(const Topology& topo) {
  Mapping m;
  const size_t ngpu = topo.gpus.size();
  const size_t nnic = topo.nics.size();
  m.socket_fallback = nnic == 0;
  m.gpus.resize(ngpu);

  // depth[g][n]: how deep GPU g and NIC n meet in the tree; among equally near NICs of the same load,
  // the one that meets deeper (same package rather than across sockets) is preferred.
  std::vector<std::vector<size_t>> depth(ngpu, std::vector<size_t>(nnic, 0));
  for (size_t g = 0; g < ngpu; ++g) {
    GpuNicLink& link = m.gpus[g];
    link.gpu = static_cast<int>(g);
    if (nnic == 0) continue;
    Proximity best = Proximity::kOther;
    std::vector<Proximity> prox(nnic);
    for (size_t n = 0; n < nnic; ++n) {
      prox[n] = nic_proximity(topo.gpus[g], topo.nics[n]);
      depth[g][n] = common_prefix(topo.gpus[g].ancestors, topo.nics[n].ancestors);
      best = std::min(best, prox[n]);
    }
    link.proximity = best;
    for (size_t n = 0; n < nnic; ++n)
      if (prox[n] == best) link.nearest_nics.push_back(static_cast<int>(n));
  }

  // Most constrained GPUs choose first (a GPU with one nearest NIC has no choice), then each takes its
  // least loaded nearest NIC: loads stay even and the result depends only on the topology.
  std::vector<size_t> order(ngpu);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return m.gpus[a].nearest_nics.size() < m.gpus[b].nearest_nics.size(); });
  std::vector<int> load(nnic, 0);
  for (size_t g : order) {
    GpuNicLink& link = m.gpus[g];
    int pick = -1;
    for (int n : link.nearest_nics) {
      if (pick < 0 || load[n] < load[pick] || (load[n] == load[pick] && depth[g][n] > depth[g][pick])) pick = n;
    }
    link.primary_nic = pick;
    if (pick >= 0) ++load[pick];
  }

  // The proxy thread runs near the NIC it feeds; without a NIC (or NUMA information) near the GPU.
  for (size_t g = 0; g < ngpu; ++g) {
    GpuNicLink& link = m.gpus[g];
    const Gpu& gpu = topo.gpus[g];
    const Nic* nic = link.primary_nic >= 0 ? &topo.nics[link.primary_nic] : nullptr;
    std::string cpus;
    if (nic && nic->numa_node >= 0) cpus = numa_cpuset(topo, nic->numa_node);
    if (cpus.empty() && gpu.numa_node >= 0) cpus = numa_cpuset(topo, gpu.numa_node);
    if (cpus.empty() && nic) cpus = nic->cpuset;
    if (cpus.empty()) cpus = gpu.cpuset;
    link.proxy_cpuset = cpus;
    WEFT_INFO(kTopo, "GPU %s -> NIC %s (%s, %zu equally near), proxy CPUs %s", gpu.pci_bus_id.c_str(),
              nic ? nic->name.c_str() : "none (socket backend)", to_string(link.proximity), link.nearest_nics.size(),
              cpus.c_str());
  }
  return m;
}

std::vector<NicShare> nic_sharing(const Mapping& mapping, int gpus) {
  const int n = std::max(0, std::min(gpus, static_cast<int>(mapping.gpus.size())));
  std::vector<NicShare> out;
  for (int g = 0; g < n; ++g) {
    const int nic = mapping.gpus[g].primary_nic;
    if (nic < 0) continue;
    auto it = std::find_if(out.begin(), out.end(), [&](const NicShare& s) { return s.nic == nic; });
    if (it == out.end()) it = out.insert(out.end(), NicShare{nic, {}});
    it->gpus.push_back(g);
  }
  std::sort(out.begin(), out.end(), [](const NicShare& a, const NicShare& b) { return a.nic < b.nic; });
  return out;
}

int nic_sharers(const std::vector<NicShare>& sharing, int g) {
  for (const NicShare& s : sharing)
    if (std::find(s.gpus.begin(), s.gpus.end(), g) != s.gpus.end()) return static_cast<int>(s.gpus.size());
  return 0;
}

}  // namespace weft::topology
