// this_machine(): CUDA's device name and versions, the build's kernels hash, hwloc's topology.
#include "runtime/exec/machine.h"

#include <cuda_runtime.h>

#include "topology/topology.h"
#include "weft_kernels_hash.h"

namespace weft::runtime {

bool this_machine(TuneMachine* out) {
  int count = 0, driver = 0, rt = 0;
  cudaDeviceProp prop{};
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0 || cudaGetDeviceProperties(&prop, 0) != cudaSuccess ||
      cudaDriverGetVersion(&driver) != cudaSuccess || cudaRuntimeGetVersion(&rt) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  out->gpu = prop.name;
  out->cuda = "driver " + std::to_string(driver) + ", runtime " + std::to_string(rt);
  out->kernels = WEFT_KERNELS_HASH;
  topology::Topology topo;
  out->topology = topology::load("", &topo) == Status::kOk ? topology_fingerprint(topo) : "unknown";
  return true;
}

}  // namespace weft::runtime
