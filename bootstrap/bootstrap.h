// How a rank learns who it is and exchanges small blobs with its peers (PMIx behind it in production).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace weft::bootstrap {

using Blob = std::vector<uint8_t>;

struct RankInfo {
  int rank = 0;
  int size = 1;
  int local_rank = 0;  // index among the ranks of this node
  int local_size = 1;
  int node = 0;  // node index, 0..num_nodes-1 (emulated nodes count as nodes)
  int num_nodes = 1;
  std::string hostname;  // as the launcher reports it (differs per emulated node)
  std::string nspace;    // job namespace (PMIx), for messages
};

// Every method is collective where it says so, bounded by WEFT_BOOTSTRAP_TIMEOUT, and on timeout
// fails with a message naming the ranks that did not arrive.
class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  virtual const RankInfo& info() const = 0;
  // Collective: every rank contributes `mine` under `key`; `all` receives every rank's blob in rank
  // order (all[info().rank] == mine). Keys must be unique per exchange within a job.
  virtual Status allgather(const std::string& key, const Blob& mine, std::vector<Blob>* all) = 0;
  // Collective like allgather (every rank publishes `mine` under `key`), but this rank reads only the
  // blobs of the ranks in `from`: *some holds one entry per rank, empty except those and its own.
  // A rank's exchange with its peer set (transport/peer_set.h): O(peers) blobs read, not O(world).
  // Default: allgather.
  virtual Status allgather_from(const std::string& key, const Blob& mine, const std::vector<int>& from,
                                std::vector<Blob>* some) {
    (void)from;
    return allgather(key, mine, some);
  }
  // Collective: returns once every rank has entered the barrier with the same tag.
  virtual Status barrier(const std::string& tag) = 0;
  // Tells the launcher this rank failed (it stops the job); `why` reaches the user.
  virtual void abort(const std::string& why) = 0;
  // A peer's failure the launcher or the liveness ring reported (an abort, a crash, a stall): true
  // and its rank in the whole job (-2: the launcher itself is gone; -3: a peer the report did not name) and reason,
  // else false. Cheap; never waits.
  virtual bool peer_failure(int* rank, std::string* why) const {
    (void)rank;
    (void)why;
    return false;
  }

  // This object's next exchange number, 0 first: every rank makes the same exchanges over its
  // bootstrap in the same order, so numbered keys agree across ranks. Counted per object, not per
  // address: a bootstrap made where an earlier one lived (a second weft::Context) starts at 0 on
  // every rank, where a count kept by address continued on some ranks and restarted on others.
  int next_exchange_id() { return exchange_seq_.fetch_add(1); }

 private:
  std::atomic<int> exchange_seq_{0};
};

}  // namespace weft::bootstrap
