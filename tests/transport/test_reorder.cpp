// Ordering tests that can fail: the real proxy over a shim that reorders every write a fence does not order. With
// the proxy's fence decision on, >= 10^5 randomised sequences per mode hold; forced off, fenced and batched break.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <string>
#include <thread>

#include "base/backoff.h"
#include "reorder_backend.h"
#include "transport/fifo.h"
#include "transport/proxy.h"
#include "transport/signal_plan.h"

using namespace weft;
using namespace weft::transport;
using testing::ReorderBackend;
using testing::ReorderStats;

namespace {

constexpr int kRanks = 3;
constexpr int kSlots = 32;
constexpr uint64_t kSlotBytes = 512;
constexpr double kTimeout = 60;

uint8_t pattern(int src, uint64_t seq, uint64_t i) {
  uint64_t x = (seq + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t(src) << 56) ^ (i * 0xD6E8FEB86659FD93ull);
  return static_cast<uint8_t>((x >> 32) ^ (x >> 13) ^ i);
}
uint64_t seq_len(int src, int dst, uint64_t seq) {
  uint64_t x = (seq * 0x2545F4914F6CDD1Dull) ^ (uint64_t(src) * 7919 + dst * 104729);
  return 8 + (x >> 17) % (kSlotBytes - 7);
}

// Heap layout per rank: send slots, receive slots, data flags, ack flags.
struct Layout {
  uint64_t send_slot(int peer, int slot) const { return (uint64_t(peer) * kSlots + slot) * kSlotBytes; }
  uint64_t recv_slot(int src, int slot) const { return kRanks * kSlots * kSlotBytes + send_slot(src, slot); }
  uint64_t data_flag(int src, int slot) const { return 2 * kRanks * kSlots * kSlotBytes + (src * kSlots + slot) * 8; }
  uint64_t ack_flag(int dst, int slot) const { return data_flag(kRanks, 0) + (dst * kSlots + slot) * 8; }
  uint64_t bytes() const { return ack_flag(kRanks, 0); }
};

struct Outcome {
  uint64_t verified = 0;
  std::string violation;  // the first signal seen before its data ("" if none)
  std::string error;      // anything else that went wrong
  ReorderStats shim;
  ProxyCounters proxy;
};

struct Rank {
  std::vector<uint64_t> heap;
  Region region;
  std::unique_ptr<Fifo> fifo;
  std::unique_ptr<ReorderBackend> backend;
  std::unique_ptr<Proxy> proxy;
};

// Each rank sends every peer `per_peer` sequences (1..4 pieces pushed in random order, the signal on
// the last piece or after it) and reads what its peers send, acking each slot.
Outcome run(SignalMode mode, bool fences_on, uint64_t per_peer) {
  set_fence_decision_for_test(fences_on);
  Outcome out;
  Layout L;
  auto fabric = std::make_shared<testing::ReorderFabric>(kRanks);
  std::vector<Rank> ranks(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    Rank& k = ranks[r];
    k.heap.assign(L.bytes() / 8, 0);
    k.region = Region{k.heap.data(), L.bytes(), MemKind::kHost, -1};
    BackendConfig bc;
    bc.rank = r;
    bc.size = kRanks;
    bc.timeout_s = kTimeout;
    k.backend = std::make_unique<testing::ReorderBackend>(bc, fabric, 0xfe11ce + r);
    PeerInfo info;
    REQUIRE(k.backend->register_region(k.region) == Status::kOk);
    REQUIRE(k.backend->local_info(&info) == Status::kOk);
    REQUIRE(Fifo::create(256, r, 0, FifoMemory{}, &k.fifo) == Status::kOk);
  }
  for (int r = 0; r < kRanks; ++r) {
    for (int p = 0; p < kRanks; ++p)
      if (p != r) REQUIRE(ranks[r].backend->connect(p, LoopbackPeerInfo{}) == Status::kOk);
    ProxyConfig pc;
    pc.rank = r;
    pc.world_size = kRanks;
    pc.mode = mode;
    pc.timeout_s = kTimeout;
    pc.batch_max = 8;
    ranks[r].proxy = std::make_unique<Proxy>(pc, ranks[r].fifo->ring(), ranks[r].backend.get());
    REQUIRE(ranks[r].proxy->start() == Status::kOk);
  }

  std::atomic<bool> stop{false};
  std::mutex out_mutex;
  auto note = [&](std::string* field, const std::string& what) {
    std::lock_guard<std::mutex> lock(out_mutex);
    if (field->empty()) *field = what;
    stop = true;
  };
  auto body = [&](int me) {
    Rank& k = ranks[me];
    char* base = reinterpret_cast<char*>(k.heap.data());
    auto flag_at = [&](uint64_t off) {
      return __atomic_load_n(reinterpret_cast<uint64_t*>(base + off), __ATOMIC_ACQUIRE);
    };
    auto push = [&](const FifoCommand& c) {
      return fifo_push(k.fifo->ring(), k.fifo->host_producer_state(), c, kTimeout);
    };
    std::mt19937_64 rng(0x5eed + me * 31 + static_cast<int>(mode));
    uint64_t next_send[kRanks] = {}, next_recv[kRanks] = {}, verified = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(240);
    for (Backoff backoff; !stop;) {
      bool done = true, progress = false;
      for (int p = 0; p < kRanks; ++p)
        if (p != me && (next_send[p] < per_peer || next_recv[p] < per_peer)) done = false;
      if (done) break;
      int d = static_cast<int>(rng() % (kRanks - 1));
      if (d >= me) ++d;
      const uint64_t seq = next_send[d];
      const int slot = static_cast<int>(seq % kSlots);
      const uint64_t lap = seq / kSlots;
      if (seq < per_peer && (lap == 0 || flag_at(L.ack_flag(d, slot)) >= lap)) {
        const uint64_t len = seq_len(me, d, seq);
        char* src = base + L.send_slot(d, slot);
        for (uint64_t i = 0; i < len; ++i) src[i] = static_cast<char>(pattern(me, seq, i));
        uint64_t cuts[5] = {0, 0, 0, 0, 0};
        const int pieces = 1 + static_cast<int>(rng() % 4);
        for (int c = 1; c < pieces; ++c) cuts[c] = rng() % len;
        for (int a = 2; a < pieces; ++a)  // insertion sort of cuts[1..pieces): std::sort trips GCC 12 -Warray-bounds
          for (int b = a; b > 1 && cuts[b - 1] > cuts[b]; --b) std::swap(cuts[b - 1], cuts[b]);
        cuts[pieces] = len;
        int order[4] = {0, 1, 2, 3};
        std::shuffle(order, order + pieces, rng);
        const bool fused = rng() & 1;
        for (int c = 0; c < pieces; ++c) {
          const uint64_t a = cuts[order[c]], b = cuts[order[c] + 1];
          const uint64_t so = L.send_slot(d, slot) + a, ro = L.recv_slot(me, slot) + a;
          Status s = Status::kOk;
          if (c == pieces - 1 && fused)
            s = push(b > a ? make_fifo_command(FifoOp::kPutSignal, d, so, ro, b - a, L.data_flag(me, slot), lap + 1)
                           : make_fifo_command(FifoOp::kSignal, d, 0, 0, 0, L.data_flag(me, slot), lap + 1));
          else if (b > a)
            s = push(make_fifo_command(FifoOp::kPut, d, so, ro, b - a, 0, 0));
          if (s != Status::kOk) return note(&out.error, "rank " + std::to_string(me) + ": push failed");
        }
        if (!fused &&
            push(make_fifo_command(FifoOp::kSignal, d, 0, 0, 0, L.data_flag(me, slot), lap + 1)) != Status::kOk)
          return note(&out.error, "rank " + std::to_string(me) + ": push failed");
        ++next_send[d];
        progress = true;
      }
      for (int s = 0; s < kRanks; ++s) {
        if (s == me) continue;
        while (next_recv[s] < per_peer) {
          const uint64_t q = next_recv[s];
          const int sl = static_cast<int>(q % kSlots);
          const uint64_t epoch = q / kSlots + 1;
          const uint64_t f = flag_at(L.data_flag(s, sl));
          if (f < epoch) break;
          if (f > epoch) return note(&out.violation, "a flag ran ahead of its reader");
          const uint64_t len = seq_len(s, me, q);
          const uint8_t* got = reinterpret_cast<const uint8_t*>(base + L.recv_slot(s, sl));
          for (uint64_t i = 0; i < len; ++i)
            if (got[i] != pattern(s, q, i))
              return note(&out.violation, std::string("mode ") + to_string(mode) + ": rank " + std::to_string(me) +
                                              " saw the signal of sequence " + std::to_string(q) + " from rank " +
                                              std::to_string(s) + " before its data (byte " + std::to_string(i) +
                                              " of " + std::to_string(len) + ")");
          ++verified;
          if (push(make_fifo_command(FifoOp::kSignal, s, 0, 0, 0, L.ack_flag(me, sl), epoch)) != Status::kOk)
            return note(&out.error, "rank " + std::to_string(me) + ": ack push failed");
          ++next_recv[s];
          progress = true;
        }
      }
      if (progress) {
        backoff.reset();
        continue;
      }
      if (k.proxy->status() != Status::kOk) return note(&out.error, "proxy failed: " + k.proxy->error_message());
      if (std::chrono::steady_clock::now() > deadline) return note(&out.error, "no progress before the deadline");
      backoff.pause();
    }
    std::lock_guard<std::mutex> lock(out_mutex);
    out.verified += verified;
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) threads.emplace_back(body, r);
  for (auto& t : threads) t.join();
  for (auto& k : ranks) {
    if (out.error.empty() && out.violation.empty() && k.proxy->flush() != Status::kOk) out.error = "flush failed";
    k.proxy->stop();
    k.backend->close("");
    out.proxy += k.proxy->counters();
    const ReorderStats& s = k.backend->stats();
    out.shim.puts += s.puts;
    out.shim.signals += s.signals;
    out.shim.bytes += s.bytes;
    out.shim.fences += s.fences;
    out.shim.overtakes += s.overtakes;
    out.shim.signals_before_data += s.signals_before_data;
  }
  set_fence_decision_for_test(true);
  return out;
}

constexpr uint64_t kPerPeer = 17000;  // 3 ranks x 2 peers x 17000 = 102000 sequences per mode

void expect_holds(SignalMode mode) {
  const auto t0 = std::chrono::steady_clock::now();
  Outcome o = run(mode, true, kPerPeer);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double model = testing::modelled_seconds(o.shim, o.proxy.stalls, testing::ReorderCost{});
  MESSAGE(std::string(to_string(mode)) << ": " << o.verified << " sequences in " << s << " s; " << to_string(o.proxy)
                                       << "; shim overtakes " << o.shim.overtakes << "; modelled network time "
                                       << model * 1e3 << " ms");
  CHECK(o.error == "");
  CHECK(o.violation == "");
  CHECK(o.verified == uint64_t(kRanks) * (kRanks - 1) * kPerPeer);
  CHECK(o.shim.overtakes > 0);  // the shim did reorder: ordering came from the fences (or serial waits)
  CHECK(o.shim.signals_before_data == 0);
  CHECK(o.shim.fences == o.proxy.fences);
}

}  // namespace

TEST_CASE("the reorder shim: ordering holds over 10^5 randomised sequences: serial") {
  expect_holds(SignalMode::kSerial);
}
TEST_CASE("the reorder shim: ordering holds over 10^5 randomised sequences: fenced") {
  expect_holds(SignalMode::kFenced);
}
TEST_CASE("the reorder shim: ordering holds over 10^5 randomised sequences: batched") {
  expect_holds(SignalMode::kBatched);
}

TEST_CASE("the reorder shim: with the proxy's fence decision forced off, fenced and batched break; serial holds") {
  for (SignalMode mode : {SignalMode::kFenced, SignalMode::kBatched}) {
    const std::string mode_name = to_string(mode);
    CAPTURE(mode_name);
    Outcome o = run(mode, false, kPerPeer);
    MESSAGE(std::string(to_string(mode)) << " without fences: " << (o.violation.empty() ? "no violation" : o.violation)
                                         << " after " << o.verified << " verified sequences");
    CHECK(o.error == "");
    CHECK(o.proxy.fences == 0);
    // The missing fence is caught at the shim, where a signal overtakes a pending put, every time;
    // whether a reader also sees the flag before the data depends on thread timing (reported).
    MESSAGE("signals applied before their data: " << o.shim.signals_before_data);
    CHECK(o.shim.signals_before_data > 0);
  }
  Outcome o = run(SignalMode::kSerial, false, 2000);  // serial orders by waiting, not by fences
  CHECK(o.error == "");
  CHECK(o.violation == "");
  CHECK(o.shim.signals_before_data == 0);
}

TEST_CASE("the reorder shim's cost model: batched charges fewer fences than fenced for the same traffic") {
  const uint64_t n = 3000;
  testing::ReorderCost cost;
  Outcome f = run(SignalMode::kFenced, true, n), b = run(SignalMode::kBatched, true, n),
          s = run(SignalMode::kSerial, true, n);
  REQUIRE(f.error == "");
  REQUIRE(b.error == "");
  REQUIRE(s.error == "");
  const double tf = testing::modelled_seconds(f.shim, f.proxy.stalls, cost),
               tb = testing::modelled_seconds(b.shim, b.proxy.stalls, cost),
               ts = testing::modelled_seconds(s.shim, s.proxy.stalls, cost);
  MESSAGE("modelled network time: serial " << ts * 1e3 << " ms (stalls " << s.proxy.stalls << "), fenced " << tf * 1e3
                                           << " ms (fences " << f.shim.fences << "), batched " << tb * 1e3
                                           << " ms (fences " << b.shim.fences << ", stalls " << b.proxy.stalls << ")");
  CHECK(b.shim.fences < f.shim.fences);
  CHECK(tb < tf);
  CHECK(s.shim.fences == 0);
}
