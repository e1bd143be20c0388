// weftrun topo: the machine's GPUs, NICs and NUMA nodes and the GPU->NIC mapping, as a table or JSON.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/params.h"
#include "base/status.h"
#include "launcher/commands.h"
#include "topology/topology.h"

namespace weft::launcher {
namespace {

using topology::Mapping;
using topology::Topology;

nlohmann::ordered_json numa_json(int os_index) {
  return os_index >= 0 ? nlohmann::ordered_json(os_index) : nlohmann::ordered_json(nullptr);
}

nlohmann::ordered_json to_json(const Topology& t, const Mapping& m) {
  nlohmann::ordered_json gpus = nlohmann::ordered_json::array();
  for (const auto& link : m.gpus) {
    const auto& g = t.gpus[link.gpu];
    nlohmann::ordered_json nics = nlohmann::ordered_json::array();
    for (int n : link.nearest_nics) nics.push_back(t.nics[n].name);
    gpus.push_back({{"index", g.index},
                    {"pci_bus_id", g.pci_bus_id},
                    {"name", g.name},
                    {"numa", numa_json(g.numa_node)},
                    {"cpuset", g.cpuset},
                    {"nic", link.primary_nic >= 0 ? nlohmann::ordered_json(t.nics[link.primary_nic].name) : nullptr},
                    {"nics", nics},
                    {"proximity", link.primary_nic >= 0 ? nlohmann::ordered_json(to_string(link.proximity)) : nullptr},
                    {"proxy_cpuset", link.proxy_cpuset}});
  }
  nlohmann::ordered_json nics = nlohmann::ordered_json::array();
  for (const auto& n : t.nics) {
    nlohmann::ordered_json users = nlohmann::ordered_json::array();
    for (const auto& link : m.gpus)
      if (link.primary_nic == n.index) users.push_back(t.gpus[link.gpu].pci_bus_id);
    nlohmann::ordered_json ports = nlohmann::ordered_json::array();
    for (const auto& p : n.ports) ports.push_back({{"port", p.number}, {"state", topology::port_state_name(p.state)}});
    nics.push_back({{"index", n.index},
                    {"name", n.name},
                    {"pci_bus_id", n.pci_bus_id},
                    {"numa", numa_json(n.numa_node)},
                    {"cpuset", n.cpuset},
                    {"ports", ports},
                    {"gpus", users}});
  }
  nlohmann::ordered_json numa = nlohmann::ordered_json::array();
  for (const auto& n : t.numa_nodes)
    numa.push_back({{"os_index", n.os_index}, {"cpuset", n.cpuset}, {"memory_bytes", n.memory_bytes}});
  return {{"source", t.source}, {"hostname", t.hostname}, {"cores", t.cores}, {"pus", t.pus},
          {"gpus", gpus},       {"nics", nics},           {"numa", numa},     {"socket_fallback", m.socket_fallback}};
}

std::string numa_text(int os_index) { return os_index >= 0 ? std::to_string(os_index) : "?"; }

void print_table(const Topology& t, const Mapping& m) {
  printf("topology of %s (%s): %d cores, %d PUs, %zu NUMA nodes, %zu GPUs, %zu NICs\n",
         t.hostname.empty() ? "?" : t.hostname.c_str(), t.source == "live" ? "live machine" : t.source.c_str(), t.cores,
         t.pus, t.numa_nodes.size(), t.gpus.size(), t.nics.size());

  printf("\nGPUs\n");
  if (t.gpus.empty())
    printf("  none found (no NVIDIA GPU in the PCI tree)\n");
  else
    printf("  %-3s %-13s %-4s %-10s %-16s %-20s %-16s %s\n", "#", "PCI bus id", "NUMA", "NIC", "proximity",
           "equally near NICs", "proxy CPUs", "name");
  for (const auto& link : m.gpus) {
    const auto& g = t.gpus[link.gpu];
    std::string near;
    for (int n : link.nearest_nics) near += (near.empty() ? "" : ",") + t.nics[n].name;
    bool has_nic = link.primary_nic >= 0;
    printf("  %-3d %-13s %-4s %-10s %-16s %-20s %-16s %s\n", g.index, g.pci_bus_id.c_str(),
           numa_text(g.numa_node).c_str(), has_nic ? t.nics[link.primary_nic].name.c_str() : "-",
           has_nic ? to_string(link.proximity) : "-", near.empty() ? "-" : near.c_str(), link.proxy_cpuset.c_str(),
           g.name.c_str());
  }

  printf("\nNICs\n");
  if (t.nics.empty())
    printf("  none found (no OpenFabrics device)\n");
  else
    printf("  %-3s %-10s %-13s %-4s %-16s %s\n", "#", "name", "PCI bus id", "NUMA", "ports", "primary NIC of GPUs");
  for (const auto& n : t.nics) {
    std::string users;
    for (const auto& link : m.gpus)
      if (link.primary_nic == n.index) users += (users.empty() ? "" : ",") + std::to_string(link.gpu);
    std::string ports;  // "1 ACTIVE", the port weft would open first
    for (const auto& p : n.ports)
      ports += (ports.empty() ? "" : ",") + std::to_string(p.number) + " " + topology::port_state_name(p.state);
    printf("  %-3d %-10s %-13s %-4s %-16s %s\n", n.index, n.name.c_str(),
           n.pci_bus_id.empty() ? "?" : n.pci_bus_id.c_str(), numa_text(n.numa_node).c_str(),
           ports.empty() ? "?" : ports.c_str(), users.empty() ? "-" : users.c_str());
  }

  printf("\nNUMA nodes\n");
  printf("  %-4s %-10s %s\n", "os", "memory", "CPUs");
  for (const auto& n : t.numa_nodes)
    printf("  %-4d %-10s %s\n", n.os_index, (std::to_string(n.memory_bytes >> 30) + " GiB").c_str(), n.cpuset.c_str());

  if (m.socket_fallback)
    printf("\nNo RDMA NIC: inter-node traffic would use the socket backend (TCP between proxies).\n");
}

int run_topo(const std::string& path, bool json) {
  Topology t;
  Status s = topology::load(path, &t);
  if (s != Status::kOk) {
    std::string what = path.empty() ? "" : "'" + path + "'";
    std::string env;
    if (what.empty() && get_param("WEFT_TOPO_FILE", &env) == Status::kOk && !env.empty())
      what = "'" + env + "' (WEFT_TOPO_FILE)";
    fprintf(stderr, "weftrun topo: cannot load the topology from %s: %s\n",
            what.empty() ? "the live machine" : what.c_str(), to_string(s));
    return 1;
  }
  Mapping m = topology::map_gpus_to_nics(t);
  if (json)
    printf("%s\n", to_json(t, m).dump(2).c_str());
  else
    print_table(t, m);
  return 0;
}

}  // namespace

void add_topo_command(CLI::App& app, int* exit_code) {
  auto* sub = app.add_subcommand("topo", "show GPUs, NICs, NUMA nodes and the GPU->NIC mapping");
  auto path = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  sub->add_option("--topology", *path, "hwloc XML export to read instead of the live machine (else WEFT_TOPO_FILE)");
  sub->add_flag("--json", *json, "print JSON instead of a table");
  sub->callback([exit_code, path, json] { *exit_code = run_topo(*path, *json); });
}

}  // namespace weft::launcher
