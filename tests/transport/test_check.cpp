// The transport check behind `weftrun check --transport socket`: 4 processes on 2 emulated nodes.
#include <doctest/doctest.h>

#include "local_bootstrap.h"
#include "transport/transport_check.h"

using namespace weft;
using namespace weft::transport;

TEST_CASE("transport check: all-gather + all-to-all verified, counters summed over ranks") {
  auto res = testing::run_forked(
      4, 2,
      [](testing::ForkBootstrap& boot) -> int {
        TransportCheckOptions o;
        o.backend = "socket";
        o.signal_mode = "fenced";
        o.iterations = 2;
        o.block_bytes = 100000;  // not a multiple of a page: offsets of every alignment
        TransportCheckResult r;
        Status s = run_transport_check(boot, o, &r);
        boot.report(r.to_json() + " verified " + std::to_string(r.bytes_verified));
        if (s != Status::kOk) return 1;
        // Per rank per iteration: 3 peers x 2 phases, one put and one signal each (fenced: one fence each).
        const uint64_t per_rank = 2 * 3 * 2;
        // Then one block from the rail peer (the other node's rank of the same local index).
        bool ok = r.counters.puts == 4 * per_rank && r.counters.signals == 4 * per_rank &&
                  r.counters.fences == r.counters.signals && r.bytes_verified == (per_rank + 1) * 100000 &&
                  r.backend == "socket" && r.signal_mode == "fenced";
        // Connections: a full mesh (3 peers) for the exchanges, then the one rail peer, each as the
        // peer-set function plans it; 4 ranks x (3 + 1) in the job.
        ok = ok && r.connections_opened == 3 && r.connections_planned == 3 && r.rails_opened == 1 &&
             r.rails_planned == 1 && r.job_connections_opened == 16 && r.job_connections_planned == 16;
        return ok ? 0 : 2;
      },
      120);
  for (const auto& r : res) {
    CAPTURE(r.rank);
    CAPTURE(r.report);
    CHECK(r.exited);
    CHECK(r.exit_code == 0);
    CHECK(r.report.find("\"backend\": \"socket\"") != std::string::npos);
  }
}

TEST_CASE("transport check: the launcher-facing report") {
  auto res = testing::run_forked(
      2, 1,
      [](testing::ForkBootstrap& boot) -> int {
        std::string summary, json;
        Status s = run_transport_check_report("socket", boot, 1, &summary, &json);
        boot.report(summary + " | " + json);
        return s == Status::kOk && summary.find("verified") != std::string::npos &&
                       json.find("\"puts\": 4") != std::string::npos &&
                       summary.find(
                           "; connections: 1 opened, 1 planned (every rank), 1 opened, 1 planned (rails); "
                           "used ") != std::string::npos &&
                       json.find(
                           "\"connections\": {\"opened\": 1, \"planned\": 1, \"rails_opened\": 1, "
                           "\"rails_planned\": 1, \"job_opened\": 4, \"job_planned\": 4}") != std::string::npos
                   ? 0
                   : 1;
      },
      60);
  for (const auto& r : res) {
    CAPTURE(r.report);
    CHECK(r.exit_code == 0);
  }
}
