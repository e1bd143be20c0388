// Rank -> NIC, port and proxy CPUs: the transport's placement against the topology mapping, on the real
// server exports in tests/data (WEFT_TOPO_FILE), through place_rank and through Transport::create.
#include <dirent.h>
#include <doctest/doctest.h>
#include <sched.h>
#include <stdlib.h>

#include <chrono>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "local_bootstrap.h"
#include "topology/topology.h"
#include "transport/heap.h"
#include "transport/nic_placement.h"
#include "transport/transport.h"

using weft::Status;
using namespace weft::topology;
namespace tr = weft::transport;

namespace {

std::string data(const char* file) { return std::string(WEFT_SOURCE_DIR) + "/tests/data/" + file; }

const char* const kServers[] = {"psmgmt-topo.jwb0004.xml", "psmgmt-topo.mel2001.xml", "psmgmt-topo.jsfc005.xml",
                                "psmgmt-topo.mel3001.xml", "hwloc-nvidiaDGX2.xml"};

struct Loaded {
  Topology topo;
  Mapping map;
};
Loaded load_data(const char* file) {
  Loaded l;
  REQUIRE(load_xml(data(file), &l.topo) == Status::kOk);
  l.map = map_gpus_to_nics(l.topo);
  return l;
}

// Threads of this process whose CPU mask is exactly `list` (Cpus_allowed_list in /proc).
int threads_pinned_to(const std::string& list) {
  int n = 0;
  DIR* d = opendir("/proc/self/task");
  if (!d) return -1;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream f(std::string("/proc/self/task/") + e->d_name + "/status");
    std::string line;
    while (std::getline(f, line))
      if (line.rfind("Cpus_allowed_list:", 0) == 0) {
        std::string v = line.substr(line.find(':') + 1);
        v.erase(0, v.find_first_not_of(" \t"));
        if (v == list) ++n;
      }
  }
  closedir(d);
  return n;
}

// Sets WEFT_TOPO_FILE for one scope.
struct TopoFile {
  explicit TopoFile(const std::string& path) { setenv("WEFT_TOPO_FILE", path.c_str(), 1); }
  ~TopoFile() { unsetenv("WEFT_TOPO_FILE"); }
};

}  // namespace

TEST_CASE("every server export: channel 0 of each GPU's rank is the mapping's primary NIC, proxy CPUs as mapped") {
  for (const char* file : kServers) {
    CAPTURE(file);
    Loaded l = load_data(file);
    for (const Gpu& g : l.topo.gpus) {
      CAPTURE(g.pci_bus_id);
      const GpuNicLink& link = l.map.gpus[g.index];
      // By bus id (a bound CUDA device) and by local rank (no bus id): the same GPU, the same NIC.
      for (const RankPlacement& p :
           {place_rank(l.topo, l.map, g.pci_bus_id, 99, 1), place_rank(l.topo, l.map, "", g.index, 1)}) {
        CHECK(p.gpu == g.index);
        REQUIRE(p.channels.size() == 1);
        CHECK(p.channels[0].nic == link.primary_nic);
        CHECK(p.channels[0].cpuset == link.proxy_cpuset);
        if (link.primary_nic >= 0) {
          CHECK(p.channels[0].nic_name == l.topo.nics[link.primary_nic].name);
          CHECK(p.channels[0].port >= 1);
          CHECK(p.note.empty());
        } else {
          CHECK(p.channels[0].nic_name.empty());
          CHECK(p.channels[0].port == 0);
          CHECK(p.note.find("no RDMA NIC") != std::string::npos);
        }
      }
    }
  }
}

TEST_CASE("JUWELS Booster jwb0004: rank r of a node -> its GPU's switch-local NIC, port 1 ACTIVE, NIC NUMA CPUs") {
  Loaded l = load_data("psmgmt-topo.jwb0004.xml");
  REQUIRE(l.topo.gpus.size() == 4);
  struct Want {
    const char* nic;
    const char* cpus;
  };
  const Want want[] = {
      {"mlx5_0", "18-23,66-71"}, {"mlx5_1", "6-11,54-59"}, {"mlx5_2", "42-47,90-95"}, {"mlx5_3", "30-35,78-83"}};
  for (int r = 0; r < 4; ++r) {
    RankPlacement p = place_rank(l.topo, l.map, "", r, 1);
    CHECK(p.gpu_from == "local rank");
    CHECK(p.channels[0].nic_name == want[r].nic);
    CHECK(p.channels[0].port == 1);
    CHECK(p.channels[0].port_state == 4);
    CHECK(p.channels[0].cpuset == want[r].cpus);
  }
  // Local rank 5 of a 4-GPU node wraps to GPU 1, as CUDA device binding does.
  CHECK(place_rank(l.topo, l.map, "", 5, 1).channels[0].nic_name == "mlx5_1");
}

TEST_CASE("mel2001: channels rotate over the equally near NICs starting at the primary; a DOWN port is reported") {
  Loaded l = load_data("psmgmt-topo.mel2001.xml");
  REQUIRE(l.topo.nics.size() == 2);
  // mlx5_0's only port is DOWN in this export: still port 1, its state says so.
  int state = 0;
  CHECK(pick_port(l.topo.nics[0], &state) == 1);
  CHECK(state == 1);
  CHECK(std::string(port_state_name(state)) == "DOWN");
  tr::ChannelUse down{"mlx5_0", 1, 1, "", "", false};
  CHECK(tr::describe_placement(place_rank(l.topo, l.map, "", 0, 1), {down}, "").find("NIC mlx5_0 port 1 (DOWN)") !=
        std::string::npos);
  for (const Gpu& g : l.topo.gpus) {
    const GpuNicLink& link = l.map.gpus[g.index];
    RankPlacement p = place_rank(l.topo, l.map, g.pci_bus_id, 0, 4);
    REQUIRE(p.channels.size() == 4);
    CHECK(p.channels[0].nic == link.primary_nic);
    std::map<int, int> uses;
    for (const auto& c : p.channels) {
      CHECK(std::find(link.nearest_nics.begin(), link.nearest_nics.end(), c.nic) != link.nearest_nics.end());
      ++uses[c.nic];
    }
    CHECK(uses.size() == link.nearest_nics.size());  // every rail gets channels
  }
}

TEST_CASE("mel3001 (no GPU, four NICs): local ranks spread over the NICs; an unknown bus id is named") {
  Loaded l = load_data("psmgmt-topo.mel3001.xml");
  std::vector<std::string> seen;
  for (int r = 0; r < 4; ++r) seen.push_back(place_rank(l.topo, l.map, "", r, 1).channels[0].nic_name);
  CHECK(seen == std::vector<std::string>{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"});
  RankPlacement p = place_rank(l.topo, l.map, "0000:99:00.0", 0, 1);
  CHECK(p.gpu == -1);
  CHECK(p.channels[0].nic_name.empty());
  CHECK(p.note.find("0000:99:00.0 is not in the topology") != std::string::npos);
}

TEST_CASE("usable_cpus keeps only CPUs this process may run on") {
  CHECK(tr::usable_cpus("") == "");
  CHECK(tr::usable_cpus("100000-100001").empty());  // beyond CPU_SETSIZE: refused
  CHECK(tr::usable_cpus("0") == "0");               // CPU 0 is in every test machine's mask
  CHECK(tr::usable_cpus("900-901") == "");          // CPUs this machine does not have
}

TEST_CASE("Transport::create places each rank's channels by the mapping (WEFT_TOPO_FILE), and pins usable CPUs") {
  Loaded l = load_data("psmgmt-topo.jwb0004.xml");
  TopoFile topo(data("psmgmt-topo.jwb0004.xml"));
  const int n = 8, per_node = 4;
  std::vector<std::vector<tr::ChannelUse>> used(n);
  std::vector<std::string> summary(n);
  auto st = weft::testing::run_threads(n, per_node, [&](weft::bootstrap::Bootstrap& boot) -> Status {
    std::unique_ptr<tr::HostHeap> heap;
    WEFT_CHECK(tr::HostHeap::create(4096, &heap));
    tr::TransportOptions o;
    o.backend = "loopback";
    o.peers = tr::PeerNeed::kEveryRank;
    std::unique_ptr<tr::Transport> t;
    WEFT_CHECK(tr::Transport::create(boot, heap->region(), o, &t));
    used[boot.info().rank] = t->channel_use();
    summary[boot.info().rank] = t->placement_summary();
    WEFT_CHECK(boot.barrier("placed"));  // nobody leaves (and withdraws its region) before all connected
    return t->stop();
  });
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    REQUIRE(st[r] == Status::kOk);
    const GpuNicLink& link = l.map.gpus[r % per_node];
    REQUIRE(used[r].size() == 1);
    CHECK(used[r][0].nic == l.topo.nics[link.primary_nic].name);
    CHECK(used[r][0].port == 1);
    CHECK(used[r][0].cpus_wanted == link.proxy_cpuset);
    CHECK(used[r][0].cpus_used == tr::usable_cpus(link.proxy_cpuset));
    CHECK_FALSE(used[r][0].nic_used);  // loopback opens no NIC
    CHECK(summary[r].find("GPU " + l.topo.gpus[r % per_node].pci_bus_id) != std::string::npos);
    CHECK(summary[r].find("NIC " + used[r][0].nic + " port 1") != std::string::npos);
  }
}

TEST_CASE("explicit channel NICs and CPUs override the mapping; use_topology=false places nothing") {
  TopoFile topo(data("psmgmt-topo.jwb0004.xml"));
  std::vector<tr::ChannelUse> a, b;
  int pinned = -1;
  cpu_set_t mask;
  CPU_ZERO(&mask);
  REQUIRE(sched_getaffinity(0, sizeof mask, &mask) == 0);
  const bool several_cpus = CPU_COUNT(&mask) > 1 && CPU_ISSET(0, &mask);
  auto st = weft::testing::run_threads(2, 2, [&](weft::bootstrap::Bootstrap& boot) -> Status {
    std::unique_ptr<tr::HostHeap> heap;
    WEFT_CHECK(tr::HostHeap::create(4096, &heap));
    tr::TransportOptions o;
    o.backend = "loopback";
    o.peers = tr::PeerNeed::kEveryRank;
    if (boot.info().rank == 0) {
      o.channel_nics = {"mlx5_3"};
      o.channel_ports = {2};
      o.channel_cpusets = {"0"};
    } else {
      o.use_topology = false;
    }
    std::unique_ptr<tr::Transport> t;
    WEFT_CHECK(tr::Transport::create(boot, heap->region(), o, &t));
    (boot.info().rank == 0 ? a : b) = t->channel_use();
    if (boot.info().rank == 0) {
      // The proxy pins itself when its thread starts: wait (bounded) until one thread runs on CPU 0 only.
      auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (threads_pinned_to("0") < 1 && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      pinned = threads_pinned_to("0");
    }
    WEFT_CHECK(boot.barrier("placed"));
    return t->stop();
  });
  REQUIRE(st[0] == Status::kOk);
  REQUIRE(st[1] == Status::kOk);
  CHECK(a[0].nic == "mlx5_3");
  CHECK(a[0].port == 2);
  CHECK(a[0].cpus_used == "0");
  if (several_cpus)
    CHECK(pinned == 1);  // rank 0's proxy thread, and no other thread, runs on CPU 0 only
  else
    MESSAGE("one usable CPU: every thread's mask is CPU 0, so the proxy's pinning is not observable");
  CHECK(b[0].nic.empty());
  CHECK(b[0].cpus_used.empty());
}
