// Device symmetric heap: cudaMalloc, CUDA IPC handles published through the bootstrap, same-node peers opened.
#include <cuda_runtime.h>

#include <cstring>

#include "base/log.h"
#include "transport/cuda_transport.h"
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

}  // namespace

Status CudaHeap::create(bootstrap::Bootstrap& boot, uint64_t bytes, std::unique_ptr<CudaHeap>* out) {
  const auto& me = boot.info();
  std::unique_ptr<CudaHeap> h(new CudaHeap());
  h->rank_ = me.rank;
  h->bytes_ = bytes;
  h->peers_.assign(me.size, nullptr);
  cudaError_t e = cudaGetDevice(&h->device_);
  if (e != cudaSuccess) return cuda_fail(e, me.rank, "cudaGetDevice");
  // Phase 1: create and export.
  if ((e = cudaMalloc(&h->base_, bytes)) != cudaSuccess) return cuda_fail(e, me.rank, "cudaMalloc(symmetric heap)");
  if ((e = cudaMemset(h->base_, 0, bytes)) != cudaSuccess) return cuda_fail(e, me.rank, "cudaMemset(heap)");
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
