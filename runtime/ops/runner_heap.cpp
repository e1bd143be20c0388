// RunnerHeap: the declared buffers laid out in one CudaHeap.
#include "runtime/ops/runner_heap.h"

#include "base/log.h"
#include "transport/cuda_transport.h"

namespace weft::runtime::ops {

RunnerHeap::RunnerHeap() = default;
RunnerHeap::~RunnerHeap() = default;

void RunnerHeap::take(size_t bytes, HeapBuffer* out) {
  const uint64_t align = bytes >= (uint64_t(64) << 10) ? uint64_t(2) << 20 : 256;
  const uint64_t offset = (bytes_ + align - 1) / align * align;
  bytes_ = offset + (bytes + 255) / 256 * 256;
  out->bytes_ = bytes;
  taken_.emplace_back(offset, out);
}

Status RunnerHeap::create(bootstrap::Bootstrap& boot, const char* what) {
  const int rank = boot.info().rank, world = boot.info().size;
  if (heap_) {
    WEFT_WARN(kTransport, "rank %d: %s: the runner's heap is already created", rank, what);
    return Status::kInvalidArgument;
  }
  const Status st = transport::CudaHeap::create(boot, bytes_ ? bytes_ : 256, &heap_);
  if (st != Status::kOk) {
    WEFT_WARN(kTransport, "rank %d: %s: cannot create the runner's symmetric heap of %llu bytes", rank, what,
              (unsigned long long)bytes_);
    return st;
  }
  for (const auto& [offset, buf] : taken_) {
    buf->local_ = static_cast<char*>(heap_->local()) + offset;
    buf->peers_.assign(size_t(world), nullptr);
    for (int q = 0; q < world; ++q)
      if (void* base = heap_->peer(q)) buf->peers_[size_t(q)] = static_cast<char*>(base) + offset;
  }
  taken_.clear();
  return Status::kOk;
}

Status RunnerHeap::close(bootstrap::Bootstrap& boot) {
  if (!heap_) return Status::kOk;
  const Status st = heap_->close(boot);
  heap_.reset();
  return st;
}

}  // namespace weft::runtime::ops
