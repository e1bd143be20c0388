// Stream memory operations: a stream waits for or writes a 64-bit word (peer-mapped too) without an SM.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "base/status.h"

namespace weft::runtime {

// Writes a 64-bit value to device memory from the stream, without an SM (driver stream memory op,
// preceded by a memory fence, so everything earlier in the stream is visible first).
Status stream_write_u64(cudaStream_t s, uint64_t* addr, uint64_t value);

// Makes the stream wait, without an SM, until *addr >= value (driver stream memory op). Unbounded
// on the device: every stream that waits must be synchronized with sync_bounded(), whose `unstick`
// releases such waits when the producer failed.
Status stream_wait_u64_geq(cudaStream_t s, const uint64_t* addr, uint64_t value);

// One step of a stream batch: wait until *addr >= value, or write value to *addr (with the same
// fence as stream_write_u64). Addresses may be peers' memory mapped through CUDA IPC.
struct StreamMemOp {
  enum Kind { kWaitGeq, kWrite } kind = kWaitGeq;
  uint64_t* addr = nullptr;
  uint64_t value = 0;
};

// Enqueues the steps in order as one driver call (cuStreamBatchMemOp, at most 255 steps): the same
// as one stream_wait_u64_geq / stream_write_u64 each, with fewer host calls. Waits are unbounded on
// the device like stream_wait_u64_geq's.
Status stream_mem_ops(cudaStream_t s, const std::vector<StreamMemOp>& ops);

// Waits for the stream at most `timeout_s`; past that calls `unstick` (if any: e.g. raise the flags
// the stream waits on so it drains; again every 100 ms, so it must be idempotent), waits a moment
// more, and fails naming `what`.
Status sync_bounded(cudaStream_t s, double timeout_s, const char* what, const std::function<void()>& unstick);
// The same for the work before an event.
Status event_wait_bounded(cudaEvent_t e, double timeout_s, const char* what, const std::function<void()>& unstick);

// An op's clock stream (the stream that writes its calls' start marks into a host-mapped word) at the
// op's destruction: synchronised, at most 10 s, and destroyed. It waits only for a call's start on
// the caller's stream, which the op's own bounded wait for its last call covers; should that stream
// still be stuck, false: the stream is left, and the caller keeps the word (a few bytes) rather than
// free it under a pending write. True for a null stream.
bool retire_clock_stream(cudaStream_t s, const char* what);

// Records an op's completion event at the end of its work on `s`. Under stream capture it becomes an
// external record node, so each replay of the graph records the event and event_wait_bounded waits
// for the replay, as it waits for a direct call.
Status record_done(cudaEvent_t e, cudaStream_t s);

}  // namespace weft::runtime
