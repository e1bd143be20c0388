// The transport check: all-gather + all-to-all over proxy and backend, verified byte by byte.
#include "transport/transport_check.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>

#include "base/log.h"
#include "transport/heap.h"
#include "transport/transport.h"

namespace weft::transport {
namespace {

// Byte i of the block src sends to dst in iteration it, phase ph: distinct across all four.
inline uint8_t pattern(int src, int dst, int it, int ph, uint64_t i) {
  uint64_t x = (uint64_t(src) * 0x9E3779B1u) ^ (uint64_t(dst) * 0x85EBCA77u) ^ (uint64_t(it) * 0xC2B2AE3Du) ^
               (uint64_t(ph) << 29) ^ (i * 0x27D4EB2Fu);
  x ^= x >> 15;
  return static_cast<uint8_t>(x ^ (x >> 8) ^ i);
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\')
      out += '\\', out += c;
    else if (static_cast<unsigned char>(c) < 0x20)
      out += ' ';
    else
      out += c;
  }
  return out + "\"";
}

}  // namespace

std::string TransportCheckResult::to_json() const {
  char buf[512];
  snprintf(buf, sizeof buf,
           "{\"backend\": \"%s\", \"signal_mode\": \"%s\", \"puts\": %llu, \"signals\": %llu, \"fences\": %llu, "
           "\"batches\": %llu, \"stalls\": %llu",
           backend.c_str(), signal_mode.c_str(), (unsigned long long)counters.puts,
           (unsigned long long)counters.signals, (unsigned long long)counters.fences,
           (unsigned long long)counters.batches, (unsigned long long)counters.stalls);
  char conn[256];
  snprintf(conn, sizeof conn,
           ", \"connections\": {\"opened\": %d, \"planned\": %d, \"rails_opened\": %d, \"rails_planned\": %d, "
           "\"job_opened\": %lld, \"job_planned\": %lld}",
           connections_opened, connections_planned, rails_opened, rails_planned, (long long)job_connections_opened,
           (long long)job_connections_planned);
  return std::string(buf) + ", \"backend_reason\": " + json_string(backend_reason) +
         ", \"ordering\": " + json_string(ordering) + ", \"registration\": " + json_string(registration) +
         ", \"placement\": " + json_string(placement) + conn + "}";
}

namespace {

// What the peer-set function says `t` should have opened: its net peers on every channel.
Status planned_connections(const Transport& t, PeerNeed need, int* out) {
  PeerSet s;
  std::string why;
  if (peer_set(t.layout(), t.rank(), need, &s, &why) != Status::kOk) {
    WEFT_WARN(kTransport, "rank %d: check: no peer set for the gathered layout: %s", t.rank(), why.c_str());
    return Status::kInternal;
  }
  *out = static_cast<int>(s.net.size()) * t.channels();
  if (t.connections_opened() != *out) {
    WEFT_WARN(kTransport, "rank %d: check: the transport opened %d connections, the peer set (%s) has %d", t.rank(),
              t.connections_opened(), to_string(need), *out);
    return Status::kInternal;
  }
  return Status::kOk;
}

}  // namespace

Status run_transport_check(bootstrap::Bootstrap& boot, const TransportCheckOptions& options,
                           TransportCheckResult* result) {
  const int me = boot.info().rank, n = boot.info().size;
  const std::string key = "weft.transport.check." + std::to_string(next_exchange_id(&boot)) + ".";
  const uint64_t B = options.block_bytes ? options.block_bytes : 1;
  // Heap: [send: n blocks][recv all-gather: n blocks][recv all-to-all: n blocks][flags: 2n].
  HeapAllocator alloc(uint64_t(3) * n * B + 4096 + 16 * n + 4096);
  uint64_t send_off, ag_off, a2a_off, flags_off;
  WEFT_CHECK(alloc.allocate(n * B, 4096, "check send", &send_off));
  WEFT_CHECK(alloc.allocate(n * B, 4096, "check all-gather", &ag_off));
  WEFT_CHECK(alloc.allocate(n * B, 4096, "check all-to-all", &a2a_off));
  WEFT_CHECK(alloc.allocate(16 * n, 64, "check flags", &flags_off));
  std::unique_ptr<HostHeap> heap;
  WEFT_CHECK(HostHeap::create(alloc.capacity(), &heap));

  TransportOptions to;
  to.backend = options.backend;
  to.signal_mode = options.signal_mode;
  to.timeout_s = options.timeout_s;
  to.peers = PeerNeed::kEveryRank;
  std::unique_ptr<Transport> t;
  WEFT_CHECK(Transport::create(boot, heap->region(), to, &t));
  result->backend = t->backend_name();
  result->signal_mode = to_string(t->signal_mode());
  result->placement = t->placement_summary();
  result->backend_reason = t->backend_reason();
  result->ordering = t->ordering();
  result->registration = t->memory_registration();

  auto flag = [&](int phase, int src) { return flags_off + 8 * (uint64_t(phase) * n + src); };
  const auto t0 = std::chrono::steady_clock::now();
  for (int it = 0; it < options.iterations; ++it) {
    for (int ph = 0; ph < 2; ++ph) {
      const uint64_t recv_off = ph == 0 ? ag_off : a2a_off;
      const uint64_t epoch = uint64_t(it) + 1;
      // Phase 0 (all-gather): my one block goes to everyone. Phase 1 (all-to-all): block d to rank d.
      for (int d = 0; d < n; ++d) {
        uint8_t* blk = heap->at(send_off + d * B);
        for (uint64_t i = 0; i < B; ++i) blk[i] = pattern(me, ph == 0 ? -1 : d, it, ph, i);
      }
      memcpy(heap->at(recv_off + me * B), heap->at(send_off + (ph == 0 ? 0 : me) * B), B);
      for (int d = 0; d < n; ++d) {
        if (d == me) continue;
        WEFT_CHECK(t->put_signal(0, d, send_off + (ph == 0 ? 0 : d) * B, recv_off + me * B, B, flag(ph, me), epoch));
      }
      for (int s = 0; s < n; ++s) {
        if (s == me) continue;
        char what[96];
        snprintf(what, sizeof what, "%s block from rank %d (iteration %d)", ph == 0 ? "all-gather" : "all-to-all", s,
                 it);
        WEFT_CHECK(t->wait_flag(flag(ph, s), epoch, what));
        const uint8_t* got = heap->at(recv_off + s * B);
        for (uint64_t i = 0; i < B; ++i) {
          if (got[i] != pattern(s, ph == 0 ? -1 : me, it, ph, i)) {
            WEFT_WARN(kTransport, "rank %d: check %s: byte %llu of the block from rank %d is 0x%02x, expected 0x%02x",
                      me, what, (unsigned long long)i, s, got[i], pattern(s, ph == 0 ? -1 : me, it, ph, i));
            t->stop();
            return Status::kProtocolError;
          }
        }
        result->bytes_verified += B;
      }
      // Nobody rewrites its send blocks before every rank has received them.
      WEFT_CHECK(t->flush());
      WEFT_CHECK(boot.barrier(key + std::to_string(it) + "." + std::to_string(ph)));
    }
  }
  result->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  result->producer_stalls = t->producer_stalls();
  WEFT_CHECK(t->stop());
  result->connections_opened = t->connections_opened();
  WEFT_CHECK(planned_connections(*t, PeerNeed::kEveryRank, &result->connections_planned));

  // The fused ops' wiring: rail peers only. One all-gather block to each, verified.
  if (options.rails) {
    TransportOptions ro = to;
    ro.peers = PeerNeed::kRails;
    std::unique_ptr<Transport> rt;
    WEFT_CHECK(Transport::create(boot, heap->region(), ro, &rt));
    const int it = options.iterations;
    const uint64_t epoch = uint64_t(it) + 1;
    uint8_t* blk = heap->at(send_off);
    for (uint64_t i = 0; i < B; ++i) blk[i] = pattern(me, -1, it, 0, i);
    const std::vector<int>& rails = rt->peer_set().net;
    for (int p : rails) WEFT_CHECK(rt->put_signal(0, p, send_off, ag_off + me * B, B, flag(0, me), epoch));
    for (int p : rails) {
      char what[64];
      snprintf(what, sizeof what, "the block from rail peer %d", p);
      WEFT_CHECK(rt->wait_flag(flag(0, p), epoch, what));
      const uint8_t* got = heap->at(ag_off + p * B);
      for (uint64_t i = 0; i < B; ++i)
        if (got[i] != pattern(p, -1, it, 0, i)) {
          WEFT_WARN(kTransport, "rank %d: check %s: byte %llu is 0x%02x, expected 0x%02x", me, what,
                    (unsigned long long)i, got[i], pattern(p, -1, it, 0, i));
          rt->stop();
          return Status::kProtocolError;
        }
      result->bytes_verified += B;
    }
    WEFT_CHECK(rt->flush());
    WEFT_CHECK(boot.barrier(key + "rails"));
    WEFT_CHECK(rt->stop());
    result->rails_opened = rt->connections_opened();
    WEFT_CHECK(planned_connections(*rt, PeerNeed::kRails, &result->rails_planned));
  }

  // Sum the counters (of the full-mesh exchanges) and the connections over ranks.
  ProxyCounters c = t->counters();
  const int32_t conn[2] = {result->connections_opened + std::max(0, result->rails_opened),
                           result->connections_planned + std::max(0, result->rails_planned)};
  bootstrap::Blob mine(sizeof c + sizeof conn);
  memcpy(mine.data(), &c, sizeof c);
  memcpy(mine.data() + sizeof c, conn, sizeof conn);
  std::vector<bootstrap::Blob> all;
  WEFT_CHECK(boot.allgather(key + "counters", mine, &all));
  result->counters = ProxyCounters{};
  result->job_connections_opened = result->job_connections_planned = 0;
  for (int r = 0; r < n; ++r) {
    if (all[r].size() != sizeof c + sizeof conn) {
      WEFT_WARN(kTransport, "rank %d: check counters from rank %d are malformed", me, r);
      return Status::kProtocolError;
    }
    ProxyCounters rc;
    memcpy(&rc, all[r].data(), sizeof rc);
    result->counters += rc;
    int32_t theirs[2];
    memcpy(theirs, all[r].data() + sizeof c, sizeof theirs);
    result->job_connections_opened += theirs[0];
    result->job_connections_planned += theirs[1];
  }
  return Status::kOk;
}

Status run_transport_check_report(const std::string& backend, bootstrap::Bootstrap& boot, int iterations,
                                  std::string* summary, std::string* json) {
  TransportCheckOptions o;
  o.backend = backend;
  o.iterations = iterations < 1 ? 1 : iterations > 3 ? 3 : iterations;  // --iters sizes the bootstrap part
  TransportCheckResult r;
  WEFT_CHECK(run_transport_check(boot, o, &r));
  char line[256];
  snprintf(line, sizeof line, "%s/%s: %d x (all-gather + all-to-all) verified, %.1f MB in %.1f ms", r.backend.c_str(),
           r.signal_mode.c_str(), o.iterations, r.bytes_verified / 1e6, r.seconds * 1e3);
  char conn[160];
  snprintf(conn, sizeof conn, "; connections: %d opened, %d planned (every rank)", r.connections_opened,
           r.connections_planned);
  std::string rails;
  if (r.rails_opened >= 0)
    rails = ", " + std::to_string(r.rails_opened) + " opened, " + std::to_string(r.rails_planned) + " planned (rails)";
  *summary = std::string(line) + " (" + r.backend_reason + (r.ordering.empty() ? "" : "; ordering: " + r.ordering) +
             (r.registration.empty() ? "" : "; memory: " + r.registration) + ")" + conn + rails + "; used " +
             r.placement;
  *json = r.to_json();
  return Status::kOk;
}

}  // namespace weft::transport
