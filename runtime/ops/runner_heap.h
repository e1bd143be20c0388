// The benchmark runners' symmetric memory: each runner carves the buffers its peers read or write
// from one symmetric heap (transport::CudaHeap) of its own, declared first and bound at creation.
//
//   RunnerHeap heap;
//   heap.take(bytes_a, &a);  heap.take(bytes_b, &b);   host only, the same order on every rank
//   heap.create(boot);                                 collective: one CudaHeap, a and b bound, zeroed
//   a.local<T>(), a.peer<T>(q)                         q's copy through CUDA IPC (same node)
//   heap.close(boot);                                  collective (or the destructor, no barrier)
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/status.h"
#include "bootstrap/bootstrap.h"

namespace weft::transport {
class CudaHeap;
}

namespace weft::runtime::ops {

// A buffer of a RunnerHeap: the same offset on every rank; this rank's pointer and the same-node
// peers' (nullptr for ranks on other nodes). A view: the heap owns the memory.
class HeapBuffer {
 public:
  template <typename T>
  T* local() const {
    return reinterpret_cast<T*>(local_);
  }
  template <typename T>
  T* peer(int rank) const {
    return rank >= 0 && size_t(rank) < peers_.size() ? reinterpret_cast<T*>(peers_[size_t(rank)]) : nullptr;
  }
  size_t bytes() const { return bytes_; }

 private:
  friend class RunnerHeap;
  char* local_ = nullptr;
  std::vector<char*> peers_;
  size_t bytes_ = 0;
};

class RunnerHeap {
 public:
  RunnerHeap();
  RunnerHeap(const RunnerHeap&) = delete;
  RunnerHeap& operator=(const RunnerHeap&) = delete;
  ~RunnerHeap();

  // Host only: reserves `bytes` for *out, bound by create(); *out must stay where it is until then.
  // Buffers of 64 KiB or more start on a 2 MiB page, smaller ones on 256 bytes.
  void take(size_t bytes, HeapBuffer* out);
  // Collective: one heap of the declared bytes (the same on every rank, checked), every declared
  // buffer bound to it, all zero. Once per heap; `what` names the runner in errors.
  Status create(bootstrap::Bootstrap& boot, const char* what);
  // Collective: unmaps the peers' heaps, waits for every rank to have done so, then frees.
  Status close(bootstrap::Bootstrap& boot);
  uint64_t bytes() const { return bytes_; }

 private:
  std::vector<std::pair<uint64_t, HeapBuffer*>> taken_;  // offset, buffer
  uint64_t bytes_ = 0;
  std::unique_ptr<transport::CudaHeap> heap_;
};

}  // namespace weft::runtime::ops
