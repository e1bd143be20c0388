// The receive side of signals sent as SENDs: CQ and buffers, posting, and checked completions.
#include "transport/ibverbs_signal_rx.h"

#include <errno.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "transport/ibverbs_sizes.h"

namespace weft::transport::ibv {

Status SignalReceiver::open(ibv_context* ctx, ibv_pd* pd, int peers, int depth, int max_cqe, std::string* why) {
  peers_ = peers;
  depth_ = depth;
  const uint64_t cqe = std::min<uint64_t>(max_cqe, recv_cq_entries(peers, depth));
  cq_ = api_.create_cq(ctx, static_cast<int>(cqe), nullptr, nullptr, 0);
  if (!cq_) {
    *why = std::string("ibv_create_cq(signal receives): ") + strerror(errno);
    return Status::kSystemError;
  }
  bufs_.assign(recv_buffer_bytes(peers, depth) / sizeof(SignalRecord), SignalRecord{});
  mr_ = api_.reg_mr(pd, bufs_.data(), bufs_.size() * sizeof(SignalRecord), IBV_ACCESS_LOCAL_WRITE);
  if (!mr_) {
    *why = std::string("ibv_reg_mr(signal receives): ") + strerror(errno);
    return Status::kSystemError;
  }
  return Status::kOk;
}

Status SignalReceiver::post(ibv_qp* qp, int slot, uint32_t index, int peer, std::string* why) {
  SignalRecord* buf = &bufs_[size_t(slot) * depth_ + index];
  ibv_sge sge{reinterpret_cast<uint64_t>(buf), sizeof *buf, mr_->lkey};
  ibv_recv_wr wr{};
  wr.wr_id = make_recv_id(slot, index);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  if (int rc = api_.post_recv(qp, &wr, &bad)) {
    *why = "ibv_post_recv for signals from rank " + std::to_string(peer) + ": " + strerror(rc);
    return Status::kSystemError;
  }
  return Status::kOk;
}

Status SignalReceiver::poll(const std::vector<int>& peer_list, uint64_t heap_bytes, std::vector<Arrived>* out,
                            std::string* why) {
  ibv_wc wc[64];
  const int n = api_.poll_cq(cq_, 64, wc);
  if (n < 0) {
    *why = "ibv_poll_cq(signal receives) failed";
    return Status::kSystemError;
  }
  for (int j = 0; j < n; ++j) {
    const uint64_t id = wc[j].wr_id;
    const int slot = recv_slot(id);
    const uint32_t index = recv_index(id);
    if (!(id & kRecvTag) || slot >= peers_ || slot >= static_cast<int>(peer_list.size()) ||
        index >= static_cast<uint32_t>(depth_)) {
      *why = "a receive completion names no receive this rank posted";
      return Status::kProtocolError;
    }
    const int peer = peer_list[slot];
    if (wc[j].status != IBV_WC_SUCCESS) {
      char hex[16];
      snprintf(hex, sizeof hex, "%x", wc[j].vendor_err);
      *why = "receiving a signal from rank " + std::to_string(peer) + " failed: " + api_.wc_status_str(wc[j].status) +
             " (status " + std::to_string(wc[j].status) + ", vendor error 0x" + hex + ")";
      return Status::kPeerFailed;
    }
    Arrived a;
    a.slot = slot;
    a.index = index;
    a.record = bufs_[size_t(slot) * depth_ + index];
    std::string bad;
    if (!signal_record_ok(wc[j].byte_len, a.record, heap_bytes, &bad)) {
      *why = "rank " + std::to_string(peer) + " sent " + bad;
      return Status::kProtocolError;
    }
    out->push_back(a);
  }
  return Status::kOk;
}

void SignalReceiver::release() {
  if (mr_) api_.dereg_mr(mr_), mr_ = nullptr;
  if (cq_) api_.destroy_cq(cq_), cq_ = nullptr;
}

}  // namespace weft::transport::ibv
