// ibverbs net backend: RC QP per peer, heap registered once, RDMA WRITE data, inline fenced WRITE signals.
// Not yet run on a NIC (none exists on the machines weft is developed on); the logic that needs no
// device is in ibverbs_plan.cpp and unit-tested, the rest follows the verbs API and is reviewed.
#include <errno.h>
#include <infiniband/verbs.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "base/log.h"
#include "transport/ibverbs_plan.h"
#include "transport/ibverbs_wr.h"
#include "transport/net_backend.h"

namespace weft::transport {
namespace {

constexpr int kSendQueueDepth = 1024;
constexpr int kCqDepth = 4096;
constexpr int kSignalInterval = 32;
constexpr uint8_t kPort = 1;

class IbvBackend final : public NetBackend {
 public:
  explicit IbvBackend(const BackendConfig& c)
      : cfg_(c),
        qps_(c.size, nullptr),
        peers_(c.size),
        ledgers_(c.size),
        seq_(c.size, 0),
        values_(c.size, 0),
        posted_since_poll_(c.size, 0) {
    for (int i = 0; i < c.size; ++i) policies_.emplace_back(kSignalInterval, kSendQueueDepth);
  }
  ~IbvBackend() override { release(); }
  const char* name() const override { return "ibverbs"; }

  Status open() {
    int n = 0;
    errno = 0;
    ibv_device** list = ibv_get_device_list(&n);
    if (!list)
      return fail(Status::kUnsupported,
                  std::string("no RDMA device: ibv_get_device_list failed: ") + strerror(errno ? errno : ENODEV));
    // The topology mapping names this channel's NIC; without one, the first device.
    ibv_device* dev = nullptr;
    for (int i = 0; i < n && !dev; ++i)
      if (cfg_.nic_name.empty() || cfg_.nic_name == ibv_get_device_name(list[i])) dev = list[i];
    if (!dev) {
      ibv_free_device_list(list);
      return fail(Status::kUnsupported, n ? "RDMA device '" + cfg_.nic_name + "' not found"
                                          : std::string("no RDMA device found (ibv_get_device_list returned 0)"));
    }
    dev_name_ = ibv_get_device_name(dev);
    ctx_ = ibv_open_device(dev);
    ibv_free_device_list(list);
    if (!ctx_) return fail_errno("ibv_open_device(" + dev_name_ + ")");
    if (ibv_query_port(ctx_, kPort, &port_)) return fail_errno("ibv_query_port");
    pd_ = ibv_alloc_pd(ctx_);
    if (!pd_) return fail_errno("ibv_alloc_pd");
    // One CQ for every QP: deep enough for each send queue full of signalled WRs (serial mode),
    // within what the device allows.
    ibv_device_attr dattr{};
    int cq_depth = kCqDepth;
    if (ibv_query_device(ctx_, &dattr) == 0)
      cq_depth = std::min(dattr.max_cqe, std::max(kCqDepth, cfg_.size * kSendQueueDepth + 64));
    cq_ = ibv_create_cq(ctx_, cq_depth, nullptr, nullptr, 0);
    if (!cq_) return fail_errno("ibv_create_cq");
    // Signal values are staged here; inline WRITEs copy them into the WQE at post time.
    values_mr_ = ibv_reg_mr(pd_, values_.data(), values_.size() * sizeof(uint64_t), IBV_ACCESS_LOCAL_WRITE);
    if (!values_mr_) return fail_errno("ibv_reg_mr(signal values)");
    return Status::kOk;
  }

  Status register_region(const Region& r) override {
    const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    region_ = r;
    if (r.dmabuf_fd >= 0) {
      // GPU heap exported as dma-buf: the NIC reads and writes device memory directly.
      mr_ = ibv_reg_dmabuf_mr(pd_, 0, r.bytes, reinterpret_cast<uint64_t>(r.base), r.dmabuf_fd, access);
      if (!mr_)
        WEFT_INFO(kNet, "rank %d: ibv_reg_dmabuf_mr failed (%s); trying ibv_reg_mr", cfg_.rank, strerror(errno));
    }
    if (!mr_) mr_ = ibv_reg_mr(pd_, r.base, r.bytes, access);
    if (!mr_) return fail_errno("registering the " + std::to_string(r.bytes) + "-byte heap");
    return Status::kOk;
  }

  Status local_info(PeerInfo* out) override {
    IbvPeerInfo info;
    info.lid = port_.lid;
    info.port_num = kPort;
    info.mtu = static_cast<uint8_t>(port_.active_mtu);
    ibv_gid gid{};
    if (ibv_query_gid(ctx_, kPort, 0, &gid) == 0) memcpy(info.gid.data(), gid.raw, 16);
    info.heap_addr = reinterpret_cast<uint64_t>(region_.base);
    info.rkey = mr_->rkey;
    info.qpn.assign(cfg_.size, 0);
    info.psn.assign(cfg_.size, 0);
    std::mt19937 rng(std::random_device{}());
    psn_.assign(cfg_.size, 0);
    for (int p = 0; p < cfg_.size; ++p) {
      if (p == cfg_.rank) continue;
      ibv_qp_init_attr a{};
      a.send_cq = cq_;
      a.recv_cq = cq_;
      a.qp_type = IBV_QPT_RC;
      a.sq_sig_all = 0;  // selective signalling
      a.cap.max_send_wr = kSendQueueDepth;
      a.cap.max_recv_wr = 1;
      a.cap.max_send_sge = 1;
      a.cap.max_recv_sge = 1;
      a.cap.max_inline_data = ibv::kMaxInlineBytes;
      qps_[p] = ibv_create_qp(pd_, &a);
      if (!qps_[p]) return fail_errno("ibv_create_qp for rank " + std::to_string(p));
      ibv_qp_attr m{};
      m.qp_state = IBV_QPS_INIT;
      m.port_num = kPort;
      m.pkey_index = 0;
      m.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
      if (ibv_modify_qp(qps_[p], &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        return fail_errno("QP to INIT for rank " + std::to_string(p));
      info.qpn[p] = qps_[p]->qp_num;
      info.psn[p] = psn_[p] = rng() & 0xffffff;
    }
    *out = info;
    return Status::kOk;
  }

  Status connect(int peer, const PeerInfo& pinfo) override {
    const auto* info = std::get_if<IbvPeerInfo>(&pinfo);
    if (!info || info->qpn.size() != static_cast<size_t>(cfg_.size) || !qps_[peer])
      return fail(Status::kInvalidArgument, "connect: endpoint of rank " + std::to_string(peer) + " is not ibverbs");
    ibv_qp_attr m;
    int mask =
        ibv::rtr_attr(*info, cfg_.rank, kPort, port_.active_mtu, port_.link_layer == IBV_LINK_LAYER_ETHERNET, &m);
    if (ibv_modify_qp(qps_[peer], &m, mask)) return fail_errno("QP to RTR for rank " + std::to_string(peer));
    ibv_qp_attr s;
    mask = ibv::rts_attr(psn_[peer], &s);
    if (ibv_modify_qp(qps_[peer], &s, mask)) return fail_errno("QP to RTS for rank " + std::to_string(peer));
    peers_[peer] = *info;
    return Status::kOk;
  }

  bool can_post(int peer) const override {
    // A put may split into several WRITEs; keep headroom for one of the largest.
    return ledgers_[peer].in_flight() + 8 < static_cast<uint64_t>(kSendQueueDepth);
  }

  Status post_put(int peer, uint64_t local_offset, uint64_t remote_offset, uint64_t bytes, PostFlags flags,
                  uint64_t wr_id) override {
    if (status_ != Status::kOk) return status_;
    if (local_offset > region_.bytes || bytes > region_.bytes - local_offset)
      return fail(Status::kInvalidArgument, "put outside the local heap");
    auto plan = ibv::plan_put(peer, reinterpret_cast<uint64_t>(region_.base), mr_->lkey, local_offset,
                              peers_[peer].heap_addr, peers_[peer].rkey, remote_offset, bytes, flags.need_completion,
                              wr_id, &seq_[peer], ledgers_[peer].in_flight(), &policies_[peer]);
    for (const auto& w : plan) WEFT_CHECK(post(peer, w));
    return Status::kOk;
  }

  Status post_signal(int peer, uint64_t flag_offset, uint64_t value, PostFlags flags, uint64_t wr_id) override {
    if (status_ != Status::kOk) return status_;
    values_[peer] = value;
    auto w = ibv::plan_signal(peer, reinterpret_cast<uint64_t>(&values_[peer]), values_mr_->lkey,
                              peers_[peer].heap_addr, peers_[peer].rkey, flag_offset, flags.fence,
                              flags.need_completion, wr_id, &seq_[peer], ledgers_[peer].in_flight(), &policies_[peer]);
    return post(peer, w);
  }

  Status poll(std::vector<Completion>* done) override {
    if (status_ != Status::kOk) return status_;
    // A peer the proxy stopped posting to, whose newest WR is unsignalled, gets a probe so that
    // every post eventually completes (selective signalling would otherwise strand the tail).
    for (int p = 0; p < cfg_.size; ++p) {
      if (!posted_since_poll_[p] && qps_[p] && ledgers_[p].tail_unsignaled()) {
        ibv::WrPlan probe = ibv::plan_probe(p, &seq_[p]);
        probe.remote_addr = peers_[p].heap_addr;
        probe.rkey = peers_[p].rkey;
        WEFT_CHECK(post(p, probe));
      }
      posted_since_poll_[p] = 0;
    }
    ibv_wc wc[64];
    int n = ibv_poll_cq(cq_, 64, wc);
    if (n < 0) return fail(Status::kSystemError, "ibv_poll_cq failed");
    std::vector<uint64_t> ids;
    for (int i = 0; i < n; ++i) {
      const int peer = ibv::wr_peer(wc[i].wr_id);
      if (wc[i].status != IBV_WC_SUCCESS)
        return fail(Status::kPeerFailed,
                    ibv::describe_wc_failure(ibv_wc_status_str(wc[i].status), wc[i].status, wc[i].vendor_err, peer));
      if (peer < 0 || peer >= cfg_.size) return fail(Status::kProtocolError, "completion for an unknown peer");
      ids.clear();
      std::string why;
      if (ledgers_[peer].retire(wc[i].wr_id, &ids, &why) != Status::kOk) return fail(Status::kInternal, why);
      for (uint64_t id : ids) done->push_back({id, peer});
    }
    return Status::kOk;
  }

  void wait_activity(double max_s) override { usleep(static_cast<useconds_t>(std::min(max_s, 50e-6) * 1e6)); }

  Status close(const std::string&) override {  // peers see the QPs go to error: IBV_WC_RETRY_EXC_ERR
    release();
    return status_;
  }

  std::string error_message() const override { return error_; }

 private:
  Status post(int peer, const ibv::WrPlan& w) {
    ibv_sge sge;
    ibv_send_wr wr;
    ibv_send_wr* bad = nullptr;
    ibv::to_send_wr(w, &sge, &wr);
    int rc = ibv_post_send(qps_[peer], &wr, &bad);
    if (rc) return fail(Status::kSystemError, "ibv_post_send to rank " + std::to_string(peer) + ": " + strerror(rc));
    ledgers_[peer].posted(w);
    ++posted_since_poll_[peer];
    return Status::kOk;
  }

  Status fail(Status s, const std::string& what) {
    if (status_ == Status::kOk) {
      status_ = s;
      error_ = "rank " + std::to_string(cfg_.rank) + " channel " + std::to_string(cfg_.channel) + ": ibverbs" +
               (dev_name_.empty() ? "" : " (" + dev_name_ + ")") + ": " + what;
      WEFT_WARN(kNet, "%s", error_.c_str());
    }
    return status_;
  }
  Status fail_errno(const std::string& what) { return fail(Status::kSystemError, what + ": " + strerror(errno)); }

  void release() {
    for (auto& q : qps_)
      if (q) ibv_destroy_qp(q), q = nullptr;
    if (mr_) ibv_dereg_mr(mr_), mr_ = nullptr;
    if (values_mr_) ibv_dereg_mr(values_mr_), values_mr_ = nullptr;
    if (cq_) ibv_destroy_cq(cq_), cq_ = nullptr;
    if (pd_) ibv_dealloc_pd(pd_), pd_ = nullptr;
    if (ctx_) ibv_close_device(ctx_), ctx_ = nullptr;
  }

  BackendConfig cfg_;
  Region region_;
  std::string dev_name_;
  ibv_context* ctx_ = nullptr;
  ibv_port_attr port_{};
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_mr* mr_ = nullptr;
  ibv_mr* values_mr_ = nullptr;
  std::vector<ibv_qp*> qps_;
  std::vector<uint32_t> psn_;
  std::vector<IbvPeerInfo> peers_;
  std::vector<ibv::CompletionLedger> ledgers_;
  std::vector<ibv::SignalPolicy> policies_;
  std::vector<uint64_t> seq_;
  std::vector<uint64_t> values_;
  std::vector<uint64_t> posted_since_poll_;
  Status status_ = Status::kOk;
  std::string error_;
};

}  // namespace

bool ibverbs_device_present(std::string* why) {
  int n = 0;
  errno = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list) {
    *why = std::string("ibv_get_device_list: ") + strerror(errno ? errno : ENODEV);
    return false;
  }
  ibv_free_device_list(list);
  if (n == 0) *why = "no RDMA device";
  return n > 0;
}

Status make_ibverbs_backend(const BackendConfig& config, std::unique_ptr<NetBackend>* out) {
  auto b = std::make_unique<IbvBackend>(config);
  WEFT_CHECK(b->open());
  *out = std::move(b);
  return Status::kOk;
}

}  // namespace weft::transport
