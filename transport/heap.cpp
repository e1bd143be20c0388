// Symmetric heap offset allocator and host heap.
#include "transport/heap.h"

#include <cstdlib>
#include <cstring>

#include "base/log.h"

namespace weft::transport {

Status HeapAllocator::allocate(uint64_t bytes, uint64_t align, const char* name, uint64_t* offset) {
  if (!align || (align & (align - 1))) {
    WEFT_WARN(kTransport, "heap: alignment %llu for '%s' is not a power of two", (unsigned long long)align, name);
    return Status::kInvalidArgument;
  }
  uint64_t start = (used_ + align - 1) & ~(align - 1);
  if (start < used_ || start > capacity_ || bytes > capacity_ - start) {
    WEFT_WARN(kTransport,
              "heap: '%s' needs %llu bytes at alignment %llu, but only %llu of %llu are free "
              "(raise WEFT_HEAP_BYTES)",
              name, (unsigned long long)bytes, (unsigned long long)align, (unsigned long long)(capacity_ - used_),
              (unsigned long long)capacity_);
    return Status::kInvalidArgument;
  }
  used_ = start + bytes;
  *offset = start;
  return Status::kOk;
}

Status HostHeap::create(uint64_t bytes, std::unique_ptr<HostHeap>* out) {
  std::unique_ptr<HostHeap> h(new HostHeap());
  uint64_t rounded = (bytes + 4095) & ~uint64_t{4095};
  h->base_ = aligned_alloc(4096, rounded ? rounded : 4096);
  if (!h->base_) {
    WEFT_WARN(kTransport, "heap: cannot allocate %llu bytes of host memory", (unsigned long long)bytes);
    return Status::kSystemError;
  }
  memset(h->base_, 0, rounded);
  h->bytes_ = bytes;
  *out = std::move(h);
  return Status::kOk;
}

HostHeap::~HostHeap() { free(base_); }

}  // namespace weft::transport
