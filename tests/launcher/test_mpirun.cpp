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
