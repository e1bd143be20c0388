// ibverbs backend logic that needs no device: work-request plans, selective signalling, completion ledger.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "base/status.h"
#include "transport/ibverbs_sizes.h"

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
  bool send = false;         // IBV_WR_SEND (a SignalRecord to the peer's receives), not an RDMA WRITE
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

// A signal for a receiver that applies it itself (its heap is on a GPU that needs a flush between the
// NIC's data and the flag): a 16-byte inline SEND of this record to one of its posted receives. RC
// delivers it after every WRITE posted before it on the QP; the receiving proxy flushes, then stores
// `value` at `flag_offset` in its own heap.
struct SignalRecord {
  uint64_t flag_offset = 0;
  uint64_t value = 0;
};
static_assert(sizeof(SignalRecord) == kSignalRecordBytes, "SignalRecord is 16 bytes on the wire");
// As plan_signal, but the record staged at `record_addr` goes as a SEND.
WrPlan plan_signal_send(int peer, uint64_t record_addr, uint32_t lkey, bool fence, bool need_completion,
                        uint64_t user_wr_id, uint64_t* next_seq, uint64_t in_flight, SignalPolicy* policy);
// A received record is applied only if it is whole and names an aligned flag inside the heap.
bool signal_record_ok(uint32_t byte_len, const SignalRecord& r, uint64_t heap_bytes, std::string* why);

// Who sets a signal on a rank's heap, decided once per transport from the heap and its GPU:
// the NIC (a WRITE straight into the flag word), or the rank's own proxy after a flush.
enum class SignalApply { kNicWrite, kProxyAfterFlush };
// kProxyAfterFlush for a device heap whose GPU orders RDMA writes below "owner" (attribute 0..99);
// a host heap, a GPU at owner or above, or a device heap whose ordering was not stated (-1): kNicWrite.
// `force_off` (tests only) keeps kNicWrite. *why says which and why, with the attribute value.
SignalApply choose_signal_apply(bool device_heap, int rdma_writes_ordering, bool force_off, std::string* why);

// Receive work-request ids: the peer's slot in the peer set and the receive buffer's index.
constexpr uint64_t kRecvTag = 1ull << 63;
inline uint64_t make_recv_id(int slot, uint32_t index) { return kRecvTag | (uint64_t(slot) << 32) | index; }
inline int recv_slot(uint64_t id) { return static_cast<int>((id >> 32) & 0x7fffffff); }
inline uint32_t recv_index(uint64_t id) { return static_cast<uint32_t>(id); }

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

// --- GID choice (RoCE) -----------------------------------------------------------------------------
// One GID table entry as ibv_query_gid_ex / ibv_query_gid_table report it.
struct GidCandidate {
  uint32_t index = 0;
  uint32_t port = 1;
  uint32_t type = 0;          // enum ibv_gid_type: 0 IB, 1 RoCE v1, 2 RoCE v2
  uint32_t ndev_ifindex = 0;  // the netdev the GID belongs to (0: none)
  uint8_t raw[16] = {};
};
constexpr uint32_t kGidTypeRoceV2 = 2;
// The GID a RoCE port's QPs use: on `port`, a RoCE v2 entry bound to a netdev (index 0 is the
// link-local RoCE v1 GID on most NICs, and v1 is not routable), preferring an IPv4-mapped address
// (::ffff:a.b.c.d), then a global IPv6 one, then link-local (fe80::). `forced` >= 0 (WEFT_IB_GID_INDEX)
// takes that index if it exists on the port. Returns the index into `table`, -1 when none fits;
// *why says what was chosen or why nothing was.
int choose_gid(const std::vector<GidCandidate>& table, uint32_t port, int forced, std::string* why);
// "::ffff:10.80.100.45" / "fe80::ba59:9fff:fee4:2cfa"-style text of a raw GID, for logs.
std::string gid_text(const uint8_t raw[16]);

// --- GPU memory as dma-buf ----------------------------------------------------------------------
// cuMemGetHandleForAddressRange exports whole host pages: the heap [base, base + bytes) is exported
// as the page-aligned range around it, and ibv_reg_dmabuf_mr registers `bytes` at `offset` into that
// dma-buf (with iova = base, so remote addresses stay the heap's virtual addresses).
struct DmabufRange {
  uint64_t aligned_base = 0;   // base rounded down to a page
  uint64_t aligned_bytes = 0;  // up to the page after base + bytes
  uint64_t offset = 0;         // base - aligned_base: the offset argument of ibv_reg_dmabuf_mr
};
// page must be a power of two; bytes > 0.
DmabufRange dmabuf_range(uint64_t base, uint64_t bytes, uint64_t page);

// Text for a failed work completion: the status string plus what it usually means here.
std::string describe_wc_failure(const char* status_str, int status, uint32_t vendor_err, int peer);

}  // namespace weft::transport::ibv
