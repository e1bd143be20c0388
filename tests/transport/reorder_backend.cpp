// Test shim net backend: delays and reorders writes between fences; counts fences and overtakes for the cost model.
#include "reorder_backend.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "base/log.h"

namespace weft::testing {

using transport::Completion;
using transport::PeerInfo;
using transport::PostFlags;
using transport::Region;

void ReorderFabric::publish(int rank, const Region& r) {
  std::lock_guard<std::mutex> lock(mutex_);
  regions_[rank] = r;
}

Region ReorderFabric::lookup(int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  return regions_[rank];
}

double modelled_seconds(const ReorderStats& s, uint64_t proxy_stalls, const ReorderCost& c) {
  return static_cast<double>(s.bytes) / (c.gbytes_per_s * 1e9) + static_cast<double>(s.puts + s.signals) * c.op_s +
         static_cast<double>(s.fences) * c.fence_s + static_cast<double>(proxy_stalls) * c.stall_s;
}

ReorderBackend::ReorderBackend(const transport::BackendConfig& cfg, std::shared_ptr<ReorderFabric> fabric,
                               uint64_t seed, int max_delay_polls)
    : cfg_(cfg),
      fabric_(std::move(fabric)),
      rng_(seed),
      max_delay_(max_delay_polls),
      peers_(cfg.size),
      pending_(cfg.size),
      epoch_(cfg.size, 0) {}

Status ReorderBackend::fail(Status s, const std::string& what) {
  if (status_ == Status::kOk) {
    status_ = s;
    error_ = "rank " + std::to_string(cfg_.rank) + ": reorder shim: " + what;
    WEFT_WARN(kNet, "%s", error_.c_str());
  }
  return status_;
}

Status ReorderBackend::register_region(const Region& region) {
  if (region.kind != transport::MemKind::kHost) return fail(Status::kUnsupported, "host memory only");
  region_ = region;
  return Status::kOk;
}

Status ReorderBackend::local_info(PeerInfo* out) {
  fabric_->publish(cfg_.rank, region_);
  *out = transport::LoopbackPeerInfo{0, static_cast<int32_t>(getpid())};
  return Status::kOk;
}

Status ReorderBackend::connect(int peer, const PeerInfo&) {
  peers_[peer] = fabric_->lookup(peer);
  if (!peers_[peer].base) return fail(Status::kNotFound, "rank " + std::to_string(peer) + " has no region");
  return Status::kOk;
}

Status ReorderBackend::post_put(int peer, uint64_t local_offset, uint64_t remote_offset, uint64_t bytes,
                                PostFlags flags, uint64_t wr_id) {
  if (status_ != Status::kOk) return status_;
  if (!peers_[peer].base || local_offset > region_.bytes || bytes > region_.bytes - local_offset ||
      remote_offset > peers_[peer].bytes || bytes > peers_[peer].bytes - remote_offset)
    return fail(Status::kInvalidArgument, "put outside a region (rank " + std::to_string(peer) + ")");
  if (flags.fence) ++epoch_[peer], ++stats_.fences;
  ++stats_.puts;
  stats_.bytes += bytes;
  pending_[peer].push_back(
      {true, local_offset, remote_offset, bytes, wr_id, epoch_[peer], seq_++, polls_ + rng_() % (max_delay_ + 1)});
  return Status::kOk;
}

Status ReorderBackend::post_signal(int peer, uint64_t flag_offset, uint64_t value, PostFlags flags, uint64_t wr_id) {
  if (status_ != Status::kOk) return status_;
  if (!peers_[peer].base || flag_offset % 8 || flag_offset + 8 > peers_[peer].bytes)
    return fail(Status::kInvalidArgument, "flag outside the region of rank " + std::to_string(peer));
  if (flags.fence) ++epoch_[peer], ++stats_.fences;
  ++stats_.signals;
  pending_[peer].push_back(
      {false, 0, flag_offset, value, wr_id, epoch_[peer], seq_++, polls_ + rng_() % (max_delay_ + 1)});
  return Status::kOk;
}

void ReorderBackend::apply(int peer, const Write& w) {
  char* dst = static_cast<char*>(peers_[peer].base);
  if (w.is_put)
    memcpy(dst + w.dst, static_cast<char*>(region_.base) + w.src, w.bytes_or_value);
  else
    __atomic_store_n(reinterpret_cast<uint64_t*>(dst + w.dst), w.bytes_or_value, __ATOMIC_RELEASE);
}

// Per peer: the writes of the oldest pending epoch that are due, a random number of them in a random order.
Status ReorderBackend::poll(std::vector<Completion>* done) {
  if (status_ != Status::kOk) return status_;
  ++polls_;
  std::vector<size_t> due;
  for (int p = 0; p < cfg_.size; ++p) {
    auto& q = pending_[p];
    if (q.empty()) continue;
    const uint64_t epoch = q.front().epoch;  // epochs never decrease along the queue
    due.clear();
    for (size_t i = 0; i < q.size() && q[i].epoch == epoch; ++i)
      if (q[i].ready_poll <= polls_) due.push_back(i);
    if (due.empty()) continue;
    std::shuffle(due.begin(), due.end(), rng_);
    due.resize(1 + rng_() % due.size());
    std::sort(due.begin(), due.end(), [&](size_t a, size_t b) { return q[a].seq > q[b].seq; });
    // Applied newest first among the chosen: whatever is left behind was overtaken.
    std::vector<Write> applied;
    for (size_t i : due) applied.push_back(q[i]);
    std::shuffle(applied.begin(), applied.end(), rng_);
    for (size_t i : due) q.erase(q.begin() + static_cast<std::ptrdiff_t>(i));  // descending: indices stay valid
    for (const Write& w : applied) {
      bool overtook = false;
      for (const Write& o : q) overtook |= o.seq < w.seq;
      for (const Write& o : applied) overtook |= o.seq<w.seq&& & o> & w;
      stats_.overtakes += overtook;
      apply(p, w);
      done->push_back({w.wr_id, p});
    }
  }
  return Status::kOk;
}

void ReorderBackend::wait_activity(double max_s) {
  bool pending = false;
  for (const auto& q : pending_) pending |= !q.empty();
  usleep(static_cast<useconds_t>(std::min(max_s, pending ? 2e-6 : 1e-3) * 1e6));
}

Status ReorderBackend::close(const std::string&) {
  std::vector<Completion> ignored;
  for (int rounds = 0; status_ == Status::kOk && rounds < 1000000; ++rounds) {
    bool any = false;
    for (const auto& q : pending_) any |= !q.empty();
    if (!any) break;
    poll(&ignored);
  }
  return status_;
}

}  // namespace weft::testing
