// Fence + modex time as weft's ranks see it: `weftrun check --json` for each rank count through the
// embedded PMIx server, and through srun --mpi=pmix on fake Slurm nodes; prints a markdown table.
//
//   bench_bootstrap [--ranks 2,4,8,16,32,64] [--iters 50] [--slurm]
//
// "fence+modex" is one allgather of a 40-byte blob (put, commit, fence with data collection, a get
// per peer), timed on every rank; per iteration the slowest rank counts; median/min/max over
// iterations. "barrier" is a fence without data. "job" is weftrun's wall time, start to exit.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace {

struct Row {
  std::string path;
  int ranks = 0, nodes = 0;
  double med = 0, min = 0, max = 0, barrier = 0, wall = 0;
  bool ok = false;
};

std::string self_dir() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  buf[n > 0 ? n : 0] = 0;
  std::string p(buf);
  return p.substr(0, p.rfind('/'));
}

Row measure(const std::string& path, const std::string& cmd) {
  Row row;
  row.path = path;
  auto t0 = std::chrono::steady_clock::now();
  FILE* f = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while (f && (n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  int rc = f ? pclose(f) : -1;
  row.wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto doc = nlohmann::json::parse(out, nullptr, false);
  if (rc != 0 || doc.is_discarded() || !doc.value("passed", false)) {
    fprintf(stderr, "bench_bootstrap: '%s' failed (exit %d)\n", cmd.c_str(), rc);
    return row;
  }
  row.ok = true;
  row.ranks = doc["ranks"];
  row.nodes = doc["nodes"];
  row.med = doc["modex_us"]["median"];
  row.min = doc["modex_us"]["min"];
  row.max = doc["modex_us"]["max"];
  row.barrier = doc["barrier_us"]["median"];
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_bootstrap: fence + modex time per launch path and rank count"};
  std::vector<int> ranks = {2, 4, 8, 16, 32, 64};
  int iters = 50;
  bool slurm = false;
  app.add_option("--ranks", ranks, "rank counts for the embedded launcher")->delimiter(',');
  app.add_option("--iters", iters, "exchanges per run");
  app.add_flag("--slurm", slurm, "also run on 2 fake Slurm nodes (root; starts and stops the daemons)");
  CLI11_PARSE(app, argc, argv);

  const std::string weftrun = self_dir() + "/weftrun";
  const std::string it = " --iters " + std::to_string(iters) + " --json";
  std::vector<Row> rows;
  for (int n : ranks) {
    fprintf(stderr, "bench_bootstrap: embedded, %d ranks\n", n);
    rows.push_back(measure("weftrun (embedded PMIx server)", weftrun + " check -n " + std::to_string(n) + it));
  }
  for (int n : ranks) {
    if (n < 2) continue;
    fprintf(stderr, "bench_bootstrap: embedded, %d ranks on 2 emulated nodes\n", n);
    rows.push_back(
        measure("weftrun --emulate-nodes 2", weftrun + " check -n " + std::to_string(n) + " --emulate-nodes 2" + it));
  }
  if (slurm) {
    const std::string state = "/tmp/weft-slurm-bench";
    const std::string env =
        "SLURM_STATE_DIR=" + state + " SLURM_CONF_DEST=" + state + "/slurm.conf SLURM_CONF=" + state + "/slurm.conf ";
    const std::string scripts = std::string(WEFT_SOURCE_DIR) + "/scripts/slurm";
    if (system((env + scripts + "/slurm-up.sh 2 >&2").c_str()) == 0) {
      for (int per_node : {1, 2, 4}) {
        fprintf(stderr, "bench_bootstrap: srun, 2 nodes x %d tasks\n", per_node);
        rows.push_back(measure("srun --mpi=pmix, 2 fake nodes",
                               "env " + env + "timeout 120 srun -N 2 --ntasks-per-node=" + std::to_string(per_node) +
                                   " --mpi=pmix " + weftrun + " check" + it));
      }
    } else {
      fprintf(stderr, "bench_bootstrap: slurm-up.sh failed; no Slurm rows\n");
    }
    if (system((env + scripts + "/slurm-down.sh >&2").c_str()) != 0)
      fprintf(stderr, "bench_bootstrap: slurm-down.sh failed\n");
  }

  char host[256] = "";
  gethostname(host, sizeof host - 1);
  printf("host %s, %ld CPUs, %d iterations per run\n\n", host, sysconf(_SC_NPROCESSORS_ONLN), iters);
  printf(
      "| launch path | ranks | nodes | fence+modex median (us) | min (us) | max (us) | barrier median (us) | job wall "
      "(s) |\n");
  printf("|---|---:|---:|---:|---:|---:|---:|---:|\n");
  int failed = 0;
  for (const auto& r : rows) {
    if (!r.ok) {
      printf("| %s | - | - | failed | | | | %.2f |\n", r.path.c_str(), r.wall);
      ++failed;
      continue;
    }
    printf("| %s | %d | %d | %.0f | %.0f | %.0f | %.0f | %.2f |\n", r.path.c_str(), r.ranks, r.nodes, r.med, r.min,
           r.max, r.barrier, r.wall);
  }
  return failed ? 1 : 0;
}
