// Device symmetric heap: cudaMalloc, CUDA IPC handles published through the bootstrap, same-node peers opened.
#include <cuda.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <cstring>

#include "base/log.h"
#include "transport/cuda_transport.h"
#include "transport/ibverbs_plan.h"
#include "transport/transport.h"

namespace weft::transport {
namespace {

constexpr uint32_t kHeapMagic = 0x48544657u;  // "WFTH"

struct HeapRecord {  // what each rank publishes
  uint32_t magic;
  int32_t node;
  int32_t device;
  int32_t pad;
  uint64_t bytes;
  cudaIpcMemHandle_t handle;
};

Status cuda_fail(cudaError_t e, int rank, const char* what) {
  WEFT_WARN(kTransport, "rank %d: %s: %s (%s)", rank, what, cudaGetErrorString(e), cudaGetErrorName(e));
  return Status::kCudaError;
}

using GetHandleFn = CUresult (*)(void* handle, CUdeviceptr dptr, size_t size, CUmemRangeHandleType type,
                                 unsigned long long flags);

// cuMemGetHandleForAddressRange from the driver the runtime loaded (no link against libcuda).
GetHandleFn get_handle_fn() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
#if CUDART_VERSION >= 12050
  if (cudaGetDriverEntryPointByVersion("cuMemGetHandleForAddressRange", &fn, 11070, cudaEnableDefault, &q) !=
      cudaSuccess)
#else
  if (cudaGetDriverEntryPoint("cuMemGetHandleForAddressRange", &fn, cudaEnableDefault, &q) != cudaSuccess)
#endif
  {
    cudaGetLastError();
    return nullptr;
  }
  return q == cudaDriverEntryPointSuccess ? reinterpret_cast<GetHandleFn>(fn) : nullptr;
}

}  // namespace

// The heap as a dma-buf, for ibv_reg_dmabuf_mr: the driver exports whole host pages, so the export
// covers the page-aligned range around the heap and the heap starts dmabuf_offset_ bytes into it.
// Not available (old driver, GPU or kernel): dmabuf_fd_ stays -1 and ibverbs falls back to peer memory.
void CudaHeap::export_dmabuf() {
  int supported = 0;
  if (cudaDeviceGetAttribute(&supported, static_cast<cudaDeviceAttr>(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED), device_) !=
      cudaSuccess) {
    cudaGetLastError();
    supported = 0;
  }
  if (cudaDeviceGetAttribute(&rdma_writes_ordering_, cudaDevAttrGPUDirectRDMAWritesOrdering, device_) != cudaSuccess) {
    cudaGetLastError();
    rdma_writes_ordering_ = 0;
  }
  if (rdma_writes_ordering_ < cudaGPUDirectRDMAWritesOrderingOwner)
    WEFT_INFO(kTransport,
              "rank %d: GPU %d does not order GPUDirect RDMA writes for its own kernels "
              "(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING = %d): data an RDMA NIC writes must be flushed "
              "(cuFlushGPUDirectRDMAWrites) before a kernel consumes the flag after it (ibverbs: the receiving "
              "proxy flushes, then sets the flag)",
              rank_, device_, rdma_writes_ordering_);
  if (!supported) {
    WEFT_INFO(kTransport, "rank %d: GPU %d: no dma-buf export (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 0)", rank_,
              device_);
    return;
  }
  GetHandleFn get = get_handle_fn();
  if (!get) {
    WEFT_INFO(kTransport, "rank %d: the CUDA driver has no cuMemGetHandleForAddressRange: no dma-buf export", rank_);
    return;
  }
  const long page = sysconf(_SC_PAGESIZE);
  const ibv::DmabufRange r =
      ibv::dmabuf_range(reinterpret_cast<uint64_t>(base_), bytes_, page > 0 ? static_cast<uint64_t>(page) : 4096);
  int fd = -1;
  CUresult e =
      get(&fd, static_cast<CUdeviceptr>(r.aligned_base), r.aligned_bytes, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
  if (e != CUDA_SUCCESS || fd < 0) {
    WEFT_INFO(kTransport, "rank %d: cuMemGetHandleForAddressRange(dma-buf, %llu bytes) failed (CUresult %d)", rank_,
              (unsigned long long)r.aligned_bytes, static_cast<int>(e));
    return;
  }
  dmabuf_fd_ = fd;
  dmabuf_offset_ = r.offset;
}

// The flush targets the current device: the proxy thread calling it starts with device 0 current.
static Status flush_gpu_rdma_writes(int device, int rank) {
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) return cuda_fail(e, rank, "cudaSetDevice before cudaDeviceFlushGPUDirectRDMAWrites");
  e = cudaDeviceFlushGPUDirectRDMAWrites(cudaFlushGPUDirectRDMAWritesTargetCurrentDevice,
                                         cudaFlushGPUDirectRDMAWritesToOwner);
  return e == cudaSuccess ? Status::kOk : cuda_fail(e, rank, "cudaDeviceFlushGPUDirectRDMAWrites");
}

Status CudaHeap::flush_rdma_writes() const { return flush_gpu_rdma_writes(device_, rank_); }

Region CudaHeap::region() const {
  Region r{base_, bytes_, MemKind::kDevice, dmabuf_fd_, dmabuf_offset_};
  r.rdma_writes_ordering = rdma_writes_ordering_;
  r.flush_rdma_writes = [device = device_, rank = rank_] { return flush_gpu_rdma_writes(device, rank); };
  r.cuda_device = device_;
  return r;
}

Status CudaHeap::create(bootstrap::Bootstrap& boot, uint64_t bytes, std::unique_ptr<CudaHeap>* out) {
  const auto& me = boot.info();
  std::unique_ptr<CudaHeap> h(new CudaHeap());
  h->rank_ = me.rank;
  h->bytes_ = bytes;
  h->peers_.assign(me.size, nullptr);
  cudaError_t e = cudaGetDevice(&h->device_);
  if (e != cudaSuccess) return cuda_fail(e, me.rank, "cudaGetDevice");
  // Phase 1: create and export.
  // Whole 2 MiB pages (the GPU's large page). A heap sized to the byte put an op's flag words in the
  // last few KiB past a page boundary, and AllGather+GEMM 16384 x 2048 x 8192 then ran markedly
  // slower than in this rounded heap or a 1 GiB one (figures: docs/results/2026-11-26-four-h200.md).
  // Why the partial page costs that much was not measured.
  const uint64_t kPage = uint64_t(2) << 20;
  const uint64_t alloc = (bytes + kPage - 1) / kPage * kPage;
  if ((e = cudaMalloc(&h->base_, alloc)) != cudaSuccess) return cuda_fail(e, me.rank, "cudaMalloc(symmetric heap)");
  if ((e = cudaMemset(h->base_, 0, alloc)) != cudaSuccess) return cuda_fail(e, me.rank, "cudaMemset(heap)");
  h->export_dmabuf();
  HeapRecord rec{};
  rec.magic = kHeapMagic;
  rec.node = me.node;
  rec.device = h->device_;
  rec.bytes = bytes;
  if ((e = cudaIpcGetMemHandle(&rec.handle, h->base_)) != cudaSuccess)
    return cuda_fail(e, me.rank, "cudaIpcGetMemHandle(heap)");
  bootstrap::Blob mine(sizeof rec);
  memcpy(mine.data(), &rec, sizeof rec);
  std::vector<bootstrap::Blob> all;
  // Phase 2: publish.
  WEFT_CHECK(boot.allgather("weft.heap." + std::to_string(next_exchange_id(&boot)), mine, &all));
  if (all.size() != static_cast<size_t>(me.size)) {
    WEFT_WARN(kTransport, "rank %d: the bootstrap returned %zu heap records for %d ranks", me.rank, all.size(),
              me.size);
    return Status::kProtocolError;
  }
  // Phase 3: connect same-node peers.
  h->peers_[me.rank] = h->base_;
  for (int r = 0; r < me.size; ++r) {
    HeapRecord pr;
    if (all[r].size() != sizeof pr) {
      WEFT_WARN(kTransport, "rank %d: heap record of rank %d is %zu bytes, expected %zu", me.rank, r, all[r].size(),
                sizeof pr);
      return Status::kProtocolError;
    }
    memcpy(&pr, all[r].data(), sizeof pr);
    if (pr.magic != kHeapMagic || pr.bytes != bytes) {
      WEFT_WARN(kTransport, "rank %d: rank %d's heap is %llu bytes, mine %llu: the heap must be symmetric", me.rank, r,
                (unsigned long long)pr.bytes, (unsigned long long)bytes);
      return Status::kInvalidArgument;
    }
    if (r == me.rank || pr.node != me.node) continue;
    void* p = nullptr;
    if ((e = cudaIpcOpenMemHandle(&p, pr.handle, cudaIpcMemLazyEnablePeerAccess)) != cudaSuccess) {
      WEFT_WARN(kTransport, "rank %d (GPU %d): cannot map the heap of rank %d (GPU %d) on this node: %s", me.rank,
                h->device_, r, pr.device, cudaGetErrorString(e));
      return Status::kCudaError;
    }
    h->peers_[r] = p;
  }
  if ((e = cudaMalloc(&h->device_table_, sizeof(void*) * me.size)) != cudaSuccess)
    return cuda_fail(e, me.rank, "cudaMalloc(peer table)");
  if ((e = cudaMemcpy(h->device_table_, h->peers_.data(), sizeof(void*) * me.size, cudaMemcpyHostToDevice)) !=
      cudaSuccess)
    return cuda_fail(e, me.rank, "cudaMemcpy(peer table)");
  *out = std::move(h);
  return Status::kOk;
}

void CudaHeap::release() {
  for (size_t r = 0; r < peers_.size(); ++r)
    if (peers_[r] && static_cast<int>(r) != rank_) cudaIpcCloseMemHandle(peers_[r]);
  peers_.assign(peers_.size(), nullptr);
  if (device_table_) cudaFree(device_table_), device_table_ = nullptr;
  if (dmabuf_fd_ >= 0) ::close(dmabuf_fd_), dmabuf_fd_ = -1;
  if (base_) cudaFree(base_), base_ = nullptr;
}

Status CudaHeap::close(bootstrap::Bootstrap& boot) {
  for (size_t r = 0; r < peers_.size(); ++r)
    if (peers_[r] && static_cast<int>(r) != rank_) cudaIpcCloseMemHandle(peers_[r]), peers_[r] = nullptr;
  // Nobody frees a heap another rank still maps.
  Status s = boot.barrier("weft.heap.close." + std::to_string(next_exchange_id(&boot)));
  release();
  return s;
}

CudaHeap::~CudaHeap() { release(); }

}  // namespace weft::transport
