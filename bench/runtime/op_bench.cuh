// What the runtime-op benchmarks (bench_ag_gemm_op, bench_gemm_reduce_op) share: a CUDA call that
// ends the program with the call named, joining the job on this rank's GPU, a cheap deterministic
// fill, and the stream barrier that lines the ranks up before a call.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "bootstrap/pmix_bootstrap.h"
#include "runtime/exec/context.h"
#include "runtime/exec/stream_ops.h"

#define BENCH_CUDA(x)                                                                     \
  do {                                                                                    \
    cudaError_t e_ = (x);                                                                 \
    if (e_ != cudaSuccess) {                                                              \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

namespace weft::bench {

// Uniform in [-0.5, 0.5) from a hash of the index and the seed.
__global__ inline void fill_hash(__nv_bfloat16* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    p[i] = __float2bfloat16(float(h & 0xFFFF) / 65536.f - 0.5f);
  }
}

// One warp that sleeps on the stream for `us` microseconds (the GPU's timer), so lined-up calls can
// be spaced by idle time: with the clocks under the power cap, a process that runs only the op and
// one that interleaves it with lighter rows (as `weftrun bench`'s rounds do) do not run at the same
// clock; `--idle-us` lets the two be compared at the same duty.
__global__ inline void idle_for(uint64_t us) {
  uint64_t t0 = 0, t = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < us * 1000);
}

// A flag's value: the whole text a base-10 integer in [lo, hi] (a non-number or one out of range is
// refused, not read as 0 or clamped); false leaves *out as it was.
inline bool flag_int(const char* text, int lo, int hi, int* out) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi) return false;
  *out = static_cast<int>(v);
  return true;
}

inline void idle_on(cudaStream_t s, int us) {
  if (us > 0) idle_for<<<1, 32, 0, s>>>(uint64_t(us));
}

// Joins the job (PMIx) and selects the GPU of this rank's local index; null if the job cannot be joined.
inline std::unique_ptr<bootstrap::PmixBootstrap> join_job() {
  std::unique_ptr<bootstrap::PmixBootstrap> boot;
  if (bootstrap::PmixBootstrap::connect(&boot) != Status::kOk) return nullptr;
  int gpus = 0;
  BENCH_CUDA(cudaGetDeviceCount(&gpus));
  BENCH_CUDA(cudaSetDevice(boot->info().local_rank % gpus));
  return boot;
}

// A barrier of the ranks on a stream, with no SM and no host wait: every rank writes the barrier's
// number into a word of every rank's (its own index), then waits until all of its own words have it.
// The host enqueues it ahead like any stream work, so the calls it lines up are timed without the
// host's enqueue (how `weftrun bench` lines its rows up with a one-word NCCL all-reduce).
class StreamLineUp {
 public:
  // Collective: W words from the context's heap, zeroed on every rank before anyone writes. Only
  // where every rank's heap is mapped here (one node): available() says so.
  bool create(runtime::Context& ctx, bootstrap::Bootstrap& boot) {
    ctx_ = &ctx;
    rank_ = boot.info().rank;
    world_ = boot.info().size;
    if (ctx.reserve(uint64_t(world_) * 8, "bench.line_up", &at_) != Status::kOk) return false;
    available_ = true;
    for (int q = 0; q < world_; ++q) available_ = available_ && (q == rank_ || ctx.peer(q, at_) != nullptr);
    if (cudaMemset(ctx.local(at_), 0, size_t(world_) * 8) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess)
      return false;
    return boot.barrier("bench.line_up") == Status::kOk;
  }
  bool available() const { return available_; }
  Status enqueue(cudaStream_t s) {
    if (!available_) return Status::kUnsupported;
    ++n_;
    std::vector<runtime::StreamMemOp> ops;
    for (int q = 0; q < world_; ++q)
      ops.push_back({runtime::StreamMemOp::kWrite,
                     static_cast<uint64_t*>(q == rank_ ? ctx_->local(at_) : ctx_->peer(q, at_)) + rank_, n_});
    for (int q = 0; q < world_; ++q)
      ops.push_back({runtime::StreamMemOp::kWaitGeq, static_cast<uint64_t*>(ctx_->local(at_)) + q, n_});
    return runtime::stream_mem_ops(s, ops);
  }

 private:
  runtime::Context* ctx_ = nullptr;
  int rank_ = 0, world_ = 1;
  uint64_t at_ = 0, n_ = 0;
  bool available_ = false;
};

}  // namespace weft::bench
