// Rank entry: launch path detection and the connection every rank makes first.
#include "launcher/rank.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "base/log.h"
#include "transport/nic_placement.h"

namespace weft::launcher {
namespace {

int env_int(const char* name, int fallback) {
  const char* v = getenv(name);
  return v && *v ? atoi(v) : fallback;
}

}  // namespace

Role detect_role(std::string* why) {
  if (bootstrap::started_under_pmix()) return Role::kRank;
  // One task of several, started by a launcher that gave it no PMIx server: running our own
  // launcher in each task would start N separate jobs, so say how to launch instead.
  int slurm_tasks = env_int("SLURM_STEP_NUM_TASKS", env_int("SLURM_NTASKS", 1));
  if (getenv("SLURM_STEP_ID") && getenv("SLURM_PROCID") && slurm_tasks > 1) {
    *why = "started by srun as one of " + std::to_string(slurm_tasks) +
           " tasks without a PMIx server (no PMIX_NAMESPACE/PMIX_SERVER_URI* in the environment): launch with "
           "'srun --mpi=pmix weftrun ...' (see 'srun --mpi=list'), or set MpiDefault=pmix in slurm.conf";
    return Role::kMisLaunched;
  }
  int ompi = env_int("OMPI_COMM_WORLD_SIZE", env_int("PMI_SIZE", 1));
  if (ompi > 1) {
    *why = "started by an MPI launcher as one of " + std::to_string(ompi) +
           " processes without a PMIx server: use Open MPI's mpirun (it serves PMIx), 'srun --mpi=pmix', or "
           "run weftrun alone (it starts the ranks itself)";
    return Role::kMisLaunched;
  }
  return Role::kLauncher;
}

int dispatch_role(const char* command, const std::function<int()>& as_rank, const std::function<int()>& as_launcher) {
  std::string why;
  switch (detect_role(&why)) {
    case Role::kMisLaunched:
      fprintf(stderr, "weftrun %s: %s\n", command, why.c_str());
      return 2;
    case Role::kRank:
      return as_rank();
    case Role::kLauncher:
      return as_launcher();
  }
  return 2;
}

Status start_rank(RankContext* ctx, std::unique_ptr<bootstrap::PmixBootstrap>* boot) {
  WEFT_CHECK(bootstrap::PmixBootstrap::connect(boot));
  ctx->info = (*boot)->info();
  ctx->pid = getpid();
  if (!strncmp(ctx->info.nspace.c_str(), "weft.", 5))
    ctx->launched_by = "weftrun";
  else if (getenv("SLURM_STEP_ID") || getenv("SLURM_JOB_ID"))
    ctx->launched_by = "slurm";
  else if (getenv("OMPI_COMM_WORLD_SIZE"))
    ctx->launched_by = "mpirun";
  else
    ctx->launched_by = "pmix";
  Status s = bind_gpu(ctx->info.local_rank, &ctx->gpu, &ctx->gpu_count, &ctx->gpu_pci_bus_id);
  if (s != Status::kOk) {
    (*boot)->abort("could not bind a GPU");
    return s;
  }
  // The transport places this rank's channels (NIC, port, proxy CPUs) by the GPU bound here.
  transport::set_bound_gpu(ctx->gpu_pci_bus_id);
  return Status::kOk;
}

}  // namespace weft::launcher
