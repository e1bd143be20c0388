// weftrun's embedded launcher for real: N rank processes under its own PMIx server (libpmix), the
// check they run, and every way a job can fail (kill -9, stall, early exit, abort, Ctrl-C).
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "tests/launcher/proc.h"

using weft::testing::Proc;
using weft::testing::ProcResult;

namespace {

const std::string kWeftrun = std::string(WEFT_BINARY_DIR) + "/bin/weftrun";
// Environment for every run: short bounds so a broken build fails fast instead of hanging CI.
const std::string kEnv = "env -u WEFT_TEST_FAULT WEFT_BOOTSTRAP_TIMEOUT=20 WEFT_LAUNCH_KILL_GRACE=2 ";

std::string weftrun(const std::string& args, const std::string& env = "") {
  return kEnv + env + " " + kWeftrun + " " + args;
}

// Starts a long check and returns the ranks' pids by rank, once all of them are running.
std::vector<pid_t> wait_for_ranks(Proc& p, int n) {
  std::vector<pid_t> by_rank(n, -1);
  for (int tries = 0; tries < 200; ++tries) {
    auto kids = weft::testing::children_of(p.pid());
    int found = 0;
    for (pid_t k : kids) {
      std::string r = weft::testing::env_of(k, "PMIX_RANK");
      if (!r.empty() && atoi(r.c_str()) < n) by_rank[atoi(r.c_str())] = k, ++found;
    }
    if (found == n) {
      p.read_until("", 0.5);  // let them get into the exchange loop
      return by_rank;
    }
    p.read_until("", 0.05);
  }
  return {};
}

}  // namespace

TEST_CASE("check with 4 ranks passes and prints one line per rank, then the summary line") {
  ProcResult r = weft::testing::run("exec " + weftrun("check -n 4 --iters 3"), 60);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(weft::testing::count_lines_starting(r.out, "rank ") == 4);
  for (int i = 0; i < 4; ++i) CHECK(r.out.find("rank " + std::to_string(i) + "/4: node 0/1") != std::string::npos);
  // Each line says which GPU the rank bound, or that there is none (scripts/gpu/10-launch.sh checks
  // the bus ids against nvidia-smi where there are GPUs).
  CHECK(weft::testing::count_lines_starting(r.out, "rank ") ==
        static_cast<int>(std::count_if(r.out.begin(), r.out.end(), [](char c) { return c == '\n'; })) - 2);
  CHECK((r.out.find("no GPU") != std::string::npos || r.out.find(", GPU ") != std::string::npos));
  CHECK(weft::testing::last_line(r.out) == "check passed: 4 ranks, 1 nodes");
}

TEST_CASE("check --transport socket --json reports the job's transport counters under \"transport\"") {
  ProcResult r =
      weft::testing::run("exec " + weftrun("check -n 4 --emulate-nodes 2 --transport socket --iters 2 --json"), 90);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  auto doc = nlohmann::json::parse(r.out);
  CHECK(doc["passed"] == true);
  const auto& t = doc["transport"];
  CHECK(t["backend"] == "socket");
  CHECK(t["signal_mode"].is_string());
  for (const char* k : {"puts", "signals", "fences", "batches", "stalls"}) CHECK(t[k].is_number_unsigned());
  CHECK(t["puts"].get<uint64_t>() > 0);
  CHECK(t["signals"].get<uint64_t>() > 0);
  CHECK(t["per_rank"].size() == 4);
}

TEST_CASE("--emulate-nodes gives each emulated node its own node index, hostname and local ranks") {
  ProcResult r = weft::testing::run("exec " + weftrun("check -n 5 --emulate-nodes 2 --iters 2 --json"), 60);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  auto doc = nlohmann::json::parse(r.out);
  CHECK(doc["passed"] == true);
  CHECK(doc["ranks"] == 5);
  CHECK(doc["nodes"] == 2);
  CHECK(doc["launched_by"] == "weftrun");
  REQUIRE(doc["per_rank"].size() == 5);
  // Block placement: 3 ranks on node 0, 2 on node 1; local ranks restart at 0 on each node.
  const int node[5] = {0, 0, 0, 1, 1}, local[5] = {0, 1, 2, 0, 1};
  std::set<std::string> hosts[2];
  std::set<int> pids;
  for (int i = 0; i < 5; ++i) {
    const auto& e = doc["per_rank"][i];
    CHECK(e["rank"] == i);
    CHECK(e["node"] == node[i]);
    CHECK(e["local_rank"] == local[i]);
    hosts[node[i]].insert(e["hostname"].get<std::string>());
    pids.insert(e["pid"].get<int>());
  }
  CHECK(hosts[0].size() == 1);
  CHECK(hosts[1].size() == 1);
  CHECK(*hosts[0].begin() != *hosts[1].begin());
  CHECK(pids.size() == 5);  // five processes, not one answering for all
  CHECK(doc["modex_us"]["median"].get<double>() > 0);
}

TEST_CASE("a rank killed with SIGKILL mid-check is reported by the launcher and its peers; nothing is left") {
  Proc p("exec " + weftrun("check -n 4 --iters 100000000"));
  auto ranks = wait_for_ranks(p, 4);
  REQUIRE(ranks.size() == 4);
  REQUIRE(kill(ranks[2], SIGKILL) == 0);
  double killed_at = p.elapsed();
  ProcResult r = p.wait(40);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 1);
  CHECK(r.seconds - killed_at < 30);
  CHECK(r.err.find("rank 2 (pid " + std::to_string(ranks[2])) != std::string::npos);
  CHECK(r.err.find("killed by signal 9") != std::string::npos);
  CHECK(r.err.find("peer rank 2 failed") != std::string::npos);  // a peer noticed, not just the launcher
  for (pid_t k : ranks) CHECK_FALSE(weft::testing::alive(k));
}

TEST_CASE("a rank that never reaches the fence makes the others time out naming it") {
  ProcResult r =
      weft::testing::run("exec " + weftrun("check -n 4", "WEFT_TEST_FAULT=2:stall WEFT_BOOTSTRAP_TIMEOUT=2"), 40);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 1);
  CHECK(r.seconds < 20);
  CHECK(r.err.find("timed out after") != std::string::npos);
  CHECK(r.err.find("ranks that did not arrive: 2\n") != std::string::npos);
  CHECK(r.out.find("check passed") == std::string::npos);
}

TEST_CASE("early exit, crash and abort of one rank each stop the job with the cause named") {
  struct Case {
    const char* mode;
    const char* expect;
  } cases[] = {{"exit", "rank 1 (pid"},
               {"exit", "never called PMIx_Finalize"},
               {"crash", "killed by signal 11"},
               {"abort", "rank 1 aborted the job"}};
  for (const auto& c : cases) {
    ProcResult r = weft::testing::run("exec " + weftrun("check -n 3", std::string("WEFT_TEST_FAULT=1:") + c.mode), 40);
    INFO(c.mode << ": " << r.out << r.err);
    CHECK(r.exit_code == 1);
    CHECK(r.seconds < 30);
    CHECK(r.err.find(c.expect) != std::string::npos);
    CHECK(r.err.find("job failed") != std::string::npos);
  }
}

TEST_CASE("SIGINT to weftrun stops every rank") {
  Proc p("exec " + weftrun("check -n 3 --iters 100000000"));
  auto ranks = wait_for_ranks(p, 3);
  REQUIRE(ranks.size() == 3);
  REQUIRE(kill(p.pid(), SIGINT) == 0);
  ProcResult r = p.wait(30);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 128 + SIGINT);
  CHECK(r.err.find("stopping 3 ranks") != std::string::npos);
  for (pid_t k : ranks) CHECK_FALSE(weft::testing::alive(k));
}

TEST_CASE("a task of a launcher without PMIx is told how to launch") {
  ProcResult r = weft::testing::run(
      "exec " + weftrun("check", "SLURM_JOB_ID=7 SLURM_STEP_ID=0 SLURM_PROCID=1 SLURM_STEP_NUM_TASKS=4"), 20);
  INFO(r.err);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("srun --mpi=pmix") != std::string::npos);

  // PMIx variables that point at no server: a bounded failure that says how to launch.
  r = weft::testing::run("exec " + weftrun("check",
                                           "WEFT_BOOTSTRAP_TIMEOUT=3 PMIX_NAMESPACE=nowhere PMIX_RANK=0 "
                                           "PMIX_SERVER_URI41='nowhere.0;tcp4://127.0.0.1:1'"),
                         30);
  INFO(r.err);
  CHECK(r.exit_code == 1);
  CHECK(r.seconds < 15);
  CHECK(r.err.find("srun --mpi=pmix") != std::string::npos);
}

TEST_CASE("a PMIx server that accepts but never answers cannot hang a rank: PMIx_Init is bounded") {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(listen(fd, 8) == 0);  // the kernel completes connections; nobody ever replies
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  std::string uri = "'mute.0;tcp4://127.0.0.1:" + std::to_string(ntohs(addr.sin_port)) + "'";
  ProcResult r = weft::testing::run(
      "exec " + weftrun("check", "WEFT_BOOTSTRAP_TIMEOUT=3 PMIX_NAMESPACE=mute PMIX_RANK=0 PMIX_SERVER_URI41=" + uri),
      40);
  close(fd);
  INFO(r.err);
  CHECK(r.exit_code == 1);
  CHECK(r.seconds < 15);
  CHECK(r.err.find("PMIx_Init did not return within WEFT_BOOTSTRAP_TIMEOUT=3.0 s") != std::string::npos);
}

// A program that makes a second weft::Context connects to PMIx again: that connection must neither
// reuse the last one's exchange numbers nor read the entries it put (a second context once mapped
// a peer's freed heap from its first context's record).
TEST_CASE("a rank that connects three times exchanges afresh each time, never reading an earlier entry") {
  ProcResult r = weft::testing::run(
      "exec " + weftrun("exec -n 3 -- " + std::string(WEFT_BINARY_DIR) + "/bin/bootstrap_reconnect_rank",
                        "WEFT_BOOTSTRAP_TIMEOUT=3"),
      90);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  for (int rank = 0; rank < 3; ++rank)
    CHECK(r.out.find("reconnect: rank " + std::to_string(rank) + ": 3 connections, every entry from its own") !=
          std::string::npos);
}

// Ranks of a job across nodes load every kernel when CUDA starts (a lazy load during an op across
// nodes can deadlock with the proxy's copies), unless the user chose a loading mode.
// And the most hardware work queues (a proxy copy queued behind a kernel waiting for it stalls).
TEST_CASE("ranks of a job across nodes get CUDA_MODULE_LOADING=EAGER and 32 work queues unless the user set them") {
  // Each rank says what it got, then joins the job (a rank that never does is a failure).
  const std::string rank = "sh -c 'echo loading=$CUDA_MODULE_LOADING; echo queues=$CUDA_DEVICE_MAX_CONNECTIONS; exec " +
                           std::string(WEFT_BINARY_DIR) + "/bin/bootstrap_reconnect_rank'";
  auto count = [](const std::string& out, const std::string& what) {
    int n = 0;
    for (size_t at = out.find(what); at != std::string::npos; at = out.find(what, at + 1)) ++n;
    return n;
  };
  ProcResult r = weft::testing::run("exec env -u CUDA_MODULE_LOADING -u CUDA_DEVICE_MAX_CONNECTIONS " +
                                        weftrun("exec -n 2 --emulate-nodes 2 -- " + rank),
                                    60);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(count(r.out, "loading=EAGER\n") == 2);
  CHECK(count(r.out, "queues=32\n") == 2);
  r = weft::testing::run("exec " + weftrun("exec -n 2 --emulate-nodes 2 -- " + rank,
                                           "CUDA_MODULE_LOADING=LAZY CUDA_DEVICE_MAX_CONNECTIONS=16"),
                         60);
  CHECK(r.exit_code == 0);
  CHECK(count(r.out, "loading=LAZY\n") == 2);
  CHECK(count(r.out, "queues=16\n") == 2);
  // One node: CUDA's defaults stay.
  r = weft::testing::run(
      "exec env -u CUDA_MODULE_LOADING -u CUDA_DEVICE_MAX_CONNECTIONS " + weftrun("exec -n 2 -- " + rank), 60);
  CHECK(r.exit_code == 0);
  CHECK(count(r.out, "loading=\n") == 2);
  CHECK(count(r.out, "queues=\n") == 2);
}

TEST_CASE("weftrun run: a bad workload fails before any rank starts, GPU or not") {
  ProcResult r = weft::testing::run("exec " + weftrun("run /nonexistent/workload.yaml"), 30);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("/nonexistent/workload.yaml:1:1: (file): cannot be read") != std::string::npos);
  r = weft::testing::run("exec " + weftrun("run /dev/zero"), 30);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("/dev/zero:1:1: (file): is a character device") != std::string::npos);
}

TEST_CASE("weftrun run without a GPU prints the plan, saying why, and exits 0") {
  if (access("/dev/nvidia0", F_OK) == 0) {
    // With a GPU it runs the op instead, which the GPU suite tests.
    printf("SKIPPED: 'weftrun run without a GPU' (this machine has /dev/nvidia0)\n");
    return;
  }
  ProcResult r = weft::testing::run(
      "exec " + weftrun("run " + std::string(WEFT_SOURCE_DIR) + "/configs/examples/ag_gemm_llama70b.yaml"), 60);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.out.rfind("weftrun run: no GPU found on this machine: printing the plan", 0) == 0);
}

TEST_CASE("--transport with no registered transport check is refused before any rank starts, naming it") {
  ProcResult r = weft::testing::run("exec " + weftrun("check -n 2 --transport no-such-transport"), 40);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 2);
  CHECK(r.out.empty());
  CHECK(r.err.find("--transport: no transport 'no-such-transport' in this build") != std::string::npos);
}

// A stopped rank neither exits nor answers: no launcher event reports it. The liveness ring
// (WEFT_LIVENESS=on; on by default under srun) names it once its heartbeats stop.
TEST_CASE("WEFT_LIVENESS=on: a SIGSTOPped rank is named by its peers after WEFT_LIVENESS_TIMEOUT; the job ends") {
  Proc p("exec " + weftrun("check -n 4 --iters 100000000", "WEFT_LIVENESS=on WEFT_LIVENESS_TIMEOUT=3"));
  auto ranks = wait_for_ranks(p, 4);
  REQUIRE(ranks.size() == 4);
  REQUIRE(kill(ranks[1], SIGSTOP) == 0);
  double stopped_at = p.elapsed();
  ProcResult r = p.wait(60);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 1);
  CHECK(r.seconds - stopped_at < 15);  // 3 s of silence, then the peers leave and the launcher stops the rest
  // "sent no heartbeat for" or, stopped before its first heartbeat, "sent nothing on its liveness connection"
  CHECK(r.err.find("peer rank 1 failed: rank 1 sent no") != std::string::npos);
  for (pid_t k : ranks) CHECK_FALSE(weft::testing::alive(k));
  if (weft::testing::alive(ranks[1])) kill(ranks[1], SIGKILL);
}

TEST_CASE("WEFT_LIVENESS=on: a job whose ranks all finish is not a failure (each says goodbye)") {
  auto r = weft::testing::run("exec " + weftrun("check -n 4 --iters 20",
                                                "WEFT_LIVENESS=on WEFT_LIVENESS_TIMEOUT=2 WEFT_DEBUG=INFO "
                                                "WEFT_DEBUG_SUBSYS=BOOT"),
                              60);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(weft::testing::count_lines_starting(r.err, "weft") > 0);
  CHECK(r.err.find("liveness ring up: to rank 1") != std::string::npos);
  CHECK(r.err.find("failed") == std::string::npos);
}
