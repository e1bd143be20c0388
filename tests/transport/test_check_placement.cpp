// `weftrun check` end to end: each rank's line names the GPU, NIC, port and proxy CPUs its placement gives
// (WEFT_TOPO_FILE: a real server's export), with and without a transport; --bandwidth needs --transport.
#include <doctest/doctest.h>
#include <stdio.h>
#include <sys/wait.h>

#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Result {
  int exit_code = -1;
  std::string out;
};

Result weftrun(const std::string& env, const std::string& args) {
  std::string cmd = env + " " + std::string(WEFT_BINARY_DIR) + "/bin/weftrun " + args + " 2>&1";
  Result r;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::vector<std::string> rank_lines(const std::string& out) {
  std::vector<std::string> lines;
  std::istringstream in(out);
  for (std::string l; std::getline(in, l);)
    if (l.rfind("rank ", 0) == 0) lines.push_back(l);
  return lines;
}

const std::string kTopo =
    std::string("WEFT_TOPO_FILE=") + WEFT_SOURCE_DIR + "/tests/data/psmgmt-topo.jwb0004.xml WEFT_PROXY_TIMEOUT=30";

}  // namespace

TEST_CASE("check: 4 ranks on 2 nodes of jwb0004 each name their GPU's NIC, port and the NIC's NUMA CPUs") {
  Result r = weftrun(kTopo, "check -n 4 --emulate-nodes 2");
  CAPTURE(r.out);
  REQUIRE(r.exit_code == 0);
  auto lines = rank_lines(r.out);
  REQUIRE(lines.size() == 4);
  // Local rank 0 -> GPU 0000:03:00.0 -> mlx5_0 (CPUs 18-23,66-71); local rank 1 -> 0000:44:00.0 -> mlx5_1.
  for (int i : {0, 2})
    CHECK(lines[i].find("placement: GPU 0000:03:00.0, NIC mlx5_0 port 1, proxy CPUs") != std::string::npos);
  for (int i : {1, 3})
    CHECK(lines[i].find("placement: GPU 0000:44:00.0, NIC mlx5_1 port 1, proxy CPUs") != std::string::npos);
  CHECK(lines[0].find("18-23,66-71") != std::string::npos);  // as CPUs, or as the mapping's where not usable here
}

TEST_CASE("check --transport socket: the line says which backend, why, and what the transport used") {
  Result r = weftrun(kTopo, "check -n 2 --emulate-nodes 2 --transport socket");
  CAPTURE(r.out);
  REQUIRE(r.exit_code == 0);
  auto lines = rank_lines(r.out);
  REQUIRE(lines.size() == 2);
  for (const auto& l : lines) {
    CHECK(l.find("socket/batched") != std::string::npos);
    CHECK(l.find("(requested") != std::string::npos);
    CHECK(l.find("used GPU 0000:03:00.0, NIC mlx5_0 port 1 (unused: socket)") != std::string::npos);
  }
}

TEST_CASE("check --bandwidth without --transport is refused before any rank starts") {
  Result r = weftrun("", "check -n 2 --bandwidth");
  CHECK(r.exit_code == 2);
  CHECK(r.out.find("--bandwidth needs --transport") != std::string::npos);
}

#if WEFT_CHECK_OFI
TEST_CASE("check --transport ofi --bandwidth across 2 emulated nodes: bytes verified, the ordering named, a table") {
  // libfabric's default here: tcp;ofi_rxm (write-after-write order, no FI_FENCE, manual progress).
  Result r = weftrun("WEFT_PROXY_TIMEOUT=30", "check -n 4 --emulate-nodes 2 --transport ofi --bandwidth");
  CAPTURE(r.out);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("check passed: 4 ranks, 2 nodes") != std::string::npos);
  auto lines = rank_lines(r.out);
  REQUIRE(lines.size() == 4);
  for (const auto& l : lines) {
    CHECK(l.find("ofi/batched: 1 x (all-gather + all-to-all) verified") != std::string::npos);
    CHECK(l.find("ordering: ") != std::string::npos);
  }
  // Rows: backend, mode, size, count, GB/s, signal us, fences, batches, stalls.
  int rows[3] = {0, 0, 0};
  std::map<double, double> fenced;  // size -> the fenced row's fences (its rows come before batched's)
  std::istringstream in(r.out);
  for (std::string l; std::getline(in, l);) {
    std::istringstream f(l);
    std::string backend, mode;
    double size = 0, count = 0, gbs = 0, sig = 0, fences = -1, batches = -1, stalls = -1;
    if (!(f >> backend >> mode >> size >> count >> gbs >> sig >> fences >> batches >> stalls) || backend != "ofi")
      continue;
    CAPTURE(l);
    CHECK(gbs > 0);
    CHECK(count > 0);
    if (mode == "serial") {
      ++rows[0];
      CHECK(fences == 0);  // serial never fences: each signal waits for its put's delivery
      CHECK(batches == 0);
    } else if (mode == "fenced") {
      ++rows[1];
      CHECK(fences >= count);  // a fenced signal behind every put, in every round
      fenced[size] = fences;
    } else if (mode == "batched") {
      ++rows[2];
      CHECK(batches > 0);
      REQUIRE(fenced.count(size) == 1);
      CHECK(fences <= fenced[size]);  // one fence per batch: never more than one per signal
    }
  }
  CHECK(rows[0] >= 1);
  CHECK(rows[1] == rows[0]);
  CHECK(rows[2] == rows[0]);
}
#endif
