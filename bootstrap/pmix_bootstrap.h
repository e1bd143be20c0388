// The PMIx implementation of Bootstrap: a rank's identity, blob exchange and barriers, all bounded.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "bootstrap/group_bootstrap.h"
#include "bootstrap/liveness.h"
#include "bootstrap/node_exchange.h"

namespace weft::bootstrap {

// Where a put blob is visible: every rank, only ranks on this node, or only ranks on other nodes.
enum class Scope { kGlobal, kLocal, kRemote };

// True when this process was started by a PMIx server (weftrun's own, slurmstepd, mpirun): the
// server exported PMIX_NAMESPACE/PMIX_RANK (and a PMIX_SERVER_URI*) into our environment.
bool started_under_pmix();

class PmixBootstrap final : public Bootstrap, public SubsetExchange {
 public:
  // PMIx_Init plus the identity queries, bounded by WEFT_BOOTSTRAP_TIMEOUT. On failure the message
  // says how to launch (weftrun, srun --mpi=pmix, mpirun).
  static Status connect(std::unique_ptr<PmixBootstrap>* out);
  ~PmixBootstrap() override;  // PMIx_Finalize

  const RankInfo& info() const override { return info_; }
  Status allgather(const std::string& key, const Blob& mine, std::vector<Blob>* all) override;
  Status allgather_from(const std::string& key, const Blob& mine, const std::vector<int>& from,
                        std::vector<Blob>* some) override;
  Status barrier(const std::string& tag) override;
  void abort(const std::string& why) override;
  // A rank group's exchange (group_bootstrap.h): put under "<scope>.<key>", one fence without data
  // (PMIx fences the whole job), then a get from each member only: O(members) blobs per rank.
  Status subset_allgather(const std::string& scope, const std::string& key, const std::vector<int>& members,
                          const Blob& mine, std::vector<Blob>* all) override;
  // A job-wide fence: every group enters its barrier at the same point, and the fence spans the job anyway.
  Status subset_barrier(const std::string& scope, const std::string& tag, const std::vector<int>& members) override;

  // Two-phase building blocks (see bootstrap/wiring.h): put any number of blobs, then fence once,
  // then get each peer's. `key` is namespaced ("weft.<key>") and framed with its size.
  Status put(const std::string& key, const Blob& blob, Scope scope);
  // Commit + fence over every rank; `collect` makes the fence carry the put data (one round trip
  // instead of one direct-modex request per get). Names the ranks that did not arrive on timeout.
  Status fence(const std::string& tag, bool collect);
  Status get(int peer, const std::string& key, Blob* out);

  // Scoped allgather: entries of peers outside `scope` are left empty.
  Status decode_entry(int peer, const std::string& key, const Blob& sealed, Blob* out) const;
  // `from` (optional): read only these ranks' entries as well.
  Status allgather_scoped(const std::string& key, const Blob& mine, Scope scope, std::vector<Blob>* all,
                          const std::vector<int>* from = nullptr);

  double timeout_s() const { return timeout_s_; }
  // Set by the PMIx event handler when the launcher reports a dead peer; waits end early with it.
  void note_peer_failed(int rank, const std::string& why);
  bool peer_failure(int* rank, std::string* why) const override;

  // Whether the heartbeat ring (liveness.h) runs: WEFT_LIVENESS=on, or auto under a launcher that
  // reports no dead ranks (not weftrun's own server, not mpirun).
  bool liveness_on() const { return liveness_ != nullptr; }

  struct State;  // shared with libpmix's callback threads (opaque)

 private:
  PmixBootstrap() = default;
  Status query_identity();
  Status start_liveness();
  Status wait_peer_failure(const std::string& what) const;
  std::string missing_ranks(uint64_t seq);
  // `key` as this connection names it in PMIx: "weft." + key_prefix_ + key.
  std::string pmix_key(const std::string& key) const { return "weft." + key_prefix_ + key; }

  RankInfo info_;
  double timeout_s_ = 60;
  uint64_t fence_seq_ = 0;
  std::string key_prefix_;    // "" on a process's first connection, "c<N>." on its N-th after that
  bool initialized_ = false;  // PMIx_Init succeeded: the destructor finalizes
  std::shared_ptr<State> state_;
  NodeExchange node_;  // same-host peers' blobs (node_exchange.h)
  bool node_ready_ = false;
  bool node_tried_ = false;
  std::unique_ptr<Liveness> liveness_;  // declared last: its thread stops before the rest goes
};

}  // namespace weft::bootstrap
