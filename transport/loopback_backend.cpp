// loopback net backend: ranks that are threads of one process; posts are queued and applied in order on poll.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>

#include "base/log.h"
#include "transport/net_backend.h"

namespace weft::transport {
namespace {

// fabric id -> rank -> region. Entries live until the backend that registered them closes.
std::mutex g_mutex;
std::map<std::pair<uint64_t, int>, Region> g_regions;

struct Op {
  bool is_put;
  uint64_t src, dst, bytes_or_value;
  uint64_t wr_id;
};

class LoopbackBackend final : public NetBackend {
 public:
  explicit LoopbackBackend(const BackendConfig& c) : cfg_(c), peers_(c.size), queues_(c.size) {}
  ~LoopbackBackend() override { unpublish(); }
  const char* name() const override { return "loopback"; }

  Status register_region(const Region& r) override {
    if (r.kind != MemKind::kHost) return fail(Status::kUnsupported, "loopback serves host memory only");
    region_ = r;
    return Status::kOk;
  }

  Status local_info(PeerInfo* out) override {
    // The job secret doubles as the fabric id: ranks of one job share it, other jobs do not.
    std::lock_guard<std::mutex> lock(g_mutex);
    g_regions[{fabric(), cfg_.rank}] = region_;
    published_ = true;
    *out = LoopbackPeerInfo{fabric(), static_cast<int32_t>(getpid())};
    return Status::kOk;
  }

  Status connect(int peer, const PeerInfo& info) override {
    const auto* li = std::get_if<LoopbackPeerInfo>(&info);
    if (!li || li->pid != getpid())
      return fail(Status::kUnsupported,
                  "loopback connects ranks of one process only (rank " + std::to_string(peer) + " is elsewhere)");
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_regions.find({li->fabric, peer});
    if (it == g_regions.end()) return fail(Status::kNotFound, "rank " + std::to_string(peer) + " has no region");
    peers_[peer] = it->second;
    return Status::kOk;
  }

  bool can_post(int peer) const override { return queues_[peer].size() < 1024; }

  Status post_put(int peer, uint64_t local_offset, uint64_t remote_offset, uint64_t bytes, PostFlags,
                  uint64_t wr_id) override {
    if (status_ != Status::kOk) return status_;
    if (!peers_[peer].base) return fail(Status::kInvalidArgument, "rank " + std::to_string(peer) + " not connected");
    if (local_offset > region_.bytes || bytes > region_.bytes - local_offset || remote_offset > peers_[peer].bytes ||
        bytes > peers_[peer].bytes - remote_offset)
      return fail(Status::kInvalidArgument, "put outside a region (rank " + std::to_string(peer) + ")");
    queues_[peer].push_back({true, local_offset, remote_offset, bytes, wr_id});
    return Status::kOk;
  }

  Status post_signal(int peer, uint64_t flag_offset, uint64_t value, PostFlags, uint64_t wr_id) override {
    if (status_ != Status::kOk) return status_;
    if (!peers_[peer].base) return fail(Status::kInvalidArgument, "rank " + std::to_string(peer) + " not connected");
    if (flag_offset % 8 || peers_[peer].bytes < 8 || flag_offset > peers_[peer].bytes - 8)  // no wrap near 2^64
      return fail(Status::kInvalidArgument, "flag offset outside the region of rank " + std::to_string(peer));
    queues_[peer].push_back({false, 0, flag_offset, value, wr_id});
    return Status::kOk;
  }

  // Applies a few queued ops per peer in order, so completions trail posts as on a real network.
  Status poll(std::vector<Completion>* done) override {
    if (status_ != Status::kOk) return status_;
    for (int p = 0; p < cfg_.size; ++p) {
      for (int k = 0; k < 64 && !queues_[p].empty(); ++k) {
        const Op& op = queues_[p].front();
        char* dst = static_cast<char*>(peers_[p].base);
        if (op.is_put) {
          memcpy(dst + op.dst, static_cast<char*>(region_.base) + op.src, op.bytes_or_value);
        } else {
          __atomic_store_n(reinterpret_cast<uint64_t*>(dst + op.dst), op.bytes_or_value, __ATOMIC_RELEASE);
        }
        done->push_back({op.wr_id, p});
        queues_[p].pop_front();
      }
    }
    return Status::kOk;
  }

  void wait_activity(double max_s) override { usleep(static_cast<useconds_t>(std::min(max_s, 0.001) * 1e6)); }

  Status close(const std::string&) override {
    std::vector<Completion> ignored;
    while (status_ == Status::kOk) {
      bool any = false;
      for (auto& q : queues_) any |= !q.empty();
      if (!any) break;
      poll(&ignored);
    }
    unpublish();
    return status_;
  }

  std::string error_message() const override { return error_; }

 private:
  Status fail(Status s, const std::string& what) {
    if (status_ == Status::kOk) {
      status_ = s;
      error_ = "rank " + std::to_string(cfg_.rank) + " channel " + std::to_string(cfg_.channel) + ": loopback: " + what;
      WEFT_WARN(kNet, "%s", error_.c_str());
    }
    return status_;
  }
  uint64_t fabric() const { return cfg_.secret + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(cfg_.channel + 1); }
  void unpublish() {
    if (!published_) return;
    std::lock_guard<std::mutex> lock(g_mutex);
    g_regions.erase({fabric(), cfg_.rank});
    published_ = false;
  }

  BackendConfig cfg_;
  Region region_;
  std::vector<Region> peers_;
  std::vector<std::deque<Op>> queues_;
  bool published_ = false;
  Status status_ = Status::kOk;
  std::string error_;
};

}  // namespace

std::unique_ptr<NetBackend> make_loopback_backend(const BackendConfig& config) {
  return std::make_unique<LoopbackBackend>(config);
}

}  // namespace weft::transport
