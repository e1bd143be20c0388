// Perseus signal ordering: fence choice and per-destination batching.
#include "transport/signal_plan.h"

#include <atomic>

#include "transport/proxy.h"

namespace weft::transport {
namespace {

std::atomic<bool> g_fence_decision{true};

}  // namespace

void set_fence_decision_for_test(bool on) { g_fence_decision.store(on, std::memory_order_relaxed); }

bool signal_fence(SignalMode mode, bool first_in_batch) {
  if (!g_fence_decision.load(std::memory_order_relaxed)) return false;
  switch (mode) {
    case SignalMode::kSerial:
      return false;
    case SignalMode::kFenced:
      return true;
    case SignalMode::kBatched:
      return first_in_batch;
  }
  return true;
}

bool proxy_waits_before_signal(SignalMode mode) { return mode == SignalMode::kSerial; }

bool SignalBatcher::add(int peer, uint64_t flag, uint64_t value) {
  auto& pend = pending_[peer];
  for (auto& fv : pend)
    if (fv.first == flag) {
      if (value > fv.second) fv.second = value;
      return false;
    }
  pend.emplace_back(flag, value);
  ++total_;
  return static_cast<int>(pend.size()) >= batch_max_;
}

bool SignalBatcher::close_before_put(int peer, uint64_t bytes) {
  if (pending_[peer].empty()) return false;
  if (bytes > max_behind_ || behind_[peer] > max_behind_ - bytes) return true;
  behind_[peer] += bytes;
  return false;
}

std::vector<SignalPost> SignalBatcher::take(int peer) {
  auto& pend = pending_[peer];
  std::vector<SignalPost> out;
  out.reserve(pend.size());
  for (size_t i = 0; i < pend.size(); ++i)
    out.push_back({pend[i].first, pend[i].second, signal_fence(SignalMode::kBatched, i == 0)});
  total_ -= pend.size();
  pend.clear();
  behind_[peer] = 0;
  return out;
}

}  // namespace weft::transport
