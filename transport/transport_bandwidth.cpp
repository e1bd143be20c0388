// Bandwidth and signal latency through proxy + backend: rank 0 streams put+signal tiles to one partner.
#include "transport/transport_bandwidth.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "base/log.h"
#include "transport/heap.h"
#include "transport/transport.h"

namespace weft::transport {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

constexpr uint64_t kMaxPut = 16ull << 20;
constexpr uint64_t kFlagBytes = 64ull << 10;  // 8192 tile flags

}  // namespace

int bandwidth_partner(const bootstrap::RankInfo& me, const std::vector<int>& node_of_rank) {
  if (me.size < 2) return -1;
  for (int r = 1; r < static_cast<int>(node_of_rank.size()); ++r)
    if (node_of_rank[r] != node_of_rank[0]) return r;
  return 1;
}

Status run_transport_bandwidth(bootstrap::Bootstrap& boot, const BandwidthOptions& o, std::vector<BandwidthRow>* rows) {
  const bootstrap::RankInfo& me = boot.info();
  if (me.size < 2) {
    WEFT_WARN(kTransport, "rank %d: the bandwidth check needs at least 2 ranks", me.rank);
    return Status::kInvalidArgument;
  }
  for (uint64_t s : o.sizes)
    if (s == 0 || s > kMaxPut) {
      WEFT_WARN(kTransport, "rank %d: bandwidth check: put size %llu outside 1..%llu", me.rank, (unsigned long long)s,
                (unsigned long long)kMaxPut);
      return Status::kInvalidArgument;
    }
  const std::string key = "weft.transport.bw." + std::to_string(next_exchange_id(&boot)) + ".";
  // Who is on which node: the partner of rank 0 is the first rank on another node.
  std::vector<bootstrap::Blob> all;
  int32_t node = me.node;
  bootstrap::Blob mine(sizeof node);
  memcpy(mine.data(), &node, sizeof node);
  WEFT_CHECK(boot.allgather(key + "nodes", mine, &all));
  std::vector<int> node_of(me.size, 0);
  for (int r = 0; r < me.size && r < static_cast<int>(all.size()); ++r)
    if (all[r].size() == sizeof node) memcpy(&node_of[r], all[r].data(), sizeof node);
  const int partner = bandwidth_partner(me, node_of);
  const bool sender = me.rank == 0, receiver = me.rank == partner;

  std::unique_ptr<HostHeap> heap;
  WEFT_CHECK(HostHeap::create(kMaxPut * 4 + kFlagBytes + 64, &heap));
  const uint64_t data_bytes = kMaxPut * 4, flags = data_bytes, pong = data_bytes + kFlagBytes;
  uint64_t epoch = 0;
  for (const std::string& mode : o.modes) {
    TransportOptions opt;
    opt.backend = o.backend;
    opt.signal_mode = mode;
    opt.timeout_s = o.timeout_s;
    opt.peers = PeerNeed::kEveryRank;
    std::unique_ptr<Transport> t;
    WEFT_CHECK(Transport::create(boot, heap->region(), opt, &t));
    const size_t first_row = rows->size();
    for (uint64_t size : o.sizes) {
      const uint64_t count = std::max<uint64_t>(4, std::min<uint64_t>(o.bytes_per_size / size, kFlagBytes / 8));
      const uint64_t span = data_bytes / size;  // tiles cycle through the buffer
      double best = 1e30;
      const ProxyCounters before = t->counters();
      for (int rep = 0; rep < std::max(1, o.repetitions); ++rep) {
        ++epoch;
        WEFT_CHECK(boot.barrier(key + "rep." + std::to_string(epoch)));
        const double t0 = now_s();
        if (sender) {
          for (uint64_t i = 0; i < count; ++i) {
            const uint64_t off = (i % span) * size;
            WEFT_CHECK(t->put_signal(0, partner, off, off, size, flags + 8 * i, epoch));
          }
          WEFT_CHECK(t->wait_flag(pong, epoch, "the partner's answer to a bandwidth round"));
          best = std::min(best, now_s() - t0);
        } else if (receiver) {
          WEFT_CHECK(t->wait_flag(flags + 8 * (count - 1), epoch, "the last tile of a bandwidth round"));
          WEFT_CHECK(t->signal(0, 0, pong, epoch));
        }
      }
      if (sender) {
        BandwidthRow r;
        r.backend = t->backend_name();
        r.backend_reason = t->backend_reason();
        r.signal_mode = to_string(t->signal_mode());
        r.bytes = size;
        r.count = count;
        r.gbps = double(size) * count / best / 1e9;
        const ProxyCounters after = t->counters();
        r.counters.puts = after.puts - before.puts;
        r.counters.signals = after.signals - before.signals;
        r.counters.fences = after.fences - before.fences;
        r.counters.batches = after.batches - before.batches;
        r.counters.stalls = after.stalls - before.stalls;
        rows->push_back(r);
      }
    }
    // Signal latency: a ping-pong of signals on two flags, no data.
    WEFT_CHECK(boot.barrier(key + "lat." + mode));
    const uint64_t base = ++epoch * 1000000;
    const double t0 = now_s();
    for (int i = 1; i <= o.latency_iters; ++i) {
      if (sender) {
        WEFT_CHECK(t->signal(0, partner, flags, base + i));
        WEFT_CHECK(t->wait_flag(pong, base + i, "a latency pong"));
      } else if (receiver) {
        WEFT_CHECK(t->wait_flag(flags, base + i, "a latency ping"));
        WEFT_CHECK(t->signal(0, 0, pong, base + i));
      }
    }
    const double lat_us = o.latency_iters > 0 ? (now_s() - t0) / o.latency_iters / 2 * 1e6 : 0;
    epoch = base + o.latency_iters;  // flags only grow: the next mode's rounds start above the pongs
    for (size_t i = first_row; i < rows->size(); ++i) (*rows)[i].signal_us = lat_us;
    WEFT_CHECK(t->flush());
    WEFT_CHECK(boot.barrier(key + "end." + mode));
    WEFT_CHECK(t->stop());
  }
  return Status::kOk;
}

std::string format_bandwidth_table(const std::vector<BandwidthRow>& rows, int from, int to) {
  std::string out;
  char line[256];
  snprintf(line, sizeof line,
           "# transport bandwidth: rank %d -> rank %d, each put followed by a signal on its own flag\n", from, to);
  out += line;
  snprintf(line, sizeof line, "# %-8s %-8s %10s %7s %9s %10s %8s %8s %7s\n", "backend", "mode", "size", "count", "GB/s",
           "signal us", "fences", "batches", "stalls");
  out += line;
  for (const auto& r : rows) {
    snprintf(line, sizeof line, "  %-8s %-8s %10llu %7llu %9.3f %10.1f %8llu %8llu %7llu\n", r.backend.c_str(),
             r.signal_mode.c_str(), (unsigned long long)r.bytes, (unsigned long long)r.count, r.gbps, r.signal_us,
             (unsigned long long)r.counters.fences, (unsigned long long)r.counters.batches,
             (unsigned long long)r.counters.stalls);
    out += line;
  }
  if (!rows.empty() && !rows[0].backend_reason.empty()) out += "# backend: " + rows[0].backend_reason + "\n";
  return out;
}

}  // namespace weft::transport
