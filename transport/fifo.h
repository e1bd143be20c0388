// GPU->proxy FIFO on the host: ring ownership, the host producer (CPU tests, host callers) and the consumer.
#pragma once

#include <cstdint>
#include <memory>

#include "base/status.h"
#include "transport/fifo_command.h"

namespace weft::transport {

// Where ring memory comes from: plain host memory by default; weft_transport_cuda supplies
// host-pinned, device-mapped memory (cuda_fifo_memory()) so device threads can push.
struct FifoMemory {
  void* (*alloc)(uint64_t bytes) = nullptr;  // nullptr: aligned host allocation
  void (*release)(void* p) = nullptr;
};

class Fifo {
 public:
  // depth must be a power of two; rank/channel only name the ring in messages.
  static Status create(uint32_t depth, int rank, int channel, const FifoMemory& mem, std::unique_ptr<Fifo>* out);
  ~Fifo();
  Fifo(const Fifo&) = delete;
  Fifo& operator=(const Fifo&) = delete;

  FifoRingHeader* ring() const { return ring_; }
  FifoCommand* slots() const { return fifo_slots(ring_); }
  uint32_t depth() const { return ring_->depth; }
  FifoProducerState* host_producer_state() { return &host_state_; }

 private:
  Fifo() = default;
  FifoRingHeader* ring_ = nullptr;
  FifoMemory mem_;
  FifoProducerState host_state_{};
};

// Host producer: takes a ticket (atomic add, so threads may push concurrently), waits for space
// at most timeout_s (kTimeout naming rank/channel), fills the slot, then release-stores the word.
// Returns the proxy's error instead of waiting when the proxy has failed.
Status fifo_push(FifoRingHeader* ring, FifoProducerState* state, const FifoCommand& cmd, double timeout_s,
                 uint64_t* ticket_out = nullptr);
// Waits until the proxy has completed the flush command with this ticket.
Status fifo_wait_flushed(const FifoRingHeader* ring, uint64_t ticket, double timeout_s);

// Single consumer (the proxy thread).
class FifoConsumer {
 public:
  explicit FifoConsumer(FifoRingHeader* ring) : ring_(ring), slots_(fifo_slots(ring)), mask_(ring->depth - 1) {}
  // Copies the next committed command, if any, without releasing its slot.
  bool peek(FifoCommand* out);
  // Releases every slot peeked so far to the producers (one release store of tail).
  void release();
  uint64_t consumed() const { return next_; }
  void publish_flushed(uint64_t ticket);
  void publish_error(int32_t status);

 private:
  FifoRingHeader* ring_;
  FifoCommand* slots_;
  uint64_t mask_;
  uint64_t next_ = 0;
};

}  // namespace weft::transport
