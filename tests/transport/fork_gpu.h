// GPU tests whose ranks are forked processes (local_bootstrap.h): how many GPUs the ranks may use,
// probed before CUDA is initialised in the parent, the skip when there are none, and one-line
// returns from a rank body (`boot` is the body's ForkBootstrap) that report what failed.
#pragma once

#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "base/status.h"

namespace weft::testing {

// Visible CUDA devices (at most 100), counted in a child: CUDA must not be initialised in the parent
// before the ranks fork. -1 when `hopper_only` and device 0 is not compute capability 9.0.
inline int fork_probe_gpus(bool hopper_only) {
  pid_t pid = fork();
  if (pid == 0) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    cudaDeviceProp prop{};
    if (hopper_only && n > 0 && (cudaGetDeviceProperties(&prop, 0) != cudaSuccess || prop.major != 9)) n = -1;
    _exit(n < 0 ? 101 : (n > 100 ? 100 : n));
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? (WEXITSTATUS(st) == 101 ? -1 : WEXITSTATUS(st)) : 0;
}

// The GPU count for `ranks` forked ranks, or exit 77 (CTest's "skipped") after saying why; with fewer
// GPUs than ranks, says that ranks share them.
inline int fork_gpus_or_skip(int ranks, bool hopper_only) {
  const int ngpu = fork_probe_gpus(hopper_only);
  if (ngpu <= 0) {
    printf("SKIPPED: %s\n", ngpu < 0 ? "needs a Hopper GPU (compute capability 9.0)" : "no CUDA device visible");
    fflush(stdout);
    _exit(77);
  }
  if (ngpu < ranks) printf("NOTE: %d GPU(s) for %d ranks: ranks share GPUs (the protocol, not NVLink)\n", ngpu, ranks);
  return ngpu;
}

}  // namespace weft::testing

// In a rank body: a failed CUDA call or Status ends the rank with its text in the report.
#define FORK_CUDA_TRY(call)                                                                            \
  do {                                                                                                 \
    cudaError_t e_ = (call);                                                                           \
    if (e_ != cudaSuccess) return boot.report(std::string(#call) + ": " + cudaGetErrorString(e_)), 20; \
  } while (0)
#define FORK_TRY(call, code)                                                                                  \
  do {                                                                                                        \
    const ::weft::Status s_ = (call);                                                                         \
    if (s_ != ::weft::Status::kOk) return boot.report(std::string(#call) + ": " + weft::to_string(s_)), code; \
  } while (0)
