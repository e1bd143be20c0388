// `weftrun check --transport NAME --bandwidth`: put bandwidth, signal latency, fences and stalls per signal mode.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "bootstrap/bootstrap.h"
#include "transport/proxy.h"

namespace weft::transport {

struct BandwidthOptions {
  std::string backend = "socket";  // any WEFT_NET_BACKEND value
  std::vector<std::string> modes = {"serial", "fenced", "batched"};
  std::vector<uint64_t> sizes = {4096, 65536, 1 << 20, 16 << 20};  // bytes per put, at most 16 MiB
  uint64_t bytes_per_size = 64ull << 20;                           // streamed per size and repetition
  int repetitions = 3;                                             // the fastest counts
  int latency_iters = 200;
  double timeout_s = 0;  // 0 = WEFT_PROXY_TIMEOUT
};

// One line of the table: what rank 0 measured streaming to its partner.
struct BandwidthRow {
  std::string backend, signal_mode, backend_reason;
  uint64_t bytes = 0;      // per put
  uint64_t count = 0;      // puts (each followed by a signal on its own flag) per repetition
  double gbps = 0;         // bytes * count / (first push .. the partner's answer), fastest repetition
  double signal_us = 0;    // half the round trip of a signal ping-pong without data (per mode)
  ProxyCounters counters;  // rank 0's, over this size's repetitions
};

// Collective over every rank of the job (at least 2). For each mode a transport is made on every
// rank; rank 0 streams put+signal tiles to its partner (the first rank on another node, else rank 1),
// which answers with a signal after the last; the other ranks take part in the setup only. Rows are
// filled on rank 0. Bounded by the proxy timeout.
Status run_transport_bandwidth(bootstrap::Bootstrap& boot, const BandwidthOptions& options,
                               std::vector<BandwidthRow>* rows);

// nccl-tests-style text: a header naming the pair, then one line per row.
std::string format_bandwidth_table(const std::vector<BandwidthRow>& rows, int from, int to);
// The partner of rank 0 in run_transport_bandwidth (-1 for a job of one rank).
int bandwidth_partner(const bootstrap::RankInfo& me, const std::vector<int>& node_of_rank);

}  // namespace weft::transport
