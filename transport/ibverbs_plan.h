// ibverbs backend logic that needs no device: work-request plans, selective signalling, completion ledger.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "base/status.h"

namespace weft::transport::ibv {

// One RDMA WRITE as the backend will post it (converted to ibv_send_wr in ibverbs_backend.cpp).
struct WrPlan {
  uint64_t wr_id = 0;  // internal id: (peer << 40) | per-QP sequence
  uint64_t local_addr = 0;
  uint32_t length = 0;
  uint32_t lkey = 0;
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  bool inline_data = false;  // signals: the 8-byte value is copied into the WQE at post time
  bool fence = false;        // IBV_SEND_FENCE
  bool signaled = false;     // IBV_SEND_SIGNALED: produces a CQE
  bool report = false;       // the last WR of a post: its retirement completes the caller's wr_id
  uint64_t user_wr_id = 0;
};

constexpr uint64_t kMaxWriteBytes = 1ull << 30;  // well under the 2^31 limit of one WRITE
constexpr uint32_t kMaxInlineBytes = 64;
constexpr int kPeerShift = 40;

inline uint64_t make_wr_id(int peer, uint64_t seq) {
  return (uint64_t(peer) << kPeerShift) | (seq & ((1ull << kPeerShift) - 1));
}
inline int wr_peer(uint64_t wr_id) { return static_cast<int>(wr_id >> kPeerShift); }
inline uint64_t wr_seq(uint64_t wr_id) { return wr_id & ((1ull << kPeerShift) - 1); }

// Selective signalling for one QP: one CQE per `interval` WRs, plus every WR someone waits for,
// plus the WR that brings the send queue to its limit (otherwise the queue could fill with
// unsignalled WRs and never report room again).
class SignalPolicy {
 public:
  SignalPolicy(int interval, int send_queue_depth) : interval_(interval), depth_(send_queue_depth) {}
  bool choose(bool need_completion, uint64_t in_flight_after_post);

 private:
  int interval_, depth_;
  int since_ = 0;
};

// A put of `bytes` as WRITEs of at most kMaxWriteBytes; only the last reports the caller's wr_id.
// `next_seq` is the QP's sequence counter, advanced by the number of WRs.
std::vector<WrPlan> plan_put(int peer, uint64_t local_base, uint32_t lkey, uint64_t local_offset, uint64_t remote_base,
                             uint32_t rkey, uint64_t remote_offset, uint64_t bytes, bool need_completion,
                             uint64_t user_wr_id, uint64_t* next_seq, uint64_t in_flight, SignalPolicy* policy);
// A signal: an inline 8-byte WRITE of the value staged at `value_addr`, fenced if asked.
WrPlan plan_signal(int peer, uint64_t value_addr, uint32_t lkey, uint64_t remote_base, uint32_t rkey,
                   uint64_t flag_offset, bool fence, bool need_completion, uint64_t user_wr_id, uint64_t* next_seq,
                   uint64_t in_flight, SignalPolicy* policy);

// A zero-length, signalled WRITE: posted when a QP's newest WR is unsignalled and the proxy has
// stopped posting to that peer, so the unsignalled tail still produces a completion.
WrPlan plan_probe(int peer, uint64_t* next_seq);

// RC queue pairs complete in order: a signalled WR's CQE retires it and every unsignalled WR
// posted before it. The ledger turns CQEs into the caller's completions.
class CompletionLedger {
 public:
  void posted(const WrPlan& wr);
  // CQE for internal id `wr_id`: appends the user ids of retired posts. kProtocolError if the id
  // was never posted here or is not signalled (a bug or a corrupted CQ).
  Status retire(uint64_t wr_id, std::vector<uint64_t>* user_ids, std::string* why);
  uint64_t in_flight() const { return queue_.size(); }
  // True when the newest WR in flight is unsignalled: nothing would ever report it without a probe.
  bool tail_unsignaled() const { return !queue_.empty() && !queue_.back().signaled; }

 private:
  struct Entry {
    uint64_t seq;
    bool signaled;
    bool report;
    uint64_t user_wr_id;
  };
  std::deque<Entry> queue_;
};

// Text for a failed work completion: the status string plus what it usually means here.
std::string describe_wc_failure(const char* status_str, int status, uint32_t vendor_err, int peer);

}  // namespace weft::transport::ibv
