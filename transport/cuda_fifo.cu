// Pinned FIFO memory, device copy hooks on a non-blocking stream, kernel preloading, and the kernel-side FIFO handle.
#include <cuda.h>  // CUfunction / CUresult types only: cuFuncLoad is reached through the runtime
#include <cuda_runtime.h>

#include <atomic>
#include <map>
#include <mutex>

#include "base/log.h"
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

// Streams for the copies of one device. Each proxy thread (one per channel) takes its own stream on
// its first copy, so the channels' copies run side by side instead of waiting for each other's.
struct CopyContext {
  static constexpr int kStreams = 8;  // a proxy thread per channel (at most 8); few streams share few work queues
  int device;
  cudaStream_t streams[kStreams];
  std::atomic<int> next{0};
};

cudaStream_t thread_stream(CopyContext* c) {
  thread_local std::map<CopyContext*, int> slot;  // no CUDA call here: the streams exist already
  auto it = slot.find(c);
  if (it == slot.end()) it = slot.emplace(c, c->next.fetch_add(1) % CopyContext::kStreams).first;
  return c->streams[it->second];
}

Status copy(void* ctx, void* dst, const void* src, uint64_t bytes, cudaMemcpyKind kind) {
  auto* c = static_cast<CopyContext*>(ctx);
  cudaStream_t stream = thread_stream(c);
  if (!stream) {  // the legacy default stream would queue behind every kernel of the device
    WEFT_WARN(kTransport, "GPU %d: no copy stream for the socket backend (creating it failed)", c->device);
    return Status::kCudaError;
  }
  cudaError_t e = cudaSetDevice(c->device);  // the proxy thread starts with device 0 current
  if (e == cudaSuccess) e = cudaMemcpyAsync(dst, src, bytes, kind, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
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

Status bind_thread(void* ctx) {
  auto* c = static_cast<CopyContext*>(ctx);
  const cudaError_t e = cudaSetDevice(c->device);
  if (e == cudaSuccess) return Status::kOk;
  WEFT_WARN(kTransport, "GPU %d: cannot make it current on the proxy thread: %s", c->device, cudaGetErrorString(e));
  return Status::kCudaError;
}

// Page-locked staging (portable: usable from any device's copies). Failure is not an error: the
// backend then stages through ordinary memory, slower.
void* host_alloc(void* ctx, uint64_t bytes) {
  void* p = nullptr;
  cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
  if (e != cudaSuccess) {
    WEFT_INFO(kTransport, "GPU %d: cudaHostAlloc(%llu) for socket staging: %s; staging through pageable memory",
              static_cast<CopyContext*>(ctx)->device, (unsigned long long)bytes, cudaGetErrorString(e));
    return nullptr;
  }
  return p;
}
void host_free(void*, void* p) { cudaFreeHost(p); }

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
    c = new CopyContext();
    c->device = device;
    int prev = 0;
    cudaGetDevice(&prev);
    cudaError_t e = cudaSetDevice(device);
    for (int i = 0; i < CopyContext::kStreams; ++i) {
      c->streams[i] = nullptr;
      if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&c->streams[i], cudaStreamNonBlocking);
      if (e != cudaSuccess) {
        WEFT_WARN(kTransport, "GPU %d: cannot create the socket backend's copy stream: %s", device,
                  cudaGetErrorString(e));
        c->streams[i] = nullptr;  // copies then fail with this reason instead of using the legacy stream
      }
    }
    cudaSetDevice(prev);
  }
  DeviceCopyHooks h;
  h.to_region = to_region;
  h.from_region = from_region;
  h.alloc_host = host_alloc;
  h.free_host = host_free;
  h.bind_thread = bind_thread;
  h.ctx = c;
  return h;
}

Status preload_kernels(std::initializer_list<const void*> kernels, const char* what) {
  // cuFuncLoad (driver 12.4+) loads a function explicitly; reached through the runtime, so weft
  // needs no link against libcuda. Where it is missing, cudaFuncGetAttributes still loads the
  // function (it reports maxThreadsPerBlock, which the driver knows only for a loaded function).
  using FuncLoad = CUresult (*)(CUfunction);
  static FuncLoad func_load = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuFuncLoad", &fn, 12040, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<FuncLoad>(fn);
  }();
  int i = 0;
  for (const void* k : kernels) {
    cudaFuncAttributes attr;
    cudaError_t e = cudaFuncGetAttributes(&attr, k);
    cudaFunction_t f = nullptr;
    if (e == cudaSuccess && func_load) e = cudaGetFuncBySymbol(&f, k);
    if (e != cudaSuccess) {
      WEFT_WARN(kTransport, "%s: cannot load kernel %d of %zu: %s", what, i, kernels.size(), cudaGetErrorString(e));
      return Status::kCudaError;
    }
    if (func_load) {
      CUresult r = func_load(reinterpret_cast<CUfunction>(f));
      if (r != CUDA_SUCCESS) {
        WEFT_WARN(kTransport, "%s: cuFuncLoad(kernel %d of %zu) failed with CUresult %d", what, i, kernels.size(),
                  static_cast<int>(r));
        return Status::kCudaError;
      }
    }
    ++i;
  }
  return Status::kOk;
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
