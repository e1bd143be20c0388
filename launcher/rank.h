// A rank's entry: how weftrun knows it is a rank, connects to its PMIx server and binds its GPU.
#pragma once

#include <memory>
#include <string>

#include "bootstrap/bootstrap.h"
#include "bootstrap/pmix_bootstrap.h"

namespace weft::launcher {

// What every op runner and check hook gets about the rank it runs in.
struct RankContext {
  bootstrap::RankInfo info;
  std::string launched_by;     // "weftrun" (embedded server), "slurm", "mpirun" or "pmix" (another server)
  int gpu = -1;                // CUDA device this rank bound (local_rank % visible devices); -1: no GPU
  int gpu_count = 0;           // CUDA devices visible to this rank
  std::string gpu_pci_bus_id;  // "0000:00:06.0" as CUDA reports it; "" without a GPU
  int pid = 0;
};

// How this weftrun process was started.
enum class Role {
  kLauncher,     // nobody serves PMIx to us: weftrun starts the ranks itself (embedded server)
  kRank,         // a PMIx server started us (weftrun's own, slurmstepd via srun --mpi=pmix, mpirun)
  kMisLaunched,  // started as one of several tasks by a launcher that gives no PMIx (srun --mpi=none...)
};
// `why` (kMisLaunched) says what was seen and how to launch instead.
Role detect_role(std::string* why);

// Connects to the PMIx server (bounded by WEFT_BOOTSTRAP_TIMEOUT), fills ctx (identity, launch
// path) and binds the GPU of local rank % device count when CUDA sees one.
Status start_rank(RankContext* ctx, std::unique_ptr<bootstrap::PmixBootstrap>* boot);

// GPU binding (rank_gpu.cpp: CUDA when built with it, "no GPU" otherwise).
int visible_gpu_count();
Status bind_gpu(int local_rank, int* device, int* count, std::string* pci_bus_id);

}  // namespace weft::launcher
