// The socket backend's device-heap path on the CPU: a heap declared device memory is reached only through copy
// hooks (memcpy here, CUDA copies on a GPU), fed by a burst that laps a shallow FIFO several times, as in the GPU
// test, from host producers or from threads following the device push's protocol (then flushed from the host); a
// stalled copy (the GPU hang's signature: tail stuck at one drain round); and a bootstrap that returns too few
// endpoint blobs is refused rather than read past its end.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "base/backoff.h"
#include "base/log.h"
#include "local_bootstrap.h"
#include "transport/heap.h"
#include "transport/transport.h"

using namespace weft;
using namespace weft::transport;

namespace {

constexpr uint64_t kChunk = 4 << 20;
constexpr int kPuts = 256;  // slices of the chunk, as the GPU test's 256 producer threads push them
constexpr int kProducers = 4;
constexpr uint32_t kDepth = 64;

// What the hooks saw. A hook is called on the proxy thread only; producers never copy.
struct HookLog {
  std::atomic<uint64_t> to_bytes{0}, from_bytes{0};
  std::atomic<int> on_producer_thread{0};
  std::vector<std::thread::id> producers;  // written before the first push, read by hooks afterwards
  std::atomic<bool> producers_known{false};
  std::atomic<bool>* gate = nullptr;  // if set: from_region waits (bounded) until it opens, like a stalled copy
  void note_thread() {
    if (!producers_known.load(std::memory_order_acquire)) return;
    for (const auto& id : producers)
      if (id == std::this_thread::get_id()) ++on_producer_thread;
  }
};

// A copy engine stand-in. A flag-sized copy is one atomic store, so the reader's acquire load may race with it.
Status to_region(void* ctx, void* dst, const void* src, uint64_t bytes) {
  auto* log = static_cast<HookLog*>(ctx);
  log->note_thread();
  if (bytes == 8 && reinterpret_cast<uintptr_t>(dst) % 8 == 0) {
    uint64_t v;
    memcpy(&v, src, 8);
    __atomic_store_n(static_cast<uint64_t*>(dst), v, __ATOMIC_RELEASE);
  } else {
    memcpy(dst, src, bytes);
  }
  log->to_bytes += bytes;
  return Status::kOk;
}

Status from_region(void* ctx, void* dst, const void* src, uint64_t bytes) {
  auto* log = static_cast<HookLog*>(ctx);
  log->note_thread();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (log->gate && !log->gate->load() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  memcpy(dst, src, bytes);
  log->from_bytes += bytes;
  return Status::kOk;
}

// The device push's protocol (fifo_device.cuh) on a CPU thread: a ticket from the producers' own counter, a bounded
// wait for room, plain stores of bytes 0..55, then a release store of the command word.
Status device_style_push(FifoRingHeader* ring, FifoProducerState* state, const FifoCommand& cmd) {
  const uint64_t depth = ring->depth;
  const uint64_t t = __atomic_fetch_add(&state->next_ticket, 1, __ATOMIC_RELAXED);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  Backoff backoff;
  while (t >= __atomic_load_n(&ring->tail, __ATOMIC_ACQUIRE) + depth) {
    if (int32_t e = __atomic_load_n(&ring->error, __ATOMIC_ACQUIRE)) return static_cast<Status>(e);
    if (std::chrono::steady_clock::now() > deadline) {
      WEFT_WARN(kTransport, "device-style push: ticket %llu found no room (tail %llu)", (unsigned long long)t,
                (unsigned long long)__atomic_load_n(&ring->tail, __ATOMIC_ACQUIRE));
      return Status::kTimeout;
    }
    backoff.pause();
  }
  FifoCommand* slot = fifo_slots(ring) + (t & (depth - 1));
  memcpy(static_cast<void*>(slot), &cmd, offsetof(FifoCommand, word));
  __atomic_store_n(&slot->word, make_command_word(command_op(cmd.word), t), __ATOMIC_RELEASE);
  return Status::kOk;
}

uint32_t word_of(int src, int mode, uint64_t i) { return static_cast<uint32_t>(i * 2654435761u) ^ (src << 24) ^ mode; }

// 2 ranks on 2 emulated nodes: each sends its chunk to the other as kPuts puts from kProducers threads, then one
// signal; the heap is "device" memory, so every byte moves through the hooks. device_style: after one host put
// and a flush, the producers feed the ring as kernel threads do (DeviceFifoHandle: own ticket counter starting at
// the ring's tail, host pushes refused), and Transport::flush must still complete.
Status staged_body(bootstrap::Bootstrap& boot, const char* mode, int mode_index, bool device_style) {
  const int me = boot.info().rank, peer = 1 - me;
  const uint64_t send = 0, recv = kChunk, flag = 2 * kChunk;
  std::unique_ptr<HostHeap> heap;
  WEFT_CHECK(HostHeap::create(2 * kChunk + 4096, &heap));
  for (uint64_t i = 0; i < kChunk / 4; ++i) heap->at<uint32_t>(send)[i] = word_of(me, mode_index, i);
  Region region = heap->region();
  region.kind = MemKind::kDevice;  // the backend may touch it only through the hooks
  HookLog log;
  TransportOptions opt;
  opt.backend = "socket";
  opt.signal_mode = mode;
  opt.fifo_depth = kDepth;
  opt.timeout_s = 20;
  opt.copy_hooks.to_region = to_region;
  opt.copy_hooks.from_region = from_region;
  opt.copy_hooks.ctx = &log;
  std::unique_ptr<Transport> t;
  WEFT_CHECK(Transport::create(boot, region, opt, &t));
  WEFT_CHECK(boot.barrier(std::string("up.") + mode));

  std::vector<std::thread> producers;
  std::atomic<int> push_errors{0};
  const uint64_t slice = kChunk / kPuts;
  FifoRingHeader* ring = t->fifo_ring(0);
  FifoProducerState device_state{};
  const uint64_t extra = device_style ? 1 : 0;  // the host put before the switch
  if (device_style) {
    WEFT_CHECK(t->put(0, peer, send, recv, slice));  // slice 0 again: same bytes
    WEFT_CHECK(t->flush());
    device_state.next_ticket = device_state.tail_cache = __atomic_load_n(&ring->tail, __ATOMIC_ACQUIRE);
    ring->device_producers = 1;
    if (t->put(0, peer, send, recv, slice) != Status::kInvalidArgument) return Status::kInternal;
  }
  auto put = [&](uint64_t src, uint64_t dst, uint64_t bytes) {
    if (!device_style) return t->put(0, peer, src, dst, bytes);
    FifoCommand c{};
    c.src_offset = src;
    c.dst_offset = dst;
    c.bytes = bytes;
    c.peer = static_cast<uint32_t>(peer);
    c.word = make_command_word(FifoOp::kPut, 0);
    return device_style_push(ring, &device_state, c);
  };
  log.producers.resize(kProducers);
  std::atomic<int> ready{0};
  for (int p = 0; p < kProducers; ++p)
    producers.emplace_back([&, p] {
      log.producers[p] = std::this_thread::get_id();
      if (++ready == kProducers) log.producers_known.store(true, std::memory_order_release);
      for (Backoff backoff; ready.load() < kProducers;) backoff.pause();
      for (int i = p; i < kPuts; i += kProducers)
        if (put(send + i * slice, recv + i * slice, slice) != Status::kOk) ++push_errors;
    });
  for (auto& th : producers) th.join();
  if (device_style) {
    FifoCommand c{};
    c.flag_offset = flag;
    c.signal_value = 1;
    c.peer = static_cast<uint32_t>(peer);
    c.word = make_command_word(FifoOp::kSignal, 0);
    WEFT_CHECK(device_style_push(ring, &device_state, c));
  } else {
    WEFT_CHECK(t->signal(0, peer, flag, 1));
  }

  const uint64_t* f = heap->at<uint64_t>(flag);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (__atomic_load_n(f, __ATOMIC_ACQUIRE) < 1) {
    WEFT_CHECK(t->status());
    if (std::chrono::steady_clock::now() > deadline) {
      WEFT_WARN(kTransport, "rank %d (%s): the chunk's signal did not arrive (ring tail %llu)", me, mode,
                (unsigned long long)__atomic_load_n(&t->fifo_ring(0)->tail, __ATOMIC_ACQUIRE));
      return Status::kTimeout;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  for (uint64_t i = 0; i < kChunk / 4; ++i)
    if (heap->at<uint32_t>(recv)[i] != word_of(peer, mode_index, i)) {
      WEFT_WARN(kTransport, "rank %d (%s): word %llu of the chunk from rank %d is wrong", me, mode,
                (unsigned long long)i, peer);
      return Status::kProtocolError;
    }
  WEFT_CHECK(t->flush());
  const uint64_t tail = __atomic_load_n(&t->fifo_ring(0)->tail, __ATOMIC_ACQUIRE);
  WEFT_CHECK(boot.barrier(std::string("verified.") + mode));
  TransportCounters c = t->counters();
  WEFT_CHECK(t->stop());
  // Sender side: exactly the chunk went out through from_region; receiver side: the chunk and the flag came in
  // through to_region; the proxy drained every lap of the ring; no copy ran on a producer thread.
  const bool ok = push_errors == 0 && tail == kPuts + 1 + extra && c.puts == kPuts + extra &&
                  log.from_bytes == kChunk + extra * slice && log.to_bytes == kChunk + 8 + extra * slice &&
                  log.on_producer_thread == 0;
  if (!ok) {
    WEFT_WARN(kTransport,
              "rank %d (%s%s): push errors %d, ring tail %llu (want %llu), puts %llu, copied out %llu in %llu, "
              "copies on producer threads %d",
              me, mode, device_style ? ", device-style producers" : "", push_errors.load(), (unsigned long long)tail,
              (unsigned long long)(kPuts + 1 + extra), (unsigned long long)c.puts,
              (unsigned long long)log.from_bytes.load(), (unsigned long long)log.to_bytes.load(),
              log.on_producer_thread.load());
    return Status::kInternal;
  }
  return Status::kOk;
}

// Rank 0's copies out of its heap stall until the test opens the gate, as a CUDA copy stalls behind a lazy kernel
// load: the proxy takes one drain round (depth commands), then sits in its first copy, so the tail stops at exactly
// the depth and a host flush times out (naming the stuck call); once the copy returns, everything completes.
Status stalled_copy_body(bootstrap::Bootstrap& boot) {
  const int me = boot.info().rank;
  constexpr int kCount = 2 * kDepth - 1;  // puts; with the signal the ring is filled twice: no push waits
  constexpr uint64_t kSlice = 4096;
  std::unique_ptr<HostHeap> heap;
  WEFT_CHECK(HostHeap::create(2 * kCount * kSlice + 4096, &heap));
  const uint64_t recv = kCount * kSlice, flag = 2 * kCount * kSlice;
  for (uint64_t i = 0; i < kCount * kSlice / 4; ++i) heap->at<uint32_t>(0)[i] = word_of(me, 99, i);
  Region region = heap->region();
  region.kind = MemKind::kDevice;
  HookLog log;
  std::atomic<bool> gate{me != 0};
  log.gate = &gate;
  TransportOptions opt;
  opt.backend = "socket";
  opt.fifo_depth = kDepth;
  opt.timeout_s = 1.5;
  opt.copy_hooks.to_region = to_region;
  opt.copy_hooks.from_region = from_region;
  opt.copy_hooks.ctx = &log;
  std::unique_ptr<Transport> t;
  WEFT_CHECK(Transport::create(boot, region, opt, &t));
  WEFT_CHECK(boot.barrier("stall.up"));
  if (me == 0) {
    for (int i = 0; i < kCount; ++i) WEFT_CHECK(t->put(0, 1, i * kSlice, recv + i * kSlice, kSlice));
    WEFT_CHECK(t->signal(0, 1, flag, 1));
    const Status stalled = t->flush();
    const uint64_t tail = __atomic_load_n(&t->fifo_ring(0)->tail, __ATOMIC_ACQUIRE);
    gate = true;
    if (stalled != Status::kTimeout || tail != kDepth) {
      WEFT_WARN(kTransport, "stalled copy: flush gave %d, ring tail %llu (want %d, %u)", static_cast<int>(stalled),
                (unsigned long long)tail, static_cast<int>(Status::kTimeout), kDepth);
      return Status::kInternal;
    }
    WEFT_CHECK(t->flush());
    if (__atomic_load_n(&t->fifo_ring(0)->tail, __ATOMIC_ACQUIRE) != kCount + 1) return Status::kInternal;
  } else {
    const uint64_t* f = heap->at<uint64_t>(flag);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (__atomic_load_n(f, __ATOMIC_ACQUIRE) < 1) {
      if (std::chrono::steady_clock::now() > deadline) return Status::kTimeout;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    for (uint64_t i = 0; i < kCount * kSlice / 4; ++i)
      if (heap->at<uint32_t>(recv)[i] != word_of(0, 99, i)) return Status::kProtocolError;
  }
  WEFT_CHECK(boot.barrier("stall.done"));
  return t->stop();
}

// Returns one blob too few for the transport's endpoint exchange, as a broken bootstrap might.
class ShortEndpointBootstrap : public bootstrap::Bootstrap {
 public:
  explicit ShortEndpointBootstrap(bootstrap::Bootstrap& inner) : inner_(inner) {}
  const bootstrap::RankInfo& info() const override { return inner_.info(); }
  Status allgather(const std::string& key, const bootstrap::Blob& mine, std::vector<bootstrap::Blob>* all) override {
    WEFT_CHECK(inner_.allgather(key, mine, all));
    if (key.find(".ep.") != std::string::npos) all->pop_back();
    return Status::kOk;
  }
  Status barrier(const std::string& tag) override { return inner_.barrier(tag); }
  void abort(const std::string& why) override { inner_.abort(why); }

 private:
  bootstrap::Bootstrap& inner_;
};

}  // namespace

TEST_CASE("device-kind heap over socket: every byte through the copy hooks, a burst lapping a 64-deep FIFO") {
  int mode_index = 0;
  for (bool device_style : {false, true}) {
    for (const char* mode : {"serial", "fenced", "batched"}) {
      CAPTURE(device_style);
      CAPTURE(mode);
      ++mode_index;
      auto st = testing::run_threads(
          2, 1, [&](bootstrap::Bootstrap& b) { return staged_body(b, mode, mode_index, device_style); }, 60);
      for (int r = 0; r < 2; ++r) {
        CAPTURE(r);
        CHECK(st[r] == Status::kOk);
      }
    }
  }
}

TEST_CASE("a copy that stalls stops the ring's tail at one drain round; the flush says so, and it recovers") {
  auto st = testing::run_threads(2, 1, stalled_copy_body, 60);
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(st[r] == Status::kOk);
  }
}

TEST_CASE("a device-kind heap without copy hooks, or a bootstrap short of endpoint blobs, is refused") {
  auto st = testing::run_threads(2, 1, [](bootstrap::Bootstrap& boot) -> Status {
    std::unique_ptr<HostHeap> heap;
    WEFT_CHECK(HostHeap::create(4096, &heap));
    Region region = heap->region();
    region.kind = MemKind::kDevice;
    TransportOptions opt;
    opt.backend = "socket";
    std::unique_ptr<Transport> t;
    return Transport::create(boot, region, opt, &t);
  });
  for (auto s : st) CHECK(s == Status::kUnsupported);

  auto short_st = testing::run_threads(2, 1, [](bootstrap::Bootstrap& boot) -> Status {
    auto shorted = std::make_unique<ShortEndpointBootstrap>(boot);
    std::unique_ptr<HostHeap> heap;
    WEFT_CHECK(HostHeap::create(4096, &heap));
    TransportOptions opt;
    opt.backend = "socket";
    std::unique_ptr<Transport> t;
    return Transport::create(*shorted, heap->region(), opt, &t);
  });
  for (auto s : short_st) CHECK(s == Status::kProtocolError);
}
