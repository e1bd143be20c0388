// Open MPI's mpirun as the PMIx server: weftrun check runs as one rank of its job.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "tests/launcher/proc.h"

TEST_CASE("mpirun -np 4 weftrun check passes with mpirun serving PMIx") {
  if (system("command -v mpirun >/dev/null 2>&1") != 0) {
    printf("SKIPPED: mpirun not found (apt-get install openmpi-bin)\n");
    exit(77);
  }
  std::string weftrun = std::string(WEFT_BINARY_DIR) + "/bin/weftrun";
  std::string mpirun = "exec env WEFT_BOOTSTRAP_TIMEOUT=30 mpirun --allow-run-as-root --oversubscribe -np 4 ";
  auto r = weft::testing::run(mpirun + weftrun + " check --iters 3", 90);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(weft::testing::count_lines_starting(r.out, "rank ") == 4);
  CHECK(weft::testing::last_line(r.out) == "check passed: 4 ranks, 1 nodes");

  r = weft::testing::run(mpirun + weftrun + " check --json", 90);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  auto doc = nlohmann::json::parse(r.out);  // only rank 0 prints: one document
  CHECK(doc["passed"] == true);
  CHECK(doc["ranks"] == 4);
  CHECK(doc["nodes"] == 1);
  CHECK(doc["launched_by"] == "mpirun");
}

#if WEFT_TEST_RUN
namespace {
bool gpus_visible() { return system("nvidia-smi -L >/dev/null 2>&1") == 0; }
}  // namespace

// On a machine without a GPU, `weftrun run` under mpirun behaves as under weftrun's own launcher:
// the plan the job would run, printed once, exit 0; a job the plan does not fit is refused (exit 2).
TEST_CASE("mpirun weftrun run without a GPU: rank 0 prints the plan the job would run, exit 0" *
          doctest::skip(gpus_visible())) {
  if (system("command -v mpirun >/dev/null 2>&1") != 0) {
    printf("SKIPPED: mpirun not found (apt-get install openmpi-bin)\n");
    exit(77);
  }
  const std::string weftrun = std::string(WEFT_BINARY_DIR) + "/bin/weftrun";
  const std::string workload = std::string(WEFT_SOURCE_DIR) + "/configs/examples/ag_gemm_m2048.yaml";
  const std::string mpirun = "exec env WEFT_BOOTSTRAP_TIMEOUT=30 mpirun --allow-run-as-root --oversubscribe ";
  auto r = weft::testing::run(mpirun + "-np 4 " + weftrun + " run " + workload, 90);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(weft::testing::count_lines_starting(r.out, "weftrun run: no rank of this job has a GPU") == 1);
  CHECK(weft::testing::count_lines_starting(r.out, "plan for ag-gemm-m2048") == 1);
  CHECK(r.out.find("1 node x 4 GPUs = 4 ranks") != std::string::npos);

  r = weft::testing::run(mpirun + "-np 4 " + weftrun + " run --json " + workload, 90);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  const auto json = r.out.substr(r.out.find('\n') + 1);  // after the line saying why
  auto doc = nlohmann::json::parse(json);
  CHECK(doc["layout"]["world_size"] == 4);

  r = weft::testing::run(mpirun + "-np 2 " + weftrun + " run " + workload, 90);
  INFO(r.out << r.err);
  CHECK(r.exit_code != 0);
  CHECK((r.out + r.err).find("weftrun run: the plan is for 4 ranks, the job has 2") != std::string::npos);
}
#else
// This weftrun is built without CUDA (weft_exec): its `run` says it can only plan.
TEST_CASE("mpirun weftrun run without a GPU: skipped, this build has no CUDA (weftrun run cannot run plans)" *
          doctest::skip(true)) {}
#endif
