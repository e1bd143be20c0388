// GPU->proxy FIFO: the fixed-size command POD and ring header, one layout for host and device code.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define WEFT_FIFO_HD __host__ __device__
#else
#define WEFT_FIFO_HD
#endif

namespace weft::transport {

enum class FifoOp : uint8_t {
  kNone = 0,
  kPut = 1,        // copy [src_offset, +bytes) of my heap to [dst_offset, +bytes) of peer's heap
  kSignal = 2,     // store signal_value at flag_offset of peer's heap, after my earlier puts to peer
  kPutSignal = 3,  // kPut then kSignal to the same peer
  kFlush = 4,      // proxy completes everything before it, then publishes FifoRingHeader::flushed
};

// One command, 64 bytes (one cache line, one PCIe write burst from the GPU), little endian:
//
//   byte  0  u64 src_offset    put: offset of the data in the local symmetric heap
//   byte  8  u64 dst_offset    put: offset in the peer's heap
//   byte 16  u64 bytes         put: length; 0 for signal and flush
//   byte 24  u64 flag_offset   signal: offset of the peer's 8-byte flag (8-byte aligned)
//   byte 32  u64 signal_value  signal: value stored in the flag (epochs increase, never reset)
//   byte 40  u32 peer          destination rank (ignored by flush)
//   byte 44  u32 reserved0     zero
//   byte 48  u64 reserved1     zero
//   byte 56  u64 word          bits 0..7: FifoOp; bits 8..63: low 56 bits of the producer's ticket
//
// The producer writes bytes 0..55 with plain stores, then `word` with a release store (system
// scope on the GPU). The consumer owns slot `ticket & mask` once its acquire load of `word` shows
// that ticket: a stale command from the previous lap carries a different ticket, so slots are never
// cleared and no flag word is shared between producer and consumer.
struct alignas(64) FifoCommand {
  uint64_t src_offset;
  uint64_t dst_offset;
  uint64_t bytes;
  uint64_t flag_offset;
  uint64_t signal_value;
  uint32_t peer;
  uint32_t reserved0;
  uint64_t reserved1;
  uint64_t word;
};
static_assert(sizeof(FifoCommand) == 64, "FifoCommand is one 64-byte line; the device push relies on it");
static_assert(alignof(FifoCommand) == 64, "FifoCommand slots are line aligned");

constexpr int kTicketShift = 8;
constexpr uint64_t kTicketMask = (uint64_t{1} << 56) - 1;

WEFT_FIFO_HD constexpr uint64_t make_command_word(FifoOp op, uint64_t ticket) {
  return ((ticket & kTicketMask) << kTicketShift) | static_cast<uint64_t>(op);
}
WEFT_FIFO_HD constexpr FifoOp command_op(uint64_t word) { return static_cast<FifoOp>(word & 0xffu); }
WEFT_FIFO_HD constexpr uint64_t command_ticket(uint64_t word) { return word >> kTicketShift; }

// The one place a put / signal / put+signal command is built, for host and device producers alike.
// The ticket is left 0: the push assigns it when it commits the command word.
WEFT_FIFO_HD inline FifoCommand make_fifo_command(FifoOp op, int peer, uint64_t src_offset, uint64_t dst_offset,
                                                  uint64_t bytes, uint64_t flag_offset, uint64_t value) {
  FifoCommand c{};
  c.src_offset = src_offset;
  c.dst_offset = dst_offset;
  c.bytes = bytes;
  c.flag_offset = flag_offset;
  c.signal_value = value;
  c.peer = static_cast<uint32_t>(peer);
  c.word = make_command_word(op, 0);
  return c;
}

// Ring header, followed in the same allocation (host-pinned for GPU producers) by `depth` slots.
// A ring is fed either by host producers or by device producers, never both (one ticket counter).
// `tail` and `flushed` are written only by the proxy; producers only read them. The ticket counter
// lives with the producers (device memory for GPU producers, FifoProducerState), because atomics
// from the GPU to host memory are not available on every PCIe platform.
struct alignas(64) FifoRingHeader {
  uint64_t tail;  // commands consumed; a producer may fill ticket t once t < tail + depth
  uint64_t pad0[7];
  uint64_t flushed;  // 1 + ticket of the newest completed flush command
  uint64_t pad1[7];
  int32_t error;   // non-zero: weft::Status of the proxy's first error; producers stop waiting
  uint32_t depth;  // power of two
  int32_t rank;    // for messages
  int32_t channel;
  // 1 once a DeviceFifoHandle feeds this ring: its tickets come from device memory, so host pushes
  // (with their own counter) would collide and are refused.
  uint32_t device_producers;
  uint32_t reserved;
  uint64_t pad2[5];
};
static_assert(sizeof(FifoRingHeader) == 192, "FifoRingHeader layout is shared with device code");

// Producer-side counters: in device memory for GPU producers, host memory for host producers.
struct alignas(64) FifoProducerState {
  uint64_t next_ticket;  // atomic add hands out tickets: many producers may push concurrently
  uint64_t tail_cache;   // newest tail seen by any producer, so most pushes skip reading the ring
  uint64_t stalls;       // pushes that found the ring full and had to wait
  uint64_t pad[5];
};
static_assert(sizeof(FifoProducerState) == 64, "FifoProducerState is one line");

WEFT_FIFO_HD inline FifoCommand* fifo_slots(FifoRingHeader* ring) {
  return reinterpret_cast<FifoCommand*>(reinterpret_cast<char*>(ring) + sizeof(FifoRingHeader));
}
WEFT_FIFO_HD constexpr uint64_t fifo_ring_bytes(uint32_t depth) {
  return sizeof(FifoRingHeader) + uint64_t{depth} * sizeof(FifoCommand);
}
WEFT_FIFO_HD constexpr bool is_power_of_two(uint64_t v) { return v && !(v & (v - 1)); }

}  // namespace weft::transport
