// GPU: device threads push FIFO commands; data moves between 2 emulated nodes x 2 GPUs through proxy + socket
// (loopback TCP) and between same-node GPUs through CUDA IPC peer pointers, in every signal mode; then the
// same through the ofi backend where libfabric offers its provider here (WEFT_OFI_PROVIDER): the GPU
// heap registered with the provider where it takes device memory (FI_HMEM, e.g. shm on one host),
// else staged through host memory; each rank's line says which.
//
//   node 0: rank 0 (GPU 0), rank 1 (GPU 1)      node 1: rank 2 (GPU 2), rank 3 (GPU 3)
//   inter-node (FIFO -> proxy -> socket):  0 <-> 2, 1 <-> 3   (same local index on the other node)
//   intra-node (NVLink stores + flag):     0 -> 1 -> 0, 2 -> 3 -> 2
#include <cuda_runtime.h>
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "base/params.h"
#include "fork_gpu.h"
#include "local_bootstrap.h"
#include "transport/cuda_transport.h"
#include "transport/fifo_device.cuh"
#include "transport/net_backend.h"
#include "transport/transport.h"

using weft::Status;
namespace testing = weft::testing;  // not "using namespace weft": weft::log hides ::log in CUDA headers
using namespace weft::transport;

namespace {

constexpr int kRanks = 4, kPerNode = 2;
constexpr uint64_t kChunk = 4 << 20;
constexpr uint64_t kTimeoutNs = 20ull * 1000 * 1000 * 1000;

struct Layout {
  uint64_t send = 0, recv_inter = kChunk, recv_nvl = kChunk * (1 + kRanks);
  uint64_t flags_inter = kChunk * (1 + 2 * kRanks), flags_nvl = flags_inter + 8 * kRanks;
  uint64_t bytes = flags_nvl + 8 * kRanks;
};

__host__ __device__ inline uint32_t pattern(int src, int epoch, uint64_t word) {
  return static_cast<uint32_t>(word * 2654435761u) ^ (uint32_t(src) << 24) ^ (uint32_t(epoch) << 16);
}

__global__ void fill(char* heap, Layout L, int me, int epoch) {
  uint32_t* w = reinterpret_cast<uint32_t*>(heap + L.send);
  for (uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < kChunk / 4; i += gridDim.x * blockDim.x)
    w[i] = pattern(me, epoch, i);
}

// Every thread of the block pushes its slice as a put; then one signal covers all of them (their
// tickets precede it, and the proxy orders a signal after earlier puts to the same peer).
__global__ void push_inter(DeviceFifo f, Layout L, int me, int peer, int epoch, int* errors) {
  const uint64_t slice = kChunk / blockDim.x;
  int rc =
      device::push_put(f, peer, L.send + threadIdx.x * slice, L.recv_inter + me * kChunk + threadIdx.x * slice, slice);
  if (rc) atomicAdd(errors, 1);
  __syncthreads();
  if (threadIdx.x == 0 && device::push_signal(f, peer, L.flags_inter + 8 * me, epoch)) atomicAdd(errors, 1);
}

// Same-node path: store straight into the peer's heap, then release its flag.
__global__ void push_nvl(char* const* peers, Layout L, int me, int peer, int epoch) {
  uint32_t* dst = reinterpret_cast<uint32_t*>(peers[peer] + L.recv_nvl + me * kChunk);
  for (uint64_t i = threadIdx.x; i < kChunk / 4; i += blockDim.x) dst[i] = pattern(me, epoch, i);
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) device::signal_peer(reinterpret_cast<uint64_t*>(peers[peer] + L.flags_nvl + 8 * me), epoch);
}

__global__ void verify(char* heap, uint64_t region, uint64_t flag, int me, int src, int epoch, int* errors) {
  __shared__ int ok;
  if (threadIdx.x == 0)
    ok = device::wait_flag(reinterpret_cast<uint64_t*>(heap + flag), epoch, kTimeoutNs, me, "a chunk") == 0;
  __syncthreads();
  if (!ok) {
    if (threadIdx.x == 0) atomicAdd(errors, 1 << 20);
    return;
  }
  const uint32_t* w = reinterpret_cast<const uint32_t*>(heap + region + src * kChunk);
  int bad = 0;
  for (uint64_t i = threadIdx.x; i < kChunk / 4; i += blockDim.x) bad += w[i] != pattern(src, epoch, i);
  if (bad) atomicAdd(errors, bad);
}

int rank_body(testing::ForkBootstrap& boot, int ngpu) {
  const int me = boot.info().rank;
  const int node = boot.info().node, local = boot.info().local_rank;
  const int dev = me % ngpu;
  FORK_CUDA_TRY(cudaSetDevice(dev));
  // push_inter waits on the proxy (the ring is shallower than its pushes) and verify on peers'
  // proxies; a lazy load of a kernel launched behind them would stall the proxy's copies until they
  // finish. Load every kernel up front.
  if (preload_kernels({reinterpret_cast<const void*>(fill), reinterpret_cast<const void*>(push_inter),
                       reinterpret_cast<const void*>(push_nvl), reinterpret_cast<const void*>(verify)},
                      "test_transport_gpu") != Status::kOk)
    return boot.report("preload_kernels failed"), 21;
  Layout L;
  std::unique_ptr<CudaHeap> heap;
  if (CudaHeap::create(boot, L.bytes, &heap) != Status::kOk) return boot.report("heap create failed"), 2;
  char* base = static_cast<char*>(heap->local());
  int* errors = nullptr;
  FORK_CUDA_TRY(cudaMalloc(&errors, sizeof(int)));
  cudaStream_t stream;
  FORK_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int inter_peer = (me + kPerNode) % kRanks;
  const int nvl_to = node * kPerNode + (local + 1) % kPerNode;
  const int nvl_from = node * kPerNode + (local + kPerNode - 1) % kPerNode;
  std::string summary = "rank " + std::to_string(me) + " GPU " + std::to_string(dev);
  int epoch = 0;
  std::vector<std::string> backends = {"socket"};
  std::string provider, why;
  if (weft::get_param("WEFT_OFI_PROVIDER", &provider) != Status::kOk) return boot.report("WEFT_OFI_PROVIDER"), 22;
  if (weft::transport::ofi_provider_present(provider, &why))
    backends.push_back("ofi");
  else
    summary += "; ofi not run: " + why;
  for (size_t b = 0; b < backends.size() * 3; ++b) {
    const std::string& backend = backends[b / 3];
    const char* mode = b % 3 == 0 ? "serial" : b % 3 == 1 ? "fenced" : "batched";
    ++epoch;
    TransportOptions opt;
    opt.backend = backend;
    opt.signal_mode = mode;
    opt.fifo_depth = 64;  // 256 producer threads: back-pressure on the device side too
    opt.fifo_memory = cuda_fifo_memory();
    opt.copy_hooks = cuda_copy_hooks(dev);
    std::unique_ptr<Transport> t;
    if (Transport::create(boot, heap->region(), opt, &t) != Status::kOk)
      return boot.report(summary + "; " + backend + " " + mode + ": transport failed"), 3;
    if (b % 3 == 0) summary += "; " + backend + " (" + t->ordering() + ")";
    std::unique_ptr<DeviceFifoHandle> fifo;
    if (DeviceFifoHandle::create(t->fifo_ring(0), 30, &fifo) != Status::kOk) return 4;
    FORK_CUDA_TRY(cudaMemsetAsync(errors, 0, sizeof(int), stream));
    fill<<<64, 256, 0, stream>>>(base, L, me, epoch);
    FORK_CUDA_TRY(cudaStreamSynchronize(stream));
    if (boot.barrier(std::string("filled.") + mode) != Status::kOk) return 5;
    auto t0 = std::chrono::steady_clock::now();
    push_inter<<<1, 256, 0, stream>>>(fifo->get(), L, me, inter_peer, epoch, errors);
    push_nvl<<<1, 1024, 0, stream>>>(reinterpret_cast<char* const*>(heap->device_peer_table()), L, me, nvl_to, epoch);
    verify<<<1, 1024, 0, stream>>>(base, L.recv_inter, L.flags_inter + 8 * inter_peer, me, inter_peer, epoch, errors);
    verify<<<1, 1024, 0, stream>>>(base, L.recv_nvl, L.flags_nvl + 8 * nvl_from, me, nvl_from, epoch, errors);
    FORK_CUDA_TRY(cudaStreamSynchronize(stream));
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    int h_errors = -1;
    FORK_CUDA_TRY(cudaMemcpy(&h_errors, errors, sizeof(int), cudaMemcpyDeviceToHost));
    if (t->flush() != Status::kOk || boot.barrier(std::string("verified.") + mode) != Status::kOk) return 6;
    TransportCounters c = t->counters();
    uint64_t dev_stalls = fifo->stalls();
    if (t->stop() != Status::kOk) return 7;
    summary += std::string("; ") + mode + ": " + (h_errors ? "BAD " + std::to_string(h_errors) : "ok") + " in " +
               std::to_string(s * 1e3) + " ms, puts " + std::to_string(c.puts) + " signals " +
               std::to_string(c.signals) + " fences " + std::to_string(c.fences) + " batches " +
               std::to_string(c.batches) + " proxy stalls " + std::to_string(c.stalls) + " device stalls " +
               std::to_string(dev_stalls);
    if (h_errors) return boot.report(summary), 8;
    if (c.puts != 256) return boot.report(summary + " (expected 256 puts)"), 9;
  }
  boot.report(summary);
  cudaFree(errors);
  cudaStreamDestroy(stream);
  return heap->close(boot) == Status::kOk ? 0 : 10;
}

}  // namespace

TEST_CASE("device FIFO producers, socket between emulated nodes, NVLink peers within a node") {
  const int ngpu = testing::fork_probe_gpus(false);
  if (ngpu <= 0) {
    printf("SKIPPED: no CUDA device visible\n");
    fflush(stdout);
    _exit(77);
  }
  auto res = testing::run_forked(
      kRanks, kPerNode, [&](testing::ForkBootstrap& b) { return rank_body(b, ngpu); }, 240);
  for (const auto& r : res) {
    MESSAGE(r.report);
    CAPTURE(r.rank);
    CHECK(r.exited);
    CHECK(r.exit_code == 0);
  }
}
