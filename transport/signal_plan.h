// Perseus signal ordering as pure functions: which signals carry a fence, and per-destination batching.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "base/signal_mode.h"

namespace weft::transport {

using runtime::SignalMode;
using runtime::to_string;

// serial: no fence (the proxy waited for the data); fenced: every signal; batched: the first
// signal of each per-destination batch (the NIC then orders the whole batch after earlier puts).
bool signal_fence(SignalMode mode, bool first_in_batch);
// Test-only (never a WEFT_* parameter): with `on` false, signal_fence() answers false in every mode,
// the proxy's fence decision forced off, so the ordering tests can show that they catch a missing
// fence. Process-wide; tests set it back to true when done.
void set_fence_decision_for_test(bool on);
// Only serial mode makes the proxy wait for put completions before a signal.
bool proxy_waits_before_signal(SignalMode mode);

struct SignalPost {
  uint64_t flag = 0;
  uint64_t value = 0;
  bool fence = false;
};

// Batched mode: signals wait per destination until the FIFO runs dry, a batch fills, or the puts
// posted behind a batch's signals would exceed `max_bytes_behind` (a signal never waits behind more
// than that much data: a chunked transfer's flags keep pace with its chunks). Signals to one flag
// coalesce to the largest value (epochs only grow, so the newest covers the rest).
class SignalBatcher {
 public:
  SignalBatcher(int world_size, int batch_max, uint64_t max_bytes_behind = ~uint64_t{0})
      : pending_(world_size), behind_(world_size, 0), batch_max_(batch_max), max_behind_(max_bytes_behind) {}
  // Returns true when `peer`'s batch is full and should be posted now.
  bool add(int peer, uint64_t flag, uint64_t value);
  // A put of `bytes` to `peer` is about to be posted: true when the peer's pending batch must be
  // posted first (then call take(peer) before the put); otherwise the put is counted behind it.
  bool close_before_put(int peer, uint64_t bytes);
  // The batch for `peer`, in arrival order, first one fenced; the batch is emptied.
  std::vector<SignalPost> take(int peer);
  uint64_t pending() const { return total_; }
  uint64_t pending(int peer) const { return pending_[peer].size(); }

 private:
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> pending_;
  std::vector<uint64_t> behind_;  // put bytes posted after each pending batch opened
  int batch_max_;
  uint64_t max_behind_;
  uint64_t total_ = 0;
};

}  // namespace weft::transport
