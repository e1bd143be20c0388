// Pinned FIFO memory, device copy hooks on a non-blocking stream, and the kernel-side FIFO handle.
#include <cuda_runtime.h>

#include <map>
#include <mutex>

#include "runtime/log.h"
#include "transport/cuda_transport.h"

namespace weft::transport {
namespace {

void* pinned_alloc(uint64_t bytes) {
  void* p = nullptr;
  cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
  if (e != cudaSuccess) {
    WEFT_WARN(kTransport, "cudaHostAlloc(%llu bytes, mapped) for a FIFO: %s", (unsigned long long)bytes,
              cudaGetErrorString(e));
    return nullptr;
  }
  return p;
}

void pinned_free(void* p) { cudaFreeHost(p); }

struct CopyContext {
  int device;
  cudaStream_t stream;
};

Status copy(void* ctx, void* dst, const void* src, uint64_t bytes, cudaMemcpyKind kind) {
  auto* c = static_cast<CopyContext*>(ctx);
  cudaError_t e = cudaSetDevice(c->device);  // the proxy thread starts with device 0 current
  if (e == cudaSuccess) e = cudaMemcpyAsync(dst, src, bytes, kind, c->stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
  if (e != cudaSuccess) {
    WEFT_WARN(kTransport, "GPU %d: %s copy of %llu bytes for the socket backend: %s", c->device,
              kind == cudaMemcpyHostToDevice ? "host-to-device" : "device-to-host", (unsigned long long)bytes,
              cudaGetErrorString(e));
    return Status::kCudaError;
  }
  return Status::kOk;
}

Status to_region(void* ctx, void* dst, const void* src, uint64_t bytes) {
  return copy(ctx, dst, src, bytes, cudaMemcpyHostToDevice);
}
Status from_region(void* ctx, void* dst, const void* src, uint64_t bytes) {
  return copy(ctx, dst, src, bytes, cudaMemcpyDeviceToHost);
}

}  // namespace

FifoMemory cuda_fifo_memory() {
  FifoMemory m;
  m.alloc = pinned_alloc;
  m.release = pinned_free;
  return m;
}

DeviceCopyHooks cuda_copy_hooks(int device) {
  // One context per device for the life of the process (hooks are plain function pointers).
  static std::mutex mu;
  static std::map<int, CopyContext*> contexts;
  std::lock_guard<std::mutex> lock(mu);
  CopyContext*& c = contexts[device];
  if (!c) {
    c = new CopyContext{device, nullptr};
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(device);
    cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    cudaSetDevice(prev);
  }
  DeviceCopyHooks h;
  h.to_region = to_region;
  h.from_region = from_region;
  h.ctx = c;
  return h;
}

Status DeviceFifoHandle::create(FifoRingHeader* ring, double timeout_s, std::unique_ptr<DeviceFifoHandle>* out) {
  if (ring->device_producers) {  // a second ticket counter on one ring would hand out the same tickets
    WEFT_WARN(kTransport, "rank %d channel %d: this FIFO already has a device handle; share that one", ring->rank,
              ring->channel);
    return Status::kInvalidArgument;
  }
  std::unique_ptr<DeviceFifoHandle> h(new DeviceFifoHandle());
  void* dring = nullptr;
  cudaError_t e = cudaHostGetDevicePointer(&dring, ring, 0);
  if (e != cudaSuccess) {
    WEFT_WARN(kTransport,
              "rank %d channel %d: the FIFO is not device-mapped (create the transport with "
              "cuda_fifo_memory()): %s",
              ring->rank, ring->channel, cudaGetErrorString(e));
    return Status::kCudaError;
  }
  h->fifo_.ring = static_cast<FifoRingHeader*>(dring);
  h->fifo_.slots = fifo_slots(h->fifo_.ring);
  h->fifo_.mask = ring->depth - 1;
  h->fifo_.rank = ring->rank;
  h->fifo_.channel = ring->channel;
  h->fifo_.timeout_ns = static_cast<uint64_t>(timeout_s * 1e9);
  // Device tickets continue from what the proxy has consumed (host producers, if any, are done).
  FifoProducerState init{};
  init.next_ticket = init.tail_cache = __atomic_load_n(&ring->tail, __ATOMIC_ACQUIRE);
  if ((e = cudaMalloc(&h->fifo_.state, sizeof(FifoProducerState))) != cudaSuccess ||
      (e = cudaMemcpy(h->fifo_.state, &init, sizeof init, cudaMemcpyHostToDevice)) != cudaSuccess) {
    WEFT_WARN(kTransport, "rank %d: FIFO producer state: %s", ring->rank, cudaGetErrorString(e));
    return Status::kCudaError;
  }
  ring->device_producers = 1;
  *out = std::move(h);
  return Status::kOk;
}

DeviceFifoHandle::~DeviceFifoHandle() {
  if (fifo_.state) cudaFree(fifo_.state);
}

uint64_t DeviceFifoHandle::stalls() const {
  FifoProducerState s{};
  if (cudaMemcpy(&s, fifo_.state, sizeof s, cudaMemcpyDeviceToHost) != cudaSuccess) return 0;
  return s.stalls;
}

}  // namespace weft::transport
