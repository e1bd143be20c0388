// `weftrun check --bandwidth`'s measurement: rows per mode and size, the pair it measures, counters per mode.
#include <doctest/doctest.h>

#include <map>
#include <string>
#include <vector>

#include "local_bootstrap.h"
#include "transport/transport_bandwidth.h"

using weft::Status;
namespace tr = weft::transport;

TEST_CASE("the partner of rank 0 is the first rank on another node, else rank 1") {
  weft::bootstrap::RankInfo me;
  me.size = 4;
  CHECK(tr::bandwidth_partner(me, {0, 0, 1, 1}) == 2);
  CHECK(tr::bandwidth_partner(me, {0, 0, 0, 0}) == 1);
  me.size = 1;
  CHECK(tr::bandwidth_partner(me, {0}) == -1);
}

TEST_CASE("socket, 4 ranks on 2 nodes: a row per mode and size, measured from rank 0 to rank 2") {
  std::vector<std::vector<tr::BandwidthRow>> rows(4);
  auto st = weft::testing::run_threads(4, 2, [&](weft::bootstrap::Bootstrap& boot) -> Status {
    tr::BandwidthOptions o;
    o.backend = "socket";
    o.sizes = {4096, 65536};
    o.bytes_per_size = 1 << 20;
    o.repetitions = 2;
    o.latency_iters = 20;
    o.timeout_s = 30;
    return tr::run_transport_bandwidth(boot, o, &rows[boot.info().rank]);
  });
  for (Status s : st) CHECK(s == Status::kOk);
  for (int r = 1; r < 4; ++r) CHECK(rows[r].empty());  // rank 0 holds the table
  REQUIRE(rows[0].size() == 6);
  std::map<std::string, uint64_t> fences, signals;
  for (const auto& r : rows[0]) {
    CAPTURE(r.signal_mode);
    CAPTURE(r.bytes);
    CHECK(r.backend == "socket");
    CHECK(r.gbps > 0);
    CHECK(r.signal_us > 0);
    CHECK(r.count == std::max<uint64_t>(4, (1u << 20) / r.bytes));
    CHECK(r.counters.puts == 2 * r.count);  // two repetitions
    fences[r.signal_mode] += r.counters.fences;
    signals[r.signal_mode] += r.counters.signals;
  }
  CHECK(fences["serial"] == 0);
  CHECK(fences["fenced"] == signals["fenced"]);  // one fence per signal
  CHECK(fences["batched"] < fences["fenced"]);   // one per batch
  const std::string table = tr::format_bandwidth_table(rows[0], 0, 2);
  CHECK(table.find("rank 0 -> rank 2") != std::string::npos);
  CHECK(table.find("batched") != std::string::npos);
}

TEST_CASE("one rank, or a put larger than the buffer: refused with a reason") {
  std::vector<tr::BandwidthRow> rows;
  auto st = weft::testing::run_threads(1, 1, [&](weft::bootstrap::Bootstrap& boot) -> Status {
    return tr::run_transport_bandwidth(boot, tr::BandwidthOptions{}, &rows);
  });
  CHECK(st[0] == Status::kInvalidArgument);
  st = weft::testing::run_threads(2, 1, [&](weft::bootstrap::Bootstrap& boot) -> Status {
    tr::BandwidthOptions o;
    o.sizes = {64ull << 20};
    return tr::run_transport_bandwidth(boot, o, &rows);
  });
  CHECK(st[0] == Status::kInvalidArgument);
  CHECK(st[1] == Status::kInvalidArgument);
}
