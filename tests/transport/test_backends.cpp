// One test body over every backend that runs here (socket, loopback, ofi over tcp) and every signal mode: ranks as
// threads.
#include <dirent.h>
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "base/log.h"
#include "local_bootstrap.h"
#include "transport/heap.h"
#include "transport/transport.h"

using namespace weft;
using namespace weft::transport;

namespace {

uint8_t byte_of(int src, int dst, int round, uint64_t i) {
  return static_cast<uint8_t>((src * 131) ^ (dst * 29) ^ (round * 7) ^ (i * 2654435761u >> 7) ^ i);
}

// Each rank sends every peer a block per round (sizes vary up to a few MiB, so socket writes are
// partial), signals it, waits for every peer's block and checks each byte and the counters.
Status exchange_body(bootstrap::Bootstrap& boot, const std::string& backend, const std::string& mode) {
  const int me = boot.info().rank, n = boot.info().size;
  const uint64_t kBlock = 3 << 20;
  HeapAllocator alloc(uint64_t(2) * n * kBlock + 4096);
  uint64_t send_off = 0, recv_off = 0, flags_off = 0;
  WEFT_CHECK(alloc.allocate(n * kBlock, 4096, "send", &send_off));
  WEFT_CHECK(alloc.allocate(n * kBlock, 4096, "recv", &recv_off));
  WEFT_CHECK(alloc.allocate(8 * n, 8, "flags", &flags_off));
  std::unique_ptr<HostHeap> heap;
  WEFT_CHECK(HostHeap::create(alloc.capacity(), &heap));
  TransportOptions opt;
  opt.backend = backend;
  opt.signal_mode = mode;
  opt.peers = PeerNeed::kEveryRank;
  opt.fifo_depth = 16;  // small: producers meet back-pressure
  opt.timeout_s = 20;
  std::unique_ptr<Transport> t;
  WEFT_CHECK(Transport::create(boot, heap->region(), opt, &t));
  const uint64_t sizes[] = {1, 8, 4095, 65536, kBlock};
  int rounds = 0;
  for (uint64_t size : sizes) {
    for (int d = 0; d < n; ++d)
      for (uint64_t i = 0; i < size; ++i) heap->at(send_off + d * kBlock)[i] = byte_of(me, d, rounds, i);
    for (int d = 0; d < n; ++d) {
      if (d == me) continue;
      // Split into two puts and a separate signal, so a signal covers more than one put.
      uint64_t half = size / 2;
      if (half) WEFT_CHECK(t->put(0, d, send_off + d * kBlock, recv_off + me * kBlock, half));
      WEFT_CHECK(t->put(0, d, send_off + d * kBlock + half, recv_off + me * kBlock + half, size - half));
      WEFT_CHECK(t->signal(0, d, flags_off + 8 * me, rounds + 1));
    }
    for (int s = 0; s < n; ++s) {
      if (s == me) continue;
      WEFT_CHECK(t->wait_flag(flags_off + 8 * s, rounds + 1, "a block"));
      const uint8_t* got = heap->at(recv_off + s * kBlock);
      for (uint64_t i = 0; i < size; ++i)
        if (got[i] != byte_of(s, me, rounds, i)) {
          WEFT_WARN(kTransport, "rank %d: byte %llu of the %llu-byte block from rank %d is wrong", me,
                    (unsigned long long)i, (unsigned long long)size, s);
          return Status::kProtocolError;
        }
    }
    WEFT_CHECK(t->flush());
    WEFT_CHECK(boot.barrier("round" + std::to_string(rounds)));
    ++rounds;
  }
  TransportCounters c = t->counters();
  WEFT_CHECK(t->stop());
  const uint64_t sent_signals = uint64_t(rounds) * (n - 1);
  bool ok = c.puts == sent_signals * 2 - (n - 1);  // the 1-byte round has no first half
  if (mode == "serial") ok = ok && c.fences == 0 && c.batches == 0 && c.signals == sent_signals;
  if (mode == "fenced") ok = ok && c.fences == c.signals && c.signals == sent_signals && c.batches == 0;
  if (mode == "batched") ok = ok && c.fences == c.batches && c.batches >= 1 && c.signals <= sent_signals;
  if (!ok) {
    WEFT_WARN(kTransport, "rank %d (%s, %s): counters puts %llu signals %llu fences %llu batches %llu stalls %llu", me,
              backend.c_str(), mode.c_str(), (unsigned long long)c.puts, (unsigned long long)c.signals,
              (unsigned long long)c.fences, (unsigned long long)c.batches, (unsigned long long)c.stalls);
    return Status::kInternal;
  }
  return Status::kOk;
}

}  // namespace

TEST_CASE("socket, loopback, ofi and (with an RDMA device) ibverbs move data and order signals in every mode") {
  // 4 ranks on 2 emulated nodes. ibverbs needs a device, ofi libfabric's tcp provider (unless
  // WEFT_OFI_PROVIDER names another); without them they are not run, and say so.
  std::vector<const char*> backends = {"socket", "loopback"};
  std::string why;
  if (ibverbs_device_present(&why))
    backends.push_back("ibverbs");
  else
    printf("SKIPPED: the ibverbs backend's data path (%s)\n", why.c_str());
  setenv("WEFT_OFI_PROVIDER", "tcp;ofi_rxm", 0);
  setenv("FI_TCP_IFACE", "lo", 0);  // whatever other interfaces come and go (read when libfabric loads)
  if (ofi_provider_present(getenv("WEFT_OFI_PROVIDER"), &why))
    backends.push_back("ofi");
  else
    printf("SKIPPED: the ofi backend's data path (%s)\n", why.c_str());
  for (const char* backend : backends) {
    for (const char* mode : {"serial", "fenced", "batched"}) {
      CAPTURE(backend);
      CAPTURE(mode);
      auto st = testing::run_threads(4, 2, [&](bootstrap::Bootstrap& b) { return exchange_body(b, backend, mode); });
      for (int r = 0; r < 4; ++r) {
        CAPTURE(r);
        CHECK(st[r] == Status::kOk);
      }
    }
  }
}

TEST_CASE("only the rail peers are connected unless every rank is asked for; unknown or absent backends fail cleanly") {
  for (PeerNeed need : {PeerNeed::kRails, PeerNeed::kEveryRank}) {
    CAPTURE(to_string(need));
    auto st = testing::run_threads(4, 2, [need](bootstrap::Bootstrap& boot) -> Status {
      std::unique_ptr<HostHeap> heap;
      WEFT_CHECK(HostHeap::create(4096, &heap));
      TransportOptions opt;
      opt.backend = "socket";
      opt.channels = 2;
      opt.peers = need;
      std::unique_ptr<Transport> t;
      WEFT_CHECK(Transport::create(boot, heap->region(), opt, &t));
      const int me = boot.info().rank;
      // Rails: the same local index on the other node (ranks 0 <-> 2, 1 <-> 3); else everyone.
      for (int p = 0; p < 4; ++p)
        if (t->connected(p) != (need == PeerNeed::kEveryRank ? p != me : p == (me + 2) % 4)) return Status::kInternal;
      if (t->connections_opened() != 2 * (need == PeerNeed::kEveryRank ? 3 : 1)) return Status::kInternal;
      WEFT_CHECK(boot.barrier("connected"));
      return t->stop();
    });
    for (auto s : st) CHECK(s == Status::kOk);
  }

  auto bad = testing::run_threads(2, 1, [](bootstrap::Bootstrap& boot) -> Status {
    std::unique_ptr<HostHeap> heap;
    WEFT_CHECK(HostHeap::create(4096, &heap));
    TransportOptions opt;
    opt.backend = "carrier-pigeon";
    std::unique_ptr<Transport> t;
    return Transport::create(boot, heap->region(), opt, &t);
  });
  for (auto s : bad) CHECK(s == Status::kInvalidArgument);

  std::string why;
  if (!ibverbs_device_present(&why)) {
    auto ib = testing::run_threads(2, 1, [](bootstrap::Bootstrap& boot) -> Status {
      std::unique_ptr<HostHeap> heap;
      WEFT_CHECK(HostHeap::create(4096, &heap));
      TransportOptions opt;
      opt.backend = "ibverbs";
      std::unique_ptr<Transport> t;
      return Transport::create(boot, heap->region(), opt, &t);
    });
    for (auto s : ib) CHECK(s == Status::kUnsupported);
  }
}

namespace {

// CPU lists of this process's threads, from /proc.
std::vector<std::string> thread_cpu_lists() {
  std::vector<std::string> out;
  DIR* d = opendir("/proc/self/task");
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::string path = std::string("/proc/self/task/") + e->d_name + "/status";
    if (FILE* f = fopen(path.c_str(), "r")) {
      char line[256];
      while (fgets(line, sizeof line, f))
        if (!strncmp(line, "Cpus_allowed_list:", 18)) {
          std::string v(line + 18);
          v.erase(0, v.find_first_not_of(" \t"));
          v.erase(v.find_last_not_of(" \t\n") + 1);
          out.push_back(v);
        }
      fclose(f);
    }
  }
  closedir(d);
  return out;
}

}  // namespace

TEST_CASE("two channels, proxies pinned to the given cpuset; an unusable cpuset is tolerated") {
  std::atomic<int> pinned{0};
  auto st = testing::run_threads(2, 1, [&](bootstrap::Bootstrap& boot) -> Status {
    const int me = boot.info().rank;
    std::unique_ptr<HostHeap> heap;
    WEFT_CHECK(HostHeap::create(1 << 20, &heap));
    TransportOptions opt;
    opt.backend = "socket";
    opt.channels = 2;
    opt.channel_cpusets = {"0", "5000-5001"};  // channel 1: CPUs this machine does not have
    std::unique_ptr<Transport> t;
    WEFT_CHECK(Transport::create(boot, heap->region(), opt, &t));
    WEFT_CHECK(boot.barrier("up"));
    if (me == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // proxies pin themselves at start
      for (const auto& l : thread_cpu_lists()) pinned += l == "0";
    }
    for (int ch = 0; ch < 2; ++ch) {
      heap->at<uint64_t>(1024 * ch)[0] = 0x1111 * (me + 1) * (ch + 1);
      WEFT_CHECK(t->put_signal(ch, 1 - me, 1024 * ch, 4096 + 1024 * ch, 8, 8192 + 8 * ch, 1));
    }
    for (int ch = 0; ch < 2; ++ch) {
      WEFT_CHECK(t->wait_flag(8192 + 8 * ch, 1, "a put on each channel"));
      if (heap->at<uint64_t>(4096 + 1024 * ch)[0] != 0x1111u * (2 - me) * (ch + 1)) return Status::kInternal;
    }
    WEFT_CHECK(t->flush());
    WEFT_CHECK(boot.barrier("done"));
    return t->stop();
  });
  for (auto s : st) CHECK(s == Status::kOk);
  CHECK(pinned >= 2);  // both ranks' channel-0 proxies
}

TEST_CASE("WEFT_SOCKET_IFNAME naming a missing interface fails with the interfaces that exist") {
  BackendConfig cfg;
  cfg.size = 2;
  cfg.socket_ifname = "weft-no-such0";
  auto b = make_socket_backend(cfg);
  std::vector<uint8_t> mem(64);
  REQUIRE(b->register_region(Region{mem.data(), mem.size(), MemKind::kHost, -1}) == Status::kOk);
  PeerInfo info;
  CHECK(b->local_info(&info) == Status::kNotFound);
  CHECK(b->error_message().find("weft-no-such0") != std::string::npos);
  CHECK(b->error_message().find("lo") != std::string::npos);
}

TEST_CASE("backend and signal mode precedence: explicit, then environment, then workload, then default") {
  auto pick = [](const char* env_backend, const char* env_mode, std::string explicit_backend,
                 std::string workload_backend, std::string workload_mode) {
    if (env_backend)
      setenv("WEFT_NET_BACKEND", env_backend, 1);
    else
      unsetenv("WEFT_NET_BACKEND");
    if (env_mode)
      setenv("WEFT_SIGNAL_MODE", env_mode, 1);
    else
      unsetenv("WEFT_SIGNAL_MODE");
    std::string got;
    auto st = testing::run_threads(2, 1, [&](bootstrap::Bootstrap& boot) -> Status {
      std::unique_ptr<HostHeap> heap;
      WEFT_CHECK(HostHeap::create(4096, &heap));
      TransportOptions opt;
      opt.backend = explicit_backend;
      opt.workload_backend = workload_backend;
      opt.workload_signal_mode = workload_mode;
      opt.peers = PeerNeed::kEveryRank;
      std::unique_ptr<Transport> t;
      WEFT_CHECK(Transport::create(boot, heap->region(), opt, &t));
      if (boot.info().rank == 0) got = t->backend_name() + "/" + to_string(t->signal_mode());
      WEFT_CHECK(boot.barrier("x"));
      return t->stop();
    });
    unsetenv("WEFT_NET_BACKEND");
    unsetenv("WEFT_SIGNAL_MODE");
    return st[0] == Status::kOk && st[1] == Status::kOk ? got : std::string("failed");
  };
  std::string why;
  if (!ibverbs_device_present(&why)) CHECK(pick(nullptr, nullptr, "", "", "") == "socket/batched");  // auto
  CHECK(pick(nullptr, nullptr, "", "loopback", "serial") == "loopback/serial");
  CHECK(pick("socket", "fenced", "", "loopback", "serial") == "socket/fenced");
  CHECK(pick("socket", nullptr, "loopback", "", "") == "loopback/batched");
}
