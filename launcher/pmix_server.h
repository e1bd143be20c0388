// weftrun's embedded PMIx server: one job of N local ranks, optionally split into emulated nodes.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "base/status.h"

namespace weft::launcher {

// Which rank runs on which (emulated) node. Ranks are split into nodes in blocks, as Slurm's
// --ntasks-per-node would place them; node k's hostname is the real one when there is one node,
// "<host>-node<k>" otherwise, so PMIx reports a distinct hostname and node id per emulated node.
struct JobLayout {
  int ranks = 1;
  int nodes = 1;
  std::vector<int> node_of;        // [rank]
  std::vector<int> local_rank_of;  // [rank]
  std::vector<int> local_size_of;  // [node]
  std::vector<std::string> hostname_of_node;
};
Status make_layout(int ranks, int nodes, const std::string& real_host, JobLayout* out);

// A rank's PMIx_Abort, queued by the upcall; the launcher acts on it from its own loop (stopping
// ranks from inside the upcall crashed PMIx_server_finalize).
struct AbortRequest {
  int rank = -1;
  int status = 0;
  std::string message;
};

class EmbeddedServer {
 public:
  // PMIx_server_init with a private temporary directory, then the job's namespace (node and proc
  // maps, per-rank local rank / node id / hostname).
  // `tcp_if` (not empty): the server listens only on that interface (the bridge of emulated hosts in
  // network namespaces, netns_hosts.h), so ranks in other namespaces reach it through the network.
  static Status start(const JobLayout& layout, std::unique_ptr<EmbeddedServer>* out, const std::string& tcp_if = "");
  ~EmbeddedServer();  // deregisters, PMIx_server_finalize, removes the temporary directory

  // register_client + setup_fork: the environment rank `rank` must be started with (`base` plus
  // the PMIX_* variables that point it at this server).
  Status client_env(int rank, const std::vector<std::string>& base, std::vector<std::string>* env);

  // Readable when upcall work is queued; the launcher's loop polls it and calls run_pending().
  int wake_fd() const { return pipe_[0]; }
  // Replies to queued upcalls (fence, finalize, abort acknowledgements) from the caller's thread.
  void run_pending();
  bool take_abort(AbortRequest* out);
  bool finalized(int rank);
  // Tells every rank that `rank` is gone (PMIX_PROC_TERMINATED with the affected proc and `why`),
  // so peers waiting in a fence end with a message naming it instead of timing out.
  void notify_rank_failed(int rank, int exit_code, const std::string& why);

  const std::string& nspace() const { return nspace_; }
  const std::string& tmpdir() const { return tmpdir_; }

  // Upcall side (called on libpmix's thread through the module's C callbacks).
  void post(std::function<void()> work);
  void record_abort(AbortRequest a);
  void record_finalized(int rank);

 private:
  EmbeddedServer() = default;
  Status register_job();

  JobLayout layout_;
  std::string nspace_;
  std::string tmpdir_;
  bool initialized_ = false;
  bool nspace_registered_ = false;
  std::vector<bool> client_registered_;
  int pipe_[2] = {-1, -1};
  std::mutex mu_;
  std::vector<std::function<void()>> work_;
  std::vector<AbortRequest> aborts_;
  std::atomic<int> notices_in_flight_{0};  // PMIx_Notify_event calls whose callback has not come
  std::set<int> finalized_;
};

}  // namespace weft::launcher
