// Ordering across processes: a reader never sees a signal before the data it covers, over >= 10^5 randomised
// put/signal sequences per signal mode (3 ranks on 3 emulated nodes, socket and ofi backends, slots reused under
// acks).
#include <doctest/doctest.h>

#include <chrono>
#include <random>
#include <string>

#include "base/backoff.h"
#include "base/log.h"
#include "local_bootstrap.h"
#include "transport/heap.h"
#include "transport/transport.h"

using namespace weft;
using namespace weft::transport;

namespace {

constexpr int kRanks = 3;
constexpr int kSeqPerPeer = 17000;  // 3 ranks x 2 peers x 17000 = 102000 sequences per mode
constexpr int kSlots = 64;
constexpr uint64_t kSlotBytes = 1024;

inline uint8_t pattern(int src, uint64_t seq, uint64_t i) {
  uint64_t x = (seq + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t(src) << 56) ^ (i * 0xD6E8FEB86659FD93ull);
  return static_cast<uint8_t>((x >> 32) ^ (x >> 13) ^ i);
}

struct Layout {
  uint64_t send, recv, data_flags, ack_flags, bytes;
  Layout() {
    HeapAllocator a(uint64_t(2) * kRanks * kSlots * kSlotBytes + uint64_t(2) * kRanks * kSlots * 8 + 8192);
    a.allocate(kRanks * kSlots * kSlotBytes, 4096, "send", &send);
    a.allocate(kRanks * kSlots * kSlotBytes, 4096, "recv", &recv);
    a.allocate(kRanks * kSlots * 8, 64, "data flags", &data_flags);
    a.allocate(kRanks * kSlots * 8, 64, "ack flags", &ack_flags);
    bytes = a.capacity();
  }
  uint64_t send_slot(int peer, int slot) const { return send + (uint64_t(peer) * kSlots + slot) * kSlotBytes; }
  uint64_t recv_slot(int peer, int slot) const { return recv + (uint64_t(peer) * kSlots + slot) * kSlotBytes; }
  uint64_t data_flag(int src, int slot) const { return data_flags + (uint64_t(src) * kSlots + slot) * 8; }
  uint64_t ack_flag(int dst, int slot) const { return ack_flags + (uint64_t(dst) * kSlots + slot) * 8; }
};

// Sequence length is a function of (src, dst, seq) so the reader knows how many bytes to check.
uint64_t seq_len(int src, int dst, uint64_t seq) {
  uint64_t x = (seq * 0x2545F4914F6CDD1Dull) ^ (uint64_t(src) * 7919 + dst * 104729);
  return 8 + (x >> 17) % (kSlotBytes - 7);
}

int rank_body(testing::ForkBootstrap& boot, const std::string& backend, const std::string& mode) {
  const int me = boot.info().rank;
  Layout L;
  std::unique_ptr<HostHeap> heap;
  if (HostHeap::create(L.bytes, &heap) != Status::kOk) return 2;
  TransportOptions opt;
  opt.backend = backend;
  opt.signal_mode = mode;
  opt.fifo_depth = 256;
  opt.timeout_s = 60;
  std::unique_ptr<Transport> t;
  if (Transport::create(boot, heap->region(), opt, &t) != Status::kOk) return 3;
  auto flag_at = [&](uint64_t off) { return __atomic_load_n(heap->at<uint64_t>(off), __ATOMIC_ACQUIRE); };

  std::mt19937_64 rng(0x5eed + me);
  uint64_t next_send[kRanks] = {}, next_recv[kRanks] = {};
  uint64_t verified = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(400);
  Backoff backoff;
  for (;;) {
    bool done = true, progress = false;
    for (int p = 0; p < kRanks; ++p)
      if (p != me && (next_send[p] < kSeqPerPeer || next_recv[p] < kSeqPerPeer)) done = false;
    if (done) break;
    // Send one sequence to a random peer whose slot is free (the reader acked its previous lap).
    int d = static_cast<int>(rng() % (kRanks - 1));
    if (d >= me) ++d;
    const uint64_t seq = next_send[d];
    const int slot = static_cast<int>(seq % kSlots);
    const uint64_t lap = seq / kSlots;
    if (seq < kSeqPerPeer && (lap == 0 || flag_at(L.ack_flag(d, slot)) >= lap)) {
      const uint64_t len = seq_len(me, d, seq);
      uint8_t* src = heap->at(L.send_slot(d, slot));
      for (uint64_t i = 0; i < len; ++i) src[i] = pattern(me, seq, i);
      // 1..4 pieces, pushed in random order; the signal rides on the last (put+signal) or follows it.
      uint64_t cuts[5] = {0, 0, 0, 0, len};
      const int pieces = 1 + static_cast<int>(rng() % 4);
      for (int k = 1; k < pieces; ++k) cuts[k] = rng() % len;
      // Sorts cuts[1..pieces) (std::sort on 3 values: a GCC 12 -Warray-bounds false alarm).
      for (int a = 2; a < pieces; ++a)
        for (int b = a; b > 1 && cuts[b - 1] > cuts[b]; --b) std::swap(cuts[b - 1], cuts[b]);
      cuts[pieces] = len;
      int order[4] = {0, 1, 2, 3};
      std::shuffle(order, order + pieces, rng);
      const bool fused = rng() & 1;
      for (int k = 0; k < pieces; ++k) {
        const int pc = order[k];
        const uint64_t a = cuts[pc], b = cuts[pc + 1];
        Status s;
        if (k == pieces - 1 && fused) {
          s = b > a ? t->put_signal(0, d, L.send_slot(d, slot) + a, L.recv_slot(me, slot) + a, b - a,
                                    L.data_flag(me, slot), lap + 1)
                    : t->signal(0, d, L.data_flag(me, slot), lap + 1);
        } else {
          s = b > a ? t->put(0, d, L.send_slot(d, slot) + a, L.recv_slot(me, slot) + a, b - a) : Status::kOk;
        }
        if (s != Status::kOk) return boot.report("push failed: " + t->error_message()), 4;
      }
      if (!fused && t->signal(0, d, L.data_flag(me, slot), lap + 1) != Status::kOk) return 4;
      ++next_send[d];
      progress = true;
    }
    // Read whatever arrived, in each source's order.
    for (int s = 0; s < kRanks; ++s) {
      if (s == me) continue;
      while (next_recv[s] < kSeqPerPeer) {
        const uint64_t q = next_recv[s];
        const int sl = static_cast<int>(q % kSlots);
        const uint64_t epoch = q / kSlots + 1;
        const uint64_t f = flag_at(L.data_flag(s, sl));
        if (f < epoch) break;
        if (f > epoch) return boot.report("flag ran ahead of the reader: impossible with acks"), 5;
        const uint64_t len = seq_len(s, me, q);
        const uint8_t* got = heap->at(L.recv_slot(s, sl));
        for (uint64_t i = 0; i < len; ++i)
          if (got[i] != pattern(s, q, i)) {
            boot.report("mode " + mode + ": rank " + std::to_string(me) + " saw the signal of sequence " +
                        std::to_string(q) + " from rank " + std::to_string(s) + " before its data (byte " +
                        std::to_string(i) + " of " + std::to_string(len) + ")");
            return 6;
          }
        ++verified;
        if (t->signal(0, s, L.ack_flag(me, sl), epoch) != Status::kOk) return 7;
        ++next_recv[s];
        progress = true;
      }
    }
    if (progress) {
      backoff.reset();
      continue;
    }
    if (t->status() != Status::kOk) return boot.report("transport failed: " + t->error_message()), 8;
    if (std::chrono::steady_clock::now() > deadline) return boot.report("no progress before the deadline"), 9;
    backoff.pause();
  }
  if (t->flush() != Status::kOk || boot.barrier("done") != Status::kOk) return 10;
  TransportCounters c = t->counters();
  if (t->stop() != Status::kOk) return 11;
  boot.report("rank " + std::to_string(me) + " verified " + std::to_string(verified) + " sequences; puts " +
              std::to_string(c.puts) + " signals " + std::to_string(c.signals) + " fences " + std::to_string(c.fences) +
              " batches " + std::to_string(c.batches) + " stalls " + std::to_string(c.stalls));
  const uint64_t pushed_signals = 2ull * kSeqPerPeer * 2;  // a data signal and an ack per sequence, per peer
  if (mode == "serial" && (c.fences != 0 || c.signals != pushed_signals)) return 12;
  if (mode == "fenced" && (c.fences != c.signals || c.signals != pushed_signals)) return 12;
  if (mode == "batched" && (c.fences != c.batches || c.signals > pushed_signals || !c.batches)) return 12;
  return verified == 2ull * kSeqPerPeer ? 0 : 13;
}

void run_mode(const std::string& mode, const std::string& backend = "socket") {
  auto t0 = std::chrono::steady_clock::now();
  auto res = testing::run_forked(
      kRanks, 1, [&](testing::ForkBootstrap& b) { return rank_body(b, backend, mode); }, 500);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE(backend << " " << mode << ": " << kRanks * (kRanks - 1) * kSeqPerPeer << " sequences in " << s << " s");
  for (const auto& r : res) {
    CAPTURE(r.rank);
    CAPTURE(r.report);
    MESSAGE(r.report);
    CHECK(r.exited);
    CHECK(r.exit_code == 0);
    CHECK_FALSE(r.timed_out);
  }
}

}  // namespace

TEST_CASE("ordering holds over 10^5 randomised sequences: serial") { run_mode("serial"); }
TEST_CASE("ordering holds over 10^5 randomised sequences: fenced") { run_mode("fenced"); }
TEST_CASE("ordering holds over 10^5 randomised sequences: batched") { run_mode("batched"); }

// ofi over libfabric's tcp provider (WEFT_OFI_PROVIDER names another), on the loopback interface.
bool ofi_here() {
  setenv("WEFT_OFI_PROVIDER", "tcp;ofi_rxm", 0);
  setenv("FI_TCP_IFACE", "lo", 0);
  std::string why;
  if (ofi_provider_present(getenv("WEFT_OFI_PROVIDER"), &why)) return true;
  MESSAGE("SKIPPED: ofi (" << why << ")");
  return false;
}

TEST_CASE("ordering holds over 10^5 randomised sequences: ofi serial") {
  if (ofi_here()) run_mode("serial", "ofi");
}
TEST_CASE("ordering holds over 10^5 randomised sequences: ofi fenced") {
  if (ofi_here()) run_mode("fenced", "ofi");
}
TEST_CASE("ordering holds over 10^5 randomised sequences: ofi batched") {
  if (ofi_here()) run_mode("batched", "ofi");
}
