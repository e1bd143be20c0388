// Host API of the CUDA side of transport: device symmetric heap with CUDA IPC peers, pinned FIFOs, device copies.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

#include "base/status.h"
#include "bootstrap/bootstrap.h"
#include "transport/device_fifo.h"
#include "transport/fifo.h"
#include "transport/net_backend.h"

namespace weft::transport {

// The symmetric heap in device memory (cudaMalloc on the current device, same size on every rank).
// Ranks on the same node map each other's heap with CUDA IPC, so kernels get peer pointers.
class CudaHeap {
 public:
  // Collective, two phases: allocate + export the IPC handle -> allgather -> open same-node peers.
  static Status create(bootstrap::Bootstrap& boot, uint64_t bytes, std::unique_ptr<CudaHeap>* out);
  ~CudaHeap();
  CudaHeap(const CudaHeap&) = delete;
  CudaHeap& operator=(const CudaHeap&) = delete;

  // The heap for a net backend: with its dma-buf export (ibv_reg_dmabuf_mr) where the GPU and driver
  // offer one (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED), else dmabuf_fd -1 (ibverbs then tries peer memory);
  // with this GPU's RDMA write ordering and a flush for it (Region::flush_rdma_writes; usable from
  // any thread, e.g. the proxy's, and after this object is gone: it names the device, not the heap).
  Region region() const;
  // CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING of this GPU: 0 none, 100 owner, 200 all devices.
  // Below 100, a kernel of this GPU that sees a flag written by the NIC may still read stale data the
  // NIC wrote before it: the data must be flushed (flush_rdma_writes) before the flag is consumed. The
  // ibverbs backend does that in the receiving proxy (transport/ibverbs_backend.cpp).
  int rdma_writes_ordering() const { return rdma_writes_ordering_; }
  // cudaDeviceFlushGPUDirectRDMAWrites to the owner scope (cuFlushGPUDirectRDMAWrites) on this heap's GPU.
  Status flush_rdma_writes() const;
  void* local() const { return base_; }
  // Peer heap base in this process's address space; nullptr for ranks on other nodes.
  void* peer(int rank) const { return peers_[rank]; }
  // Device array of world_size heap bases (own heap at [rank], nullptr off-node), for kernels.
  void* const* device_peer_table() const { return device_table_; }
  // Collective: closes IPC mappings, waits for every rank to have done so, then frees. The
  // destructor does the same minus the barrier (use close() when peers may still be mapped).
  Status close(bootstrap::Bootstrap& boot);

 private:
  CudaHeap() = default;
  void release();
  void export_dmabuf();
  int rank_ = 0;
  int dmabuf_fd_ = -1;
  uint64_t dmabuf_offset_ = 0;
  int rdma_writes_ordering_ = 0;
  int device_ = 0;
  void* base_ = nullptr;
  uint64_t bytes_ = 0;
  std::vector<void*> peers_;
  void** device_table_ = nullptr;
};

// Host-pinned, device-mapped ring memory (TransportOptions::fifo_memory) for device producers.
FifoMemory cuda_fifo_memory();

// Loads kernels (their host stubs: `(const void*)my_kernel`) into the current device's context now.
// With lazy module loading (CUDA's default since 12.2) a kernel is loaded at its first launch, and a
// load may wait for the whole context to go idle while every other CUDA call of the process, the
// proxy's copies included, waits behind it. A kernel that waits on the proxy (FIFO back-pressure,
// flags delivered by the proxy's copies) is never idle, so launching a not-yet-loaded kernel while
// it runs deadlocks. Call this for every kernel of a run before launching the first one (or run
// with CUDA_MODULE_LOADING=EAGER). `what` names the caller in the error message.
Status preload_kernels(std::initializer_list<const void*> kernels, const char* what);
// Copies between host staging and a device heap on `device`, on a non-blocking stream of their
// own, so they never queue behind a running persistent kernel (TransportOptions::copy_hooks).
DeviceCopyHooks cuda_copy_hooks(int device);

// A kernel-side handle for a ring (Transport::fifo_ring(ch)); frees its device state on destruction.
// From then on device threads feed that ring (tickets continue from the ring's tail) and host
// pushes on it are refused; Transport::flush() still works (it goes through the proxy). One handle
// per ring: every kernel feeding the ring shares it (a second create is refused).
// Destroy it before the Transport that owns the ring.
class DeviceFifoHandle {
 public:
  static Status create(FifoRingHeader* ring, double timeout_s, std::unique_ptr<DeviceFifoHandle>* out);
  ~DeviceFifoHandle();
  const DeviceFifo& get() const { return fifo_; }
  uint64_t stalls() const;  // device producers' waits for space (reads device memory)

 private:
  DeviceFifoHandle() = default;
  DeviceFifo fifo_;
};

}  // namespace weft::transport
