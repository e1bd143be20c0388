// `weftrun check --transport`: all-gather and all-to-all through proxy + net backend, every byte verified.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"
#include "bootstrap/bootstrap.h"
#include "transport/proxy.h"

namespace weft::transport {

struct TransportCheckOptions {
  std::string backend = "socket";    // "" = WEFT_NET_BACKEND
  std::string signal_mode;           // "" = WEFT_SIGNAL_MODE, else batched
  uint64_t block_bytes = 256 << 10;  // bytes each rank sends to each rank per exchange
  int iterations = 1;
  double timeout_s = 0;  // 0 = WEFT_PROXY_TIMEOUT
  bool rails = true;     // then the fused ops' wiring: a transport to the rail peers only, one block each
};

struct TransportCheckResult {
  std::string backend;
  std::string signal_mode;
  std::string backend_reason;    // Transport::backend_reason
  std::string ordering;          // Transport::ordering: how a fenced signal stays behind its puts
  std::string registration;      // Transport::memory_registration: the mr_mode bits used (ofi)
  std::string placement;         // this rank: GPU, NIC, port, proxy CPUs used (Transport::placement_summary)
  ProxyCounters counters;        // summed over ranks
  uint64_t bytes_verified = 0;   // by this rank
  uint64_t producer_stalls = 0;  // this rank: FIFO-full waits of the host producer
  double seconds = 0;            // this rank, exchanges only
  // Connections this rank's backends opened (one per peer per channel), and what the peer-set
  // function (transport/peer_set.h) says they should be: every rank for the exchanges above, the
  // rail peers for the fused ops' wiring (rails_* stay -1 when options.rails is off).
  int connections_opened = 0, connections_planned = 0;
  int rails_opened = -1, rails_planned = -1;
  int64_t job_connections_opened = 0, job_connections_planned = 0;  // both kinds, summed over ranks
  std::string to_json() const;  // {"backend": ..., "signal_mode": ..., "puts": P, ..., "connections": {...}}
};

// Collective. Every rank connects to every other through the backend (host heap), then runs
// `iterations` x (all-gather, all-to-all) whose payload bytes encode (source rank, destination
// rank, iteration, index); a wrong byte fails with a message naming the source rank and offset.
// With options.rails, it then wires the fused ops' peer set (rail peers only) and sends one
// verified block to each rail peer; a count of connections other than the peer set's fails.
Status run_transport_check(bootstrap::Bootstrap& boot, const TransportCheckOptions& options,
                           TransportCheckResult* result);

// The shape `weftrun check --transport NAME` wants: a one-line summary for this rank and the JSON
// object (counters summed over ranks, so every rank reports the same object). Collective.
Status run_transport_check_report(const std::string& backend, bootstrap::Bootstrap& boot, int iterations,
                                  std::string* summary, std::string* json);

}  // namespace weft::transport
