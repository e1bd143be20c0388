// A rank's entry: how weftrun knows it is a rank, connects to its PMIx server and binds its GPU.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "bootstrap/bootstrap.h"
#include "bootstrap/pmix_bootstrap.h"
#include "bootstrap/rank_context.h"

namespace weft::launcher {

// What every op runner and check hook gets about the rank it runs in (bootstrap/rank_context.h, so that
// the runtime's headers need nothing from the launcher).
using RankContext = bootstrap::RankContext;

// How this weftrun process was started.
enum class Role {
  kLauncher,     // nobody serves PMIx to us: weftrun starts the ranks itself (embedded server)
  kRank,         // a PMIx server started us (weftrun's own, slurmstepd via srun --mpi=pmix, mpirun)
  kMisLaunched,  // started as one of several tasks by a launcher that gives no PMIx (srun --mpi=none...)
};
// `why` (kMisLaunched) says what was seen and how to launch instead.
Role detect_role(std::string* why);

// The one way a subcommand acts on how it was started: as a rank (a PMIx server started it), as the
// launcher of its own ranks, or refused (exit 2, "weftrun COMMAND: why") when mis-launched. Returns
// the exit code.
int dispatch_role(const char* command, const std::function<int()>& as_rank, const std::function<int()>& as_launcher);

// Connects to the PMIx server (bounded by WEFT_BOOTSTRAP_TIMEOUT), fills ctx (identity, launch
// path) and binds the GPU of local rank % device count when CUDA sees one.
Status start_rank(RankContext* ctx, std::unique_ptr<bootstrap::PmixBootstrap>* boot);

// GPU binding (rank_gpu.cpp: CUDA when built with it, "no GPU" otherwise).
int visible_gpu_count();
Status bind_gpu(int local_rank, int* device, int* count, std::string* pci_bus_id);

}  // namespace weft::launcher
