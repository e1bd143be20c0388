// weftrun refuses bad input before any rank starts, once, with exit 2 and one line: command-line
// errors, counts that cannot be a job, unknown transports, and the WEFT_* environment (unknown
// names, bad values, experiment switches outside bench). Also --help, --version, --print-params.
#include <doctest/doctest.h>

#include <algorithm>
#include <regex>
#include <string>
#include <vector>

#include "launcher/launch.h"
#include "launcher/preflight.h"
#include "runtime/tuner.h"
#include "runtime/workload.h"
#include "tests/launcher/proc.h"

using weft::Status;
using weft::testing::ProcResult;

namespace {

const std::string kWeftrun = std::string(WEFT_BINARY_DIR) + "/bin/weftrun";
const std::string kExample = std::string(WEFT_SOURCE_DIR) + "/configs/examples/ag_gemm_llama70b.yaml";
// Every weftrun here starts from an environment with no WEFT_* parameter but the ones a case sets.
const std::string kClean =
    "env -u WEFT_TEST_FAULT -u WEFT_NET_CHANNELS -u WEFT_GPU_ARCH -u WEFT_AG_MOVER -u WEFT_TOPO_FILE "
    "-u WEFT_DEBUG WEFT_BOOTSTRAP_TIMEOUT=10 ";

ProcResult weftrun(const std::string& args, const std::string& env = "") {
  return weft::testing::run("exec " + kClean + env + " " + kWeftrun + " " + args, 60);
}

int lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

// The longest run of digits: a range printed as 1.79769e+308 written out is hundreds long.
size_t longest_number(const std::string& s) {
  size_t best = 0, cur = 0;
  for (char c : s) best = std::max(best, cur = isdigit(static_cast<unsigned char>(c)) ? cur + 1 : 0);
  return best;
}

// A refusal: exit 2, nothing on stdout, exactly one line on stderr that starts with `prefix`.
void refused(const ProcResult& r, const std::string& prefix) {
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  CHECK(r.exit_code == 2);
  CHECK(r.out.empty());
  CHECK(lines(r.err) == 1);
  CHECK(r.err.rfind(prefix, 0) == 0);
  CHECK(r.seconds < 20);  // refused at once, not after a bootstrap timeout
}

char** env_of(std::vector<std::string>& entries, std::vector<char*>* ptrs) {
  ptrs->clear();
  for (auto& e : entries) ptrs->push_back(e.data());
  ptrs->push_back(nullptr);
  return ptrs->data();
}

}  // namespace

TEST_CASE("command-line errors: exit 2, one line 'weftrun <cmd>: what', no CLI11 exit codes or ranges") {
  struct Case {
    const char* args;
    const char* prefix;
  };
  const std::string w = "'" + kExample + "'";
  const Case cases[] = {
      {"check --iters 0", "weftrun check: --iters: "},
      {"check --iters 99999999999", "weftrun check: --iters: "},
      {"check --iters -1", "weftrun check: --iters: "},
      {"check -n 0", "weftrun check: --ranks: "},
      {"check -n -3", "weftrun check: --ranks: "},
      {"check -n 100000", "weftrun check: --ranks: "},
      {"check -n abc", "weftrun check: --ranks: "},
      {"check --emulate-nodes 0", "weftrun check: --emulate-nodes: "},
      {"check --bogus", "weftrun check: "},
      {"run -n 0 x.yaml", "weftrun run: --ranks: "},
      {"plan --nodes 0 x.yaml", "weftrun plan: --nodes: "},
      {"plan", "weftrun plan: workload is required"},
      {"topo --bogus", "weftrun topo: "},
      {"frobnicate", "weftrun: "},
  };
  for (const auto& c : cases) {
    INFO(c.args);
    ProcResult r = weftrun(c.args);
    refused(r, c.prefix);
    CHECK(longest_number(r.err) < 12);
  }
  // bench's own options (cmd_bench.cpp) still say CLI::PositiveNumber: exit 2 and one line all the same.
  refused(weftrun("bench -n 0 " + w), "weftrun bench: --ranks: ");
}

TEST_CASE("counts that cannot be a job are refused before any rank starts") {
  refused(weftrun("check -n 2 --emulate-nodes 4"), "weftrun check: cannot place 2 ranks on 4 emulated nodes");
  const std::string w = "'" + kExample + "'";
  refused(weftrun("bench -n 100000 " + w), "weftrun bench: --ranks: Value 100000 not in range 1 to 4096");
  refused(weftrun("bench -n 2 --emulate-nodes 3 " + w), "weftrun bench: " + kExample + ": cannot place 2 ranks");
  refused(weftrun("bench --seed -1 " + w), "weftrun bench: --seed: ");
  refused(weftrun("bench --seed many " + w), "weftrun bench: --seed: ");
  // --json's file is made before any rank starts: one it cannot write is refused then.
  refused(weftrun("bench --json /nonexistent-weft-dir/rows.jsonl " + w),
          "weftrun bench: --json /nonexistent-weft-dir/rows.jsonl: cannot write it: No such file or directory");
}

TEST_CASE("check --transport: a name this build does not have is refused on the command line") {
  ProcResult r = weftrun("check -n 2 --transport sockt");
  refused(r, "weftrun check: --transport: no transport 'sockt' in this build; did you mean socket?");
  refused(weftrun("check -n 2 --transport rdma"), "weftrun check: --transport: no transport 'rdma' in this build");
}

TEST_CASE("--help and --version exit 0; --version names the version, the commit and CUDA") {
  for (const char* args : {"--help", "check --help", "run --help", "bench --help", "plan --help", "topo --help"}) {
    INFO(args);
    ProcResult r = weftrun(args);
    CHECK(r.exit_code == 0);
    CHECK(r.out.find("Usage: ") != std::string::npos);
  }
  ProcResult v = weftrun("--version");
  INFO(v.out << v.err);
  CHECK(v.exit_code == 0);
  CHECK(std::regex_match(v.out,
                         std::regex("weftrun [0-9]+\\.[0-9]+\\.[0-9]+ \\(.+, (CUDA [0-9.]+|built without CUDA)\\)\n")));
  // A bad environment does not stop --version, --help or --print-params: they are how one finds out.
  CHECK(weftrun("--version", "WEFT_NET_CHANNELS=99").exit_code == 0);
  ProcResult p = weftrun("--print-params", "WEFT_NET_CHANNELS=99");
  CHECK(p.exit_code == 0);
  CHECK(p.out.find("WEFT_NET_CHANNELS") != std::string::npos);
  CHECK(p.out.find("refused: expected an integer from 1 to 8") != std::string::npos);
  CHECK(p.out.find("WEFT_AG_MOVER") == std::string::npos);
  ProcResult all = weftrun("--print-params=all");
  CHECK(all.exit_code == 0);
  CHECK(all.out.find("WEFT_AG_MOVER") != std::string::npos);
  CHECK(all.out.find(" bench ") != std::string::npos);
  refused(weftrun("--print-params=some"), "weftrun: --print-params: ");
}

TEST_CASE("WEFT_* values: one rule at startup, naming the variable, exit 2") {
  const std::string w = "'" + kExample + "'";
  ProcResult r = weftrun("plan " + w, "WEFT_NET_CHANNELS=99");
  refused(r, "weftrun: WEFT_NET_CHANNELS=99: expected an integer from 1 to 8");
  r = weftrun("plan " + w, "WEFT_NET_CHANNEL=4");
  refused(r, "weftrun: WEFT_NET_CHANNEL is not a weft parameter; did you mean WEFT_NET_CHANNELS?");
  r = weftrun("plan " + w, "WEFT_GPU_ARCH=a100");
  refused(r, "weftrun: WEFT_GPU_ARCH=a100: expected one of auto, h100, h200");
  CHECK(r.err.find(":1:1") == std::string::npos);
  refused(weftrun("check -n 1", "WEFT_BOOTSTRAP_TIMEOUT=0"), "weftrun: WEFT_BOOTSTRAP_TIMEOUT=0: expected a number");
  refused(weftrun("topo", "WEFT_DEBUG=verbose"), "weftrun: WEFT_DEBUG=verbose: expected one of NONE, WARN, INFO");
  // Two bad variables: one line each, still one refusal.
  r = weftrun("plan " + w, "WEFT_NET_CHANNELS=99 WEFT_SIGNAL_MODE=eager");
  CHECK(r.exit_code == 2);
  CHECK(lines(r.err) == 2);
  CHECK(r.err.find("WEFT_SIGNAL_MODE=eager: expected one of serial, fenced, batched") != std::string::npos);
  // A rank other than 0 (srun, mpirun) refuses as well, silently: rank 0 says it once for the job.
  r = weftrun("plan " + w, "PMIX_RANK=3 WEFT_NET_CHANNELS=99");
  CHECK(r.exit_code == 2);
  CHECK(r.err.empty());
  // Good values, the scripts' own variables and an empty value pass.
  r = weftrun("plan " + w, "WEFT_NET_CHANNELS=8 WEFT_GPU_ARCH=H100 WEFT_BUILD_DIR=/tmp/b WEFT_SIGNAL_MODE=");
  CHECK_MESSAGE(r.exit_code == 0, r.err);
}

TEST_CASE("experiment switches of weftrun bench are refused by every other command, honoured by bench") {
  const std::string w = "'" + kExample + "'";
  refused(weftrun("run " + w, "WEFT_AG_MOVER=sm"),
          "weftrun run: WEFT_AG_MOVER is an experiment switch of weftrun bench; run executes the plan (set roles in "
          "the workload or pass --plan)");
  refused(weftrun("plan " + w, "WEFT_GEMM_REDUCE_PATH=peer"),
          "weftrun plan: WEFT_GEMM_REDUCE_PATH is an experiment switch of weftrun bench");
  refused(weftrun("check -n 1", "WEFT_OPS_INPUT=uniform"), "weftrun check: WEFT_OPS_INPUT is an experiment switch");
  // bench takes it: the missing file is what it reports, not the switch (no GPU or rank needed).
  ProcResult r = weftrun("bench /nonexistent/w.yaml", "WEFT_AG_MOVER=sm");
  INFO(r.err);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("experiment switch") == std::string::npos);
  CHECK(r.err.find("/nonexistent/w.yaml") != std::string::npos);
  // A bad value of a switch is refused for bench too.
  refused(weftrun("bench " + w, "WEFT_AG_MOVER=warp"), "weftrun: WEFT_AG_MOVER=warp: expected a comma list of auto");
  // Test-only parameters pass everywhere (the launcher tests inject faults into check).
  std::vector<std::string> problems;
  std::vector<std::string> env = {"WEFT_TEST_FAULT=1:exit", "PATH=/bin"};
  std::vector<char*> ptrs;
  CHECK(weft::launcher::check_environment("check", env_of(env, &ptrs), &problems) == Status::kOk);
}

TEST_CASE("check_environment and nearest_param, directly") {
  std::vector<std::string> env = {"HOME=/root",       "WEFT_NET_CHANNELS=3",       "WEFT_GEMM_DYNAMIC=0",
                                  "WEFT_HEAPBYTES=1", "WEFT_ZZZZZZZZZZZZZZZZZZ=1", "WEFT_FIFO_DEPTH=1"};
  std::vector<char*> ptrs;
  std::vector<std::string> problems;
  CHECK(weft::launcher::check_environment("run", env_of(env, &ptrs), &problems) == Status::kInvalidArgument);
  REQUIRE(problems.size() == 4);
  CHECK(problems[0] ==
        "weftrun run: WEFT_GEMM_DYNAMIC is an experiment switch of weftrun bench; run executes the "
        "plan (set roles in the workload or pass --plan)");
  CHECK(problems[1] ==
        "weftrun: WEFT_HEAPBYTES is not a weft parameter; did you mean WEFT_HEAP_BYTES? (weftrun --print-params=all "
        "lists them)");
  CHECK(problems[2] ==
        "weftrun: WEFT_ZZZZZZZZZZZZZZZZZZ is not a weft parameter (weftrun --print-params=all lists them)");
  CHECK(problems[3] == "weftrun: WEFT_FIFO_DEPTH=1: expected an integer from 2 to 16777216");
  CHECK(weft::launcher::check_environment("bench", env_of(env, &ptrs), &problems) == Status::kInvalidArgument);
  CHECK(problems.size() == 3);  // bench takes the switch
  CHECK(weft::launcher::nearest_param("WEFT_BOOTSTRAP_TIMEOUTS") == "WEFT_BOOTSTRAP_TIMEOUT");
  CHECK(weft::launcher::nearest_param("WEFT_X") == "");
}

TEST_CASE("check_launch: counts, emulated nodes, and a GPU for every rank where that is asked") {
  auto fits = [](int ranks, int nodes, int gpus, bool per_gpu, std::string* why = nullptr) {
    weft::launcher::LaunchOptions o;
    o.ranks = ranks, o.nodes = nodes, o.gpus = gpus;
    std::string w;
    const bool ok = weft::launcher::check_launch(o, per_gpu, &w) == Status::kOk;
    if (why) *why = w;
    return ok;
  };
  std::string why;
  CHECK(fits(4, 1, 0, false));
  CHECK(fits(8, 1, 1, false));  // check, run --oversubscribe: ranks may share GPUs
  CHECK_FALSE(fits(0, 1, 0, false));
  CHECK_FALSE(fits(weft::launcher::kMaxRanks + 1, 1, 0, false));
  CHECK_FALSE(fits(2, 3, 0, false, &why));
  CHECK(why == "cannot place 2 ranks on 3 emulated nodes: expected 1 to 2 nodes (every node needs a rank)");
  CHECK(fits(4, 1, 4, true));
  CHECK(fits(4, 2, 4, true));
  CHECK(fits(4, 1, 0, true));  // no GPU: bench prints the plan
  CHECK_FALSE(fits(4, 1, 1, true, &why));
  CHECK(why == "needs 4 GPUs per node, 4 in all; this machine has 1 (a GPU of its own for every rank)");
  CHECK_FALSE(fits(2, 2, 1, true, &why));  // both emulated nodes would see the one GPU
  CHECK(why.find("needs 1 GPUs per node on 2 emulated nodes, 2 in all; this machine has 1") == 0);
  // 5 ranks on 2 nodes: 3 + 2 ranks; 5 GPUs slice 2 + 3 (gpu_slice_for_node): node 0 is short.
  CHECK_FALSE(fits(5, 2, 5, true, &why));
  CHECK(why.find("needs 3 GPUs on emulated node 0 of 2, which gets 2 of this machine's 5") == 0);
  CHECK(fits(5, 2, 6, true));
}

TEST_CASE("check_bench_fits: the workload's layout against the machine's GPUs") {
  std::string error;
  CHECK(weft::launcher::check_bench_fits(kExample, 0, 0, 4, &error) == Status::kOk);
  CHECK(weft::launcher::check_bench_fits(kExample, 0, 0, 0, &error) == Status::kOk);
  CHECK(weft::launcher::check_bench_fits(kExample, 0, 0, 2, &error) == Status::kInvalidArgument);
  CHECK(error == kExample + ": needs 4 GPUs per node, 4 in all; this machine has 2 (a GPU of its own for every rank)");
  CHECK(weft::launcher::check_bench_fits(kExample, 2, 0, 2, &error) == Status::kOk);             // -n 2
  CHECK(weft::launcher::check_bench_fits("/nonexistent.yaml", 0, 0, 1, &error) == Status::kOk);  // bench reports it
}

TEST_CASE("make_plan blames WEFT_GPU_ARCH itself, not the workload file") {
  weft::runtime::Workload w;
  std::string err;
  REQUIRE(weft::runtime::parse_workload("op: ag_gemm\nshape: {m: 8192, n: 8192, k: 8192}\n", "w.yaml", &w, &err) ==
          Status::kOk);
  weft::runtime::Plan p;
  setenv("WEFT_GPU_ARCH", "a100", 1);
  CHECK(weft::runtime::make_plan(w, w.layout, {}, {}, &p, &err) == Status::kInvalidArgument);
  unsetenv("WEFT_GPU_ARCH");
  CHECK(err == "WEFT_GPU_ARCH=a100: expected one of auto, h100, h200");
}
