// Test shim net backend: ranks as threads of one process, writes not ordered by a fence delayed and applied out of
// order, and a modelled cost charged per fence and per proxy stall (signal modes compared without a NIC).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <vector>

#include "transport/net_backend.h"

namespace weft::testing {

// The ranks' heaps, shared by the shims of one test (connect looks a peer up here).
class ReorderFabric {
 public:
  explicit ReorderFabric(int size) : regions_(size) {}
  void publish(int rank, const transport::Region& r);
  transport::Region lookup(int rank);

 private:
  std::mutex mutex_;
  std::vector<transport::Region> regions_;
};

// What the shim saw; read once the proxy has stopped.
struct ReorderStats {
  uint64_t puts = 0, signals = 0, bytes = 0;
  uint64_t fences = 0;     // posts that carried a fence
  uint64_t overtakes = 0;  // writes applied while a write posted earlier to the same peer was still pending
};

// The modelled network: a fence drains the pipe to that peer (one round trip); a proxy stall (serial
// mode waiting for put completions, full queues, flushes) costs a round trip plus the proxy's reaction.
struct ReorderCost {
  double gbytes_per_s = 25;  // wire rate
  double op_s = 0.3e-6;      // per write posted
  double fence_s = 3e-6;
  double stall_s = 5e-6;
};
double modelled_seconds(const ReorderStats& s, uint64_t proxy_stalls, const ReorderCost& c);

// Fence semantics (FI_FENCE): a fenced write, and every write posted after it, wait until every
// write posted before it to the same peer has been applied. Between fences, writes are applied in a
// random order after a random number of polls (0..max_delay_polls). A write completes when applied.
class ReorderBackend final : public transport::NetBackend {
 public:
  ReorderBackend(const transport::BackendConfig& cfg, std::shared_ptr<ReorderFabric> fabric, uint64_t seed,
                 int max_delay_polls = 6);
  const char* name() const override { return "reorder"; }
  Status register_region(const transport::Region& region) override;
  Status local_info(transport::PeerInfo* out) override;
  Status connect(int peer, const transport::PeerInfo& info) override;
  bool can_post(int peer) const override { return pending_[peer].size() < 256; }
  Status post_put(int peer, uint64_t local_offset, uint64_t remote_offset, uint64_t bytes, transport::PostFlags flags,
                  uint64_t wr_id) override;
  Status post_signal(int peer, uint64_t flag_offset, uint64_t value, transport::PostFlags flags,
                     uint64_t wr_id) override;
  Status poll(std::vector<transport::Completion>* done) override;
  void wait_activity(double max_s) override;
  Status close(const std::string& failure) override;
  std::string error_message() const override { return error_; }
  std::string ordering() const override { return "fences only (reordering shim)"; }
  const ReorderStats& stats() const { return stats_; }

 private:
  struct Write {
    bool is_put;
    uint64_t src, dst, bytes_or_value, wr_id;
    uint64_t epoch;       // fences posted to this peer up to and including this write
    uint64_t seq;         // post order
    uint64_t ready_poll;  // not applied before this poll
  };
  Status fail(Status s, const std::string& what);
  void apply(int peer, const Write& w);

  transport::BackendConfig cfg_;
  std::shared_ptr<ReorderFabric> fabric_;
  std::mt19937_64 rng_;
  int max_delay_;
  transport::Region region_;
  std::vector<transport::Region> peers_;
  std::vector<std::deque<Write>> pending_;
  std::vector<uint64_t> epoch_;
  uint64_t seq_ = 0, polls_ = 0;
  ReorderStats stats_;
  Status status_ = Status::kOk;
  std::string error_;
};

}  // namespace weft::testing
