// FIFO: command layout, ticket protocol, concurrent host producers, back-pressure with a deadline.
#include <doctest/doctest.h>

#include <atomic>
#include <cstddef>
#include <thread>
#include <vector>

#include "base/backoff.h"
#include "transport/fifo.h"

using namespace weft;
using namespace weft::transport;

TEST_CASE("fifo command layout is the documented one") {
  CHECK(offsetof(FifoCommand, src_offset) == 0);
  CHECK(offsetof(FifoCommand, dst_offset) == 8);
  CHECK(offsetof(FifoCommand, bytes) == 16);
  CHECK(offsetof(FifoCommand, flag_offset) == 24);
  CHECK(offsetof(FifoCommand, signal_value) == 32);
  CHECK(offsetof(FifoCommand, peer) == 40);
  CHECK(offsetof(FifoCommand, word) == 56);
  const uint64_t w = make_command_word(FifoOp::kPutSignal, 0x00abcdef12345678ull);
  CHECK(command_op(w) == FifoOp::kPutSignal);
  CHECK(command_ticket(w) == 0x00abcdef12345678ull);
  CHECK(command_ticket(make_command_word(FifoOp::kPut, ~0ull)) == kTicketMask);  // high bits dropped
}

TEST_CASE("fifo rejects a depth that is not a power of two") {
  std::unique_ptr<Fifo> f;
  CHECK(Fifo::create(1000, 0, 0, {}, &f) == Status::kInvalidArgument);
  CHECK(Fifo::create(1024, 0, 0, {}, &f) == Status::kOk);
}

TEST_CASE("a fresh ring shows nothing to the consumer; pushed commands come out in ticket order") {
  std::unique_ptr<Fifo> f;
  REQUIRE(Fifo::create(8, 0, 0, {}, &f) == Status::kOk);
  FifoConsumer c(f->ring());
  FifoCommand out{};
  CHECK_FALSE(c.peek(&out));
  for (int lap = 0; lap < 5; ++lap) {  // several laps: stale words never read as new
    for (uint64_t i = 0; i < 8; ++i) {
      FifoCommand cmd{};
      cmd.src_offset = lap * 100 + i;
      cmd.peer = 1;
      cmd.word = make_command_word(FifoOp::kPut, 0);
      uint64_t ticket = 0;
      REQUIRE(fifo_push(f->ring(), f->host_producer_state(), cmd, 1.0, &ticket) == Status::kOk);
      CHECK(ticket == lap * 8 + i);
    }
    for (uint64_t i = 0; i < 8; ++i) {
      REQUIRE(c.peek(&out));
      CHECK(out.src_offset == lap * 100 + i);
      CHECK(command_op(out.word) == FifoOp::kPut);
    }
    CHECK_FALSE(c.peek(&out));
    c.release();
  }
}

TEST_CASE("a full ring makes the producer wait, then time out naming rank and channel") {
  std::unique_ptr<Fifo> f;
  REQUIRE(Fifo::create(4, 3, 2, {}, &f) == Status::kOk);
  FifoCommand cmd{};
  cmd.word = make_command_word(FifoOp::kSignal, 0);
  for (int i = 0; i < 4; ++i) REQUIRE(fifo_push(f->ring(), f->host_producer_state(), cmd, 1.0) == Status::kOk);
  auto t0 = std::chrono::steady_clock::now();
  CHECK(fifo_push(f->ring(), f->host_producer_state(), cmd, 0.2) == Status::kTimeout);
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(waited >= 0.19);
  CHECK(waited < 5.0);
  CHECK(f->host_producer_state()->stalls == 1);
}

TEST_CASE("a producer waiting for space returns the proxy's error at once") {
  std::unique_ptr<Fifo> f;
  REQUIRE(Fifo::create(2, 0, 0, {}, &f) == Status::kOk);
  FifoCommand cmd{};
  cmd.word = make_command_word(FifoOp::kSignal, 0);
  REQUIRE(fifo_push(f->ring(), f->host_producer_state(), cmd, 1.0) == Status::kOk);
  REQUIRE(fifo_push(f->ring(), f->host_producer_state(), cmd, 1.0) == Status::kOk);
  FifoConsumer c(f->ring());
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    c.publish_error(static_cast<int32_t>(Status::kPeerFailed));
  });
  CHECK(fifo_push(f->ring(), f->host_producer_state(), cmd, 20.0) == Status::kPeerFailed);
  t.join();
}

TEST_CASE("concurrent producers: every command arrives exactly once, back-pressure included") {
  std::unique_ptr<Fifo> f;
  REQUIRE(Fifo::create(16, 0, 0, {}, &f) == Status::kOk);
  constexpr int kProducers = 4, kEach = 20000;
  std::atomic<int> failures{0};
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p)
    producers.emplace_back([&, p] {
      for (int i = 0; i < kEach; ++i) {
        FifoCommand cmd{};
        cmd.peer = p;
        cmd.src_offset = i;
        cmd.word = make_command_word(FifoOp::kPut, 0);
        if (fifo_push(f->ring(), f->host_producer_state(), cmd, 30.0) != Status::kOk) ++failures;
      }
    });
  FifoConsumer c(f->ring());
  std::vector<int> next(kProducers, 0);
  int got = 0, disorder = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(50);
  weft::Backoff backoff;
  while (got < kProducers * kEach && std::chrono::steady_clock::now() < deadline) {
    FifoCommand out{};
    int n = 0;
    while (n < 8 && c.peek(&out)) {
      ++n, ++got;
      // Each producer's own commands stay in its order.
      if (out.src_offset != static_cast<uint64_t>(next[out.peer])) ++disorder;
      next[out.peer] = static_cast<int>(out.src_offset) + 1;
    }
    if (n) {
      c.release();
      backoff.reset();
    } else {
      backoff.pause();
    }
  }
  for (auto& t : producers) t.join();
  CHECK(failures == 0);
  CHECK(got == kProducers * kEach);
  CHECK(disorder == 0);
  CHECK(f->host_producer_state()->stalls > 0);  // 16 slots for 4 producers: they did wait
}

TEST_CASE("a ring fed by device producers refuses host pushes") {
  std::unique_ptr<Fifo> f;
  REQUIRE(Fifo::create(8, 0, 0, {}, &f) == Status::kOk);
  f->ring()->device_producers = 1;
  FifoCommand cmd{};
  cmd.word = make_command_word(FifoOp::kSignal, 0);
  CHECK(fifo_push(f->ring(), f->host_producer_state(), cmd, 1.0) == Status::kInvalidArgument);
}
