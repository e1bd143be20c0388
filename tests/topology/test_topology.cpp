// Topology discovery and GPU->NIC mapping on real hwloc exports (tests/data) and on hand-built trees.
#include <dirent.h>
#include <doctest/doctest.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "base/log.h"
#include "topology/topology.h"

using weft::Status;
using namespace weft::topology;

namespace {

std::string data(const char* file) { return std::string(WEFT_SOURCE_DIR) + "/tests/data/" + file; }

struct Loaded {
  Topology topo;
  Mapping map;
};

Loaded load_data(const char* file) {
  Loaded l;
  REQUIRE(load_xml(data(file), &l.topo) == Status::kOk);
  l.map = map_gpus_to_nics(l.topo);
  REQUIRE(l.map.gpus.size() == l.topo.gpus.size());
  return l;
}

std::vector<std::string> gpu_bus_ids(const Topology& t) {
  std::vector<std::string> ids;
  for (const auto& g : t.gpus) ids.push_back(g.pci_bus_id);
  return ids;
}

std::vector<std::string> nic_names(const Topology& t, const std::vector<int>& idx) {
  std::vector<std::string> names;
  for (int i : idx) names.push_back(t.nics.at(i).name);
  return names;
}

// What the mapping says about the GPU at `bus_id`, in names rather than indices.
struct GpuView {
  std::string primary;
  std::vector<std::string> nearest;
  Proximity proximity;
  int numa;
  std::string proxy_cpuset;
};

GpuView view(const Loaded& l, const std::string& bus_id) {
  int g = find_gpu(l.topo, bus_id);
  REQUIRE_MESSAGE(g >= 0, "no GPU at " << bus_id);
  const GpuNicLink& link = l.map.gpus.at(g);
  CHECK(link.gpu == g);
  GpuView v;
  v.primary = link.primary_nic >= 0 ? l.topo.nics.at(link.primary_nic).name : "";
  v.nearest = nic_names(l.topo, link.nearest_nics);
  v.proximity = link.proximity;
  v.numa = l.topo.gpus[g].numa_node;
  v.proxy_cpuset = link.proxy_cpuset;
  return v;
}

std::map<std::string, int> primary_load(const Loaded& l) {
  std::map<std::string, int> load;
  for (const auto& link : l.map.gpus)
    if (link.primary_nic >= 0) ++load[l.topo.nics[link.primary_nic].name];
  return load;
}

std::string write_temp(const std::string& content) {
  char path[] = "/tmp/weft-topo-test-XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  if (!content.empty()) REQUIRE(write(fd, content.data(), content.size()) == static_cast<ssize_t>(content.size()));
  close(fd);
  return path;
}

}  // namespace

TEST_CASE("JUWELS Booster jwb0004: each A100 shares a PCIe switch with one ConnectX-6") {
  Loaded l = load_data("psmgmt-topo.jwb0004.xml");
  CHECK(l.topo.hostname == "jwb0004.juwels");
  CHECK(l.topo.cores == 48);
  CHECK(l.topo.pus == 96);
  CHECK(l.topo.numa_nodes.size() == 8);
  // The ASPEED VGA at 62:00.0 is a display adapter, not a GPU weft can use.
  CHECK(gpu_bus_ids(l.topo) ==
        std::vector<std::string>{"0000:03:00.0", "0000:44:00.0", "0000:84:00.0", "0000:c4:00.0"});
  CHECK(l.topo.gpus[0].pci_id == "10de:20b0");
  REQUIRE(l.topo.nics.size() == 4);
  CHECK(l.topo.nics[0].name == "mlx5_0");
  CHECK(l.topo.nics[0].pci_bus_id == "0000:04:00.0");
  CHECK(l.topo.nics[3].name == "mlx5_3");
  CHECK(l.topo.nics[3].pci_bus_id == "0000:c3:00.0");
  CHECK_FALSE(l.map.socket_fallback);

  struct Want {
    const char* gpu;
    const char* nic;
    int numa;
    const char* cpus;  // the NUMA node's cpuset, read from the XML's hex mask
  };
  for (Want w : {Want{"0000:03:00.0", "mlx5_0", 3, "18-23,66-71"}, Want{"0000:44:00.0", "mlx5_1", 1, "6-11,54-59"},
                 Want{"0000:84:00.0", "mlx5_2", 7, "42-47,90-95"}, Want{"0000:c4:00.0", "mlx5_3", 5, "30-35,78-83"}}) {
    CAPTURE(w.gpu);
    GpuView v = view(l, w.gpu);
    CHECK(v.proximity == Proximity::kSameSwitch);
    CHECK(v.nearest == std::vector<std::string>{w.nic});
    CHECK(v.primary == w.nic);
    CHECK(v.numa == w.numa);
    CHECK(v.proxy_cpuset == w.cpus);
  }
}

TEST_CASE("MeluXina mel2001 (hwloc v1 XML): two GPUs share a switch with a NIC, two are far from both") {
  Loaded l = load_data("psmgmt-topo.mel2001.xml");
  CHECK(l.topo.hostname == "mel2001");
  CHECK(l.topo.pus == 128);
  CHECK(gpu_bus_ids(l.topo) ==
        std::vector<std::string>{"0000:03:00.0", "0000:44:00.0", "0000:84:00.0", "0000:c3:00.0"});
  // The DRM devices (card*, renderD*) under the GPUs must not turn into extra GPUs or names.
  CHECK(l.topo.gpus[1].name.rfind("card", 0) != 0);
  REQUIRE(l.topo.nics.size() == 2);
  CHECK(l.topo.nics[0].name == "mlx5_0");
  CHECK(l.topo.nics[0].numa_node == 1);
  CHECK(l.topo.nics[1].name == "mlx5_1");
  CHECK(l.topo.nics[1].numa_node == 7);

  GpuView g44 = view(l, "0000:44:00.0");
  CHECK(g44.proximity == Proximity::kSameSwitch);
  CHECK(g44.primary == "mlx5_0");
  CHECK(g44.proxy_cpuset == "8-15,72-79");
  GpuView g84 = view(l, "0000:84:00.0");
  CHECK(g84.proximity == Proximity::kSameSwitch);
  CHECK(g84.primary == "mlx5_1");
  CHECK(g84.proxy_cpuset == "56-63,120-127");

  // 03:00.0 (NUMA 3, socket 0) and c3:00.0 (NUMA 5, socket 1) share neither switch, host bridge nor
  // NUMA node with a NIC: both NICs are listed; the primaries keep two GPUs per NIC, each GPU on
  // the NIC of its own socket.
  GpuView g03 = view(l, "0000:03:00.0");
  CHECK(g03.proximity == Proximity::kOther);
  CHECK(g03.numa == 3);
  CHECK(g03.nearest == std::vector<std::string>{"mlx5_0", "mlx5_1"});
  CHECK(g03.primary == "mlx5_0");
  CHECK(g03.proxy_cpuset == "8-15,72-79");  // the NIC's NUMA node, not the GPU's
  GpuView gc3 = view(l, "0000:c3:00.0");
  CHECK(gc3.proximity == Proximity::kOther);
  CHECK(gc3.numa == 5);
  CHECK(gc3.nearest == std::vector<std::string>{"mlx5_0", "mlx5_1"});
  CHECK(gc3.primary == "mlx5_1");
  CHECK(primary_load(l) == std::map<std::string, int>{{"mlx5_0", 2}, {"mlx5_1", 2}});
}

TEST_CASE("jsfc005 (hwloc v1 XML): one V100, both NIC ports on another NUMA node") {
  Loaded l = load_data("psmgmt-topo.jsfc005.xml");
  CHECK(l.topo.hostname == "jsfc005");
  CHECK(gpu_bus_ids(l.topo) == std::vector<std::string>{"0000:01:00.0"});
  CHECK(l.topo.gpus[0].pci_id == "10de:1db4");
  REQUIRE(l.topo.nics.size() == 2);
  CHECK(l.topo.nics[0].pci_bus_id == "0000:21:00.0");
  CHECK(l.topo.nics[1].pci_bus_id == "0000:21:00.1");
  GpuView g = view(l, "0000:01:00.0");
  CHECK(g.numa == 3);
  CHECK(g.proximity == Proximity::kOther);
  CHECK(g.nearest == std::vector<std::string>{"mlx5_0", "mlx5_1"});
  CHECK(g.primary == "mlx5_0");
  CHECK(g.proxy_cpuset == "32-47,160-175");  // NUMA 2, where the NIC is
  CHECK(numa_cpuset(l.topo, 3) == "48-63,176-191");
}

TEST_CASE("mel3001 (hwloc v1 XML): a CPU node, no GPU, four NICs") {
  Loaded l = load_data("psmgmt-topo.mel3001.xml");
  // The ASPEED VGA has DRM OS devices (card0, controlD64): still not a GPU.
  CHECK(l.topo.gpus.empty());
  CHECK(l.map.gpus.empty());
  CHECK_FALSE(l.map.socket_fallback);
  REQUIRE(l.topo.nics.size() == 4);
  std::vector<std::string> names, buses;
  std::vector<int> numa;
  for (const auto& n : l.topo.nics) {
    names.push_back(n.name);
    buses.push_back(n.pci_bus_id);
    numa.push_back(n.numa_node);
  }
  CHECK(names == std::vector<std::string>{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"});
  CHECK(buses == std::vector<std::string>{"0000:21:00.0", "0000:21:00.1", "0000:c1:00.0", "0000:c1:00.1"});
  CHECK(numa == std::vector<int>{0, 0, 1, 1});
  REQUIRE(l.topo.numa_nodes.size() == 2);
  CHECK(l.topo.numa_nodes[0].cpuset == "0-31,64-95");
  CHECK(l.topo.numa_nodes[1].cpuset == "32-63,96-127");
  CHECK(l.topo.numa_nodes[0].memory_bytes > 200ull << 30);
}

TEST_CASE("DGX-2 (NVML OS devices): 16 V100, NVSwitches are not GPUs, no NIC -> socket backend") {
  Loaded l = load_data("hwloc-nvidiaDGX2.xml");
  REQUIRE(l.topo.gpus.size() == 16);
  CHECK(l.topo.nics.empty());
  CHECK(l.map.socket_fallback);
  const std::vector<std::string> socket0 = {"0000:34:00.0", "0000:36:00.0", "0000:39:00.0", "0000:3b:00.0",
                                            "0000:57:00.0", "0000:59:00.0", "0000:5c:00.0", "0000:5e:00.0"};
  const std::vector<std::string> socket1 = {"0000:b7:00.0", "0000:b9:00.0", "0000:bc:00.0", "0000:be:00.0",
                                            "0000:e0:00.0", "0000:e2:00.0", "0000:e5:00.0", "0000:e7:00.0"};
  for (size_t i = 0; i < 8; ++i) {
    CHECK(l.topo.gpus[i].pci_bus_id == socket0[i]);
    CHECK(l.topo.gpus[i].numa_node == 0);
    CHECK(l.topo.gpus[i].name == "nvml" + std::to_string(i));
    CHECK(l.topo.gpus[8 + i].pci_bus_id == socket1[i]);
    CHECK(l.topo.gpus[8 + i].numa_node == 1);
  }
  for (const auto& link : l.map.gpus) {
    CHECK(link.primary_nic == -1);
    CHECK(link.nearest_nics.empty());
    CHECK(link.proxy_cpuset == (l.topo.gpus[link.gpu].numa_node == 0 ? "0-1" : "24-25"));
  }
}

// Which local ranks (GPU indices) use each NIC, by NIC name.
std::map<std::string, std::vector<int>> sharing_by_name(const Topology& t, const Mapping& m, int gpus) {
  std::map<std::string, std::vector<int>> out;
  for (const NicShare& s : nic_sharing(m, gpus)) out[t.nics.at(s.nic).name] = s.gpus;
  return out;
}

TEST_CASE("JUWELS Cluster GPU node jwc09n003: one NIC per two GPUs, each pair behind the NIC's own switch") {
  Loaded l = load_data("psmgmt-topo.jwc09n003.xml");
  CHECK(l.topo.hostname == "jwc09n003.juwels");
  CHECK(gpu_bus_ids(l.topo) ==
        std::vector<std::string>{"0000:5d:00.0", "0000:5e:00.0", "0000:88:00.0", "0000:89:00.0"});
  CHECK(l.topo.gpus[0].pci_id == "10de:1db1");
  REQUIRE(l.topo.nics.size() == 2);
  CHECK(l.topo.nics[0].name == "mlx5_0");
  CHECK(l.topo.nics[0].pci_bus_id == "0000:5f:00.0");
  CHECK(l.topo.nics[1].name == "mlx5_1");
  CHECK(l.topo.nics[1].pci_bus_id == "0000:8a:00.0");
  for (int g = 0; g < 4; ++g) {
    CAPTURE(g);
    const GpuNicLink& link = l.map.gpus[g];
    CHECK(link.proximity == Proximity::kSameSwitch);
    CHECK(link.nearest_nics == std::vector<int>{g / 2});  // the only nearest NIC: no choice to balance
    CHECK(link.primary_nic == g / 2);
    CHECK(link.proxy_cpuset == (g < 2 ? "0-19,40-59" : "20-39,60-79"));
  }
  // Ranks 0,1 send through mlx5_0 at the same time, ranks 2,3 through mlx5_1.
  using Share = std::map<std::string, std::vector<int>>;
  CHECK(sharing_by_name(l.topo, l.map, 4) == Share{{"mlx5_0", {0, 1}}, {"mlx5_1", {2, 3}}});
  std::vector<NicShare> all = nic_sharing(l.map, 4);
  for (int g = 0; g < 4; ++g) CHECK(nic_sharers(all, g) == 2);
  // Two ranks on the node use only the first NIC, each half of it; three: 2 + 1.
  CHECK(sharing_by_name(l.topo, l.map, 2) == Share{{"mlx5_0", {0, 1}}});
  std::vector<NicShare> three = nic_sharing(l.map, 3);
  CHECK(nic_sharers(three, 0) == 2);
  CHECK(nic_sharers(three, 2) == 1);
  CHECK(nic_sharers(three, 3) == 0);  // not among the ranks
  CHECK(nic_sharing(l.map, 0).empty());
  CHECK(nic_sharing(l.map, 99).size() == 2);  // clamped to the node's GPUs
}

TEST_CASE("MeluXina mel2001: one NIC per two GPUs, shared two and two although two GPUs are far from both") {
  Loaded l = load_data("psmgmt-topo.mel2001.xml");
  using Share = std::map<std::string, std::vector<int>>;
  // GPU 1 (44:00.0) is beside mlx5_0, GPU 2 (84:00.0) beside mlx5_1; GPUs 0 and 3 take the NIC of their socket.
  CHECK(sharing_by_name(l.topo, l.map, 4) == Share{{"mlx5_0", {0, 1}}, {"mlx5_1", {2, 3}}});
}

namespace {

// The DGX-2 export lists no NIC (its exporter filtered them out). One NIC per socket is added the
// way a node with one NIC per 8 GPUs is built: NIC k sits on a PCIe switch beside the first four GPUs
// of socket k; the other four GPUs of the socket reach it through their NUMA node.
Loaded dgx2_with_nics(bool one_per_gpu) {
  Loaded l;
  REQUIRE(load_xml(data("hwloc-nvidiaDGX2.xml"), &l.topo) == Status::kOk);
  REQUIRE(l.topo.gpus.size() == 16);
  auto add_nic = [&](std::vector<std::string> ancestors, int numa) {
    Nic n;
    n.index = static_cast<int>(l.topo.nics.size());
    n.name = "mlx5_" + std::to_string(n.index);
    n.numa_node = numa;
    n.ports = {{1, 4}};
    n.ancestors = std::move(ancestors);
    l.topo.nics.push_back(n);
  };
  if (one_per_gpu) {
    for (const Gpu& g : l.topo.gpus) add_nic(g.ancestors, g.numa_node);  // beside each GPU, on its switch
  } else {
    for (int first : {0, 8}) {
      const Gpu& a = l.topo.gpus[first];
      const Gpu& b = l.topo.gpus[first + 3];
      std::vector<std::string> common;
      for (size_t i = 0; i < a.ancestors.size() && i < b.ancestors.size() && a.ancestors[i] == b.ancestors[i]; ++i)
        common.push_back(a.ancestors[i]);
      REQUIRE(common.back().rfind("PCIBridge ", 0) == 0);  // the switch above the four GPUs
      add_nic(common, a.numa_node);
    }
  }
  l.map = map_gpus_to_nics(l.topo);
  return l;
}

}  // namespace

TEST_CASE("one NIC per eight GPUs (the DGX-2 tree, a NIC per socket): every GPU takes its socket's NIC") {
  Loaded l = dgx2_with_nics(false);
  REQUIRE(l.topo.nics.size() == 2);
  for (int g = 0; g < 16; ++g) {
    CAPTURE(g);
    const GpuNicLink& link = l.map.gpus[g];
    const int socket = g / 8;
    // Four GPUs share the NIC's switch; the other four of the socket meet it only in their NUMA node.
    CHECK(link.proximity == (g % 8 < 4 ? Proximity::kSameSwitch : Proximity::kSameNuma));
    CHECK(link.nearest_nics == std::vector<int>{socket});
    CHECK(link.primary_nic == socket);
    // Nothing nearer exists: the other socket's NIC is farther.
    CHECK(nic_proximity(l.topo.gpus[g], l.topo.nics[1 - socket]) > link.proximity);
    CHECK(link.proxy_cpuset == (socket == 0 ? "0-1" : "24-25"));
  }
  using Share = std::map<std::string, std::vector<int>>;
  // A node of 8 ranks (GPUs 0..7): all eight on mlx5_0.
  CHECK(sharing_by_name(l.topo, l.map, 8) == Share{{"mlx5_0", {0, 1, 2, 3, 4, 5, 6, 7}}});
  std::vector<NicShare> eight = nic_sharing(l.map, 8);
  for (int g = 0; g < 8; ++g) CHECK(nic_sharers(eight, g) == 8);
  // All 16: eight and eight.
  CHECK(sharing_by_name(l.topo, l.map, 16) ==
        Share{{"mlx5_0", {0, 1, 2, 3, 4, 5, 6, 7}}, {"mlx5_1", {8, 9, 10, 11, 12, 13, 14, 15}}});

  // The same tree with a NIC beside every GPU: nobody shares.
  Loaded own = dgx2_with_nics(true);
  std::vector<NicShare> mine = nic_sharing(own.map, 16);
  CHECK(mine.size() == 16);
  for (int g = 0; g < 16; ++g) {
    CHECK(own.map.gpus[g].proximity == Proximity::kSameSwitch);
    CHECK(own.map.gpus[g].primary_nic == g);
    CHECK(nic_sharers(mine, g) == 1);
  }
}

TEST_CASE("every file in tests/data loads, and its mapping is consistent and balanced") {
  std::string dir = std::string(WEFT_SOURCE_DIR) + "/tests/data";
  DIR* d = opendir(dir.c_str());
  REQUIRE(d);
  int files = 0;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name.size() < 4 || name.compare(name.size() - 4, 4, ".xml") != 0) continue;
    CAPTURE(name);
    ++files;
    Topology t;
    REQUIRE(load_xml(dir + "/" + name, &t) == Status::kOk);
    CHECK(t.source == dir + "/" + name);
    CHECK(t.pus >= t.cores);
    CHECK(t.cores > 0);
    CHECK_FALSE(t.numa_nodes.empty());
    Mapping m = map_gpus_to_nics(t);
    CHECK(m.socket_fallback == t.nics.empty());
    std::vector<int> load(t.nics.size(), 0);
    for (const auto& g : t.gpus) {
      CHECK(normalize_pci_bus_id(g.pci_bus_id) == g.pci_bus_id);
      CHECK(find_gpu(t, g.pci_bus_id) == g.index);
      const GpuNicLink& link = m.gpus[g.index];
      CHECK_FALSE(link.proxy_cpuset.empty());
      if (t.nics.empty()) continue;
      REQUIRE(link.primary_nic >= 0);
      CHECK(std::find(link.nearest_nics.begin(), link.nearest_nics.end(), link.primary_nic) != link.nearest_nics.end());
      for (int n : link.nearest_nics) CHECK(nic_proximity(g, t.nics[n]) == link.proximity);
      for (const auto& nic : t.nics) CHECK(nic_proximity(g, nic) >= link.proximity);
      ++load[link.primary_nic];
    }
    // Where a GPU could have chosen a less loaded NIC just as near, the loads would be uneven.
    for (const auto& link : m.gpus)
      for (int n : link.nearest_nics) CHECK(load[n] >= load[link.primary_nic] - 1);
  }
  closedir(d);
  CHECK(files == 6);
}

TEST_CASE("a bad topology file is an error that names the file") {
  Topology t;
  t.hostname = "untouched";
  CHECK(load_xml("/nonexistent/weft-topo.xml", &t) == Status::kNotFound);
  CHECK(t.hostname == "untouched");

  std::string empty = write_temp("");
  CHECK(load_xml(empty, &t) == Status::kInvalidArgument);
  std::string text = write_temp("this is not XML at all\n");
  CHECK(load_xml(text, &t) == Status::kInvalidArgument);
  std::string binary =
      write_temp(std::string("\x7f"
                             "ELF\x02\x01\x01\0\0\0\0\0\0\0\0\0",
                             16));
  CHECK(load_xml(binary, &t) == Status::kInvalidArgument);
  std::string other_xml = write_temp("<?xml version=\"1.0\"?>\n<workload><op>ag_gemm</op></workload>\n");
  CHECK(load_xml(other_xml, &t) == Status::kInvalidArgument);
  std::string truncated =
      write_temp("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<topology version=\"2.0\">\n  <object type=\"Machine\"");
  CHECK(load_xml(truncated, &t) == Status::kInvalidArgument);
  CHECK(load_xml(std::string(WEFT_SOURCE_DIR) + "/tests/data", &t) == Status::kInvalidArgument);
  CHECK(t.hostname == "untouched");
  for (const auto& p : {empty, text, binary, other_xml, truncated}) unlink(p.c_str());
}

namespace {

// Runs `f` with stderr (where weft logs) sent to a file, and returns what was logged.
template <typename F>
std::string logged_by(F f) {
  setenv("WEFT_DEBUG", "WARN", 1);
  weft::log::reload_from_env();
  std::string path = write_temp("");
  fflush(stderr);
  int saved = dup(2);
  int fd = open(path.c_str(), O_WRONLY | O_TRUNC);
  REQUIRE(fd >= 0);
  dup2(fd, 2);
  close(fd);
  f();
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  unlink(path.c_str());
  return text;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("topology files: only regular files of at most the cap are read, each refusal says why") {
  Topology t;
  t.hostname = "untouched";
  const auto t0 = std::chrono::steady_clock::now();
  std::string log = logged_by([&] { CHECK(load_xml("/dev/zero", &t) == Status::kInvalidArgument); });
  CHECK(contains(log, "'/dev/zero' is not a regular file"));
  log = logged_by([&] { CHECK(load_xml("/tmp", &t) == Status::kInvalidArgument); });
  CHECK(contains(log, "'/tmp' is a directory"));
  const std::string fifo = "/tmp/weft-topo-fifo-" + std::to_string(getpid());
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(load_xml(fifo, &t) == Status::kInvalidArgument);  // no writer: a blocking open would hang here
  unlink(fifo.c_str());
  // A sparse file one byte over the cap: refused by its size, not read.
  const std::string big = write_temp("");
  REQUIRE(truncate(big.c_str(), static_cast<off_t>(kMaxTopologyXmlBytes + 1)) == 0);
  log = logged_by([&] { CHECK(load_xml(big, &t) == Status::kInvalidArgument); });
  CHECK(contains(
      log, std::to_string(kMaxTopologyXmlBytes + 1) + " bytes; expected 1 to " + std::to_string(kMaxTopologyXmlBytes)));
  unlink(big.c_str());
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 5.0);
  CHECK(t.hostname == "untouched");
}

TEST_CASE("load_xml_buffer reads the same topology as the file; bad buffers are refused") {
  std::ifstream in(data("psmgmt-topo.jwb0004.xml"));
  std::string xml((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Topology from_file, from_buffer;
  REQUIRE(load_xml(data("psmgmt-topo.jwb0004.xml"), &from_file) == Status::kOk);
  REQUIRE(load_xml_buffer(xml, "jwb0004", &from_buffer) == Status::kOk);
  CHECK(from_buffer.source == "jwb0004");
  CHECK(from_buffer.gpus.size() == from_file.gpus.size());
  CHECK(from_buffer.nics.size() == from_file.nics.size());
  CHECK(from_buffer.cores == from_file.cores);
  CHECK(load_xml_buffer("", "empty", &from_buffer) == Status::kInvalidArgument);
  CHECK(load_xml_buffer(xml.substr(0, xml.size() / 2), "half", &from_buffer) == Status::kInvalidArgument);
  CHECK(load_xml_buffer(std::string(kMaxTopologyXmlBytes + 1, ' '), "big", &from_buffer) == Status::kInvalidArgument);
}

TEST_CASE("load: an explicit path, else WEFT_TOPO_FILE, else the live machine") {
  Topology t;
  setenv("WEFT_TOPO_FILE", data("psmgmt-topo.jsfc005.xml").c_str(), 1);
  REQUIRE(load("", &t) == Status::kOk);
  CHECK(t.hostname == "jsfc005");
  REQUIRE(load(data("psmgmt-topo.mel2001.xml"), &t) == Status::kOk);
  CHECK(t.hostname == "mel2001");
  setenv("WEFT_TOPO_FILE", "/nonexistent/weft-topo.xml", 1);
  CHECK(load("", &t) == Status::kNotFound);
  unsetenv("WEFT_TOPO_FILE");
  REQUIRE(load("", &t) == Status::kOk);
  CHECK(t.source == "live");
  CHECK(t.pus >= t.cores);
  CHECK(t.cores >= 1);
  REQUIRE_FALSE(t.numa_nodes.empty());
  for (const auto& n : t.numa_nodes) CHECK_FALSE(n.cpuset.empty());
  for (const auto& g : t.gpus) CHECK(normalize_pci_bus_id(g.pci_bus_id) == g.pci_bus_id);
}

TEST_CASE("PCI bus ids in the spellings of CUDA, NVML and lspci compare equal") {
  CHECK(normalize_pci_bus_id("0000:44:00.0") == "0000:44:00.0");
  CHECK(normalize_pci_bus_id("00000000:44:00.0") == "0000:44:00.0");  // NVML
  CHECK(normalize_pci_bus_id("0000:C4:00.0") == "0000:c4:00.0");      // CUDA
  CHECK(normalize_pci_bus_id("c4:00.0") == "0000:c4:00.0");           // lspci
  CHECK(normalize_pci_bus_id("0001:00:06.0") == "0001:00:06.0");
  CHECK(normalize_pci_bus_id("").empty());
  CHECK(normalize_pci_bus_id("mlx5_0").empty());
  CHECK(normalize_pci_bus_id("0000:44:00").empty());
  CHECK(normalize_pci_bus_id("0000:144:00.0").empty());
  CHECK(normalize_pci_bus_id("0000:44:20.0").empty());  // device is 5 bits
  CHECK(normalize_pci_bus_id("0000:44:00.8").empty());  // function is 3 bits
  Topology t;
  t.gpus.resize(2);
  t.gpus[0].pci_bus_id = "0000:06:00.0";
  t.gpus[1].index = 1;
  t.gpus[1].pci_bus_id = "0000:07:00.0";
  CHECK(find_gpu(t, "00000000:07:00.0") == 1);
  CHECK(find_gpu(t, "0000:08:00.0") == -1);
}

// Hand-built trees: the mapping's rules where the real files have no example.
namespace {

Gpu make_gpu(int index, std::vector<std::string> ancestors, int numa) {
  Gpu g;
  g.index = index;
  char bus[16];
  snprintf(bus, sizeof bus, "0000:%02x:00.0", 0x10 + index);
  g.pci_bus_id = bus;
  g.numa_node = numa;
  g.ancestors = std::move(ancestors);
  return g;
}

Nic make_nic(int index, std::vector<std::string> ancestors, int numa) {
  Nic n;
  n.index = index;
  n.name = "mlx5_" + std::to_string(index);
  n.numa_node = numa;
  n.ancestors = std::move(ancestors);
  return n;
}

}  // namespace

TEST_CASE("two rails on one switch: both listed, primaries alternate; the same for a host-bridge tie") {
  const std::vector<std::string> s0 = {"Machine#0", "Package#0", "HostBridge 0000:[10-1f]", "PCIBridge 0000:10:00.0"};
  const std::vector<std::string> s1 = {"Machine#0", "Package#0", "HostBridge 0000:[10-1f]", "PCIBridge 0000:10:01.0"};
  Topology t;
  t.numa_nodes = {{0, "0-7", 1}};
  for (int i = 0; i < 4; ++i) t.gpus.push_back(make_gpu(i, i < 2 ? s0 : s1, 0));
  t.nics = {make_nic(0, s0, 0), make_nic(1, s0, 0)};
  Mapping m = map_gpus_to_nics(t);
  REQUIRE(m.gpus.size() == 4);
  for (int i = 0; i < 4; ++i) {
    CHECK(m.gpus[i].nearest_nics == std::vector<int>{0, 1});
    CHECK(m.gpus[i].proximity == (i < 2 ? Proximity::kSameSwitch : Proximity::kSameHostBridge));
    CHECK(m.gpus[i].proxy_cpuset == "0-7");
  }
  CHECK(m.gpus[0].primary_nic != m.gpus[1].primary_nic);
  CHECK(m.gpus[2].primary_nic != m.gpus[3].primary_nic);
  // Deterministic: the same input gives the same answer.
  Mapping again = map_gpus_to_nics(t);
  for (int i = 0; i < 4; ++i) CHECK(again.gpus[i].primary_nic == m.gpus[i].primary_nic);
}

TEST_CASE("eight GPUs, two NICs, no tree information: NUMA decides, NICs shared four and four") {
  Topology t;
  t.numa_nodes = {{0, "0-15", 1}, {1, "16-31", 1}};
  for (int i = 0; i < 8; ++i) t.gpus.push_back(make_gpu(i, {}, -1));
  t.nics = {make_nic(0, {}, 0), make_nic(1, {}, 1)};
  Mapping m = map_gpus_to_nics(t);
  int load[2] = {0, 0};
  for (const auto& link : m.gpus) {
    CHECK(link.proximity == Proximity::kOther);
    CHECK(link.nearest_nics.size() == 2);
    REQUIRE(link.primary_nic >= 0);
    ++load[link.primary_nic];
    CHECK(link.proxy_cpuset == (link.primary_nic == 0 ? "0-15" : "16-31"));
  }
  CHECK(load[0] == 4);
  CHECK(load[1] == 4);

  // Same NUMA node as one NIC beats "other", however loaded that NIC becomes.
  for (auto& g : t.gpus) g.numa_node = 1;
  m = map_gpus_to_nics(t);
  for (const auto& link : m.gpus) {
    CHECK(link.proximity == Proximity::kSameNuma);
    CHECK(link.nearest_nics == std::vector<int>{1});
    CHECK(link.primary_nic == 1);
  }
}

TEST_CASE("a GPU with one nearest NIC keeps it; the GPUs with a choice take the other NIC") {
  const std::vector<std::string> hb = {"Machine#0", "HostBridge 0000:[00-3f]"};
  std::vector<std::string> sw0 = hb, sw1 = hb;
  sw0.push_back("PCIBridge 0000:01:00.0");
  sw1.push_back("PCIBridge 0000:02:00.0");
  Topology t;
  // GPU 0 and 1 sit under the host bridge directly (both NICs equally near); GPU 2 shares a switch with NIC 0.
  t.gpus = {make_gpu(0, hb, 0), make_gpu(1, hb, 0), make_gpu(2, sw0, 0)};
  t.nics = {make_nic(0, sw0, 0), make_nic(1, sw1, 0)};
  Mapping m = map_gpus_to_nics(t);
  CHECK(m.gpus[2].proximity == Proximity::kSameSwitch);
  CHECK(m.gpus[2].primary_nic == 0);
  CHECK(m.gpus[0].proximity == Proximity::kSameHostBridge);
  CHECK(m.gpus[0].nearest_nics == std::vector<int>{0, 1});
  // GPU 2 took NIC 0 first, so GPU 0 goes to NIC 1 and GPU 1 (NICs tied at one each) to NIC 0.
  CHECK(m.gpus[0].primary_nic == 1);
  CHECK(m.gpus[1].primary_nic == 0);
}

TEST_CASE("no NIC: socket backend, proxy CPUs from the GPU's NUMA node") {
  Topology t;
  t.numa_nodes = {{0, "0-3", 1}, {1, "4-7", 1}};
  t.gpus = {make_gpu(0, {}, 1)};
  Mapping m = map_gpus_to_nics(t);
  CHECK(m.socket_fallback);
  CHECK(m.gpus[0].primary_nic == -1);
  CHECK(m.gpus[0].proxy_cpuset == "4-7");
  CHECK(std::string(to_string(Proximity::kSameSwitch)) == "same_switch");
  CHECK(std::string(to_string(Proximity::kOther)) == "other");
}

TEST_CASE("an XML that crashes hwloc's reader is refused; this process survives (found by fuzz_topology)") {
  Topology t;
  const std::string file = std::string(WEFT_SOURCE_DIR) + "/tests/fuzz/corpus/topology/hwloc_insert_crash.xml";
  std::string log = logged_by([&] { CHECK(load_xml(file, &t) == Status::kInvalidArgument); });
  CHECK(contains(log, "crashed hwloc's XML reader"));
}
