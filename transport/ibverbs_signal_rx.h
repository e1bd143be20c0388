// The receive side of signals sent as SENDs (ibverbs, a GPU heap below "owner" RDMA write ordering):
// receive CQ, 16-byte buffers, receives posted per QP and reposted as each signal is applied.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "transport/ibverbs_api.h"
#include "transport/ibverbs_plan.h"

namespace weft::transport::ibv {

// One per backend. Buffers are indexed (peer slot, receive index); a receive's wr_id names both
// (make_recv_id). Every failure leaves *why naming the call or the peer and returns its Status.
class SignalReceiver {
 public:
  struct Arrived {
    int slot = 0;  // the sender's place in the peer set
    uint32_t index = 0;
    SignalRecord record;
  };
  explicit SignalReceiver(const Api& api) : api_(api) {}
  ~SignalReceiver() { release(); }
  SignalReceiver(const SignalReceiver&) = delete;
  SignalReceiver& operator=(const SignalReceiver&) = delete;

  // The CQ (up to max_cqe entries) and `depth` registered buffers for each of `peers` QPs.
  Status open(ibv_context* ctx, ibv_pd* pd, int peers, int depth, int max_cqe, std::string* why);
  bool is_open() const { return cq_ != nullptr; }
  ibv_cq* cq() const { return cq_; }
  int depth() const { return depth_; }
  // Posts receive `index` of the QP at `slot` (every index once before the peer may send).
  Status post(ibv_qp* qp, int slot, uint32_t index, int peer, std::string* why);
  // Up to 64 arrived signals, in completion order, each whole and naming an aligned flag inside a
  // heap of `heap_bytes`; `peer_list` maps slots to ranks for the messages.
  Status poll(const std::vector<int>& peer_list, uint64_t heap_bytes, std::vector<Arrived>* out, std::string* why);
  // Deregisters the buffers and destroys the CQ (after the QPs that use it are gone).
  void release();

 private:
  const Api& api_;
  ibv_cq* cq_ = nullptr;
  ibv_mr* mr_ = nullptr;
  std::vector<SignalRecord> bufs_;
  int peers_ = 0, depth_ = 0;
};

}  // namespace weft::transport::ibv
