// Out-of-band liveness: a TCP ring of heartbeats that names a dead or stalled rank when the launcher
// does not (Slurm's PMIx plugin delivers no process-termination events).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "bootstrap/bootstrap.h"

namespace weft::bootstrap {

// Each rank listens on the addresses the socket transport would publish (WEFT_SOCKET_IFNAME, else
// every interface that is up, loopback last), and keeps two connections: to rank+1 and from rank-1.
// A thread sends a heartbeat on both every second and watches both:
//   - end of stream without a goodbye: the neighbour died (killed, crashed);
//   - no heartbeat for `timeout_s`: the neighbour is stalled (stopped, hung, its host unreachable);
//   - a failure notice: some rank further along the ring detected one; it is passed on.
// The first failure is reported once through `on_failure(rank, why)` and sent both ways round the
// ring, so every rank learns of it even though the ring is cut at the failed rank. If the process is
// still running `grace_s` later, `on_give_up(rank, why)` runs on the thread (it ends the process).
class Liveness {
 public:
  struct Options {
    double heartbeat_s = 1.0;
    double timeout_s = 15.0;
    double grace_s = 5.0;
    std::string ifname;  // "" = every interface that is up
  };
  using FailFn = std::function<void(int rank, const std::string& why)>;

  // Collective: one allgather of every rank's listening addresses through `boot`, then connects to
  // rank+1 (bounded by timeout_s). Needs 2 or more ranks.
  static Status start(Bootstrap& boot, const Options& options, FailFn on_failure, FailFn on_give_up,
                      std::unique_ptr<Liveness>* out);
  // Says goodbye on both connections (this rank leaves the job; neighbours stop watching it).
  ~Liveness();

  // The first failure seen (another rank's, or this rank's own announcement): false when none.
  bool failure(int* rank, std::string* why);

  // Tells both neighbours this rank leaves the job (unless a failure was seen); the destructor and
  // exit() call it.
  void goodbye();

  // This rank failed (it is about to abort): tell every rank, naming it.
  void announce_own_failure(const std::string& why);

  Liveness(const Liveness&) = delete;
  Liveness& operator=(const Liveness&) = delete;

 private:
  struct Link;
  Liveness() = default;
  void run();
  void fail(int rank, const std::string& why, int from_link);
  void send_all(uint32_t kind, int subject, const std::string& text, int except_link);

  int rank_ = 0, size_ = 1;
  uint64_t token_ = 0;
  Options opt_;
  FailFn on_failure_, on_give_up_;
  std::vector<int> listen_fds_;  // one per published address, one port
  int wake_[2] = {-1, -1};
  std::unique_ptr<Link> links_[2];  // 0: to rank+1 (we connected), 1: from rank-1 (accepted)
  std::mutex mu_;                   // guards sends and the failure record
  int failed_rank_ = -1;
  std::string failed_why_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace weft::bootstrap
