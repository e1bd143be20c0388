// Test-only bootstraps: ranks as threads of one process, or as forked processes exchanging blobs over socketpairs.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bootstrap/bootstrap.h"

namespace weft::testing {

// Rank r of n lives on node r / ranks_per_node (the emulated-node split).
bootstrap::RankInfo make_rank_info(int rank, int size, int ranks_per_node);

// --- Threads -----------------------------------------------------------------------------------
// Runs body(rank's bootstrap) on n threads; returns each rank's Status.
std::vector<Status> run_threads(int n, int ranks_per_node, const std::function<Status(bootstrap::Bootstrap&)>& body,
                                double timeout_s = 60);

// --- Processes ---------------------------------------------------------------------------------
// The child side: allgather/barrier go through the parent, which answers once every rank asked or
// reports a rank that exited first (kPeerFailed naming it).
class ForkBootstrap : public bootstrap::Bootstrap {
 public:
  ForkBootstrap(int fd, const bootstrap::RankInfo& info, double timeout_s)
      : fd_(fd), info_(info), timeout_s_(timeout_s) {}
  const bootstrap::RankInfo& info() const override { return info_; }
  Status allgather(const std::string& key, const bootstrap::Blob& mine, std::vector<bootstrap::Blob>* all) override;
  Status barrier(const std::string& tag) override;
  void abort(const std::string& why) override;
  // Hands a line of text to the parent (ForkResult::report), e.g. the error a rank saw.
  void report(const std::string& text);

 private:
  int fd_;
  bootstrap::RankInfo info_;
  double timeout_s_;
};

struct ForkResult {
  int rank = 0;
  pid_t pid = 0;
  bool exited = false;  // normal exit (exit_code valid)
  int exit_code = -1;
  int term_signal = 0;     // killed by this signal
  bool timed_out = false;  // still running at the deadline: killed by the harness
  double seconds = 0;      // from start to exit
  std::string report;
};

// Forks n ranks running body (its return value is the exit code), serves their bootstrap calls,
// and reaps them; every child is SIGKILLed at timeout_s.
std::vector<ForkResult> run_forked(int n, int ranks_per_node, const std::function<int(ForkBootstrap&)>& body,
                                   double timeout_s);

}  // namespace weft::testing
