// ibverbs net backend: RC QP per peer, heap registered once, RDMA WRITE data, inline WRITE (or SEND) signals.
// Every verbs call goes through the function table of ibverbs_api.h: libibverbs on a real NIC, the
// tests' fake verbs in CI (which enforces the QP state machine, attribute masks, rkey bounds, send
// queue depth and RC order, and moves the bytes). It has not yet run on a NIC: none exists on the
// machines weft is developed on (docs/nic-bring-up.md is the checklist for the first one).
//
// Ordering, as the proxy relies on it:
// - RC executes the WRITEs of one QP in order, and the responder places them in order: a flag
//   WRITE posted after its data WRITEs on the same QP is not visible in host memory before them.
// - IBV_SEND_FENCE orders a WR only after earlier RDMA READs and atomics on the QP; this backend
//   posts neither, so a fence adds no WRITE-after-WRITE ordering (the flag is passed through when
//   the proxy's signal mode asks for it, and costs a pipeline wait on some NICs).
// - Whether a GPU kernel that sees the flag also sees the data is a property of the GPU, not of the
//   QP: CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING (cuda_heap.cu reads it into the Region).
//   At "owner" (100) or above, the flag WRITE is enough. Below it, a rank whose heap is on that GPU
//   publishes kIbvSignalsBySend: its peers send each signal as a 16-byte SEND (flag offset, value)
//   to its posted receives instead of writing the flag. RC delivers the SEND after the WRITEs posted
//   before it on the QP, so when its receive completes the data is at the GPU; the receiving proxy
//   then calls the region's flush (cuFlushGPUDirectRDMAWrites), which makes those writes visible to
//   the GPU's kernels, and only then stores the flag through the copy hook (the ofi staged path's
//   write into device memory). One flush covers every signal of a poll.
//
//   sender (any rank)                         receiver (GPU ordering < owner)
//   RDMA WRITE data ------------------------> GPU heap (not yet visible to kernels)
//   SEND {flag, value} (inline) ------------> posted receive -> receive CQ
//                                             proxy: flush hook; to_region(flag, value); repost
// - Receives: kRecvDepth per QP, posted before the QP connects and reposted as each is applied. A
//   SEND that finds none waits in the NIC's RNR retry until the receiving proxy reposts.
// - The heap is registered without IBV_ACCESS_RELAXED_ORDERING: relaxed ordering lets the NIC's
//   PCIe writes pass each other, which would break data-before-flag.
#include "transport/ibverbs_backend.h"

#include <errno.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <random>

#include "base/log.h"
#include "base/params.h"
#include "transport/ibverbs_api.h"
#include "transport/ibverbs_plan.h"
#include "transport/ibverbs_signal_rx.h"
#include "transport/ibverbs_sizes.h"
#include "transport/ibverbs_wr.h"
#include "transport/net_backend.h"

namespace weft::transport {
namespace {

using ibv::kRecvDepth;  // queue depths: ibverbs_sizes.h, shared with the resource report
using ibv::kSendQueueDepth;
constexpr int kSignalInterval = 32;
constexpr int kMaxGidEntries = 1024;

std::atomic<bool> g_receiver_flush_off{false};

// The site's traffic class for RoCE: mlx5 exposes the device default in sysfs
// ("Global tclass=106"); absent or unreadable: 0.
int site_traffic_class(const std::string& dev, int port) {
  std::ifstream f("/sys/class/infiniband/" + dev + "/tc/" + std::to_string(port) + "/traffic_class");
  std::string line;
  if (!f || !std::getline(f, line)) return 0;
  size_t eq = line.find("tclass=");
  if (eq == std::string::npos) return 0;
  int tc = atoi(line.c_str() + eq + 7);
  return tc >= 0 && tc <= 255 ? tc : 0;
}

class IbvBackend final : public NetBackend {
 public:
  // Per-peer state is indexed by slot: the peer's place in peer_list_ (the peer set), so it grows
  // with the peers this rank faces, not with the job.
  IbvBackend(const ibv::Api& api, const BackendConfig& c) : api_(api), cfg_(c), receiver_(api) {
    if (c.peers) {
      peer_list_ = *c.peers;
    } else {
      for (int p = 0; p < c.size; ++p)
        if (p != c.rank) peer_list_.push_back(p);
    }
    const size_t n = peer_list_.size();
    qps_.assign(n, nullptr);
    peers_.resize(n);
    ledgers_.resize(n);
    seq_.assign(n, 0);
    values_.assign(n, ibv::SignalRecord{});
    posted_since_poll_.assign(n, 0);
  }
  ~IbvBackend() override { release(); }
  const char* name() const override { return "ibverbs"; }

  Status open() {
    for (size_t i = 0; i < peer_list_.size(); ++i)
      if (peer_list_[i] < 0 || peer_list_[i] >= cfg_.size || peer_list_[i] == cfg_.rank ||
          (i > 0 && peer_list_[i] <= peer_list_[i - 1]) || i >= IbvPeerInfo::kMaxPeers)
        return fail(Status::kInvalidArgument, "the peer set is not an ascending list of other ranks (at most " +
                                                  std::to_string(IbvPeerInfo::kMaxPeers) + ")");
    int n = 0;
    errno = 0;
    ibv_device** list = api_.get_device_list(&n);
    if (!list)
      return fail(Status::kUnsupported,
                  std::string("no RDMA device: ibv_get_device_list failed: ") + strerror(errno ? errno : ENODEV));
    // The topology mapping names this channel's NIC; without one, the first device.
    ibv_device* dev = nullptr;
    for (int i = 0; i < n && !dev; ++i)
      if (cfg_.nic_name.empty() || cfg_.nic_name == api_.get_device_name(list[i])) dev = list[i];
    if (!dev) {
      api_.free_device_list(list);
      return fail(Status::kUnsupported, n ? "RDMA device '" + cfg_.nic_name + "' (from the topology mapping) not found"
                                          : std::string("no RDMA device found (ibv_get_device_list returned 0)"));
    }
    dev_name_ = api_.get_device_name(dev);
    ctx_ = api_.open_device(dev);
    api_.free_device_list(list);
    if (!ctx_) return fail_errno("ibv_open_device(" + dev_name_ + ")");
    ibv_device_attr dattr{};
    if (api_.query_device(ctx_, &dattr)) return fail_errno("ibv_query_device");
    // The send queue: weft's depth, within what the device allows.
    sq_depth_ = std::max(16, std::min(kSendQueueDepth, dattr.max_qp_wr));
    recv_depth_ = std::max(1, std::min(kRecvDepth, dattr.max_qp_wr));
    max_cqe_ = dattr.max_cqe;
    for (size_t i = 0; i < peer_list_.size(); ++i) policies_.emplace_back(kSignalInterval, sq_depth_);
    WEFT_CHECK(pick_port(dattr.phys_port_cnt));
    WEFT_CHECK(pick_route());
    pd_ = api_.alloc_pd(ctx_);
    if (!pd_) return fail_errno("ibv_alloc_pd");
    // One CQ for every QP: deep enough for each send queue full of signalled WRs (serial mode),
    // within what the device allows.
    const int peers = static_cast<int>(peer_list_.size());
    const int cq_depth = static_cast<int>(
        std::min<uint64_t>(dattr.max_cqe, ibv::send_cq_entries(peers, static_cast<uint64_t>(sq_depth_))));
    cq_ = api_.create_cq(ctx_, cq_depth, nullptr, nullptr, 0);
    if (!cq_) return fail_errno("ibv_create_cq");
    // Signal values are staged here; inline WRITEs copy them into the WQE at post time.
    values_.resize(ibv::signal_staging_bytes(values_.size()) / sizeof(ibv::SignalRecord));  // at least one
    values_mr_ = api_.reg_mr(pd_, values_.data(), values_.size() * sizeof(ibv::SignalRecord), IBV_ACCESS_LOCAL_WRITE);
    if (!values_mr_) return fail_errno("ibv_reg_mr(signal values)");
    return Status::kOk;
  }

  Status register_region(const Region& r) override {
    // No IBV_ACCESS_RELAXED_ORDERING: the flag must not overtake its data on the PCIe bus.
    const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    region_ = r;
    std::string dmabuf_err;
    if (r.dmabuf_fd >= 0) {
      // GPU heap exported as dma-buf (page-aligned range; the heap starts dmabuf_offset bytes into it).
      // iova = the heap's virtual address, so peers address it exactly as a host heap.
      errno = 0;
      mr_ = api_.reg_dmabuf_mr(pd_, r.dmabuf_offset, r.bytes, reinterpret_cast<uint64_t>(r.base), r.dmabuf_fd, access);
      if (mr_) registration_ = "dma-buf";
      if (!mr_) dmabuf_err = strerror(errno ? errno : EINVAL);
    }
    if (!mr_) {
      // Host memory, or GPU memory through the peer-memory client (nvidia-peermem).
      errno = 0;
      mr_ = api_.reg_mr(pd_, r.base, r.bytes, access);
      if (mr_) registration_ = r.kind == MemKind::kDevice ? "peer memory" : "host";
    }
    if (!mr_) {
      const std::string reg_err = strerror(errno ? errno : EINVAL);
      if (r.kind == MemKind::kDevice)
        return fail(Status::kUnsupported,
                    "cannot register the " + std::to_string(r.bytes) + "-byte GPU heap for RDMA: " +
                        (r.dmabuf_fd >= 0 ? "ibv_reg_dmabuf_mr: " + dmabuf_err
                                          : std::string("no dma-buf export (the GPU or driver lacks "
                                                        "CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)")) +
                        "; ibv_reg_mr through peer memory: " + reg_err +
                        ". Needs a GPU driver with dma-buf (and a kernel >= 5.12) or the nvidia-peermem module");
      return fail(Status::kSystemError, "ibv_reg_mr of the " + std::to_string(r.bytes) + "-byte host heap: " + reg_err);
    }
    WEFT_INFO(kNet, "rank %d channel %d: %s port %u: heap of %llu bytes registered (%s), %s", cfg_.rank, cfg_.channel,
              dev_name_.c_str(), port_num_, (unsigned long long)r.bytes, registration_.c_str(), route_why_.c_str());
    return choose_signal_apply();
  }

  Status local_info(PeerInfo* out) override {
    if (!mr_) return fail(Status::kInternal, "local_info before register_region");
    IbvPeerInfo info;
    info.lid = port_.lid;
    info.port_num = port_num_;
    info.mtu = static_cast<uint8_t>(port_.active_mtu);
    memcpy(info.gid.data(), gid_, 16);
    info.heap_addr = reinterpret_cast<uint64_t>(region_.base);
    info.rkey = mr_->rkey;
    std::mt19937 rng(std::random_device{}());
    psn_.assign(peer_list_.size(), 0);
    for (size_t i = 0; i < peer_list_.size(); ++i) {
      const int p = peer_list_[i];
      ibv_qp_init_attr a{};
      a.send_cq = cq_;
      a.recv_cq = receiver_.is_open() ? receiver_.cq() : cq_;
      a.qp_type = IBV_QPT_RC;
      a.sq_sig_all = 0;  // selective signalling
      a.cap.max_send_wr = sq_depth_;
      a.cap.max_recv_wr = receiver_.is_open() ? recv_depth_ : 1;
      a.cap.max_send_sge = 1;
      a.cap.max_recv_sge = 1;
      a.cap.max_inline_data = ibv::kMaxInlineBytes;
      qps_[i] = api_.create_qp(pd_, &a);
      if (!qps_[i]) return fail_errno("ibv_create_qp for rank " + std::to_string(p));
      ibv_qp_attr m{};
      m.qp_state = IBV_QPS_INIT;
      m.port_num = port_num_;
      m.pkey_index = 0;
      m.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
      if (api_.modify_qp(qps_[i], &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        return fail_errno("QP to INIT for rank " + std::to_string(p));
      // Signals from this peer arrive as SENDs: their receives are posted before the peer can send.
      if (receiver_.is_open())
        for (int k = 0; k < recv_depth_; ++k) WEFT_CHECK(post_receive(static_cast<int>(i), static_cast<uint32_t>(k)));
      psn_[i] = rng() & 0xffffff;
      info.qps.push_back({p, qps_[i]->qp_num, psn_[i]});
    }
    if (receiver_.is_open()) info.flags |= IbvPeerInfo::kIbvSignalsBySend;
    *out = info;
    return Status::kOk;
  }

  Status connect(int peer, const PeerInfo& pinfo) override {
    const auto* info = std::get_if<IbvPeerInfo>(&pinfo);
    const int i = slot(peer);
    if (!info)
      return fail(Status::kInvalidArgument, "connect: endpoint of rank " + std::to_string(peer) + " is not ibverbs");
    if (i < 0 || !qps_[i])
      return fail(Status::kInvalidArgument,
                  "connect: rank " + std::to_string(peer) + " is not in this rank's peer set");
    ibv_qp_attr m;
    int mask = ibv::rtr_attr(*info, cfg_.rank, port_num_, port_.active_mtu, route_, &m);
    if (mask == 0)
      return fail(Status::kProtocolError, "connect: rank " + std::to_string(peer) +
                                              " published no queue pair facing this rank (the two peer sets disagree)");
    if (int rc = api_.modify_qp(qps_[i], &m, mask))
      return fail(Status::kSystemError, "QP to RTR for rank " + std::to_string(peer) + ": " + strerror(rc));
    ibv_qp_attr s;
    mask = ibv::rts_attr(psn_[i], &s);
    if (int rc = api_.modify_qp(qps_[i], &s, mask))
      return fail(Status::kSystemError, "QP to RTS for rank " + std::to_string(peer) + ": " + strerror(rc));
    peers_[i] = Remote{info->heap_addr, info->rkey, (info->flags & IbvPeerInfo::kIbvSignalsBySend) != 0};
    return Status::kOk;
  }

  bool can_post(int peer) const override {
    // A put may split into several WRITEs; keep headroom for one of the largest. A peer outside the
    // set reports room, so the post itself fails with a message instead of the proxy waiting.
    const int i = slot(peer);
    return i < 0 || ledgers_[i].in_flight() + 8 < static_cast<uint64_t>(sq_depth_);
  }

  Status post_put(int peer, uint64_t local_offset, uint64_t remote_offset, uint64_t bytes, PostFlags flags,
                  uint64_t wr_id) override {
    if (status_ != Status::kOk) return status_;
    const int i = slot(peer);
    if (i < 0) return not_a_peer(peer);
    if (local_offset > region_.bytes || bytes > region_.bytes - local_offset)
      return fail(Status::kInvalidArgument, "put outside the local heap");
    if (bytes == 0) {
      // A zero-length WRITE: the peer's QP receives and acknowledges it, no memory is touched (the
      // transport's preflight of each connection).
      ibv::WrPlan w = ibv::plan_probe(peer, &seq_[i]);
      w.remote_addr = peers_[i].heap_addr;
      w.rkey = peers_[i].rkey;
      w.report = true;
      w.user_wr_id = wr_id;
      return post(i, w);
    }
    auto plan = ibv::plan_put(peer, reinterpret_cast<uint64_t>(region_.base), mr_->lkey, local_offset,
                              peers_[i].heap_addr, peers_[i].rkey, remote_offset, bytes, flags.need_completion, wr_id,
                              &seq_[i], ledgers_[i].in_flight(), &policies_[i]);
    for (const auto& w : plan) WEFT_CHECK(post(i, w));
    return Status::kOk;
  }

  // The flag WRITE (or the SEND of a peer that applies signals itself) follows this QP's earlier data
  // WRITEs in RC order (see the top of this file); flags.fence becomes IBV_SEND_FENCE, which orders
  // only after READs/atomics.
  Status post_signal(int peer, uint64_t flag_offset, uint64_t value, PostFlags flags, uint64_t wr_id) override {
    if (status_ != Status::kOk) return status_;
    const int i = slot(peer);
    if (i < 0) return not_a_peer(peer);
    values_[i] = ibv::SignalRecord{flag_offset, value};  // inline: copied into the WQE at post time
    if (peers_[i].by_send)
      return post(
          i, ibv::plan_signal_send(peer, reinterpret_cast<uint64_t>(&values_[i]), values_mr_->lkey, flags.fence,
                                   flags.need_completion, wr_id, &seq_[i], ledgers_[i].in_flight(), &policies_[i]));
    auto w = ibv::plan_signal(peer, reinterpret_cast<uint64_t>(&values_[i].value), values_mr_->lkey,
                              peers_[i].heap_addr, peers_[i].rkey, flag_offset, flags.fence, flags.need_completion,
                              wr_id, &seq_[i], ledgers_[i].in_flight(), &policies_[i]);
    return post(i, w);
  }

  Status poll(std::vector<Completion>* done) override {
    if (status_ != Status::kOk) return status_;
    // A peer the proxy stopped posting to, whose newest WR is unsignalled, gets a probe so that
    // every post eventually completes (selective signalling would otherwise strand the tail).
    for (size_t i = 0; i < peer_list_.size(); ++i) {
      if (!posted_since_poll_[i] && qps_[i] && ledgers_[i].tail_unsignaled()) {
        ibv::WrPlan probe = ibv::plan_probe(peer_list_[i], &seq_[i]);
        probe.remote_addr = peers_[i].heap_addr;
        probe.rkey = peers_[i].rkey;
        WEFT_CHECK(post(static_cast<int>(i), probe));
      }
      posted_since_poll_[i] = 0;
    }
    ibv_wc wc[64];
    int n = api_.poll_cq(cq_, 64, wc);
    if (n < 0) return fail(Status::kSystemError, "ibv_poll_cq failed");
    std::vector<uint64_t> ids;
    for (int i = 0; i < n; ++i) {
      const int peer = ibv::wr_peer(wc[i].wr_id);
      if (wc[i].status != IBV_WC_SUCCESS)
        return fail(Status::kPeerFailed,
                    ibv::describe_wc_failure(api_.wc_status_str(wc[i].status), wc[i].status, wc[i].vendor_err, peer));
      const int at = slot(peer);
      if (at < 0) return fail(Status::kProtocolError, "completion for an unknown peer");
      ids.clear();
      std::string why;
      if (ledgers_[at].retire(wc[i].wr_id, &ids, &why) != Status::kOk) return fail(Status::kInternal, why);
      for (uint64_t id : ids) done->push_back({id, peer});
    }
    return poll_receives();
  }

  void wait_activity(double max_s) override { usleep(static_cast<useconds_t>(std::min(max_s, 50e-6) * 1e6)); }

  Status close(const std::string&) override {  // peers see the QPs go to error: IBV_WC_RETRY_EXC_ERR
    release();
    return status_;
  }

  std::string error_message() const override { return error_; }
  // RC places one QP's WRITEs in order: the flag after the data posted before it (see the top of this
  // file); where this rank's GPU needs a flush, how signals to it are applied instead.
  std::string ordering() const override {
    return receiver_.is_open() ? "RC in-order WRITEs; signals to this rank: SENDs its proxy applies after "
                                 "cuFlushGPUDirectRDMAWrites (GPU RDMA write ordering " +
                                     std::to_string(region_.rdma_writes_ordering) + ")"
                               : "RC in-order WRITEs";
  }

 private:
  // The mapped port (BackendConfig::nic_port), else the first ACTIVE one; it must be ACTIVE.
  Status pick_port(int ports) {
    int first_active = 0;
    for (int p = 1; p <= ports && p <= 255; ++p) {
      ibv_port_attr a{};
      if (api_.query_port(ctx_, static_cast<uint8_t>(p), &a) == 0 && a.state == IBV_PORT_ACTIVE && !first_active)
        first_active = p;
    }
    int port = cfg_.nic_port > 0 ? cfg_.nic_port : first_active;
    if (port <= 0 || port > ports)
      return fail(Status::kUnsupported, cfg_.nic_port > 0 ? "port " + std::to_string(cfg_.nic_port) +
                                                                " (from the topology mapping) does not exist (" +
                                                                std::to_string(ports) + " ports)"
                                                          : "no ACTIVE port (" + std::to_string(ports) + " ports)");
    port_num_ = static_cast<uint8_t>(port);
    if (api_.query_port(ctx_, port_num_, &port_)) return fail_errno("ibv_query_port(" + std::to_string(port) + ")");
    if (port_.state != IBV_PORT_ACTIVE)
      return fail(Status::kUnsupported, "port " + std::to_string(port) + " is not ACTIVE (state " +
                                            std::to_string(port_.state) + "): check the cable and the subnet manager");
    return Status::kOk;
  }

  // RoCE: the RoCE v2 GID of a netdev and a global route with the traffic class. InfiniBand: LIDs
  // within the subnet (GID index 0 is the port GID, published for reference).
  Status pick_route() {
    const bool roce = port_.link_layer == IBV_LINK_LAYER_ETHERNET;
    int64_t forced = -1, tc = -1;
    WEFT_CHECK(get_param("WEFT_IB_GID_INDEX", &forced));
    WEFT_CHECK(get_param("WEFT_IB_TC", &tc));
    std::vector<ibv_gid_entry> entries(kMaxGidEntries);
    ssize_t n = api_.query_gid_table(ctx_, entries.data(), entries.size(), 0);
    std::vector<ibv::GidCandidate> table;
    if (n >= 0) {
      for (ssize_t i = 0; i < n && i < kMaxGidEntries; ++i) table.push_back(candidate(entries[i]));
    } else {
      // Older providers: walk this port's table entry by entry.
      for (int i = 0; i < port_.gid_tbl_len && i < kMaxGidEntries; ++i) {
        ibv_gid_entry e{};
        if (api_.query_gid_ex(ctx_, port_num_, i, &e, 0) == 0) table.push_back(candidate(e));
      }
    }
    if (!roce && forced < 0) {
      // InfiniBand inside a subnet: LID routing, GID 0 only identifies the port.
      for (const auto& g : table)
        if (g.port == port_num_ && g.index == 0) memcpy(gid_, g.raw, 16);
      route_why_ = "InfiniBand, LID " + std::to_string(port_.lid);
      return Status::kOk;
    }
    std::string why;
    int pick = ibv::choose_gid(table, port_num_, static_cast<int>(forced), &why);
    if (pick < 0) return fail(Status::kUnsupported, why);
    memcpy(gid_, table[pick].raw, 16);
    route_.global = true;
    route_.sgid_index = static_cast<uint8_t>(table[pick].index);
    route_.traffic_class = static_cast<uint8_t>(tc >= 0 ? tc : site_traffic_class(dev_name_, port_num_));
    route_why_ = std::string(roce ? "RoCE" : "InfiniBand global route") + ", " + why + ", traffic class " +
                 std::to_string(route_.traffic_class) + (tc >= 0 ? " (WEFT_IB_TC)" : "");
    return Status::kOk;
  }

  static ibv::GidCandidate candidate(const ibv_gid_entry& e) {
    ibv::GidCandidate c;
    c.index = e.gid_index;
    c.port = e.port_num;
    c.type = e.gid_type;
    c.ndev_ifindex = e.ndev_ifindex;
    memcpy(c.raw, e.gid.raw, 16);
    return c;
  }

  // Once, at registration: who sets signals on this rank's heap (ibverbs_plan.h), logged once per
  // transport (channel 0) for a GPU heap. The receiver-side path needs the region's flush and a copy
  // hook into device memory, and a receive CQ and buffers of its own.
  Status choose_signal_apply() {
    std::string why;
    const auto apply = ibv::choose_signal_apply(region_.kind == MemKind::kDevice, region_.rdma_writes_ordering,
                                                g_receiver_flush_off.load(std::memory_order_acquire), &why);
    if (region_.kind == MemKind::kDevice && cfg_.channel == 0)
      WEFT_INFO(kNet, "rank %d: ibverbs signals: %s", cfg_.rank, why.c_str());
    if (apply != ibv::SignalApply::kProxyAfterFlush) return Status::kOk;
    if (!region_.flush_rdma_writes)
      return fail(Status::kInvalidArgument, why +
                                                "; but the heap's region carries no flush (CudaHeap::region() "
                                                "supplies cuFlushGPUDirectRDMAWrites)");
    if (!cfg_.copy_hooks.to_region)
      return fail(Status::kInvalidArgument, why +
                                                "; but there is no copy hook to store a flag in GPU memory "
                                                "(TransportOptions::copy_hooks = cuda_copy_hooks())");
    std::string why_not;
    if (Status st = receiver_.open(ctx_, pd_, static_cast<int>(peer_list_.size()), recv_depth_, max_cqe_, &why_not);
        st != Status::kOk)
      return fail(st, why_not);
    return Status::kOk;
  }

  Status post_receive(int i, uint32_t k) {
    std::string why;
    Status st = receiver_.post(qps_[i], i, k, peer_list_[i], &why);
    return st == Status::kOk ? st : fail(st, why);
  }

  // Signals that arrived as SENDs: checked, one flush for all of them (their data was placed before
  // each SEND completed), then each flag stored in order and its receive posted again.
  Status poll_receives() {
    if (!receiver_.is_open()) return Status::kOk;
    arrived_.clear();
    std::string why;
    Status s = receiver_.poll(peer_list_, region_.bytes, &arrived_, &why);
    if (s != Status::kOk) return fail(s, why);
    if (arrived_.empty()) return Status::kOk;
    s = region_.flush_rdma_writes();
    if (s != Status::kOk)
      return fail(s, "flushing GPUDirect RDMA writes before " + std::to_string(arrived_.size()) +
                         " signal(s) from rank " + std::to_string(peer_list_[arrived_[0].slot]) + " failed");
    for (const auto& a : arrived_) {
      s = cfg_.copy_hooks.to_region(cfg_.copy_hooks.ctx, static_cast<char*>(region_.base) + a.record.flag_offset,
                                    &a.record.value, sizeof a.record.value);
      if (s != Status::kOk)
        return fail(s, "storing a signal from rank " + std::to_string(peer_list_[a.slot]) + " at flag offset " +
                           std::to_string(a.record.flag_offset) + " of the GPU heap failed");
      WEFT_CHECK(post_receive(a.slot, a.index));
    }
    return Status::kOk;
  }

  // The peer's place in peer_list_, or -1.
  int slot(int peer) const {
    auto it = std::lower_bound(peer_list_.begin(), peer_list_.end(), peer);
    return it != peer_list_.end() && *it == peer ? static_cast<int>(it - peer_list_.begin()) : -1;
  }
  Status not_a_peer(int peer) {
    return fail(Status::kInvalidArgument, "post to rank " + std::to_string(peer) +
                                              ", which is not in this rank's peer set (" +
                                              std::to_string(peer_list_.size()) + " peers; transport/peer_set.h)");
  }

  Status post(int i, const ibv::WrPlan& w) {
    ibv_sge sge;
    ibv_send_wr wr;
    ibv_send_wr* bad = nullptr;
    ibv::to_send_wr(w, &sge, &wr);
    int rc = api_.post_send(qps_[i], &wr, &bad);
    if (rc)
      return fail(Status::kSystemError, "ibv_post_send to rank " + std::to_string(peer_list_[i]) + ": " + strerror(rc));
    ledgers_[i].posted(w);
    ++posted_since_poll_[i];
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
      if (q) api_.destroy_qp(q), q = nullptr;
    if (mr_) api_.dereg_mr(mr_), mr_ = nullptr;
    if (values_mr_) api_.dereg_mr(values_mr_), values_mr_ = nullptr;
    receiver_.release();
    if (cq_) api_.destroy_cq(cq_), cq_ = nullptr;
    if (pd_) api_.dealloc_pd(pd_), pd_ = nullptr;
    if (ctx_) api_.close_device(ctx_), ctx_ = nullptr;
  }

  const ibv::Api& api_;
  BackendConfig cfg_;
  Region region_;
  std::string dev_name_;
  std::string registration_;  // "dma-buf", "peer memory" or "host"
  std::string route_why_;
  ibv_context* ctx_ = nullptr;
  int sq_depth_ = kSendQueueDepth;
  int recv_depth_ = kRecvDepth;
  int max_cqe_ = ibv::kSendCqFloor;
  uint8_t port_num_ = 1;
  ibv_port_attr port_{};
  uint8_t gid_[16] = {};
  ibv::Route route_;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_mr* mr_ = nullptr;
  ibv_mr* values_mr_ = nullptr;
  // Receiver-side signals (a GPU heap below "owner" ordering); not open where the NIC writes flags.
  ibv::SignalReceiver receiver_;
  std::vector<ibv::SignalReceiver::Arrived> arrived_;
  // Where a connected peer's heap lies, and whether it applies signals itself.
  struct Remote {
    uint64_t heap_addr = 0;
    uint32_t rkey = 0;
    bool by_send = false;
  };
  std::vector<int> peer_list_;  // the peer set, ascending; everything below is indexed by slot
  std::vector<ibv_qp*> qps_;
  std::vector<uint32_t> psn_;
  std::vector<Remote> peers_;
  std::vector<ibv::CompletionLedger> ledgers_;
  std::vector<ibv::SignalPolicy> policies_;
  std::vector<uint64_t> seq_;
  std::vector<ibv::SignalRecord> values_;  // per slot: the signal being posted (inline)
  std::vector<uint64_t> posted_since_poll_;
  Status status_ = Status::kOk;
  std::string error_;
};

}  // namespace

bool ibverbs_device_present(std::string* why) {
  const ibv::Api& api = ibv::api();
  int n = 0;
  errno = 0;
  ibv_device** list = api.get_device_list(&n);
  if (!list) {
    *why = std::string("ibv_get_device_list: ") + strerror(errno ? errno : ENODEV);
    return false;
  }
  api.free_device_list(list);
  if (n == 0) *why = "no RDMA device";
  return n > 0;
}

Status make_ibverbs_backend(const BackendConfig& config, std::unique_ptr<NetBackend>* out, std::string* why) {
  auto b = std::make_unique<IbvBackend>(ibv::api(), config);
  Status s = b->open();
  if (s != Status::kOk) {
    if (why) *why = b->error_message();
    return s;
  }
  *out = std::move(b);
  return Status::kOk;
}

Status make_ibverbs_backend(const BackendConfig& config, std::unique_ptr<NetBackend>* out) {
  return make_ibverbs_backend(config, out, nullptr);
}

void set_receiver_flush_off_for_testing(bool off) { g_receiver_flush_off.store(off, std::memory_order_release); }

}  // namespace weft::transport
