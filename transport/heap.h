// Symmetric heap bookkeeping: an offset allocator that is identical on every rank, and a host-memory heap.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"
#include "transport/net_backend.h"

namespace weft::transport {

// Buffers in the symmetric heap are named by offset. Every rank makes the same allocate() calls in
// the same order, so every rank gets the same offsets and a remote buffer is (rank, offset).
class HeapAllocator {
 public:
  explicit HeapAllocator(uint64_t capacity) : capacity_(capacity) {}
  // align: a power of two (flags: 8; tiles: 128 or more for TMA). `name` is for the error message.
  Status allocate(uint64_t bytes, uint64_t align, const char* name, uint64_t* offset);
  uint64_t used() const { return used_; }
  uint64_t capacity() const { return capacity_; }
  void reset() { used_ = 0; }

 private:
  uint64_t capacity_;
  uint64_t used_ = 0;
};

// A heap in host memory (CPU tests, `weftrun check`, benchmarks without a GPU): zeroed, 4 KiB aligned.
class HostHeap {
 public:
  static Status create(uint64_t bytes, std::unique_ptr<HostHeap>* out);
  ~HostHeap();
  HostHeap(const HostHeap&) = delete;
  HostHeap& operator=(const HostHeap&) = delete;
  Region region() const { return Region{base_, bytes_, MemKind::kHost, -1}; }
  template <typename T = uint8_t>
  T* at(uint64_t offset) const {
    return reinterpret_cast<T*>(static_cast<char*>(base_) + offset);
  }

 private:
  HostHeap() = default;
  void* base_ = nullptr;
  uint64_t bytes_ = 0;
};

}  // namespace weft::transport
