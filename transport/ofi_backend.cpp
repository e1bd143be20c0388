// ofi net backend: puts and signals through a libfabric RDM endpoint (provider from WEFT_OFI_PROVIDER).
//
// One endpoint, one completion queue and one address vector per channel. A put is one fi_writemsg
// (several where it exceeds the provider's max_msg_size); a signal is an 8-byte fi_writemsg from a
// registered slot. Posts queue per peer in order; a fenced signal is ordered after the peer's earlier
// puts by FI_FENCE, by the provider's write-after-write order, or by waiting for those puts'
// FI_DELIVERY_COMPLETE completions (ofi_plan.h decides which). Every libfabric call happens on the
// thread that owns the backend; poll() and wait_activity() read the completion queue, which also
// drives progress for providers with manual progress.
//
// Device heaps: where the provider takes device memory (FI_HMEM in its caps: shm's CUDA IPC on one
// host, EFA and verbs with GPUDirect RDMA) and registering the heap as CUDA memory succeeds
// (fi_mr_regattr, FI_HMEM_CUDA, the heap's device), puts go from it and puts and signals into it as
// for a host heap, each put naming the heap's descriptor (FI_MR_HMEM; signals leave from the host
// control block). Elsewhere (a provider listing FI_HMEM without CUDA support refuses the
// registration) they go through host staging (ofi_stage.h):
// fi_writedata into the peer's receive stage, whose proxy copies each slot in with the copy hooks, in
// sequence order, before any later signal.
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>

#include "base/log.h"
#include "base/params.h"
#include "transport/net_backend.h"
#include "transport/ofi_desc_check.h"
#include "transport/ofi_info.h"
#include "transport/ofi_plan.h"
#include "transport/ofi_sizes.h"
#include "transport/ofi_stage.h"

namespace weft::transport {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Sizes the resource report counts too (ofi_sizes.h).
constexpr size_t kOpsPerPeer = ofi::kOpsPerPeer;
constexpr int kRecvSlots = static_cast<int>(ofi::kRecvSlots);
constexpr size_t kMsgBytes = ofi::kMsgBytes;
constexpr uint32_t kStageSlots = ofi::kStageSlots;
constexpr uint32_t kStageSlotBytes = ofi::kStageSlotBytes;
constexpr size_t kQueuedPerPeer = 1024;         // accepted from the proxy, not yet posted, per peer
constexpr uint32_t kHelloMagic = 0x4f544657u;   // "WFTO"
constexpr uint32_t kCreditMagic = 0x43544657u;  // "WFTC"
using ofi::kCtrlKey;
using ofi::kHeapKey;
using ofi::kStageKey;

// Control messages (the hello at connect, staging credits), one receive buffer each.
struct CtrlMsg {
  uint32_t magic;
  int32_t rank;
  int32_t channel;
  uint32_t reserved;
  uint64_t secret;
  uint64_t value;  // credits: stage slots consumed in all
  // Hello, device heaps: where the sender writes its staged slots here (the receive ring this rank
  // keeps for it: target address of its start, 0 for offsets, and key).
  uint64_t stage_base;
  uint64_t stage_key;
};
static_assert(sizeof(CtrlMsg) <= kMsgBytes, "a control message fits a receive buffer");

// One libfabric operation in flight. `ctx` comes first: a completion hands back its address.
struct Ctx {
  fi_context2 ctx;
  enum Kind : uint8_t { kFree, kPut, kSignal, kHelloSend, kHelloRecv, kCreditSend } kind = kFree;
  bool delivery = false;  // posted with FI_DELIVERY_COMPLETE; fenced signals to `peer` wait for it
  int peer = -1;
  int op = -1;          // index into ops_ (puts and signals); the receive slot (receives)
  int stage_slot = -1;  // staged writes: the send stage slot it reads
};

// A post the proxy made: reported done once its last write completed.
struct Op {
  uint64_t wr_id = 0;
  int peer = -1;
  uint32_t in_flight = 0;  // writes posted, not completed
  bool all_posted = false;
};

// A post accepted, not yet (fully) handed to libfabric.
struct Work {
  bool is_put = false;
  uint64_t local = 0, remote = 0, bytes = 0, value = 0;  // value: signals
  PostFlags flags;
  uint64_t wr_id = 0;
  uint64_t posted = 0;  // bytes already posted (puts split at max_msg_size)
  int op = -1;
};

class OfiBackend final : public NetBackend {
 public:
  OfiBackend(const BackendConfig& c, std::string provider)
      : cfg_(c),
        provider_(std::move(provider)),
        switches_(ofi_test_switches()),
        peers_(c.size),
        queues_(c.size),
        outstanding_(c.size, 0),
        delivering_(c.size, 0),
        last_progress_s_(c.size, 0),
        hello_from_(c.size, false),
        stages_(c.size),
        senders_(c.size),
        receivers_(c.size),
        credit_in_flight_(c.size, false) {}
  ~OfiBackend() override { release(); }
  const char* name() const override { return "ofi"; }

  Status register_region(const Region& r) override {
    if (r.kind == MemKind::kDevice && !(cfg_.copy_hooks.to_region && cfg_.copy_hooks.from_region))
      return fail(Status::kInvalidArgument, "a device-memory heap needs the copy hooks (weft_transport_cuda)");
    region_ = r;
    staged_ = r.kind == MemKind::kDevice;
    return open();
  }

  Status local_info(PeerInfo* out) override {
    if (status_ != Status::kOk) return status_;
    OfiPeerInfo info;
    size_t len = 0;
    int rc = fi_getname(&ep_->fid, nullptr, &len);
    if (len == 0 || len > OfiPeerInfo::kMaxAddrBytes)
      return fail(Status::kUnsupported,
                  "endpoint address of " + std::to_string(len) + " bytes (" + ofi_error(rc) + ")");
    info.addr.resize(len);
    rc = fi_getname(&ep_->fid, info.addr.data(), &len);
    if (rc) return fail(Status::kSystemError, "fi_getname: " + ofi_error(rc));
    info.addr.resize(len);
    info.provider = info_->fabric_attr->prov_name;
    info.heap_memory = heap_memory();
    if (staged_) {
      info.stage_slots = kStageSlots;  // the rings themselves are set up per peer at connect
      info.stage_slot_bytes = kStageSlotBytes;
    } else {
      info.heap_base = virt_addr_ ? reinterpret_cast<uint64_t>(region_.base) : 0;
      info.heap_key = switches_.publish_requested_key ? kHeapKey : fi_mr_key(heap_mr_);
      if (info.heap_key == FI_KEY_NOTAVAIL) return fail(Status::kUnsupported, "the heap's key is not available");
    }
    *out = info;
    return Status::kOk;
  }

  // Inserts the peer's address and exchanges a hello carrying the job secret (bounded): a peer that
  // never comes up, or one from another job, fails here, naming it.
  Status connect(int peer, const PeerInfo& info) override {
    if (status_ != Status::kOk) return status_;
    const auto* oi = std::get_if<OfiPeerInfo>(&info);
    if (peer < 0 || peer >= cfg_.size || peer == cfg_.rank || !oi)
      return fail(Status::kInvalidArgument, "rank " + std::to_string(peer) + " did not publish an ofi endpoint");
    if (oi->provider != info_->fabric_attr->prov_name)
      return fail(Status::kInvalidArgument, "rank " + std::to_string(peer) + " opened provider '" + oi->provider +
                                                "', this rank '" + info_->fabric_attr->prov_name +
                                                "' (set WEFT_OFI_PROVIDER alike on every rank)");
    if (oi->heap_memory != heap_memory())
      return fail(Status::kInvalidArgument,
                  "rank " + std::to_string(peer) + "'s heap is " + heap_memory_text(oi->heap_memory) +
                      ", this rank's " + heap_memory_text(heap_memory()) +
                      ": ofi needs every rank alike (a GPU heap is registered with the provider only where the "
                      "libfabric of every rank takes CUDA memory: the same libfabric and provider everywhere)");
    if (staged_ ? (oi->stage_slots != kStageSlots || oi->stage_slot_bytes != kStageSlotBytes)
                : virt_addr_ != (oi->heap_base != 0))
      return fail(Status::kProtocolError, "rank " + std::to_string(peer) + " addresses its heap differently");
    fi_addr_t addr = FI_ADDR_UNSPEC;
    int rc = fi_av_insert(av_, oi->addr.data(), 1, &addr, 0, nullptr);
    if (rc != 1)
      return fail(Status::kSystemError, "fi_av_insert for rank " + std::to_string(peer) + ": " + ofi_error(rc));
    peers_[peer].addr = addr;
    peers_[peer].heap_base = oi->heap_base;
    peers_[peer].heap_key = oi->heap_key;
    peers_[peer].connected = true;
    CtrlMsg h{kHelloMagic, cfg_.rank, cfg_.channel, 0, cfg_.secret, 0, 0, 0};
    if (staged_) {
      WEFT_CHECK(open_stage(peer));
      senders_[peer] = StageSender(kStageSlots);
      receivers_[peer] = StageReceiver(kStageSlots);
      h.stage_base = virt_addr_ ? reinterpret_cast<uint64_t>(stages_[peer].mem) : 0;
      h.stage_key = switches_.publish_requested_key ? kStageKey + peer : fi_mr_key(stages_[peer].mr);
      if (h.stage_key == FI_KEY_NOTAVAIL) return fail(Status::kUnsupported, "a staging ring's key is not available");
    }

    char* buf = ctrl_ + hello_send_offset();
    memcpy(buf, &h, sizeof h);
    Ctx* c = take_ctx(Ctx::kHelloSend, peer, -1);
    if (!c) return fail(Status::kInternal, "no context for the hello to rank " + std::to_string(peer));
    const double deadline = now_s() + cfg_.timeout_s;
    bool sent = false;
    hello_sent_ = false;
    while (!sent) {
      rc = fi_send(ep_, buf, sizeof h, ctrl_desc_, addr, &c->ctx);
      if (rc == 0) {
        sent = true;
      } else if (rc != -FI_EAGAIN) {
        return fail(Status::kSystemError, "hello to rank " + std::to_string(peer) + ": fi_send: " + ofi_error(rc));
      } else {
        WEFT_CHECK(drain());
        if (now_s() > deadline) return connect_timeout(peer, "could not send the hello");
      }
    }
    while (!hello_sent_ || !hello_from_[peer]) {
      WEFT_CHECK(drain());
      if (now_s() > deadline)
        return connect_timeout(peer, hello_sent_ ? "sent the hello, none came back" : "the hello was never sent");
      if (!hello_sent_ || !hello_from_[peer]) nap(20e-6);
    }
    last_progress_s_[peer] = now_s();
    return Status::kOk;
  }

  bool can_post(int peer) const override { return queues_[peer].size() < kQueuedPerPeer; }

  Status post_put(int peer, uint64_t local_offset, uint64_t remote_offset, uint64_t bytes, PostFlags flags,
                  uint64_t wr_id) override {
    if (status_ != Status::kOk) return status_;
    WEFT_CHECK(check_peer(peer));
    if (local_offset > region_.bytes || bytes > region_.bytes - local_offset || remote_offset > region_.bytes ||
        bytes > region_.bytes - remote_offset)
      return fail(Status::kInvalidArgument, "put outside the heap (rank " + std::to_string(peer) + ")");
    if (switches_.delay_first_put_rank == cfg_.rank && !delayed_first_put_) {  // a test's late rank, progressing
      delayed_first_put_ = true;
      for (const double until = now_s() + switches_.first_put_delay_s; now_s() < until;) {
        WEFT_CHECK(drain());
        nap(50e-6);
      }
    }
    Work w;
    w.is_put = true;
    w.local = local_offset;
    w.remote = remote_offset;
    w.bytes = bytes;
    w.flags = flags;
    w.wr_id = wr_id;
    enqueue(peer, w);
    return issue(peer);
  }

  Status post_signal(int peer, uint64_t flag_offset, uint64_t value, PostFlags flags, uint64_t wr_id) override {
    if (status_ != Status::kOk) return status_;
    WEFT_CHECK(check_peer(peer));
    if (flag_offset % 8 || region_.bytes < 8 || flag_offset > region_.bytes - 8)
      return fail(Status::kInvalidArgument, "flag offset outside the heap of rank " + std::to_string(peer));
    Work w;
    w.remote = flag_offset;
    w.value = value;
    w.flags = flags;
    w.wr_id = wr_id;
    enqueue(peer, w);
    return issue(peer);
  }

  Status poll(std::vector<Completion>* done) override {
    if (status_ != Status::kOk) return status_;
    if (progress_when_idle()) WEFT_CHECK(drain());
    for (int p = 0; p < cfg_.size; ++p) {
      if (!queues_[p].empty()) WEFT_CHECK(issue(p));
      if (staged_ && receivers_[p].credit_due()) WEFT_CHECK(send_credit(p));
    }
    done->insert(done->end(), done_.begin(), done_.end());
    done_.clear();
    return check_stuck();
  }

  // Reads the completion queue until something completes or max_s passes: with manual progress this
  // is what moves data, also data other ranks write here.
  void wait_activity(double max_s) override {
    const double end = now_s() + max_s;
    for (;;) {
      const size_t before = done_.size();
      if ((progress_when_idle() && drain() != Status::kOk) || done_.size() != before || now_s() >= end) return;
      nap(std::min(5e-6, max_s));
    }
  }

  Status close(const std::string& failure) override {
    if (status_ == Status::kOk && failure.empty() && ep_) {
      const double deadline = now_s() + cfg_.timeout_s;
      while (status_ == Status::kOk && busy()) {
        std::vector<Completion> ignored;
        if (poll(&ignored) != Status::kOk) break;
        if (now_s() > deadline) {
          fail(Status::kTimeout, "close: work to " + busiest_peer() + " not completed within " +
                                     std::to_string(static_cast<int>(cfg_.timeout_s)) + "s");
          break;
        }
        nap(5e-6);
      }
    }
    release();
    return status_;
  }

  std::string error_message() const override { return error_; }
  std::string memory_registration() const override {
    if (!info_) return "";
    const uint64_t m = static_cast<uint64_t>(info_->domain_attr->mr_mode);
    return "mr_mode " + ofi_mr_mode_names(m) + ": " + ofi_mr_mode_meaning(m);
  }
  void on_proxy_thread() override {
    // libfabric's CUDA calls for a registered GPU heap (cuMemGetAddressRange, IPC), and the staging
    // copies, run on this thread. A failure is logged by the hook; the copies then fail naming it.
    if (region_.kind == MemKind::kDevice && cfg_.copy_hooks.bind_thread)
      cfg_.copy_hooks.bind_thread(cfg_.copy_hooks.ctx);
  }
  std::string ordering() const override {
    if (!info_) return "";
    if (staged_) return "host staging, applied in sequence by the receiving proxy";
    return to_string(ordering_) + std::string(hmem_ ? "; the GPU heap registered with the provider (FI_HMEM)" : "");
  }

 private:
  struct Peer {
    fi_addr_t addr = FI_ADDR_UNSPEC;
    uint64_t heap_base = 0, heap_key = 0;
    uint64_t stage_base = 0, stage_key = 0;  // device heaps: the peer's receive ring for this rank (its hello)
    bool connected = false;
  };

  uint8_t heap_memory() const {
    return region_.kind == MemKind::kHost ? OfiPeerInfo::kHostHeap
           : hmem_                        ? OfiPeerInfo::kDeviceHeapRegistered
                                          : OfiPeerInfo::kDeviceHeapStaged;
  }
  static std::string heap_memory_text(uint8_t m) {
    return m == OfiPeerInfo::kHostHeap           ? "host memory"
           : m == OfiPeerInfo::kDeviceHeapStaged ? "GPU memory staged through host memory"
                                                 : "GPU memory registered with the provider (FI_HMEM)";
  }

  Status fail(Status s, const std::string& what) {
    if (status_ == Status::kOk) {
      status_ = s;
      error_ = "rank " + std::to_string(cfg_.rank) + " channel " + std::to_string(cfg_.channel) + ": ofi" +
               (info_ ? std::string(" (") + info_->fabric_attr->prov_name + ")" : std::string()) + ": " + what;
      WEFT_WARN(kNet, "%s", error_.c_str());
    }
    return status_;
  }

  Status connect_timeout(int peer, const char* what) {
    return fail(Status::kTimeout, "rank " + std::to_string(peer) + " did not connect within " +
                                      std::to_string(static_cast<int>(cfg_.timeout_s)) + "s (" + what +
                                      "; WEFT_PROXY_TIMEOUT)");
  }

  Status check_peer(int peer) {
    if (peer < 0 || peer >= cfg_.size || !peers_[peer].connected)
      return fail(Status::kInvalidArgument, "rank " + std::to_string(peer) + " is not connected");
    return Status::kOk;
  }

  static void nap(double s) {
    timespec ts{0, static_cast<long>(s * 1e9)};
    nanosleep(&ts, nullptr);
  }

  // --- setup ---------------------------------------------------------------------------------
  Status open() {
    fi_info* found = nullptr;
    int rc = ofi_lookup(provider_, switches_.virt_addr, &found);
    if (rc == -FI_ENODATA)
      return fail(Status::kNotFound, "libfabric offers no RDM endpoint with RMA through provider '" +
                                         (provider_.empty() ? std::string("any") : provider_) +
                                         "' (WEFT_OFI_PROVIDER; providers here: " + ofi_providers_here() + ")");
    if (rc) return fail(Status::kSystemError, "fi_getinfo: " + ofi_error(rc));
    // A device heap: the same provider's entries that take device memory, where it has them (never
    // another provider than the one chosen above: that may not reach the other hosts).
    if (region_.kind == MemKind::kDevice && region_.cuda_device >= 0 && switches_.hmem != 0 && !hmem_refused_) {
      fi_info* hmem = nullptr;
      if (ofi_lookup(found->fabric_attr->prov_name, switches_.virt_addr, &hmem, true) == 0 && (hmem->caps & FI_HMEM)) {
        fi_freeinfo(found);
        found = hmem;
        hmem_ = true;
        staged_ = false;
      } else if (hmem) {
        fi_freeinfo(hmem);
      }
    }
    // A NIC named for this channel (the topology mapping) picks the domain where the provider has it.
    fi_info* pick = found;
    for (fi_info* i = found; i && !cfg_.nic_name.empty(); i = i->next)
      if (i->domain_attr->name && cfg_.nic_name == i->domain_attr->name) {
        pick = i;
        break;
      }
    info_ = fi_dupinfo(pick);
    fi_freeinfo(found);
    if (!info_) return fail(Status::kSystemError, "fi_dupinfo failed");
    // Test switches: open the domain with a bit the provider did not ask for (ofi_plan.h).
    if (switches_.virt_addr == 1) info_->domain_attr->mr_mode |= FI_MR_VIRT_ADDR;
    if (switches_.prov_key == 1) info_->domain_attr->mr_mode |= FI_MR_PROV_KEY;
    if (switches_.mr_local == 1) info_->domain_attr->mr_mode |= FI_MR_LOCAL;
    if (switches_.mr_endpoint == 1) info_->domain_attr->mr_mode |= FI_MR_ENDPOINT;
    const uint64_t mr_mode = static_cast<uint64_t>(info_->domain_attr->mr_mode);
    virt_addr_ = mr_mode & FI_MR_VIRT_ADDR;
    mr_local_ = mr_mode & FI_MR_LOCAL;
    mr_endpoint_ = mr_mode & FI_MR_ENDPOINT;
    prov_key_ = mr_mode & FI_MR_PROV_KEY;
    if (info_->domain_attr->mr_key_size > sizeof(uint64_t) || (mr_mode & FI_MR_RAW))
      return fail(Status::kUnsupported, "the provider's memory keys are raw or longer than 8 bytes");
    fence_offered_ = info_->caps & FI_FENCE;
    traits_.fence = fence_offered_ && ofi_fence_usable(info_->fabric_attr->prov_name);
    traits_.write_after_write = info_->tx_attr->msg_order & FI_ORDER_WAW;
    traits_.max_order_waw_size = traits_.write_after_write ? info_->ep_attr->max_order_waw_size : 0;
    ordering_ = choose_ofi_ordering(traits_);
    if (switches_.force_ordering >= 0) ordering_ = static_cast<OfiOrdering>(switches_.force_ordering);
    max_msg_ = std::max<uint64_t>(info_->ep_attr->max_msg_size, 8);
    manual_progress_ = info_->domain_attr->data_progress == FI_PROGRESS_MANUAL;

    rc = fi_fabric(info_->fabric_attr, &fabric_, nullptr);
    if (rc) return fail(Status::kSystemError, "fi_fabric: " + ofi_error(rc));
    rc = fi_domain(fabric_, info_, &domain_, nullptr);
    if (rc) return fail(Status::kSystemError, "fi_domain: " + ofi_error(rc));
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_DATA;
    // Completion queue, address vector and operation contexts sized for the peer set (transport/peer_set.h),
    // not the job, by ofi_sizes.h (the resource report counts the same). What is asked for is recorded
    // (tally_, ofi_plan.h) so a test can hold the report against it.
    const size_t peers = cfg_.peers ? cfg_.peers->size() : static_cast<size_t>(cfg_.size - 1);
    cq_attr.size = ofi::cq_entries(peers);
    rc = fi_cq_open(domain_, &cq_attr, &cq_, nullptr);
    if (rc) return fail(Status::kSystemError, "fi_cq_open: " + ofi_error(rc));
    tally_.completion_queues += 1;
    tally_.completion_entries += cq_attr.size;
    fi_av_attr av_attr{};
    av_attr.type = FI_AV_TABLE;
    av_attr.count = ofi::av_entries(peers);
    rc = fi_av_open(domain_, &av_attr, &av_, nullptr);
    if (rc) return fail(Status::kSystemError, "fi_av_open: " + ofi_error(rc));
    tally_.address_entries += av_attr.count;
    rc = fi_endpoint(domain_, info_, &ep_, nullptr);
    if (rc) return fail(Status::kSystemError, "fi_endpoint: " + ofi_error(rc));
    tally_.endpoints += 1;
    rc = fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV);
    if (!rc) rc = fi_ep_bind(ep_, &av_->fid, 0);
    if (!rc) rc = fi_enable(ep_);
    if (rc) return fail(Status::kSystemError, "endpoint setup: " + ofi_error(rc));
    if (switches_.check_descriptors || switches_.emulate_mr_binding)
      ofi::desc_check_attach(ep_, mr_local_ && switches_.check_descriptors, cfg_.rank, cfg_.channel,
                             mr_endpoint_ && switches_.emulate_mr_binding);

    // The heap (remote writes land there; puts read from it) and the control block (signal values,
    // hellos), registered as the mr_mode bits ask.
    ctxs_.resize(ofi::contexts(peers));  // the writes, credits, receives, the hello
    free_ctx_.clear();
    for (size_t i = ctxs_.size() - kRecvSlots; i-- > 0;) free_ctx_.push_back(static_cast<int>(i));
    ctrl_bytes_ = ofi::control_bytes(peers, static_cast<uint64_t>(cfg_.size));
    ctrl_storage_.assign(ctrl_bytes_ + 64, 0);
    ctrl_ = ctrl_storage_.data() + (64 - reinterpret_cast<uintptr_t>(ctrl_storage_.data()) % 64) % 64;
    if (staged_) {
      if (info_->domain_attr->cq_data_size < 4 || cfg_.size > 0xffff)
        return fail(Status::kUnsupported,
                    "staging a device heap needs 4 bytes of remote CQ data and at most 65535 "
                    "ranks (the provider offers " +
                        std::to_string(info_->domain_attr->cq_data_size) + " bytes)");
    } else if (hmem_) {
      // Listing FI_HMEM is not registering CUDA memory: a libfabric built without CUDA lists shm's FI_HMEM
      // entry all the same, and one built with it refuses when it cannot load the CUDA runtime. Then the
      // heap is staged, as with any provider that does not take device memory.
      int refused = 0;
      WEFT_CHECK(reg(region_.base, region_.bytes, FI_WRITE | FI_REMOTE_WRITE, kHeapKey, &heap_mr_, "the heap",
                     region_.cuda_device, &refused));
      if (refused) {
        WEFT_INFO(kNet,
                  "rank %d channel %d: provider %s lists FI_HMEM but does not register the GPU heap (%s): staging it "
                  "through host memory",
                  cfg_.rank, cfg_.channel, info_->fabric_attr->prov_name, ofi_error(refused).c_str());
        release();
        tally_ = OfiWiring{};
        hmem_ = false;
        staged_ = true;
        hmem_refused_ = true;
        return open();
      }
    } else {
      WEFT_CHECK(reg(region_.base, region_.bytes, FI_WRITE | FI_REMOTE_WRITE, kHeapKey, &heap_mr_, "the heap"));
    }
    WEFT_CHECK(reg(ctrl_, ctrl_bytes_, FI_WRITE | FI_SEND | FI_RECV, kCtrlKey, &ctrl_mr_, "the control block"));
    // FI_MR_LOCAL: every local buffer's descriptor; FI_MR_HMEM: device buffers' (the heap's) at least.
    heap_desc_ = (mr_local_ || hmem_) && heap_mr_ && !switches_.drop_heap_descriptor ? fi_mr_desc(heap_mr_) : nullptr;
    ctrl_desc_ = mr_local_ ? fi_mr_desc(ctrl_mr_) : nullptr;
    for (int i = 0; i < kRecvSlots; ++i) WEFT_CHECK(post_recv(i));
    tally_.receives_posted += kRecvSlots;
    tally_.receive_bytes += uint64_t{kRecvSlots} * kMsgBytes;
    add_ofi_wiring(cfg_.rank, tally_);
    tally_ = OfiWiring{};
    WEFT_INFO(kNet,
              "rank %d channel %d: ofi provider %s, domain %s: signals ordered by %s (FI_FENCE %s, write-after-write "
              "%s up to %llu bytes), mr_mode %s (%s), %s progress; %s",
              cfg_.rank, cfg_.channel, info_->fabric_attr->prov_name, info_->domain_attr->name, to_string(ordering_),
              traits_.fence    ? "yes"
              : fence_offered_ ? "offered, not relied on"
                               : "no",
              traits_.write_after_write ? "yes" : "no", (unsigned long long)traits_.max_order_waw_size,
              ofi_mr_mode_names(mr_mode).c_str(), ofi_mr_mode_meaning(mr_mode).c_str(),
              manual_progress_ ? "manual" : "automatic",
              region_.kind == MemKind::kHost ? "host heap"
              : hmem_                        ? ("GPU heap registered with the provider (FI_HMEM, CUDA device " +
                         std::to_string(region_.cuda_device) + ")")
                            .c_str()
                      : "GPU heap staged through host memory");
    return Status::kOk;
  }

  // cuda_device >= 0: device memory of that GPU (FI_HMEM_CUDA; FI_HMEM_DEVICE_ONLY lets shm move it
  // by CUDA IPC instead of bouncing it through host memory). refused: where the registration call
  // itself fails, its code goes there (kOk returned, nothing registered) instead of failing the backend.
  Status reg(void* base, uint64_t bytes, uint64_t access, uint64_t key, fid_mr** mr, const char* what,
             int cuda_device = -1, int* refused = nullptr) {
    int rc = 0;
    if (cuda_device < 0) {
      rc = fi_mr_reg(domain_, base, bytes, access, 0, prov_key_ ? 0 : key, 0, mr, nullptr);
    } else {
      iovec iov{base, static_cast<size_t>(bytes)};
      fi_mr_attr attr{};
      attr.mr_iov = &iov;
      attr.iov_count = 1;
      attr.access = access;
      attr.requested_key = prov_key_ ? 0 : key;
      attr.iface = FI_HMEM_CUDA;
      attr.device.cuda = cuda_device;
      rc = fi_mr_regattr(domain_, &attr, FI_HMEM_DEVICE_ONLY, mr);
    }
    if (rc && refused) {
      *mr = nullptr;
      *refused = rc;
      return Status::kOk;
    }
    if (rc)
      return fail(Status::kSystemError,
                  std::string("registering ") + what + " (mr_mode " + ofi_mr_mode_names(info_->domain_attr->mr_mode) +
                      (cuda_device < 0 ? "): fi_mr_reg: " : "): fi_mr_regattr (FI_HMEM_CUDA): ") + ofi_error(rc));
    tally_.registrations += 1;
    tally_.registered_bytes += bytes;
    if (switches_.check_descriptors || switches_.emulate_mr_binding)
      ofi::desc_check_add_registration(ep_, *mr, base, bytes);
    if (mr_endpoint_) {
      if (switches_.emulate_mr_binding) ofi::desc_check_take_binding(*mr);
      rc = fi_mr_bind(*mr, &ep_->fid, 0);
      if (!rc && !switches_.skip_mr_enable) rc = fi_mr_enable(*mr);
      if (rc)
        return fail(Status::kSystemError, std::string("binding ") + what +
                                              " to the endpoint and enabling it (FI_MR_ENDPOINT): " + ofi_error(rc));
    }
    return Status::kOk;
  }

  // Control block: 8 bytes per context (signal values), the hello, the receive buffers, a credit
  // message per peer.
  size_t hello_send_offset() const { return ctxs_.size() * 8; }
  char* recv_buf(int slot) { return ctrl_ + hello_send_offset() + kMsgBytes * (slot + 1); }
  char* credit_buf(int peer) { return ctrl_ + hello_send_offset() + kMsgBytes * (kRecvSlots + 1 + peer); }
  // A connected peer's staging memory: the ring it writes here, then the ring this rank sends from.
  char* recv_stage(int sender, uint32_t slot) { return stages_[sender].mem + uint64_t{slot} * kStageSlotBytes; }
  char* send_stage(int peer, uint32_t slot) { return recv_stage(peer, kStageSlots + slot); }

  Status open_stage(int peer) {
    Stage& st = stages_[peer];
    const uint64_t bytes = ofi::stage_bytes_per_peer();
    if (cfg_.copy_hooks.alloc_host) st.mem = static_cast<char*>(cfg_.copy_hooks.alloc_host(cfg_.copy_hooks.ctx, bytes));
    st.pinned = st.mem != nullptr;
    if (!st.mem) {
      st.storage.assign(bytes, 0);
      st.mem = st.storage.data();
    }
    WEFT_CHECK(reg(st.mem, bytes, FI_WRITE | FI_REMOTE_WRITE, kStageKey + peer, &st.mr, "a staging ring"));
    st.desc = mr_local_ ? fi_mr_desc(st.mr) : nullptr;
    tally_.staging_bytes += bytes;
    add_ofi_wiring(cfg_.rank, tally_);
    tally_ = OfiWiring{};
    return Status::kOk;
  }

  Status post_recv(int slot) {
    Ctx* c = &ctxs_[ctxs_.size() - 1 - slot];  // receives own the last contexts
    c->kind = Ctx::kHelloRecv;
    c->op = slot;
    int rc = fi_recv(ep_, recv_buf(slot), kMsgBytes, ctrl_desc_, FI_ADDR_UNSPEC, &c->ctx);
    if (rc) return fail(Status::kSystemError, "fi_recv: " + ofi_error(rc));
    return Status::kOk;
  }

  Ctx* take_ctx(Ctx::Kind kind, int peer, int op) {
    if (free_ctx_.empty()) return nullptr;
    Ctx* c = &ctxs_[free_ctx_.back()];
    free_ctx_.pop_back();
    c->kind = kind;
    c->peer = peer;
    c->op = op;
    c->delivery = false;
    c->stage_slot = -1;
    return c;
  }
  void give_ctx(Ctx* c) {
    c->kind = Ctx::kFree;
    free_ctx_.push_back(static_cast<int>(c - ctxs_.data()));
  }
  int take_op(int peer, uint64_t wr_id) {
    int i;
    if (!free_op_.empty()) {
      i = free_op_.back();
      free_op_.pop_back();
    } else {
      i = static_cast<int>(ops_.size());
      ops_.emplace_back();
    }
    ops_[i] = Op{wr_id, peer, 0, false};
    return i;
  }

  // --- data path -----------------------------------------------------------------------------
  void enqueue(int peer, const Work& w) {
    if (!outstanding_[peer] && queues_[peer].empty()) last_progress_s_[peer] = now_s();  // the clock starts now
    queues_[peer].push_back(w);
  }

  // Hands the peer's queued work to libfabric in order, as far as ordering and room allow.
  Status issue(int peer) {
    if (staged_) return issue_staged(peer);
    auto& q = queues_[peer];
    const Peer& pr = peers_[peer];
    while (!q.empty()) {
      Work& w = q.front();
      // A fenced signal behind puts that only their delivery orders waits for those deliveries.
      if (!w.is_put && w.flags.fence && ordering_ != OfiOrdering::kFence && delivering_[peer]) return Status::kOk;
      if (w.op < 0) w.op = take_op(peer, w.wr_id);
      Op& op = ops_[w.op];
      do {
        if (outstanding_[peer] >= kOpsPerPeer || free_ctx_.empty()) return Status::kOk;
        const uint64_t n = w.is_put ? std::min(w.bytes - w.posted, max_msg_) : 8;
        Ctx* c = take_ctx(w.is_put ? Ctx::kPut : Ctx::kSignal, peer, w.op);
        const size_t slot = static_cast<size_t>(c - ctxs_.data());
        void* src;
        void* desc;
        if (w.is_put) {
          src = static_cast<char*>(region_.base) + w.local + w.posted;
          desc = heap_desc_;
        } else {
          src = ctrl_ + 8 * slot;
          memcpy(src, &w.value, 8);
          desc = ctrl_desc_;
        }
        uint64_t flags = FI_COMPLETION;
        if (w.is_put && (w.flags.delivered || ofi_put_needs_delivery(ordering_, traits_, n, w.flags.need_completion))) {
          flags |= FI_DELIVERY_COMPLETE;
          c->delivery = true;
        }
        if (!w.is_put && w.flags.fence && ordering_ == OfiOrdering::kFence) flags |= FI_FENCE;
        iovec iov{src, static_cast<size_t>(n)};
        fi_rma_iov rma{ofi_target_addr(virt_addr_, pr.heap_base, w.remote + (w.is_put ? w.posted : 0)),
                       static_cast<size_t>(n), pr.heap_key};
        fi_msg_rma msg{};
        msg.msg_iov = &iov;
        msg.desc = &desc;
        msg.iov_count = 1;
        msg.addr = pr.addr;
        msg.rma_iov = &rma;
        msg.rma_iov_count = 1;
        msg.context = &c->ctx;
        int rc = fi_writemsg(ep_, &msg, flags);
        if (rc == -FI_EAGAIN) {
          give_ctx(c);
          return drain();  // progress, retried on the next poll
        }
        if (rc)
          return fail(Status::kSystemError, std::string(w.is_put ? "put" : "signal") + " to rank " +
                                                std::to_string(peer) + ": fi_writemsg: " + ofi_error(rc));
        ++outstanding_[peer];
        ++op.in_flight;
        if (c->delivery) ++delivering_[peer];
        w.posted += w.is_put ? n : 0;
      } while (w.is_put && w.posted < w.bytes);
      op.all_posted = true;
      q.pop_front();
    }
    return Status::kOk;
  }

  // Device heaps: each put chunk and each signal takes a slot of the peer's ring; the payload is
  // copied out of the device heap into the send stage and written with its header as remote CQ data.
  Status issue_staged(int peer) {
    auto& q = queues_[peer];
    const Peer& pr = peers_[peer];
    StageSender& ring = senders_[peer];
    while (!q.empty()) {
      Work& w = q.front();
      if (w.op < 0) w.op = take_op(peer, w.wr_id);
      do {
        if (!ring.can_take() || free_ctx_.empty() || outstanding_[peer] >= kOpsPerPeer) return Status::kOk;
        const uint64_t n = w.is_put ? std::min<uint64_t>(w.bytes - w.posted, kStageSlotBytes - sizeof(StageHeader)) : 0;
        uint64_t seq = 0;
        const uint32_t slot = ring.take(&seq);
        char* buf = send_stage(peer, slot);
        StageHeader h{kStageMagic, static_cast<uint32_t>(w.is_put ? StageKind::kPut : StageKind::kSignal), seq,
                      w.remote + w.posted, w.is_put ? n : w.value};
        memcpy(buf, &h, sizeof h);
        if (n) {
          Status s = cfg_.copy_hooks.from_region(cfg_.copy_hooks.ctx, buf + sizeof h,
                                                 static_cast<char*>(region_.base) + w.local + w.posted, n);
          if (s != Status::kOk)
            return fail(s, "copying a put to rank " + std::to_string(peer) + " out of the device heap");
        }
        Ctx* c = take_ctx(w.is_put ? Ctx::kPut : Ctx::kSignal, peer, w.op);
        c->stage_slot = static_cast<int>(slot);
        const uint64_t target = ofi_target_addr(virt_addr_, pr.stage_base, uint64_t{slot} * kStageSlotBytes);
        int rc = fi_writedata(ep_, buf, sizeof h + n, stages_[peer].desc, stage_cq_data(cfg_.rank, slot), pr.addr,
                              target, pr.stage_key, &c->ctx);
        if (rc == -FI_EAGAIN) {
          give_ctx(c);
          ring.untake(slot);
          return drain();
        }
        if (rc)
          return fail(Status::kSystemError, std::string(w.is_put ? "staged put" : "staged signal") + " to rank " +
                                                std::to_string(peer) + ": fi_writedata: " + ofi_error(rc));
        ++outstanding_[peer];
        ++ops_[w.op].in_flight;
        w.posted += n;
      } while (w.is_put && w.posted < w.bytes);
      ops_[w.op].all_posted = true;
      q.pop_front();
    }
    return Status::kOk;
  }

  // A stage slot from `sender` arrived: apply every slot now due from it in sequence (data copied
  // into the device heap before any later signal is set), then return credit.
  Status stage_arrived(uint64_t data) {
    int sender = -1;
    uint32_t slot = 0;
    stage_cq_split(data, &sender, &slot);
    if (!staged_ || sender < 0 || sender >= cfg_.size || sender == cfg_.rank || !receivers_[sender].arrived(slot))
      return fail(Status::kProtocolError, "remote CQ data " + std::to_string(data) +
                                              " names no stage slot this rank has open (sender field " +
                                              std::to_string(sender) + ")");
    StageReceiver& ring = receivers_[sender];
    uint64_t seq = 0;
    while (ring.next(&slot, &seq)) {
      const char* buf = recv_stage(sender, slot);
      StageHeader h;
      memcpy(&h, buf, sizeof h);
      const bool put = h.kind == static_cast<uint32_t>(StageKind::kPut);
      const uint64_t len = put ? h.length_or_value : 8;
      const bool ok = h.magic == kStageMagic && h.seq == seq &&
                      (put || h.kind == static_cast<uint32_t>(StageKind::kSignal)) &&
                      len <= kStageSlotBytes - sizeof h && h.dst_offset <= region_.bytes &&
                      len <= region_.bytes - h.dst_offset && (put || h.dst_offset % 8 == 0);
      if (!ok)
        return fail(Status::kProtocolError, "stage slot " + std::to_string(slot) + " from rank " +
                                                std::to_string(sender) + " is malformed (sequence " +
                                                std::to_string(h.seq) + ", expected " + std::to_string(seq) + ")");
      void* dst = static_cast<char*>(region_.base) + h.dst_offset;
      Status s = Status::kOk;  // a zero-length put (the preflight's) copies nothing: no CUDA call on this thread
      if (put && len)
        s = cfg_.copy_hooks.to_region(cfg_.copy_hooks.ctx, dst, buf + sizeof h, len);
      else if (!put)
        s = cfg_.copy_hooks.to_region(cfg_.copy_hooks.ctx, dst, &h.length_or_value, 8);
      if (s != Status::kOk)
        return fail(s, std::string("copying a staged ") + (put ? "put" : "signal") + " from rank " +
                           std::to_string(sender) + " into the device heap");
      ring.consume();
    }
    return send_credit(sender);
  }

  // One credit message in flight per peer; the next carries whatever was consumed meanwhile.
  Status send_credit(int peer) {
    StageReceiver& ring = receivers_[peer];
    if (!ring.credit_due() || credit_in_flight_[peer] || free_ctx_.empty()) return Status::kOk;
    CtrlMsg m{kCreditMagic, cfg_.rank, cfg_.channel, 0, cfg_.secret, ring.consumed(), 0, 0};
    memcpy(credit_buf(peer), &m, sizeof m);
    Ctx* c = take_ctx(Ctx::kCreditSend, peer, -1);
    int rc = fi_send(ep_, credit_buf(peer), sizeof m, ctrl_desc_, peers_[peer].addr, &c->ctx);
    if (rc == -FI_EAGAIN) {
      give_ctx(c);
      return Status::kOk;  // poll() tries again
    }
    if (rc) return fail(Status::kSystemError, "staging credit to rank " + std::to_string(peer) + ": " + ofi_error(rc));
    ring.credit_sent(m.value);
    credit_in_flight_[peer] = true;
    return Status::kOk;
  }

  // Reads every available completion; errors fail the backend naming the peer.
  Status drain() {
    if (status_ != Status::kOk) return status_;
    fi_cq_data_entry e[32];
    for (;;) {
      ssize_t n = fi_cq_read(cq_, e, 32);
      if (n == -FI_EAGAIN) return Status::kOk;
      if (n == -FI_EAVAIL) return read_error();
      if (n < 0) return fail(Status::kSystemError, "fi_cq_read: " + ofi_error(static_cast<int>(n)));
      for (ssize_t i = 0; i < n; ++i) {
        if (e[i].flags & FI_REMOTE_CQ_DATA) {
          WEFT_CHECK(stage_arrived(e[i].data));
          Ctx* c = reinterpret_cast<Ctx*>(e[i].op_context);  // a receive, where the provider used one
          if (c >= ctxs_.data() && c < ctxs_.data() + ctxs_.size() && c->kind == Ctx::kHelloRecv)
            WEFT_CHECK(post_recv(c->op));
          continue;
        }
        WEFT_CHECK(complete(reinterpret_cast<Ctx*>(e[i].op_context)));
      }
      if (n < 32) return Status::kOk;
    }
  }

  Status complete(Ctx* c) {
    if (c < ctxs_.data() || c >= ctxs_.data() + ctxs_.size())
      return fail(Status::kInternal, "a completion for an unknown context");
    switch (c->kind) {
      case Ctx::kHelloRecv: {
        CtrlMsg h;
        memcpy(&h, recv_buf(c->op), sizeof h);
        if ((h.magic != kHelloMagic && h.magic != kCreditMagic) || h.secret != cfg_.secret || h.rank < 0 ||
            h.rank >= cfg_.size || h.channel != cfg_.channel)
          return fail(Status::kProtocolError, "a control message that is not from this job's channel " +
                                                  std::to_string(cfg_.channel) + " (rank field " +
                                                  std::to_string(h.rank) + ")");
        if (h.magic == kHelloMagic) {
          hello_from_[h.rank] = true;
          peers_[h.rank].stage_base = h.stage_base;
          peers_[h.rank].stage_key = h.stage_key;
        } else if (!staged_ || !senders_[h.rank].credit(h.value)) {
          return fail(Status::kProtocolError, "rank " + std::to_string(h.rank) + " returned credit for " +
                                                  std::to_string(h.value) + " stage slots, more than were sent");
        }
        return post_recv(c->op);
      }
      case Ctx::kCreditSend:
        credit_in_flight_[c->peer] = false;
        give_ctx(c);
        return Status::kOk;
      case Ctx::kHelloSend:
        hello_sent_ = true;
        give_ctx(c);
        return Status::kOk;
      case Ctx::kPut:
      case Ctx::kSignal: {
        const int peer = c->peer;
        Op& op = ops_[c->op];
        if (c->stage_slot >= 0) senders_[peer].local_complete(static_cast<uint32_t>(c->stage_slot));
        --outstanding_[peer];
        if (c->delivery) --delivering_[peer];
        last_progress_s_[peer] = now_s();
        if (--op.in_flight == 0 && op.all_posted) {
          done_.push_back({op.wr_id, peer});
          free_op_.push_back(c->op);
        }
        give_ctx(c);
        return Status::kOk;
      }
      default:
        return fail(Status::kInternal, "a completion for a context not in flight");
    }
  }

  Status read_error() {
    fi_cq_err_entry err{};
    ssize_t rc = fi_cq_readerr(cq_, &err, 0);
    if (rc < 0) return fail(Status::kSystemError, "fi_cq_readerr: " + ofi_error(static_cast<int>(rc)));
    Ctx* c = reinterpret_cast<Ctx*>(err.op_context);
    const bool known = c >= ctxs_.data() && c < ctxs_.data() + ctxs_.size();
    const char* what = !known                        ? "an operation"
                       : c->kind == Ctx::kPut        ? "a put"
                       : c->kind == Ctx::kSignal     ? "a signal"
                       : c->kind == Ctx::kHelloSend  ? "the hello"
                       : c->kind == Ctx::kCreditSend ? "a staging credit"
                                                     : "a receive";
    const std::string peer = known && c->peer >= 0 ? " to rank " + std::to_string(c->peer) : std::string();
    return fail(err.err == FI_ECANCELED ? Status::kPeerFailed : Status::kSystemError,
                std::string(what) + peer + " failed: " + fi_strerror(err.err) + " (" +
                    fi_cq_strerror(cq_, err.prov_errno, err.err_data, nullptr, 0) + ")");
  }

  // A peer whose posted work has not moved for the timeout fails the backend, naming it.
  Status check_stuck() {
    const double t = now_s();
    for (int p = 0; p < cfg_.size; ++p)
      if ((outstanding_[p] || !queues_[p].empty()) && t - last_progress_s_[p] > cfg_.timeout_s)
        return fail(Status::kTimeout, "no completion from rank " + std::to_string(p) + " for " +
                                          std::to_string(static_cast<int>(cfg_.timeout_s)) + "s with " +
                                          std::to_string(outstanding_[p]) + " writes posted and " +
                                          std::to_string(queues_[p].size()) + " waiting (WEFT_PROXY_TIMEOUT)");
    return Status::kOk;
  }

  // Always, but under the test switch that shows why (OfiTestSwitches::idle_progress).
  bool progress_when_idle() const { return switches_.idle_progress != 0 || busy(); }
  bool busy() const {
    for (int p = 0; p < cfg_.size; ++p)
      if (outstanding_[p] || !queues_[p].empty()) return true;
    return false;
  }
  std::string busiest_peer() const {
    int best = 0;
    for (int p = 0; p < cfg_.size; ++p)
      if (outstanding_[p] + queues_[p].size() > outstanding_[best] + queues_[best].size()) best = p;
    return "rank " + std::to_string(best);
  }

  void release() {
    if (ep_) ofi::desc_check_detach(ep_);  // the provider's own tables back (if a test wrapped them)
    if (ep_) fi_close(&ep_->fid);
    if (heap_mr_) fi_close(&heap_mr_->fid);
    if (ctrl_mr_) fi_close(&ctrl_mr_->fid);
    for (Stage& st : stages_) {
      if (st.mr) fi_close(&st.mr->fid);
      if (st.pinned && cfg_.copy_hooks.free_host) cfg_.copy_hooks.free_host(cfg_.copy_hooks.ctx, st.mem);
      st = Stage();
    }
    if (av_) fi_close(&av_->fid);
    if (cq_) fi_close(&cq_->fid);
    if (domain_) fi_close(&domain_->fid);
    if (fabric_) fi_close(&fabric_->fid);
    if (info_) fi_freeinfo(info_);
    ep_ = nullptr;
    heap_mr_ = ctrl_mr_ = nullptr;
    av_ = nullptr;
    cq_ = nullptr;
    domain_ = nullptr;
    fabric_ = nullptr;
    info_ = nullptr;
  }

  BackendConfig cfg_;
  std::string provider_;
  OfiTestSwitches switches_;
  bool delayed_first_put_ = false;
  OfiWiring tally_;  // what this backend asked libfabric for, not yet added to the process's record
  Region region_;
  fi_info* info_ = nullptr;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_av* av_ = nullptr;
  fid_ep* ep_ = nullptr;
  fid_mr* heap_mr_ = nullptr;
  fid_mr* ctrl_mr_ = nullptr;
  void* heap_desc_ = nullptr;
  void* ctrl_desc_ = nullptr;
  bool virt_addr_ = false, mr_local_ = false, mr_endpoint_ = false, prov_key_ = false, manual_progress_ = false;
  bool fence_offered_ = false;  // FI_FENCE in the caps (traits_.fence: offered and usable, ofi_fence_usable)
  OfiOrderTraits traits_;
  OfiOrdering ordering_ = OfiOrdering::kDelivery;
  uint64_t max_msg_ = 0;

  std::vector<char> ctrl_storage_;
  char* ctrl_ = nullptr;  // signal values (8 bytes per context), the hello, receive buffers
  size_t ctrl_bytes_ = 0;
  std::vector<Ctx> ctxs_;
  std::vector<int> free_ctx_;
  std::vector<Op> ops_;
  std::vector<int> free_op_;

  std::vector<Peer> peers_;
  std::vector<std::deque<Work>> queues_;
  std::vector<uint64_t> outstanding_;  // writes posted, not completed
  std::vector<uint64_t> delivering_;   // of those, posted with FI_DELIVERY_COMPLETE
  std::vector<double> last_progress_s_;
  std::vector<bool> hello_from_;
  bool hello_sent_ = false;
  std::vector<Completion> done_;

  // Device heaps: registered with the provider (FI_HMEM), or host staging.
  bool hmem_ = false;
  bool hmem_refused_ = false;  // the provider listed FI_HMEM and refused the heap's registration
  bool staged_ = false;
  struct Stage {
    char* mem = nullptr;  // the peer's receive ring, then this rank's send ring to it
    bool pinned = false;  // from copy_hooks.alloc_host
    std::vector<char> storage;
    fid_mr* mr = nullptr;
    void* desc = nullptr;
  };
  std::vector<Stage> stages_;
  std::vector<StageSender> senders_;
  std::vector<StageReceiver> receivers_;
  std::vector<bool> credit_in_flight_;

  Status status_ = Status::kOk;
  std::string error_;
};

}  // namespace

Status make_ofi_backend(const BackendConfig& config, std::unique_ptr<NetBackend>* out) {
  std::string provider;
  WEFT_CHECK(get_param("WEFT_OFI_PROVIDER", &provider));
  *out = std::make_unique<OfiBackend>(config, provider);
  return Status::kOk;
}

}  // namespace weft::transport
