// Device side of the transport: FIFO push from kernel threads, NVLink peer signals, bounded flag waits.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cuda/atomic>

#include "transport/device_fifo.h"

namespace weft::transport::device {

// Return codes are weft::Status values (0 ok, kTimeout 4, or the proxy's error).
constexpr int kOk = 0;
constexpr int kTimeout = 4;

__device__ inline uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// Any number of threads may push concurrently: the ticket comes from an atomic add in device
// memory. The slot's first 56 bytes are plain stores; the command word is a system-scope release
// store, so the proxy (acquire load on the host) sees a complete command or none.
// kReport = false leaves out the timeout's printf: a kernel that also runs wgmma (a fused GEMM) must
// contain no call, or ptxas serializes every wgmma; such a kernel reports the returned status itself.
template <bool kReport = true>
__device__ inline int fifo_push(const DeviceFifo& f, const FifoCommand& cmd) {
  const uint64_t depth = uint64_t{f.mask} + 1;
  const uint64_t t = atomicAdd(reinterpret_cast<unsigned long long*>(&f.state->next_ticket), 1ull);
  cuda::atomic_ref<uint64_t, cuda::thread_scope_device> cache(f.state->tail_cache);
  if (t >= cache.load(cuda::memory_order_relaxed) + depth) {
    atomicAdd(reinterpret_cast<unsigned long long*>(&f.state->stalls), 1ull);
    cuda::atomic_ref<uint64_t, cuda::thread_scope_system> tail(f.ring->tail);
    cuda::atomic_ref<int32_t, cuda::thread_scope_system> err(f.ring->error);
    const uint64_t start = globaltimer_ns();
    for (;;) {
      const uint64_t seen = tail.load(cuda::memory_order_acquire);
      if (t < seen + depth) {
        cache.fetch_max(seen, cuda::memory_order_relaxed);
        break;
      }
      const int e = err.load(cuda::memory_order_relaxed);
      if (e) return e;
      if (globaltimer_ns() - start > f.timeout_ns) {
        if constexpr (kReport)
          printf(
              "weft: rank %d channel %d: device FIFO push timed out after %.1fs (ticket %llu, tail %llu, depth %llu): "
              "the proxy is not draining (WEFT_PROXY_TIMEOUT; tail stuck at one drain round: a kernel launched "
              "meanwhile without preload_kernels?)\n",
              f.rank, f.channel, f.timeout_ns * 1e-9, (unsigned long long)t, (unsigned long long)seen,
              (unsigned long long)depth);
        return kTimeout;
      }
      __nanosleep(256);
    }
  }
  FifoCommand* slot = f.slots + (t & f.mask);
  const uint64_t* src = reinterpret_cast<const uint64_t*>(&cmd);
  uint64_t* dst = reinterpret_cast<uint64_t*>(slot);
#pragma unroll
  for (int i = 0; i < 7; ++i) dst[i] = src[i];
  cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(slot->word)
      .store(make_command_word(command_op(cmd.word), t), cuda::memory_order_release);
  return kOk;
}

template <bool kReport = true>
__device__ inline int push_put(const DeviceFifo& f, int peer, uint64_t src_offset, uint64_t dst_offset,
                               uint64_t bytes) {
  return fifo_push<kReport>(f, make_fifo_command(FifoOp::kPut, peer, src_offset, dst_offset, bytes, 0, 0));
}

template <bool kReport = true>
__device__ inline int push_signal(const DeviceFifo& f, int peer, uint64_t flag_offset, uint64_t value) {
  return fifo_push<kReport>(f, make_fifo_command(FifoOp::kSignal, peer, 0, 0, 0, flag_offset, value));
}

template <bool kReport = true>
__device__ inline int push_put_signal(const DeviceFifo& f, int peer, uint64_t src_offset, uint64_t dst_offset,
                                      uint64_t bytes, uint64_t flag_offset, uint64_t value) {
  return fifo_push<kReport>(
      f, make_fifo_command(FifoOp::kPutSignal, peer, src_offset, dst_offset, bytes, flag_offset, value));
}

// NVLink path: after this thread's (and, with a preceding __syncthreads, its block's) stores to a
// peer's heap, publish a flag there. Release at system scope orders the data before the flag.
__device__ inline void signal_peer(uint64_t* peer_flag, uint64_t value) {
  cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*peer_flag).store(value, cuda::memory_order_release);
}

// Waits until *flag >= at_least (acquire, system scope: writers are peers over NVLink or the
// proxy's copies). Returns kTimeout after timeout_ns, printing what it waited for.
__device__ inline int wait_flag(uint64_t* flag, uint64_t at_least, uint64_t timeout_ns, int rank, const char* what) {
  cuda::atomic_ref<uint64_t, cuda::thread_scope_system> f(*flag);
  const uint64_t start = globaltimer_ns();
  while (f.load(cuda::memory_order_acquire) < at_least) {
    if (globaltimer_ns() - start > timeout_ns) {
      printf("weft: rank %d block %d: timed out after %.1fs waiting for %s (flag %llu < %llu)\n", rank, blockIdx.x,
             timeout_ns * 1e-9, what, (unsigned long long)f.load(cuda::memory_order_relaxed),
             (unsigned long long)at_least);
      return kTimeout;
    }
    __nanosleep(128);
  }
  return kOk;
}

}  // namespace weft::transport::device
