// What a started rank knows about itself: identity from the bootstrap, how it was launched, its GPU.
#pragma once

#include <string>

#include "bootstrap/bootstrap.h"

namespace weft::bootstrap {

// What every op runner and check hook gets about the rank it runs in.
struct RankContext {
  bootstrap::RankInfo info;
  std::string launched_by;     // "weftrun" (embedded server), "slurm", "mpirun" or "pmix" (another server)
  int gpu = -1;                // CUDA device this rank bound (local_rank % visible devices); -1: no GPU
  int gpu_count = 0;           // CUDA devices visible to this rank
  std::string gpu_pci_bus_id;  // "0000:00:06.0" as CUDA reports it; "" without a GPU
  int pid = 0;
};

}  // namespace weft::bootstrap
