// The ibverbs backend's queue depths and buffer sizes, and the CQ depths they give: one place for the
// backend (ibverbs_backend.cpp, ibverbs_signal_rx.cpp) and the resource report (peer_set.cpp), so the
// report counts what the wiring asks for. Verbs-free; the device may cap each depth at run time
// (max_qp_wr, max_cqe), so these are the most a channel asks for.
#pragma once

#include <algorithm>
#include <cstdint>

namespace weft::transport::ibv {

constexpr int kSendQueueDepth = 1024;  // send WRs per QP
constexpr int kSendCqFloor = 4096;     // the send CQ never asks for fewer entries
constexpr int kRecvDepth = 128;        // receives posted per QP for signals sent as SENDs
constexpr int kRecvCqFloor = 64;       // the receive CQ never asks for fewer entries
constexpr int kCqSlack = 64;           // entries above every queue full of signalled WRs
// A signal record (flag offset, value): the staging word of every signal a channel posts (one per peer,
// a rank without peers still registers one) and each receive buffer of a SEND signal.
constexpr uint64_t kSignalRecordBytes = 16;

// The send CQ of a channel with `peers` QPs of `sq_depth` send WRs: deep enough for every send queue
// full of signalled WRs (serial mode).
constexpr uint64_t send_cq_entries(uint64_t peers, uint64_t sq_depth) {
  return std::max<uint64_t>(kSendCqFloor, peers * sq_depth + kCqSlack);
}
// The receive CQ of a channel whose signals arrive as SENDs: every posted receive completed at once.
constexpr uint64_t recv_cq_entries(uint64_t peers, uint64_t depth) {
  return std::max<uint64_t>(kRecvCqFloor, peers * depth + kCqSlack);
}
// Bytes registered for signal staging (one record per peer) and for receive buffers (one per receive).
constexpr uint64_t signal_staging_bytes(uint64_t peers) { return std::max<uint64_t>(1, peers) * kSignalRecordBytes; }
constexpr uint64_t recv_buffer_bytes(uint64_t peers, uint64_t depth) {
  return std::max<uint64_t>(1, peers * depth) * kSignalRecordBytes;
}

}  // namespace weft::transport::ibv
