// GPU->proxy FIFO host side: ring allocation, host producer, single consumer.
#include "transport/fifo.h"

#include <chrono>
#include <cstdlib>
#include <cstring>

#include "base/backoff.h"
#include "base/log.h"

namespace weft::transport {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

Status Fifo::create(uint32_t depth, int rank, int channel, const FifoMemory& mem, std::unique_ptr<Fifo>* out) {
  if (!is_power_of_two(depth) || depth < 2 || depth > (1u << 24)) {
    WEFT_WARN(kTransport, "rank %d channel %d: FIFO depth %u is not a power of two in [2, 2^24] (WEFT_FIFO_DEPTH)",
              rank, channel, depth);
    return Status::kInvalidArgument;
  }
  std::unique_ptr<Fifo> f(new Fifo());
  f->mem_ = mem;
  uint64_t bytes = fifo_ring_bytes(depth);
  void* p = mem.alloc ? mem.alloc(bytes) : aligned_alloc(64, bytes);
  if (!p) {
    WEFT_WARN(kTransport, "rank %d channel %d: cannot allocate a %llu-byte FIFO", rank, channel,
              (unsigned long long)bytes);
    return Status::kSystemError;
  }
  memset(p, 0, bytes);
  f->ring_ = static_cast<FifoRingHeader*>(p);
  f->ring_->depth = depth;
  f->ring_->rank = rank;
  f->ring_->channel = channel;
  // Each slot starts out holding "the previous lap", so ticket i never matches before it is pushed.
  FifoCommand* slots = fifo_slots(f->ring_);
  for (uint32_t i = 0; i < depth; ++i) slots[i].word = make_command_word(FifoOp::kNone, uint64_t{i} - depth);
  *out = std::move(f);
  return Status::kOk;
}

Fifo::~Fifo() {
  if (!ring_) return;
  if (mem_.release)
    mem_.release(ring_);
  else
    free(ring_);
}

Status fifo_push(FifoRingHeader* ring, FifoProducerState* state, const FifoCommand& cmd, double timeout_s,
                 uint64_t* ticket_out) {
  int32_t err = __atomic_load_n(&ring->error, __ATOMIC_ACQUIRE);
  if (err) return static_cast<Status>(err);
  if (ring->device_producers) {
    WEFT_WARN(kTransport, "rank %d channel %d: host push on a FIFO fed by device producers (tickets would collide)",
              ring->rank, ring->channel);
    return Status::kInvalidArgument;
  }
  const uint64_t depth = ring->depth;
  const uint64_t t = __atomic_fetch_add(&state->next_ticket, 1, __ATOMIC_RELAXED);
  if (t >= __atomic_load_n(&state->tail_cache, __ATOMIC_ACQUIRE) + depth) {
    __atomic_fetch_add(&state->stalls, 1, __ATOMIC_RELAXED);
    const double deadline = now_s() + timeout_s;
    // Sleeps once the proxy takes longer than a short yield (base/backoff.h), at most 100 us at a
    // time: the proxy drains a full ring in bursts, and a long nap would leave it idle.
    Backoff backoff(Backoff::kYieldS, 100e-6);
    for (;;) {
      uint64_t tail = __atomic_load_n(&ring->tail, __ATOMIC_ACQUIRE);
      if (t < tail + depth) {
        uint64_t seen = __atomic_load_n(&state->tail_cache, __ATOMIC_RELAXED);
        while (seen < tail && !__atomic_compare_exchange_n(&state->tail_cache, &seen, tail, true, __ATOMIC_RELEASE,
                                                           __ATOMIC_RELAXED)) {
        }
        break;
      }
      err = __atomic_load_n(&ring->error, __ATOMIC_ACQUIRE);
      if (err) return static_cast<Status>(err);
      if (now_s() > deadline) {
        WEFT_WARN(kProxy,
                  "rank %d channel %d: FIFO full for %.1fs (ticket %llu, tail %llu, depth %llu): the proxy is not "
                  "draining (WEFT_PROXY_TIMEOUT)",
                  ring->rank, ring->channel, timeout_s, (unsigned long long)t, (unsigned long long)tail,
                  (unsigned long long)depth);
        return Status::kTimeout;
      }
      backoff.pause();
    }
  }
  FifoCommand* slot = fifo_slots(ring) + (t & (depth - 1));
  memcpy(static_cast<void*>(slot), &cmd, offsetof(FifoCommand, word));
  __atomic_store_n(&slot->word, make_command_word(command_op(cmd.word), t), __ATOMIC_RELEASE);
  if (ticket_out) *ticket_out = t;
  return Status::kOk;
}

Status fifo_wait_flushed(const FifoRingHeader* ring, uint64_t ticket, double timeout_s) {
  const double deadline = now_s() + timeout_s;
  Backoff backoff;
  while (__atomic_load_n(&ring->flushed, __ATOMIC_ACQUIRE) <= ticket) {
    int32_t err = __atomic_load_n(&ring->error, __ATOMIC_ACQUIRE);
    if (err) return static_cast<Status>(err);
    if (now_s() > deadline) {
      WEFT_WARN(kProxy, "rank %d channel %d: flush (ticket %llu) not completed by the proxy within %.1fs", ring->rank,
                ring->channel, (unsigned long long)ticket, timeout_s);
      return Status::kTimeout;
    }
    backoff.pause();
  }
  return Status::kOk;
}

bool FifoConsumer::peek(FifoCommand* out) {
  FifoCommand* slot = slots_ + (next_ & mask_);
  uint64_t w = __atomic_load_n(&slot->word, __ATOMIC_ACQUIRE);
  if (command_ticket(w) != (next_ & kTicketMask)) return false;
  memcpy(static_cast<void*>(out), slot, sizeof(FifoCommand));
  out->word = w;
  ++next_;
  return true;
}

void FifoConsumer::release() { __atomic_store_n(&ring_->tail, next_, __ATOMIC_RELEASE); }

void FifoConsumer::publish_flushed(uint64_t ticket) {
  uint64_t v = ticket + 1;
  if (__atomic_load_n(&ring_->flushed, __ATOMIC_RELAXED) < v) __atomic_store_n(&ring_->flushed, v, __ATOMIC_RELEASE);
}

void FifoConsumer::publish_error(int32_t status) {
  int32_t zero = 0;
  __atomic_compare_exchange_n(&ring_->error, &zero, status, false, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
}

}  // namespace weft::transport
