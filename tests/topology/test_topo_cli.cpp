// `weftrun topo` end to end: the built binary on every file in tests/data, and on bad files.
#include <doctest/doctest.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <string>

namespace {

struct Result {
  int exit_code = -1;
  std::string out;  // stdout and stderr together
};

Result weftrun(const std::string& args, bool with_stderr = true) {
  std::string cmd = std::string(WEFT_BINARY_DIR) + "/bin/weftrun " + args + (with_stderr ? " 2>&1" : " 2>/dev/null");
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

std::string data(const char* file) { return std::string(WEFT_SOURCE_DIR) + "/tests/data/" + file; }

nlohmann::json topo_json(const char* file) {
  Result r = weftrun("topo --json --topology " + data(file), false);
  CAPTURE(r.out);
  REQUIRE(r.exit_code == 0);
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  REQUIRE_FALSE(j.is_discarded());
  return j;
}

}  // namespace

TEST_CASE("topo --json on every test topology: parses, right GPU count, mapping fields present") {
  struct Want {
    const char* file;
    size_t gpus, nics;
    bool socket_fallback;
  };
  for (Want w : {Want{"psmgmt-topo.jwb0004.xml", 4, 4, false}, Want{"psmgmt-topo.mel2001.xml", 4, 2, false},
                 Want{"psmgmt-topo.jsfc005.xml", 1, 2, false}, Want{"psmgmt-topo.mel3001.xml", 0, 4, false},
                 Want{"psmgmt-topo.jwc09n003.xml", 4, 2, false}, Want{"hwloc-nvidiaDGX2.xml", 16, 0, true}}) {
    CAPTURE(w.file);
    nlohmann::json j = topo_json(w.file);
    REQUIRE(j["gpus"].is_array());
    CHECK(j["gpus"].size() == w.gpus);
    CHECK(j["nics"].size() == w.nics);
    CHECK(j["socket_fallback"] == w.socket_fallback);
    CHECK_FALSE(j["numa"].empty());
    for (const auto& g : j["gpus"]) {
      CHECK(g["pci_bus_id"].get<std::string>().size() == 12);
      CHECK_FALSE(g["proxy_cpuset"].get<std::string>().empty());
      CHECK(g["nic"].is_null() == w.socket_fallback);
      CHECK(g["nics"].size() >= (w.socket_fallback ? 0u : 1u));
    }
  }
}

TEST_CASE("topo --json states the mapping by bus id (JUWELS jwb0004, MeluXina mel2001)") {
  nlohmann::json j = topo_json("psmgmt-topo.jwb0004.xml");
  REQUIRE(j["gpus"].size() == 4);
  CHECK(j["gpus"][1]["pci_bus_id"] == "0000:44:00.0");
  CHECK(j["gpus"][1]["nic"] == "mlx5_1");
  CHECK(j["gpus"][1]["nics"] == nlohmann::json::array({"mlx5_1"}));
  CHECK(j["gpus"][1]["proximity"] == "same_switch");
  CHECK(j["gpus"][1]["numa"] == 1);
  CHECK(j["gpus"][1]["proxy_cpuset"] == "6-11,54-59");
  CHECK(j["nics"][1]["gpus"] == nlohmann::json::array({"0000:44:00.0"}));

  j = topo_json("psmgmt-topo.mel2001.xml");
  CHECK(j["gpus"][0]["pci_bus_id"] == "0000:03:00.0");
  CHECK(j["gpus"][0]["proximity"] == "other");
  CHECK(j["gpus"][0]["nics"] == nlohmann::json::array({"mlx5_0", "mlx5_1"}));
  CHECK(j["nics"][0]["gpus"].size() == 2);
  CHECK(j["nics"][1]["gpus"].size() == 2);
}

TEST_CASE("topo table: GPUs, NICs, NUMA and the socket backend note where there is no NIC") {
  Result r = weftrun("topo --topology " + data("hwloc-nvidiaDGX2.xml"));
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("0000:e7:00.0") != std::string::npos);
  CHECK(r.out.find("socket backend") != std::string::npos);
  r = weftrun("topo --topology " + data("psmgmt-topo.jwb0004.xml"));
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("mlx5_3") != std::string::npos);
  CHECK(r.out.find("same_switch") != std::string::npos);
  CHECK(r.out.find("socket backend") == std::string::npos);
}

TEST_CASE("topo on a bad file: non-zero exit, the message names the file") {
  Result r = weftrun("topo --topology /nonexistent/weft-topo.xml");
  CHECK(r.exit_code != 0);
  CHECK(r.out.find("/nonexistent/weft-topo.xml") != std::string::npos);

  char path[] = "/tmp/weft-topo-cli-XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  const char junk[] = "name: not-a-topology\nop: ag_gemm\n";
  REQUIRE(write(fd, junk, sizeof junk - 1) == static_cast<ssize_t>(sizeof junk - 1));
  close(fd);
  r = weftrun(std::string("topo --json --topology ") + path);
  CHECK(r.exit_code != 0);
  CHECK(r.out.find(path) != std::string::npos);

  // WEFT_TOPO_FILE is named too when it is where the bad path came from.
  r = weftrun(std::string("topo"), true);
  CHECK(r.exit_code == 0);  // the live machine
  setenv("WEFT_TOPO_FILE", path, 1);
  r = weftrun("topo");
  unsetenv("WEFT_TOPO_FILE");
  CHECK(r.exit_code != 0);
  CHECK(r.out.find(path) != std::string::npos);
  unlink(path);
}
