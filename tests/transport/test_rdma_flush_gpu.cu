// GPU: the flush ibverbs' receiving proxy calls before it sets a flag (CudaHeap::flush_rdma_writes,
// cudaDeviceFlushGPUDirectRDMAWrites) where the GPU's RDMA write ordering is below "owner" must
// return while a persistent kernel holds the GPU: that kernel is the one waiting for the flag, so a
// flush that waited for it would deadlock the op. One GPU: a kernel spins on a host-mapped word, the
// flush runs on another thread, bounded; the kernel is released either way.
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fork_gpu.h"
#include "local_bootstrap.h"
#include "transport/cuda_transport.h"

using weft::Status;
namespace testing = weft::testing;

namespace {

// Spins until *release is set or about `limit_ns` passed (so a broken test never holds the GPU).
__global__ void spin(const volatile int* release, unsigned long long limit_ns, int* timed_out) {
  unsigned long long t0 = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  for (;;) {
    if (*release) return;
    unsigned long long t = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (t - t0 > limit_ns) {
      *timed_out = 1;
      return;
    }
  }
}

// What the rank thread saw (asserted on the test's own thread).
struct Seen {
  std::string failed;  // a setup call that failed
  bool busy = false, returned = false, running = false, timed_out = false;
  double ms = 0;
  int ordering = -1;
  Status flush = Status::kInternal;
};

#define SEEN_CUDA(call)                                                     \
  do {                                                                      \
    const cudaError_t e_ = (call);                                          \
    if (e_ != cudaSuccess) return seen->failed = #call, Status::kCudaError; \
  } while (0)

Status flush_beside_kernel(weft::bootstrap::Bootstrap& boot, Seen* seen) {
  std::unique_ptr<weft::transport::CudaHeap> heap;
  Status made = weft::transport::CudaHeap::create(boot, 2 << 20, &heap);
  if (made != Status::kOk) return seen->failed = "CudaHeap::create", made;
  seen->ordering = heap->rdma_writes_ordering();
  int* host = nullptr;
  SEEN_CUDA(cudaHostAlloc(&host, 2 * sizeof(int), cudaHostAllocMapped));
  host[0] = host[1] = 0;
  int* dev = nullptr;
  SEEN_CUDA(cudaHostGetDevicePointer(&dev, host, 0));
  cudaStream_t s;
  SEEN_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // One block per SM, each with all the shared memory an SM has, as a persistent GEMM holds them:
  // nothing else fits beside it.
  int device = 0, sms = 0, smem = 0;
  SEEN_CUDA(cudaGetDevice(&device));
  SEEN_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  SEEN_CUDA(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  SEEN_CUDA(cudaFuncSetAttribute(spin, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  spin<<<sms, 32, size_t(smem), s>>>(dev, 30ull * 1000 * 1000 * 1000, dev + 1);  // at most 30 s
  SEEN_CUDA(cudaGetLastError());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  seen->busy = cudaStreamQuery(s) == cudaErrorNotReady;  // the kernel holds the GPU
  const auto t0 = std::chrono::steady_clock::now();
  auto flushed = std::async(std::launch::async, [&] { return heap->flush_rdma_writes(); });
  seen->returned = flushed.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  seen->ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  seen->running = cudaStreamQuery(s) == cudaErrorNotReady;
  reinterpret_cast<volatile int*>(host)[0] = 1;  // release the kernel, then join the flush either way
  seen->flush = flushed.get();
  SEEN_CUDA(cudaStreamSynchronize(s));
  seen->timed_out = host[1] != 0;
  cudaStreamDestroy(s);
  cudaFreeHost(host);
  return Status::kOk;
}

}  // namespace

TEST_CASE("the RDMA-write flush returns while a persistent kernel spins on the GPU") {
  testing::fork_gpus_or_skip(1, false);
  Seen seen;
  const std::vector<Status> st =
      testing::run_threads(1, 1, [&](weft::bootstrap::Bootstrap& boot) { return flush_beside_kernel(boot, &seen); });
  REQUIRE(st.size() == 1);
  REQUIRE_MESSAGE(st[0] == Status::kOk, seen.failed);
  MESSAGE("GPU RDMA write ordering " << seen.ordering << "; the flush "
                                     << std::string(seen.returned ? "returned after " : "had not returned after ")
                                     << seen.ms << " ms, with the kernel "
                                     << std::string(seen.running ? "still" : "no longer") << " running");
  CHECK(seen.busy);
  CHECK(seen.flush == Status::kOk);
  CHECK_MESSAGE(seen.returned,
                "cudaDeviceFlushGPUDirectRDMAWrites waited for the running kernel: the SEND-signal "
                "path would deadlock on this GPU");
  CHECK(seen.running);
  CHECK_FALSE(seen.timed_out);  // released by the test, not by its own time limit
}
