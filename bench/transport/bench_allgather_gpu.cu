// GPU all-gather on 2 emulated nodes x 2 GPUs: weft (NVLink stores within a node; device FIFO -> proxy ->
// backend between nodes: socket, and ofi with --backends socket,ofi; tile-wise put+signal in each
// Perseus mode) next to NCCL's all-gather with NCCL_HOSTID set per emulated node (so NCCL also crosses
// "nodes" through its network transport), same sizes, same process.
//
//   rank:  0 (GPU 0)  1 (GPU 1)  | node 1: 2 (GPU 2)  3 (GPU 3)
//   each rank's chunk lands in slot r of every rank's heap; inter-node chunks move in 1 MiB tiles,
//   each tile a put followed by a signal on its own flag; a rank is done when every flag arrived.
//
//   bench_allgather_gpu [--json FILE] [--quick] [--backends socket[,ofi]]
#include <cuda_runtime.h>
#include <nccl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "local_bootstrap.h"
#include "transport/cuda_transport.h"
#include "transport/fifo_device.cuh"
#include "transport/transport.h"

using weft::Status;
namespace testing = weft::testing;
using namespace weft::transport;

namespace {

constexpr int kRanks = 4, kPerNode = 2;
constexpr uint64_t kTile = 1 << 20;
constexpr uint64_t kMaxChunk = 64ull << 20;
constexpr uint64_t kMaxTiles = kMaxChunk / kTile;
constexpr uint64_t kTimeoutNs = 60ull * 1000 * 1000 * 1000;

struct Layout {
  uint64_t chunk;
  __host__ __device__ uint64_t slot(int r) const { return uint64_t(r) * kMaxChunk; }
  __host__ __device__ uint64_t flag(int src, uint64_t tile) const {
    return kRanks * kMaxChunk + (uint64_t(src) * kMaxTiles + tile) * 8;
  }
  __host__ __device__ static uint64_t bytes() { return kRanks * kMaxChunk + kRanks * kMaxTiles * 8; }
};

__global__ void fill(char* heap, Layout L, int me, uint32_t salt) {
  uint32_t* w = reinterpret_cast<uint32_t*>(heap + L.slot(me));
  for (uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < L.chunk / 4; i += gridDim.x * blockDim.x)
    w[i] = uint32_t(i * 2654435761u) ^ (uint32_t(me) << 28) ^ salt;
}

// Block 0: pushes one put+signal per tile to each other-node rank. Other blocks: copy the chunk
// into the same-node peers' heaps over NVLink, then release their tile flags.
__global__ void send(DeviceFifo f, char* const* peers, Layout L, int me, int node, uint64_t epoch, int* errors) {
  const uint64_t tiles = L.chunk / kTile;
  if (blockIdx.x == 0) {
    for (int r = 0; r < kRanks; ++r) {
      if (r / kPerNode == node) continue;
      for (uint64_t t = threadIdx.x; t < tiles; t += blockDim.x)
        if (device::push_put_signal(f, r, L.slot(me) + t * kTile, L.slot(me) + t * kTile, kTile, L.flag(me, t), epoch))
          atomicAdd(errors, 1);
    }
    return;
  }
  const uint4* src = reinterpret_cast<const uint4*>(peers[me] + L.slot(me));
  for (int r = node * kPerNode; r < (node + 1) * kPerNode; ++r) {
    if (r == me) continue;
    uint4* dst = reinterpret_cast<uint4*>(peers[r] + L.slot(me));
    for (uint64_t i = (blockIdx.x - 1) * blockDim.x + threadIdx.x; i < L.chunk / 16; i += (gridDim.x - 1) * blockDim.x)
      dst[i] = src[i];
  }
  __threadfence_system();
  __syncthreads();
  // The last block to finish publishes the flags (a counter in the peer-table-independent errors[1]).
  __shared__ bool last;
  if (threadIdx.x == 0) last = atomicAdd(errors + 1, 1) == int(gridDim.x) - 2;
  __syncthreads();
  if (!last) return;
  __threadfence_system();
  for (int r = node * kPerNode; r < (node + 1) * kPerNode; ++r) {
    if (r == me) continue;
    for (uint64_t t = threadIdx.x; t < tiles; t += blockDim.x)
      device::signal_peer(reinterpret_cast<uint64_t*>(peers[r] + L.flag(me, t)), epoch);
  }
}

__global__ void wait_all(char* heap, Layout L, int me, uint64_t epoch, int* errors) {
  const uint64_t tiles = L.chunk / kTile;
  for (int r = 0; r < kRanks; ++r) {
    if (r == me) continue;
    for (uint64_t t = threadIdx.x; t < tiles; t += blockDim.x)
      if (device::wait_flag(reinterpret_cast<uint64_t*>(heap + L.flag(r, t)), epoch, kTimeoutNs, me, "a tile"))
        atomicAdd(errors, 1);
  }
}

__global__ void verify(char* heap, Layout L, uint32_t salt, int* errors) {
  for (int r = 0; r < kRanks; ++r) {
    const uint32_t* w = reinterpret_cast<const uint32_t*>(heap + L.slot(r));
    for (uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < L.chunk / 4; i += gridDim.x * blockDim.x)
      if (w[i] != (uint32_t(i * 2654435761u) ^ (uint32_t(r) << 28) ^ salt)) atomicAdd(errors, 1);
  }
}

int probe_gpu_count() {
  pid_t pid = fork();
  if (pid == 0) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    _exit(n > 100 ? 100 : n);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 0;
}

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

#define TRY(cond, what)                       \
  do {                                        \
    if (!(cond)) return boot.report(what), 1; \
  } while (0)

int rank_body(testing::ForkBootstrap& boot, int ngpu, bool quick, const std::vector<std::string>& backends) {
  const int me = boot.info().rank, node = boot.info().node;
  TRY(cudaSetDevice(me % ngpu) == cudaSuccess, "cudaSetDevice");
  // wait_all is launched while send may wait on the proxy: load every kernel before the first launch.
  TRY(preload_kernels({reinterpret_cast<const void*>(fill), reinterpret_cast<const void*>(send),
                       reinterpret_cast<const void*>(wait_all), reinterpret_cast<const void*>(verify)},
                      "bench_allgather_gpu") == Status::kOk,
      "preload_kernels");
  std::vector<uint64_t> sizes = {1 << 20, 4 << 20, 16 << 20, 64 << 20};
  if (quick) sizes = {1 << 20, 16 << 20};
  const int iters = quick ? 3 : 10;
  std::string rows;
  cudaStream_t s;
  TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");

  // NCCL, with one host id per emulated node.
  std::string hostid = "weft-emulated-node-" + std::to_string(node);
  setenv("NCCL_HOSTID", hostid.c_str(), 1);
  ncclUniqueId id;
  if (me == 0) TRY(ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId");
  weft::bootstrap::Blob mine(sizeof id);
  memcpy(mine.data(), &id, sizeof id);
  std::vector<weft::bootstrap::Blob> all;
  TRY(boot.allgather("nccl-id", mine, &all) == Status::kOk, "allgather");
  memcpy(&id, all[0].data(), sizeof id);
  ncclComm_t comm;
  TRY(ncclCommInitRank(&comm, kRanks, id, me) == ncclSuccess, "ncclCommInitRank");
  void *nsend = nullptr, *nrecv = nullptr;
  TRY(cudaMalloc(&nsend, kMaxChunk) == cudaSuccess && cudaMalloc(&nrecv, kRanks * kMaxChunk) == cudaSuccess, "malloc");
  for (uint64_t chunk : sizes) {
    ncclAllGather(nsend, nrecv, chunk, ncclInt8, comm, s);  // warm-up
    cudaStreamSynchronize(s);
    TRY(boot.barrier("nccl" + std::to_string(chunk)) == Status::kOk, "barrier");
    double t0 = now_s();
    for (int i = 0; i < iters; ++i) ncclAllGather(nsend, nrecv, chunk, ncclInt8, comm, s);
    TRY(cudaStreamSynchronize(s) == cudaSuccess, "nccl all-gather failed");
    double dt = (now_s() - t0) / iters;
    rows += "nccl - " + std::to_string(chunk) + " " + std::to_string(chunk * kRanks / dt / 1e9) + " 0 0 0;";
  }
  ncclCommDestroy(comm);
  cudaFree(nsend);
  cudaFree(nrecv);

  // weft.
  std::unique_ptr<CudaHeap> heap;
  TRY(CudaHeap::create(boot, Layout::bytes(), &heap) == Status::kOk, "heap");
  char* base = static_cast<char*>(heap->local());
  int* errors = nullptr;
  TRY(cudaMalloc(&errors, 2 * sizeof(int)) == cudaSuccess, "malloc");
  uint64_t epoch = 0;
  for (const std::string& backend : backends)
    for (const char* mode : {"serial", "fenced", "batched"}) {
      TransportOptions opt;
      opt.backend = backend;
      opt.signal_mode = mode;
      opt.fifo_memory = cuda_fifo_memory();
      opt.copy_hooks = cuda_copy_hooks(me % ngpu);
      opt.peers = PeerNeed::kEveryRank;  // block 0 puts to every other-node rank, not only the rail peer
      std::unique_ptr<Transport> t;
      TRY(Transport::create(boot, heap->region(), opt, &t) == Status::kOk, "transport");
      std::unique_ptr<DeviceFifoHandle> fifo;
      TRY(DeviceFifoHandle::create(t->fifo_ring(0), 60, &fifo) == Status::kOk, "device fifo");
      for (uint64_t chunk : sizes) {
        Layout L{chunk};
        const uint32_t salt = uint32_t(epoch + 1) * 7919u;
        fill<<<132, 512, 0, s>>>(base, L, me, salt);
        cudaStreamSynchronize(s);
        TransportCounters c0 = t->counters();
        double best = 1e30;
        for (int i = 0; i < iters; ++i) {
          ++epoch;
          cudaMemsetAsync(errors, 0, 2 * sizeof(int), s);
          cudaStreamSynchronize(s);
          TRY(boot.barrier("weft" + std::to_string(epoch)) == Status::kOk, "barrier");
          double t0 = now_s();
          send<<<33, 512, 0, s>>>(fifo->get(), reinterpret_cast<char* const*>(heap->device_peer_table()), L, me, node,
                                  epoch, errors);
          wait_all<<<1, 256, 0, s>>>(base, L, me, epoch, errors);
          TRY(cudaStreamSynchronize(s) == cudaSuccess, "weft all-gather kernel failed");
          best = std::min(best, now_s() - t0);
          int h = 0;
          cudaMemcpy(&h, errors, sizeof h, cudaMemcpyDeviceToHost);
          TRY(h == 0, "weft/" + backend + " " + mode + ": push or wait failed");
          TRY(t->flush() == Status::kOk, "flush");
        }
        verify<<<132, 512, 0, s>>>(base, L, salt, errors);
        int h = 0;
        cudaMemcpy(&h, errors, sizeof h, cudaMemcpyDeviceToHost);
        TRY(h == 0, "weft/" + backend + " " + mode + ": " + std::to_string(h) + " wrong words");
        TransportCounters c1 = t->counters();
        rows += "weft/" + backend + " " + mode + " " + std::to_string(chunk) + " " +
                std::to_string(chunk * kRanks / best / 1e9) + " " + std::to_string(c1.fences - c0.fences) + " " +
                std::to_string(c1.batches - c0.batches) + " " + std::to_string(c1.stalls - c0.stalls) + ";";
      }
      TRY(boot.barrier("done." + backend + "." + mode) == Status::kOk, "barrier");
      TRY(t->stop() == Status::kOk, "stop");
    }
  TRY(heap->close(boot) == Status::kOk, "heap close");
  if (me == 0) boot.report(rows);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const char* json = nullptr;
  bool quick = false;
  std::vector<std::string> backends = {"socket"};
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--json") && i + 1 < argc) {
      json = argv[++i];
    } else if (!strcmp(argv[i], "--quick")) {
      quick = true;
    } else if (!strcmp(argv[i], "--backends") && i + 1 < argc) {
      backends.clear();
      for (std::string list = argv[++i]; !list.empty();) {
        const size_t comma = list.find(',');
        backends.push_back(list.substr(0, comma));
        list = comma == std::string::npos ? "" : list.substr(comma + 1);
      }
      for (const std::string& b : backends)
        if (b != "socket" && b != "ofi") {
          fprintf(stderr, "bench_allgather_gpu: --backends takes socket and ofi, not '%s'\n", b.c_str());
          return 2;
        }
    } else {
      fprintf(stderr, "usage: bench_allgather_gpu [--json FILE] [--quick] [--backends socket[,ofi]]\n");
      return 2;
    }
  }
  const int ngpu = probe_gpu_count();
  if (ngpu <= 0) {
    printf("SKIPPED: no CUDA device visible\n");
    return 77;
  }
  auto res = testing::run_forked(
      kRanks, kPerNode, [&](testing::ForkBootstrap& b) { return rank_body(b, ngpu, quick, backends); }, 900);
  int rc = 0;
  for (const auto& r : res)
    if (!r.exited || r.exit_code) {
      fprintf(stderr, "rank %d failed: %s\n", r.rank, r.report.c_str());
      rc = 1;
    }
  if (rc) return rc;
  printf("all-gather, %d ranks on 2 emulated nodes (%d GPUs visible), algbw = ranks x chunk / time\n", kRanks, ngpu);
  printf("%-11s %-8s %12s %10s %8s %8s %8s\n", "impl", "mode", "chunk", "GB/s", "fences", "batches", "stalls");
  FILE* f = json ? fopen(json, "w") : nullptr;
  if (f) fprintf(f, "{\"ranks\": %d, \"gpus\": %d, \"rows\": [", kRanks, ngpu);
  const char* p = res[0].report.c_str();
  char impl[24], mode[16];
  unsigned long long chunk, fences, batches, stalls;
  double gbps;
  int used = 0, n = 0;
  while (sscanf(p, "%23s %15s %llu %lf %llu %llu %llu;%n", impl, mode, &chunk, &gbps, &fences, &batches, &stalls,
                &used) == 7) {
    printf("%-11s %-8s %12llu %10.3f %8llu %8llu %8llu\n", impl, mode, chunk, gbps, fences, batches, stalls);
    if (f)
      fprintf(f,
              "%s{\"impl\": \"%s\", \"mode\": \"%s\", \"chunk_bytes\": %llu, \"algbw_gbps\": %.4f, \"fences\": %llu, "
              "\"batches\": %llu, \"stalls\": %llu}",
              n++ ? ", " : "", impl, mode, chunk, gbps, fences, batches, stalls);
    p += used;
  }
  if (f) fprintf(f, "]}\n"), fclose(f);
  return 0;
}
