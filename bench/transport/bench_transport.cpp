// Put bandwidth and signal latency through proxy + backend, per backend and Perseus signal mode.
//
//   bench_transport [--quick] [--json FILE]
//
// Two ranks on two emulated nodes (forked processes for socket, threads for loopback), host heaps.
// Rank 0 streams `count` tiles of `size` bytes to rank 1, each tile a put followed by a signal on its
// own flag (the fused-kernel pattern Perseus studies); rank 1 waits for the last flag and answers
// with a signal. Bandwidth = bytes / (first push .. answer). Latency = half the round trip of a
// signal ping-pong with no data.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "base/log.h"
#include "local_bootstrap.h"
#include "transport/heap.h"
#include "transport/transport.h"

using namespace weft;
using namespace weft::transport;

namespace {

struct Row {
  std::string backend, mode;
  uint64_t size = 0, count = 0;
  double gbps = 0, lat_us = 0;
  TransportCounters c;
};

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

constexpr uint64_t kMaxBytes = 64ull << 20;
constexpr uint64_t kFlags = 64 << 10;  // flag area: 8192 flags

// Runs on both ranks; rank 0 writes the rows it measured into *rows.
Status bench_body(bootstrap::Bootstrap& boot, const std::string& backend, const std::string& mode, bool quick,
                  std::vector<Row>* rows) {
  const int me = boot.info().rank;
  std::unique_ptr<HostHeap> heap;
  WEFT_CHECK(HostHeap::create(kMaxBytes + kFlags + 64, &heap));
  const uint64_t flags = kMaxBytes, pong = kMaxBytes + kFlags;
  TransportOptions opt;
  opt.backend = backend;
  opt.signal_mode = mode;
  opt.peers = PeerNeed::kEveryRank;
  opt.fifo_depth = 1024;
  std::unique_ptr<Transport> t;
  WEFT_CHECK(Transport::create(boot, heap->region(), opt, &t));
  const int peer = 1 - me;
  uint64_t epoch = 0;
  std::vector<uint64_t> sizes = {4096, 65536, 1 << 20, 16 << 20};
  for (uint64_t size : sizes) {
    const uint64_t total = quick ? (64ull << 20) : (512ull << 20);
    const uint64_t count = std::max<uint64_t>(8, std::min<uint64_t>(total / size, kFlags / 8));
    const uint64_t span = kMaxBytes / size;  // tiles cycle through the buffer
    double best = 1e30;
    TransportCounters before = t->counters();
    for (int rep = 0; rep < 3; ++rep) {
      ++epoch;
      WEFT_CHECK(boot.barrier("bw." + std::to_string(epoch)));
      const double t0 = now_s();
      if (me == 0) {
        for (uint64_t i = 0; i < count; ++i) {
          const uint64_t off = (i % span) * size;
          WEFT_CHECK(t->put_signal(0, peer, off, off, size, flags + 8 * i, epoch));
        }
        WEFT_CHECK(t->wait_flag(pong, epoch, "the bandwidth answer"));
        best = std::min(best, now_s() - t0);
      } else {
        WEFT_CHECK(t->wait_flag(flags + 8 * (count - 1), epoch, "the last tile"));
        WEFT_CHECK(t->signal(0, peer, pong, epoch));
      }
    }
    if (me == 0) {
      Row r;
      r.backend = backend;
      r.mode = mode;
      r.size = size;
      r.count = count;
      r.gbps = double(size) * count / best / 1e9;
      TransportCounters after = t->counters();
      r.c.puts = after.puts - before.puts;
      r.c.signals = after.signals - before.signals;
      r.c.fences = after.fences - before.fences;
      r.c.batches = after.batches - before.batches;
      r.c.stalls = after.stalls - before.stalls;
      rows->push_back(r);
    }
  }
  // Signal latency: ping-pong on two flags.
  const int iters = quick ? 500 : 3000;
  WEFT_CHECK(boot.barrier("lat"));
  const uint64_t base = ++epoch * 100000;
  const double t0 = now_s();
  for (int i = 1; i <= iters; ++i) {
    if (me == 0) {
      WEFT_CHECK(t->signal(0, peer, flags, base + i));
      WEFT_CHECK(t->wait_flag(pong, base + i, "a pong"));
    } else {
      WEFT_CHECK(t->wait_flag(flags, base + i, "a ping"));
      WEFT_CHECK(t->signal(0, peer, pong, base + i));
    }
  }
  const double lat = (now_s() - t0) / iters / 2 * 1e6;
  if (me == 0)
    for (auto& r : *rows)
      if (r.backend == backend && r.mode == mode) r.lat_us = lat;
  WEFT_CHECK(t->flush());
  WEFT_CHECK(boot.barrier("end"));
  return t->stop();
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  const char* json = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--quick"))
      quick = true;
    else if (!strcmp(argv[i], "--json") && i + 1 < argc)
      json = argv[++i];
    else {
      fprintf(stderr, "usage: bench_transport [--quick] [--json FILE]\n");
      return 2;
    }
  }
  char host[256] = "?";
  gethostname(host, sizeof host);
  std::vector<Row> all;
  for (const char* backend : {"socket", "loopback"}) {
    for (const char* mode : {"serial", "fenced", "batched"}) {
      std::vector<Row> rows;
      if (!strcmp(backend, "socket")) {
        // Forked ranks: rank 0 sends its rows back as text through the test bootstrap's report line.
        auto res = testing::run_forked(
            2, 1,
            [&](testing::ForkBootstrap& b) -> int {
              std::vector<Row> mine;
              if (bench_body(b, backend, mode, quick, &mine) != Status::kOk) return 1;
              std::string text;
              for (const auto& r : mine) {
                char line[256];
                snprintf(line, sizeof line, "%llu %llu %.6f %.3f %llu %llu %llu %llu %llu;", (unsigned long long)r.size,
                         (unsigned long long)r.count, r.gbps, r.lat_us, (unsigned long long)r.c.puts,
                         (unsigned long long)r.c.signals, (unsigned long long)r.c.fences,
                         (unsigned long long)r.c.batches, (unsigned long long)r.c.stalls);
                text += line;
              }
              b.report(text);
              return 0;
            },
            600);
        if (res[0].exit_code != 0 || res[1].exit_code != 0) {
          fprintf(stderr, "bench_transport: %s/%s failed\n", backend, mode);
          return 1;
        }
        const char* p = res[0].report.c_str();
        Row r;
        unsigned long long v[7];
        int used = 0;
        while (sscanf(p, "%llu %llu %lf %lf %llu %llu %llu %llu %llu;%n", &v[0], &v[1], &r.gbps, &r.lat_us, &v[2],
                      &v[3], &v[4], &v[5], &v[6], &used) == 9) {
          r.backend = backend, r.mode = mode, r.size = v[0], r.count = v[1];
          r.c.puts = v[2], r.c.signals = v[3], r.c.fences = v[4], r.c.batches = v[5], r.c.stalls = v[6];
          rows.push_back(r);
          p += used;
        }
      } else {
        std::vector<std::vector<Row>> per(2);
        auto st = testing::run_threads(
            2, 1, [&](bootstrap::Bootstrap& b) { return bench_body(b, backend, mode, quick, &per[b.info().rank]); });
        if (st[0] != Status::kOk || st[1] != Status::kOk) {
          fprintf(stderr, "bench_transport: %s/%s failed\n", backend, mode);
          return 1;
        }
        rows = per[0];
      }
      all.insert(all.end(), rows.begin(), rows.end());
    }
  }
  printf("weft transport benchmark on %s (%ld CPUs), host heaps, 2 ranks on 2 emulated nodes%s\n", host,
         sysconf(_SC_NPROCESSORS_ONLN), quick ? " (--quick)" : "");
  printf("%-9s %-8s %10s %7s %9s %12s %8s %8s %8s %8s %8s\n", "backend", "mode", "tile", "tiles", "GB/s", "signal_us",
         "puts", "signals", "fences", "batches", "stalls");
  for (const auto& r : all)
    printf("%-9s %-8s %10llu %7llu %9.3f %12.2f %8llu %8llu %8llu %8llu %8llu\n", r.backend.c_str(), r.mode.c_str(),
           (unsigned long long)r.size, (unsigned long long)r.count, r.gbps, r.lat_us, (unsigned long long)r.c.puts,
           (unsigned long long)r.c.signals, (unsigned long long)r.c.fences, (unsigned long long)r.c.batches,
           (unsigned long long)r.c.stalls);
  if (json) {
    FILE* f = fopen(json, "w");
    if (!f) return 1;
    fprintf(f, "{\"host\": \"%s\", \"rows\": [", host);
    for (size_t i = 0; i < all.size(); ++i) {
      const auto& r = all[i];
      fprintf(f,
              "%s{\"backend\": \"%s\", \"mode\": \"%s\", \"tile_bytes\": %llu, \"tiles\": %llu, \"gbps\": %.4f, "
              "\"signal_us\": %.3f, \"puts\": %llu, \"signals\": %llu, \"fences\": %llu, \"batches\": %llu, "
              "\"stalls\": %llu}",
              i ? ", " : "", r.backend.c_str(), r.mode.c_str(), (unsigned long long)r.size, (unsigned long long)r.count,
              r.gbps, r.lat_us, (unsigned long long)r.c.puts, (unsigned long long)r.c.signals,
              (unsigned long long)r.c.fences, (unsigned long long)r.c.batches, (unsigned long long)r.c.stalls);
    }
    fprintf(f, "]}\n");
    fclose(f);
  }
  return 0;
}
