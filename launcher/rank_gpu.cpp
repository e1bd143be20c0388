// GPU binding for a rank: device local_rank % count, identified by its PCI bus id.
#include "base/log.h"
#include "launcher/rank.h"

#if WEFT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace weft::launcher {

int visible_gpu_count() {
#if WEFT_HAVE_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: not an error here, just no GPU
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

Status bind_gpu(int local_rank, int* device, int* count, std::string* pci_bus_id) {
  *device = -1;
  *count = visible_gpu_count();
  pci_bus_id->clear();
  if (*count == 0) return Status::kOk;
#if WEFT_HAVE_CUDA
  int dev = local_rank % *count;
  cudaError_t e = cudaSetDevice(dev);
  char bus[32] = "";
  if (e == cudaSuccess) e = cudaDeviceGetPCIBusId(bus, sizeof bus, dev);
  if (e != cudaSuccess) {
    WEFT_WARN(kInit, "local rank %d: cannot bind CUDA device %d of %d: %s", local_rank, dev, *count,
              cudaGetErrorString(e));
    return Status::kCudaError;
  }
  *device = dev;
  *pci_bus_id = bus;
#else
  (void)local_rank;
#endif
  return Status::kOk;
}

}  // namespace weft::launcher
