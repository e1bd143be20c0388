// ibverbs on a GPU heap whose RDMA write ordering is below "owner": signals go as SENDs and the receiving
// proxy flushes before it sets the flag. The fake verbs defer the visibility of the NIC's writes into
// that heap (ibverbs_fake.h), so a flag written by the NIC can be seen before its data, as on such a GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/backoff.h"
#include "ibverbs_fake.h"
#include "local_bootstrap.h"
#include "transport/ibverbs_backend.h"
#include "transport/ibverbs_plan.h"
#include "transport/peer_set.h"
#include "transport/transport.h"

using weft::Status;
namespace tr = weft::transport;
namespace fake = weft::testing::fake_ibv;

namespace {

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + "\n";
  return s;
}

// The switch is process-wide: on for one scope only.
struct FlushOff {
  FlushOff() { tr::set_receiver_flush_off_for_testing(true); }
  ~FlushOff() { tr::set_receiver_flush_off_for_testing(false); }
};

// What the receiver's copy hook reports to: how many stores, and a check run right after each one
// (the moment a kernel polling the flag could see it).
struct StoreHook {
  uint64_t stores = 0;
  std::function<void()> after_store;
};

// The receiver's copy hook: the flag store the proxy makes into "GPU memory" (host memory here),
// with release order so a thread that acquires the flag sees what the flush made visible before it.
Status store_to_region(void* ctx, void* dst, const void* src, uint64_t bytes) {
  if (bytes == 8 && reinterpret_cast<uintptr_t>(dst) % 8 == 0) {
    uint64_t v;
    memcpy(&v, src, 8);
    __atomic_store_n(static_cast<uint64_t*>(dst), v, __ATOMIC_RELEASE);
  } else {
    memcpy(dst, src, bytes);
  }
  if (auto* h = static_cast<StoreHook*>(ctx)) {
    ++h->stores;
    if (h->after_store) h->after_store();
  }
  return Status::kOk;
}

uint64_t pattern(int round, int slot, int word) { return (uint64_t(round + 1) << 32) ^ (uint64_t(slot) << 16) ^ word; }

// Heap layout (words): kSlots data slots of kSlotWords words, then one flag word per slot.
constexpr int kSlots = 12, kSlotWords = 96;
constexpr uint64_t kFlagBase = uint64_t(kSlots) * kSlotWords * 8;
constexpr uint64_t kHeapBytes = kFlagBase + kSlots * 8;

struct SequenceStats {
  uint64_t signals = 0, rounds = 0;
  uint64_t flushes = 0;           // the receiver's flush hook
  uint64_t flag_before_data = 0;  // times the consumer saw a flag of this round before its data
  uint64_t flag_stores = 0;       // flags the receiving proxy stored through the copy hook
  std::string first_violation;
};

// Rank 0 (host heap) puts and signals to rank 1, whose heap stands for GPU memory with the given RDMA
// write ordering; rank 1's NIC writes are deferred (visible in random order until a flush). Each round
// puts to 1..4 random slots (random lengths, random exec budget per poll) and signals each with the
// round number; after every poll the consumer checks "this round's flag set => this round's data there".
void run_sequences(int ordering, int rounds, bool defer, SequenceStats* st, fake::Fabric& fab) {
  std::vector<uint64_t> src(kHeapBytes / 8, 0), dst(kHeapBytes / 8, 0);
  if (defer) fab.defer_visibility(dst.data(), kHeapBytes);
  tr::BackendConfig c0, c1;
  c0.rank = 0, c1.rank = 1;
  c0.size = c1.size = 2;
  c0.nic_name = "mlx5_0", c1.nic_name = "mlx5_1";
  c0.timeout_s = c1.timeout_s = 10;
  StoreHook hook;
  c1.copy_hooks.to_region = store_to_region;
  c1.copy_hooks.ctx = &hook;
  std::unique_ptr<tr::NetBackend> b0, b1;
  REQUIRE(tr::make_ibverbs_backend(c0, &b0) == Status::kOk);
  REQUIRE(tr::make_ibverbs_backend(c1, &b1) == Status::kOk);
  REQUIRE(b0->register_region(tr::Region{src.data(), kHeapBytes, tr::MemKind::kHost}) == Status::kOk);
  tr::Region gpu{dst.data(), kHeapBytes, tr::MemKind::kDevice};
  gpu.rdma_writes_ordering = ordering;
  gpu.flush_rdma_writes = [&] {
    ++st->flushes;
    fab.flush_deferred();
    return Status::kOk;
  };
  REQUIRE(b1->register_region(gpu) == Status::kOk);
  tr::PeerInfo i0, i1;
  REQUIRE(b0->local_info(&i0) == Status::kOk);
  REQUIRE(b1->local_info(&i1) == Status::kOk);
  REQUIRE(b0->connect(1, i1) == Status::kOk);
  REQUIRE(b1->connect(0, i0) == Status::kOk);

  std::mt19937 rng(4242);
  std::vector<int> len(kSlots, 0);  // words of this round's put to each slot (0: none this round)
  std::vector<int> slots;           // this round's slots
  int round = 0;
  // The consumer: true when every flag of this round is set; counts a flag seen before its data.
  auto consume = [&] {
    bool all_set = true;
    for (int s : slots) {
      const uint64_t flag = __atomic_load_n(&dst[kFlagBase / 8 + s], __ATOMIC_ACQUIRE);
      if (flag != uint64_t(round + 1)) {
        all_set = false;
        continue;
      }
      for (int w = 0; w < len[s]; ++w)
        if (dst[s * kSlotWords + w] != pattern(round, s, w)) {
          if (!st->flag_before_data++)
            st->first_violation = "round " + std::to_string(round) + " slot " + std::to_string(s) + " word " +
                                  std::to_string(w) + ": flag set, data not yet visible";
          break;
        }
    }
    return all_set;
  };
  hook.after_store = [&] { consume(); };
  std::vector<tr::Completion> done;
  uint64_t next_id = 1;
  for (; round < rounds; ++round) {
    fab.set_exec_budget(1 + static_cast<int>(rng() % 3));
    std::fill(len.begin(), len.end(), 0);
    const int k = 1 + static_cast<int>(rng() % 4);
    slots.clear();
    while (static_cast<int>(slots.size()) < k) {
      const int s = static_cast<int>(rng() % kSlots);
      if (std::find(slots.begin(), slots.end(), s) == slots.end()) slots.push_back(s);
    }
    for (int s : slots) {
      len[s] = 1 + static_cast<int>(rng() % kSlotWords);
      for (int w = 0; w < len[s]; ++w) src[s * kSlotWords + w] = pattern(round, s, w);
      tr::PostFlags f;
      f.need_completion = rng() % 2;
      REQUIRE(b0->post_put(1, 8ull * s * kSlotWords, 8ull * s * kSlotWords, 8ull * len[s], f, next_id++) ==
              Status::kOk);
      f.need_completion = true;
      REQUIRE(b0->post_signal(1, kFlagBase + 8ull * s, uint64_t(round + 1), f, next_id++) == Status::kOk);
      ++st->signals;
    }
    ++st->rounds;
    // Poll both ranks until every flag of this round is set, checking after each poll and after each
    // flag the receiving proxy stores (bounded).
    bool all_set = false;
    for (int iter = 0; iter < 20000 && !all_set; ++iter) {
      done.clear();
      REQUIRE(b0->poll(&done) == Status::kOk);
      REQUIRE(b1->poll(&done) == Status::kOk);
      all_set = consume();
    }
    // Every flag of the round set: the puts before them have executed, so their sources may be rewritten.
    REQUIRE_MESSAGE(all_set, "round " << round << ": not every flag arrived within 20000 polls (a lost signal)");
  }
  CHECK(b0->close() == Status::kOk);
  CHECK(b1->close() == Status::kOk);
  fab.defer_visibility(nullptr, 0);
  st->flag_stores = hook.stores;
}

}  // namespace

TEST_CASE("ordering none: signals go as SENDs, the receiver flushes then sets them; no flag before its data") {
  fake::Fabric fab({fake::ib_device("mlx5_0", 1), fake::ib_device("mlx5_1", 2)});
  SequenceStats st;
  run_sequences(0, 300, true, &st, fab);
  const fake::Counters c = fab.counters();
  MESSAGE("flush path: " << st.rounds << " rounds, " << st.signals << " signals, " << st.flushes << " flushes, "
                         << c.deferred << " deferred writes (" << c.early_visible << " visible before a flush), "
                         << st.flag_before_data << " flags seen before their data");
  INFO(st.first_violation);
  CHECK(st.flag_before_data == 0);
  CHECK(c.sends == st.signals);         // every signal was a SEND
  CHECK(st.flag_stores == st.signals);  // and every flag was stored by the receiving proxy
  CHECK(st.flushes >= st.rounds);       // at least one flush per batch of signals
  CHECK(st.flushes <= st.signals);      // and never more than one per signal
  CHECK(c.early_visible > 0);           // the fake did reorder: the test could have failed
  CHECK(c.recvs_posted >= 128);         // receives posted up front and replenished
  CHECK(c.recvs_posted >= 128 + st.signals);
  CHECK(fab.violations().empty());
  INFO(joined(fab.violations()));
  CHECK(fab.live_objects() == 0);
}

TEST_CASE("the same GPU with the receiver-side flush switched off: a flag is seen before its data") {
  fake::Fabric fab({fake::ib_device("mlx5_0", 1), fake::ib_device("mlx5_1", 2)});
  SequenceStats st;
  {
    FlushOff off;
    run_sequences(0, 300, true, &st, fab);
  }
  const fake::Counters c = fab.counters();
  MESSAGE("flush off: " << st.rounds << " rounds, " << st.signals << " signals, " << st.flag_before_data
                        << " times a flag was seen before its data (first: " << st.first_violation << ")");
  CHECK(st.flag_before_data > 0);  // what the flush prevents
  CHECK(c.sends == 0);             // signals were plain WRITEs into the flag words
  CHECK(st.flushes == 0);
  CHECK(st.flag_stores == 0);
  CHECK(fab.violations().empty());
}

TEST_CASE("ordering owner (and above): signals stay inline RDMA WRITEs, no receive-side work") {
  for (int ordering : {100, 200}) {
    CAPTURE(ordering);
    fake::Fabric fab({fake::ib_device("mlx5_0", 1), fake::ib_device("mlx5_1", 2)});
    SequenceStats st;
    run_sequences(ordering, 50, false, &st, fab);
    const fake::Counters c = fab.counters();
    CHECK(st.flag_before_data == 0);
    CHECK(c.sends == 0);
    CHECK(c.recvs_posted == 0);
    CHECK(c.inline_writes >= st.signals);
    CHECK(st.flushes == 0);
    CHECK(st.flag_stores == 0);
    CHECK(fab.violations().empty());
  }
}

TEST_CASE("the choice: a GPU heap below owner only, said with the attribute value; bad records refused") {
  std::string why;
  using A = tr::ibv::SignalApply;
  CHECK(tr::ibv::choose_signal_apply(false, 0, false, &why) == A::kNicWrite);
  CHECK(why.find("host heap") != std::string::npos);
  CHECK(tr::ibv::choose_signal_apply(true, -1, false, &why) == A::kNicWrite);
  CHECK(tr::ibv::choose_signal_apply(true, 100, false, &why) == A::kNicWrite);
  CHECK(why.find("= 100") != std::string::npos);
  CHECK(tr::ibv::choose_signal_apply(true, 200, false, &why) == A::kNicWrite);
  CHECK(tr::ibv::choose_signal_apply(true, 0, false, &why) == A::kProxyAfterFlush);
  CHECK(why.find("CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING = 0") != std::string::npos);
  CHECK(tr::ibv::choose_signal_apply(true, 99, false, &why) == A::kProxyAfterFlush);
  CHECK(tr::ibv::choose_signal_apply(true, 0, true, &why) == A::kNicWrite);
  CHECK(why.find("switched off") != std::string::npos);

  tr::ibv::SignalRecord r{64, 7};
  CHECK(tr::ibv::signal_record_ok(16, r, 4096, &why));
  CHECK_FALSE(tr::ibv::signal_record_ok(8, r, 4096, &why));  // truncated
  r.flag_offset = 4092;
  CHECK_FALSE(tr::ibv::signal_record_ok(16, r, 4096, &why));  // unaligned
  r.flag_offset = 4096;
  CHECK_FALSE(tr::ibv::signal_record_ok(16, r, 4096, &why));  // past the heap
  CHECK(why.find("4096-byte heap") != std::string::npos);
  r.flag_offset = ~uint64_t{0} - 7;
  CHECK_FALSE(tr::ibv::signal_record_ok(16, r, 4096, &why));  // no wrap-around

  // The endpoint says who applies signals; decode refuses flags it does not know.
  tr::IbvPeerInfo v;
  v.lid = 3;
  v.flags = tr::IbvPeerInfo::kIbvSignalsBySend;
  v.qps = {{0, 5, 6}};
  auto blob = tr::encode_peer_info(1, 0, v);
  CHECK(blob.size() == tr::ibv_peer_info_bytes(1));
  int node = -1;
  tr::PeerInfo back;
  REQUIRE(tr::decode_peer_info(blob, 1, &node, &back) == Status::kOk);
  CHECK(std::get<tr::IbvPeerInfo>(back).flags == tr::IbvPeerInfo::kIbvSignalsBySend);
  v.flags = 2;
  CHECK(tr::decode_peer_info(tr::encode_peer_info(1, 0, v), 1, &node, &back) == Status::kProtocolError);
}

TEST_CASE("a GPU heap below owner without a flush or a copy hook is refused at registration, saying why") {
  fake::Fabric fab({fake::ib_device("mlx5_0", 1)});
  std::vector<uint64_t> mem(512, 0);
  tr::BackendConfig c;
  c.size = 2;
  tr::Region gpu{mem.data(), mem.size() * 8, tr::MemKind::kDevice};
  gpu.rdma_writes_ordering = 0;
  {
    std::unique_ptr<tr::NetBackend> b;
    REQUIRE(tr::make_ibverbs_backend(c, &b) == Status::kOk);
    CHECK(b->register_region(gpu) == Status::kInvalidArgument);
    CHECK(b->error_message().find("carries no flush") != std::string::npos);
    b->close();
  }
  gpu.flush_rdma_writes = [] { return Status::kOk; };
  {
    std::unique_ptr<tr::NetBackend> b;
    REQUIRE(tr::make_ibverbs_backend(c, &b) == Status::kOk);
    CHECK(b->register_region(gpu) == Status::kInvalidArgument);
    CHECK(b->error_message().find("no copy hook") != std::string::npos);
    b->close();
  }
  CHECK(fab.live_objects() == 0);
}

namespace {

// Rank 0 sends `n` put+signals to rank 1 through Transport (proxies, a signal mode); both heaps stand
// for GPU memory below owner, rank 1's writes deferred. Rank 1 waits for each signal value with its
// own bounded wait (acquire) and checks the data it announces.
struct E2e {
  std::vector<Status> status;
  std::vector<std::string> error;
  std::vector<std::string> ordering;
  uint64_t flushes = 0, checked = 0, bad = 0;
};

E2e run_transport(fake::Fabric& fab, const char* mode, int n, double timeout_s) {
  E2e out;
  out.error.resize(2);
  out.ordering.resize(2);
  // Words: sources [0, 2048) (reused every 256 puts), destinations [2048, 2048 + 8n) (never reused, so a
  // later put cannot overwrite what an earlier flag announced), the flag at word 8000.
  std::vector<std::vector<uint64_t>> mem(2, std::vector<uint64_t>(8192, 0));
  REQUIRE(2048 + 8 * n <= 8000);
  fab.defer_visibility(mem[1].data(), mem[1].size() * 8);
  std::atomic<uint64_t> flushes{0};
  out.status = weft::testing::run_threads(2, 1, [&](weft::bootstrap::Bootstrap& boot) -> Status {
    const int me = boot.info().rank;
    std::vector<uint64_t>& m = mem[me];
    tr::TransportOptions o;
    o.backend = "ibverbs";
    o.signal_mode = mode;
    o.timeout_s = timeout_s;
    o.use_topology = false;
    o.copy_hooks.to_region = store_to_region;
    tr::Region heap{m.data(), m.size() * 8, tr::MemKind::kDevice};
    heap.rdma_writes_ordering = 0;
    heap.flush_rdma_writes = [&] {
      flushes.fetch_add(1);
      if (me == 1) fab.flush_deferred();
      return Status::kOk;
    };
    std::unique_ptr<tr::Transport> t;
    WEFT_CHECK(tr::Transport::create(boot, heap, o, &t));
    out.ordering[me] = t->ordering();
    Status s = Status::kOk;
    if (me == 0) {
      // Put i: source words [8 * (i % 256), +8) to rank 1's words [2048 + 8i, +8); the flag counts puts.
      for (int i = 0; i < n && s == Status::kOk; ++i) {
        for (int w = 0; w < 8; ++w) m[8 * (i % 256) + w] = pattern(i, 0, w);
        s = t->put_signal(0, 1, 64ull * (i % 256), 8ull * (2048 + 8 * i), 64, 8 * 8000, uint64_t(i + 1));
        if (s == Status::kOk && i % 256 == 255) s = t->flush();  // sources are reused: complete before rewriting
      }
      if (s == Status::kOk) s = t->flush();
    } else {
      // Every value the flag takes announces at least the put with that number.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
      uint64_t seen = 0;
      weft::Backoff backoff;  // the proxies need the CPU this machine has
      while (seen < uint64_t(n)) {
        const uint64_t v = __atomic_load_n(&m[8000], __ATOMIC_ACQUIRE);
        if (v > seen) {
          ++out.checked;
          for (uint64_t i = seen; i < v; ++i)  // every put up to the one this value announces
            for (int w = 0; w < 8; ++w)
              if (m[2048 + 8 * i + w] != pattern(static_cast<int>(i), 0, w)) ++out.bad;
          seen = v;
          backoff.reset();
          continue;
        }
        if (t->status() != Status::kOk) {
          s = t->status();
          break;
        }
        if (std::chrono::steady_clock::now() > deadline) {
          out.error[1] = "rank 1: flag at word 8000 reached " + std::to_string(seen) + " of " + std::to_string(n) +
                         " within " + std::to_string(timeout_s) + "s";
          s = Status::kTimeout;
          break;
        }
        backoff.pause();
      }
    }
    if (out.error[me].empty()) out.error[me] = t->error_message();
    Status b = boot.barrier("done");
    Status st = t->stop();
    return s != Status::kOk ? s : b != Status::kOk ? b : st;
  });
  fab.defer_visibility(nullptr, 0);
  out.flushes = flushes.load();
  return out;
}

}  // namespace

TEST_CASE("through Transport and its proxies, every signal mode: the data a flag announces is visible") {
  for (const char* mode : {"serial", "fenced", "batched"}) {
    CAPTURE(mode);
    fake::Fabric fab({fake::ib_device("mlx5_0", 1), fake::ib_device("mlx5_1", 2)});
    fab.set_exec_budget(2);
    E2e r = run_transport(fab, mode, 600, 20);
    CHECK(r.status[0] == Status::kOk);
    CHECK(r.status[1] == Status::kOk);
    INFO(r.error[0] << " | " << r.error[1]);
    CHECK(r.checked > 0);
    CHECK(r.bad == 0);
    CHECK(r.flushes > 0);
    // Every signal a SEND (batched mode coalesces signals to one flag into the newest).
    if (std::string(mode) == "batched")
      CHECK((fab.counters().sends > 0 && fab.counters().sends <= 600));
    else
      CHECK(fab.counters().sends == 600);
    CHECK(fab.counters().early_visible > 0);
    CHECK(r.ordering[1].find("SENDs its proxy applies after cuFlushGPUDirectRDMAWrites (GPU RDMA write ordering 0)") !=
          std::string::npos);
    CHECK(fab.violations().empty());
    CHECK(fab.live_objects() == 0);
  }
}

TEST_CASE("a signal whose receive never comes: bounded, and the error names rank, peer and what was awaited") {
  fake::Fabric fab({fake::ib_device("mlx5_0", 1), fake::ib_device("mlx5_1", 2)});
  // The connection preflight (zero-length WRITEs) passes; from then on no SEND is delivered.
  std::vector<std::vector<uint64_t>> mem(2, std::vector<uint64_t>(1024, 0));
  std::vector<std::string> err(2);
  const auto t0 = std::chrono::steady_clock::now();
  auto st = weft::testing::run_threads(2, 1, [&](weft::bootstrap::Bootstrap& boot) -> Status {
    const int me = boot.info().rank;
    tr::TransportOptions o;
    o.backend = "ibverbs";
    o.signal_mode = "serial";
    o.timeout_s = 1;
    o.use_topology = false;
    o.copy_hooks.to_region = store_to_region;
    tr::Region heap{mem[me].data(), mem[me].size() * 8, tr::MemKind::kDevice};
    heap.rdma_writes_ordering = 0;
    heap.flush_rdma_writes = [] { return Status::kOk; };
    std::unique_ptr<tr::Transport> t;
    WEFT_CHECK(tr::Transport::create(boot, heap, o, &t));
    WEFT_CHECK(boot.barrier("up"));
    if (me == 0) fab.set_hold_sends(true);
    WEFT_CHECK(boot.barrier("held"));
    Status s = Status::kOk;
    if (me == 0) {
      s = t->put_signal(0, 1, 0, 64, 64, 8 * 1000, 1);
      if (s == Status::kOk) s = t->flush();
      // The caller's flush and the proxy's own wait share the bound: let the proxy say why (bounded).
      for (int i = 0; i < 300 && t->status() == Status::kOk; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      err[0] = t->error_message();
    }
    boot.barrier("done");
    t->stop();
    return s;
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(st[0] == Status::kTimeout);
  CHECK(st[1] == Status::kOk);
  CHECK(seconds < 10);
  INFO(err[0]);
  CHECK(err[0].find("rank 0 channel 0") != std::string::npos);
  CHECK(err[0].find("complet") != std::string::npos);  // "no completion" / "not completed": what it awaited
  CHECK(err[0].find("to rank 1") != std::string::npos);
  CHECK(fab.counters().sends == 0);
  CHECK(mem[1][1000] == 0);  // never set without its data
}

// The report a site reads before a job (transport/peer_set.h) against what the backend really holds on the
// fake verbs, summed over ranks: 3 nodes x 1, 2 channels, rails (2 peers a rank). A GPU below "owner"
// ordering adds the receive side (receives, their registered buffers, a receive CQ); at "owner" it has none.
TEST_CASE("the resource report counts what the wiring holds, with SEND signals and with WRITE signals") {
  for (const int ordering : {0, 100}) {
    CAPTURE(ordering);
    fake::Fabric fab({fake::ib_device("mlx5_0", 1)});
    const int world = 3, channels = 2;
    std::vector<std::vector<uint64_t>> mem(world, std::vector<uint64_t>(4096, 0));
    fake::Fabric::Held held;
    std::vector<tr::RankResources> planned(world);
    auto st = weft::testing::run_threads(world, 1, [&](weft::bootstrap::Bootstrap& boot) -> Status {
      const int me = boot.info().rank;
      tr::TransportOptions o;
      o.backend = "ibverbs";
      o.channels = channels;
      o.timeout_s = 10;
      o.use_topology = false;
      o.peers = tr::PeerNeed::kRails;
      o.copy_hooks.to_region = store_to_region;
      tr::Region heap{mem[me].data(), mem[me].size() * 8, tr::MemKind::kDevice};
      heap.rdma_writes_ordering = ordering;
      heap.flush_rdma_writes = [] { return Status::kOk; };
      std::unique_ptr<tr::Transport> t;
      WEFT_CHECK(tr::Transport::create(boot, heap, o, &t));
      tr::ResourceInputs in;
      in.backend = "ibverbs";
      in.channels = channels;
      in.heap_bytes = heap.bytes;
      in.signals = ordering < 100 ? tr::SignalPath::kSend : tr::SignalPath::kWrite;
      std::string why;
      WEFT_CHECK(tr::rank_resources(t->layout(), me, tr::PeerNeed::kRails, in, &planned[me], &why));
      WEFT_CHECK(boot.barrier("wired"));
      if (me == 0) held = fab.held();
      WEFT_CHECK(boot.barrier("counted"));
      return t->stop();
    });
    fake::Fabric::Held sum;
    for (int r = 0; r < world; ++r) {
      CAPTURE(r);
      CHECK(st[r] == Status::kOk);
      CHECK(planned[r].net_peers == 2);
      sum.queue_pairs += planned[r].queue_pairs;
      sum.memory_registrations += planned[r].memory_registrations;
      sum.registered_bytes += planned[r].registered_bytes;
      sum.completion_queues += planned[r].completion_queues;
      sum.completion_entries += planned[r].completion_entries;
      sum.receives_posted += planned[r].receive_entries;
    }
    CHECK(held.queue_pairs == sum.queue_pairs);
    CHECK(held.memory_registrations == sum.memory_registrations);
    CHECK(held.registered_bytes == sum.registered_bytes);
    CHECK(held.completion_queues == sum.completion_queues);
    CHECK(held.completion_entries == sum.completion_entries);
    CHECK(held.receives_posted == sum.receives_posted);
    // The receive side exists exactly where the GPU needs the flush.
    CHECK((held.receives_posted > 0) == (ordering < 100));
    CHECK(fab.violations().empty());
    INFO(joined(fab.violations()));
    CHECK(fab.live_objects() == 0);
  }
}
