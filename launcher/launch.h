// Starting ranks on this machine: weftrun as their PMIx server, watching them until they all end.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace weft::launcher {

struct LaunchOptions {
  int ranks = 1;
  int nodes = 1;  // emulated nodes (--emulate-nodes)
  int gpus = 0;   // GPUs visible to the launcher; with nodes > 1 each node gets its own slice
  // The rank command line without argv[0]; ranks run this same weftrun binary, which sees the
  // PMIx variables in its environment and acts as a rank (see rank.h).
  std::vector<std::string> rank_args;
};

// At most this many ranks on one machine: past it a count is a typo, not a job (and the fds, pids and
// /dev/shm files it would take are not there).
constexpr int kMaxRanks = 4096;

// Whether `o` can start: 1 <= ranks <= kMaxRanks, 1 <= nodes <= ranks, and, with rank_per_gpu (a
// job that times the real GPU path), a GPU of its own for every rank: no more ranks than GPUs, and
// on each emulated node no more ranks than the GPUs its slice gets (gpu_slice_for_node). With no
// GPU (o.gpus == 0) the GPU rule does not apply. *why says what does not fit, in one phrase.
Status check_launch(const LaunchOptions& o, bool rank_per_gpu, std::string* why);

// Starts options.ranks processes under an embedded PMIx server and waits for them. If one dies
// (signal, non-zero exit, exit without PMIx_Finalize) or aborts, the others are told through a PMIx
// event, then stopped (SIGTERM, SIGKILL after WEFT_LAUNCH_KILL_GRACE); SIGINT/SIGTERM to weftrun
// stops them too. Returns the exit code weftrun should exit with: 0 only when every rank exited 0;
// 2 (and one line naming the command) when check_launch refuses the options, before anything starts.
int launch_ranks(const LaunchOptions& options);

// The CUDA_VISIBLE_DEVICES value for emulated node `node` of `nodes` when `gpus` are visible
// (`visible` is the launcher's CUDA_VISIBLE_DEVICES, empty if unset); "" when GPUs are not split.
std::string gpu_slice_for_node(int node, int nodes, int gpus, const std::string& visible);

}  // namespace weft::launcher

namespace weft::launcher {

// This process's command line without argv[0] (from /proc/self/cmdline): the ranks are started
// with exactly the arguments the user gave weftrun.
std::vector<std::string> own_args();

// Ranks to start when -n is not given: one per visible GPU (at least one), and at least one per
// emulated node.
int default_rank_count(int gpus, int nodes);

}  // namespace weft::launcher
