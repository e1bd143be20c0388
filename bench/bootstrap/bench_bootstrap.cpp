// Fence + modex time as weft's ranks see it: `weftrun check --json` for each rank count through the
// embedded PMIx server, and through srun --mpi=pmix on fake Slurm nodes; prints a markdown table.
// With --wiring, bootstrap and transport wiring time per rank count instead (bench_wiring as the ranks).
//
//   bench_bootstrap [--ranks 2,4,8,16,32,64] [--iters 50] [--slurm]
//   bench_bootstrap --wiring [--ranks ...] [--runs 3] [--reps 5] [--cluster-conf SLURM_CONF]
//
// "fence+modex" is one allgather of a 40-byte blob (put, commit, fence with data collection, a get
// per peer), timed on every rank; per iteration the slowest rank counts; median/min/max over
// iterations. "barrier" is a fence without data. "job" is weftrun's wall time, start to exit.
// Wiring rows (bench_wiring.cpp says what each figure is): every configuration runs --runs times;
// the table gives the median over runs of each run's median, and min/max over all samples.
// --cluster-conf: also srun on an already running cluster with that slurm.conf (2 nodes, e.g.
// scripts/slurm/netns-cluster.sh up 2), with ranks/2 tasks per node.
#include <stdlib.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
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

// Runs `cmd` through the shell; its stdout into *out, its exit status back.
int run_capture(const std::string& cmd, std::string* out) {
  FILE* f = popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while (f && (n = fread(buf, 1, sizeof buf, f)) > 0) out->append(buf, n);
  return f ? pclose(f) : -1;
}

Row measure(const std::string& path, const std::string& cmd) {
  Row row;
  row.path = path;
  auto t0 = std::chrono::steady_clock::now();
  std::string out;
  int rc = run_capture(cmd, &out);
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

struct WireRow {
  std::string path, peers;
  int ranks = 0, nodes = 0, connections = 0, runs = 0;
  double init_ms = 0, modex_med = 0, wire_med = 0, wire_min = 0, wire_max = 0, wall = 0;
  bool ok = false;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Runs `cmd` (whose rank 0 prints bench_wiring's JSON) `runs` times.
WireRow measure_wiring(const std::string& path, const std::string& cmd, int runs) {
  WireRow row;
  row.path = path;
  std::vector<double> init, modex, wire, wall;
  row.wire_min = 1e300;
  for (int r = 0; r < runs; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    std::string out;
    int rc = run_capture(cmd, &out);
    wall.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    // The JSON is the last line that parses (srun may print more).
    nlohmann::json doc;
    size_t start = 0;
    while (start < out.size()) {
      size_t end = out.find('\n', start);
      if (end == std::string::npos) end = out.size();
      auto j = nlohmann::json::parse(out.substr(start, end - start), nullptr, false);
      if (!j.is_discarded() && j.is_object() && j.contains("wire_us")) doc = j;
      start = end + 1;
    }
    if (rc != 0 || doc.is_null()) {
      fprintf(stderr, "bench_bootstrap: '%s' failed (exit %d)\n", cmd.c_str(), rc);
      return row;
    }
    row.ranks = doc["ranks"];
    row.nodes = doc["nodes"];
    row.peers = doc["peers"];
    row.connections = doc["connections_per_rank"];
    init.push_back(doc["init_us"].get<double>() / 1e3);
    modex.push_back(doc["modex_us"]["median"]);
    wire.push_back(doc["wire_us"]["median"].get<double>() / 1e3);
    row.wire_min = std::min(row.wire_min, doc["wire_us"]["min"].get<double>() / 1e3);
    row.wire_max = std::max(row.wire_max, doc["wire_us"]["max"].get<double>() / 1e3);
  }
  row.ok = true;
  row.runs = runs;
  row.init_ms = median(init);
  row.modex_med = median(modex);
  row.wire_med = median(wire);
  row.wall = median(wall);
  return row;
}

int wiring_main(const std::vector<int>& ranks, int iters, int runs, int reps, const std::string& cluster_conf,
                bool embedded) {
  const std::string dir = self_dir();
  const std::string weftrun = dir + "/weftrun", rank = dir + "/bench_wiring";
  auto args = [&](const char* peers) {
    return " --iters " + std::to_string(iters) + " --reps " + std::to_string(reps) + " --peers " + peers;
  };
  std::vector<WireRow> rows;
  for (int n : embedded ? ranks : std::vector<int>{}) {
    fprintf(stderr, "bench_bootstrap: wiring, embedded, %d ranks\n", n);
    rows.push_back(
        measure_wiring("weftrun exec", weftrun + " exec -n " + std::to_string(n) + " -- " + rank + args("all"), runs));
  }
  for (int n : embedded ? ranks : std::vector<int>{}) {
    if (n < 2) continue;
    for (const char* peers : {"all", "rails"}) {
      fprintf(stderr, "bench_bootstrap: wiring, embedded, %d ranks on 2 emulated nodes, peers %s\n", n, peers);
      rows.push_back(measure_wiring(
          "weftrun exec --emulate-nodes 2",
          weftrun + " exec -n " + std::to_string(n) + " --emulate-nodes 2 -- " + rank + args(peers), runs));
    }
  }
  if (!cluster_conf.empty()) {
    for (int n : ranks) {
      if (n < 2 || n % 2) continue;
      for (const char* peers : {"all", "rails"}) {
        fprintf(stderr, "bench_bootstrap: wiring, srun on 2 nodes x %d tasks, peers %s\n", n / 2, peers);
        rows.push_back(measure_wiring("srun --mpi=pmix, 2 netns nodes",
                                      "env SLURM_CONF=" + cluster_conf + " timeout 300 srun -N 2 --ntasks-per-node=" +
                                          std::to_string(n / 2) + " --mpi=pmix " + rank + args(peers),
                                      runs));
      }
    }
  }
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  double load[3] = {0, 0, 0};
  if (getloadavg(load, 3) < 0) load[0] = -1;
  printf("host %s, %ld CPUs, load average %.2f; %d runs per row, %d fence+modex rounds and %d wirings per run\n\n",
         host, sysconf(_SC_NPROCESSORS_ONLN), load[0], runs, iters, reps);
  printf(
      "| launch path | ranks | nodes | peers | connections per rank | init (ms) | fence+modex median (us) | wiring "
      "median (ms) | wiring min (ms) | wiring max (ms) | job wall (s) |\n");
  printf("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|\n");
  int failed = 0;
  for (const auto& r : rows) {
    if (!r.ok) {
      printf("| %s | - | - | - | - | failed | | | | | |\n", r.path.c_str());
      ++failed;
      continue;
    }
    printf("| %s | %d | %d | %s | %d | %.1f | %.0f | %.1f | %.1f | %.1f | %.2f |\n", r.path.c_str(), r.ranks, r.nodes,
           r.peers.c_str(), r.connections, r.init_ms, r.modex_med, r.wire_med, r.wire_min, r.wire_max, r.wall);
  }
  return failed ? 1 : 0;
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
  bool wiring = false;
  int runs = 3, reps = 5;
  std::string cluster_conf;
  app.add_flag("--wiring", wiring, "bootstrap + transport wiring time (bench_wiring as the ranks) instead");
  app.add_option("--runs", runs, "--wiring: jobs per row (the median counts)")->check(CLI::Range(1, 100));
  app.add_option("--reps", reps, "--wiring: wirings per job")->check(CLI::Range(1, 1000));
  app.add_option("--cluster-conf", cluster_conf, "--wiring: also srun on this running 2-node cluster's slurm.conf");
  bool no_embedded = false;
  app.add_flag("--no-embedded", no_embedded, "--wiring: only the --cluster-conf rows");
  CLI11_PARSE(app, argc, argv);
  if (wiring) return wiring_main(ranks, iters, runs, reps, cluster_conf, !no_embedded);

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
