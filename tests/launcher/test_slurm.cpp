// srun --mpi=pmix with real Slurm daemons (munged, slurmctld, slurmd per fake node) started by this
// test through scripts/slurm/slurm-up.sh and always stopped again through slurm-down.sh.
#include <doctest/doctest.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "tests/launcher/proc.h"

namespace {

const std::string kState = "/tmp/weft-slurm-test";
const std::string kConf = kState + "/slurm.conf";
const std::string kScripts = std::string(WEFT_SOURCE_DIR) + "/scripts/slurm";
const std::string kWeftrun = std::string(WEFT_BINARY_DIR) + "/bin/weftrun";
// Our own state directory and slurm.conf, so nothing outside the test's files is touched.
const std::string kSlurmEnv = "env SLURM_STATE_DIR=" + kState + " SLURM_CONF_DEST=" + kConf + " SLURM_CONF=" + kConf +
                              " WEFT_BOOTSTRAP_TIMEOUT=30 ";

void skip(const std::string& why) {
  printf("SKIPPED: %s\n", why.c_str());
  fflush(stdout);
  exit(77);
}

// Stops whatever slurm-up.sh started, whatever way the test ends.
struct SlurmDaemons {
  ~SlurmDaemons() { down(); }
  static void down() { weft::testing::run("exec " + kSlurmEnv + kScripts + "/slurm-down.sh", 60); }
  static weft::testing::ProcResult up(int nodes) {
    if (!weft::testing::hold_cluster_lock(200)) {
      weft::testing::ProcResult r;
      r.err = "another process held /tmp/weft-cluster.lock (Slurm or namespace tests) for 200 s";
      return r;
    }
    return weft::testing::run("exec " + kSlurmEnv + kScripts + "/slurm-up.sh " + std::to_string(nodes), 120);
  }
};

std::string srun(const std::string& args) { return "exec " + kSlurmEnv + "timeout 90 srun " + args; }

}  // namespace

TEST_CASE("srun --mpi=pmix: 1 node x 4 tasks and 2 nodes x 2 tasks pass weftrun check; the sbatch example too") {
  if (geteuid() != 0) skip("the Slurm daemons must be started as root (CI runs tests as root)");
  for (const char* b : {"srun", "sbatch", "slurmctld", "slurmd", "munged", "sinfo"})
    if (system((std::string("command -v ") + b + " >/dev/null 2>&1").c_str()) != 0)
      skip(std::string(b) + " not found (apt-get install slurm-wlm munge)");

  SlurmDaemons daemons;
  auto up = SlurmDaemons::up(1);
  INFO(up.out << up.err);
  REQUIRE(up.exit_code == 0);
  auto mpi = weft::testing::run("exec " + kSlurmEnv + "srun --mpi=list", 20);
  if ((mpi.out + mpi.err).find("pmix") == std::string::npos) {
    SlurmDaemons::down();
    skip("this Slurm has no mpi/pmix plugin (srun --mpi=list: " + mpi.out + mpi.err + ")");
  }

  auto r = weft::testing::run(srun("-N 1 -n 4 --mpi=pmix " + kWeftrun + " check --iters 3"), 120);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(weft::testing::count_lines_starting(r.out, "rank ") == 4);
  CHECK(r.out.find("(slurm, 3 iters)") != std::string::npos);
  CHECK(weft::testing::last_line(r.out) == "check passed: 4 ranks, 1 nodes");

  // Several tasks but no PMIx server: refused with how to launch, instead of 2 separate jobs.
  r = weft::testing::run(srun("-N 1 -n 2 --mpi=none " + kWeftrun + " check"), 120);
  INFO(r.out << r.err);
  CHECK(r.exit_code != 0);
  CHECK(r.err.find("srun --mpi=pmix") != std::string::npos);

  up = SlurmDaemons::up(2);
  INFO(up.out << up.err);
  REQUIRE(up.exit_code == 0);
  r = weft::testing::run(srun("-N 2 --ntasks-per-node=2 --mpi=pmix " + kWeftrun + " check --iters 3 --json"), 120);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  auto doc = nlohmann::json::parse(r.out);
  CHECK(doc["passed"] == true);
  CHECK(doc["ranks"] == 4);
  CHECK(doc["nodes"] == 2);
  CHECK(doc["launched_by"] == "slurm");
  std::set<std::string> hosts[2];
  for (const auto& e : doc["per_rank"]) {
    int node = e["node"];
    REQUIRE((node == 0 || node == 1));
    hosts[node].insert(e["hostname"].get<std::string>());
  }
  CHECK(hosts[0].size() == 1);
  CHECK(hosts[1].size() == 1);
  CHECK(*hosts[0].begin() != *hosts[1].begin());

  // Rank groups: block placement passes with a group per node; srun's cyclic order (or the 3 + 1 split
  // it can give) is refused by every rank before any work, naming the srun option that fixes it.
  r = weft::testing::run(
      srun("-N 2 --ntasks-per-node=2 --distribution=block --mpi=pmix " + kWeftrun + " check --group 2 --iters 2"), 120);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(weft::testing::last_line(r.out) == "check passed: 4 ranks, 2 nodes, 2 groups of 1 x 2");
  r = weft::testing::run(srun("-N 2 -n 4 --distribution=cyclic --mpi=pmix " + kWeftrun + " check --group 2"), 120);
  INFO(r.out << r.err);
  CHECK(r.exit_code != 0);
  CHECK(r.err.find("weftrun check --group refused before any work") != std::string::npos);
  CHECK((r.err.find("srun --ntasks-per-node=2") != std::string::npos ||
         r.err.find("srun --distribution=block") != std::string::npos));

  // The shipped batch script, as a user would submit it.
  std::string out = kState + "/check-sbatch.out";
  unlink(out.c_str());
  r = weft::testing::run("exec " + kSlurmEnv + "timeout 120 sbatch --wait -o " + out + " --export=ALL,WEFTRUN=" +
                             kWeftrun + " " + WEFT_SOURCE_DIR + "/configs/examples/check.sbatch --iters 2",
                         150);
  std::ifstream f(out);
  std::stringstream job;
  job << f.rdbuf();
  INFO(r.out << r.err << job.str());
  CHECK(r.exit_code == 0);
  CHECK(weft::testing::last_line(job.str()) == "check passed: 4 ranks, 2 nodes");
}
