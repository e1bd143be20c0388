// Fewer NICs than GPUs: the tuner divides a NIC among the node's ranks that send through it at once,
// on real hwloc exports (tests/data) and on the DGX-2 tree with one NIC per eight GPUs.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/tuner.h"
#include "runtime/workload.h"

using weft::Status;
using namespace weft::runtime;
namespace topo = weft::topology;

namespace {

struct Node {
  topo::Topology t;
  topo::Mapping m;
};

Node load(const char* file) {
  Node n;
  REQUIRE(topo::load_xml(std::string(WEFT_SOURCE_DIR) + "/tests/data/" + file, &n.t) == Status::kOk);
  n.m = topo::map_gpus_to_nics(n.t);
  return n;
}

// The DGX-2 export lists no NIC. nics_per_socket 1: one NIC per 8 GPUs, on the PCIe switch of each
// socket's first four GPUs; 8: a NIC beside every GPU (on its own switch).
Node dgx2(int nics_per_socket) {
  Node n = load("hwloc-nvidiaDGX2.xml");
  REQUIRE(n.t.gpus.size() == 16);
  for (int g = 0; g < 16; ++g) {
    if (nics_per_socket == 1 && g % 8 != 0) continue;
    const topo::Gpu& a = n.t.gpus[g];
    std::vector<std::string> anc = a.ancestors;
    if (nics_per_socket == 1) {  // where GPUs g..g+3 meet
      const topo::Gpu& b = n.t.gpus[g + 3];
      size_t k = 0;
      while (k < anc.size() && k < b.ancestors.size() && anc[k] == b.ancestors[k]) ++k;
      anc.resize(k);
    }
    topo::Nic nic;
    nic.index = static_cast<int>(n.t.nics.size());
    nic.name = "mlx5_" + std::to_string(nic.index);
    nic.numa_node = a.numa_node;
    nic.ancestors = anc;
    n.t.nics.push_back(nic);
  }
  n.m = topo::map_gpus_to_nics(n.t);
  return n;
}

Workload parse(const std::string& op, const std::string& shape, int nodes, int gpus) {
  Workload w;
  std::string err;
  const std::string text = "op: " + op + "\nshape: " + shape + "\nlayout: {nodes: " + std::to_string(nodes) +
                           ", gpus_per_node: " + std::to_string(gpus) + "}\n";
  REQUIRE_MESSAGE(parse_workload(text, "t.yaml", &w, &err) == Status::kOk, err);
  return w;
}

Plan plan(const Workload& w, const Node& n) {
  Plan p;
  std::string err;
  REQUIRE_MESSAGE(tune(w, w.layout, n.t, n.m, machine_model_h200(), &p, &err) == Status::kOk, err);
  return p;
}

}  // namespace

TEST_CASE("one NIC per eight GPUs plans an eighth of the NIC per rank, and multi-node ops take longer") {
  const Node shared = dgx2(1), own = dgx2(8);
  const double nic = machine_model_h200().nic_gbps;
  for (const char* op : {"ag_gemm", "gemm_rs", "gemm_ar"}) {
    CAPTURE(op);
    Workload w = parse(op, "{m: 16384, n: 8192, k: 8192}", 2, 8);
    Plan a = plan(w, own), b = plan(w, shared);
    CHECK(a.inter_backend == "ibverbs");
    CHECK(b.inter_backend == "ibverbs");
    CHECK(a.nics_per_node == 8);
    CHECK(b.nics_per_node == 1);
    CHECK(a.nic_sharers == 1);
    CHECK(b.nic_sharers == 8);
    CHECK(a.nic_share_gbps == doctest::Approx(nic));
    CHECK(b.nic_share_gbps == doctest::Approx(nic / 8));
    // The per-rank NIC rate is the share (the PCIe path is faster than either); the bytes are the same.
    CHECK(a.link("nic")->gbps == doctest::Approx(nic));
    CHECK(b.link("nic")->gbps == doctest::Approx(nic / 8));
    CHECK(b.link("nic")->bytes_in == doctest::Approx(a.link("nic")->bytes_in));
    REQUIRE(a.link("nic")->bytes_in + a.link("nic")->bytes_out > 0);
    CHECK(b.link("nic")->time_s == doctest::Approx(8 * a.link("nic")->time_s));
    // Eight times less NIC per rank: the op's predicted time grows, and is at least the NIC time.
    CHECK(b.makespan_s > a.makespan_s);
    CHECK(b.makespan_s >= b.link("nic")->time_s);
    CHECK(b.bound_s >= a.bound_s);
  }
  // One node: nothing crosses a NIC, so sharing changes nothing.
  Workload one = parse("ag_gemm", "{m: 16384, n: 8192, k: 8192}", 1, 8);
  Plan a1 = plan(one, own), b1 = plan(one, shared);
  CHECK(b1.nic_sharers == 0);
  CHECK(b1.makespan_s == doctest::Approx(a1.makespan_s));
}

TEST_CASE("one NIC per two GPUs (jwc09n003) halves the per-rank NIC rate of one NIC per GPU (jwb0004)") {
  const Node pairs = load("psmgmt-topo.jwc09n003.xml"), single = load("psmgmt-topo.jwb0004.xml");
  const double nic = machine_model_h200().nic_gbps;
  Workload w = parse("ag_gemm", "{m: 16384, n: 8192, k: 8192}", 2, 4);
  Plan a = plan(w, single), b = plan(w, pairs);
  CHECK(a.nics_per_node == 4);
  CHECK(a.nic_sharers == 1);
  CHECK(b.nics_per_node == 2);
  CHECK(b.nic_sharers == 2);
  CHECK(b.nic_share_gbps == doctest::Approx(nic / 2));
  CHECK(b.link("nic")->gbps == doctest::Approx(a.link("nic")->gbps / 2));
  CHECK(b.makespan_s > a.makespan_s);
  // Two ranks per node on jwc09n003 both sit on mlx5_0: still two per NIC, one NIC used.
  Plan two = plan(parse("ag_gemm", "{m: 16384, n: 8192, k: 8192}", 2, 2), pairs);
  CHECK(two.nics_per_node == 1);
  CHECK(two.nic_sharers == 2);
  // mel2001: two GPUs per NIC too; the two far from both NICs also cross the CPU interconnect.
  Plan mel = plan(w, load("psmgmt-topo.mel2001.xml"));
  CHECK(mel.nic_sharers == 2);
  CHECK(mel.link("nic")->gbps == doctest::Approx(std::min(nic / 2, machine_model_h200().pcie_remote_gbps)));
}

TEST_CASE("the plan shows how many ranks share a NIC and what each gets, in the table and the JSON") {
  Workload w = parse("gemm_rs", "{m: 16384, n: 8192, k: 8192}", 2, 8);
  Plan p = plan(w, dgx2(1));
  const std::string table = format_plan_table(p);
  INFO(table);
  CHECK(table.find("(1 NIC per node)") != std::string::npos);
  CHECK(table.find("NICs     8 ranks per NIC at once: 6.2 GB/s of the NIC per rank") != std::string::npos);
  auto j = nlohmann::json::parse(format_plan_json(p));
  CHECK(j["machine"]["nics_per_node"] == 1);
  CHECK(j["machine"]["nic_sharers"] == 8);
  CHECK(j["machine"]["nic_share_gbps"].get<double>() == doctest::Approx(50.0 / 8));
  // One node, or the socket backend: no NIC line.
  Plan one = plan(parse("gemm_rs", "{m: 16384, n: 8192, k: 8192}", 1, 8), dgx2(1));
  CHECK(format_plan_table(one).find("per NIC at once") == std::string::npos);
  Plan sock = plan(parse("gemm_rs", "{m: 16384, n: 8192, k: 8192}", 2, 8), load("hwloc-nvidiaDGX2.xml"));
  CHECK(sock.inter_backend == "socket");
  CHECK(sock.nic_sharers == 0);
  CHECK(format_plan_table(sock).find("per NIC at once") == std::string::npos);
}
