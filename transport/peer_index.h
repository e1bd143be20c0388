// Rank -> slot over a rank's peer set: per-peer state is sized by the peers a rank faces, never by the world.
//
//   peer set of r5 at 3 x 4 (transport/peer_set.h): net = {1, 9}
//   PeerIndex:  slot 0 -> rank 1, slot 1 -> rank 9;  slot(9) == 1, slot(4) == -1 (a node-mate: NVLink's)
//
// The proxy and the backends keep one entry per slot (outstanding work, batches, queues, control
// buffers); a lookup is a binary search over the peers (at most 127 at 128 x 8 with rails).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"

namespace weft::transport {

class PeerIndex {
 public:
  static constexpr int kMaxPeers = 1 << 20;  // bound on any peer list a caller may hand in

  PeerIndex() = default;

  // Every other rank of a world of `world` (the full mesh; callers that name no peer set).
  static PeerIndex every_other(int self, int world) {
    PeerIndex x;
    for (int r = 0; r < world && r < kMaxPeers; ++r)
      if (r != self) x.ranks_.push_back(r);
    return x;
  }

  // `peers` must be ascending, distinct, inside [0, world) and never `self`; *why says otherwise.
  static Status make(const std::vector<int>& peers, int self, int world, PeerIndex* out, std::string* why) {
    if (peers.size() > static_cast<size_t>(kMaxPeers)) {
      *why = std::to_string(peers.size()) + " peers, more than " + std::to_string(kMaxPeers);
      return Status::kInvalidArgument;
    }
    for (size_t i = 0; i < peers.size(); ++i) {
      const int p = peers[i];
      if (p < 0 || p >= world || p == self || (i > 0 && p <= peers[i - 1])) {
        *why = "peer " + std::to_string(p) + " (entry " + std::to_string(i) +
               ") is not an ascending list of other ranks in a world of " + std::to_string(world);
        return Status::kInvalidArgument;
      }
    }
    out->ranks_ = peers;
    return Status::kOk;
  }

  // A backend's or proxy's index: `peers` when given, else every other rank. On a malformed list
  // the index is empty and *why says why (the caller fails with it before any traffic).
  static PeerIndex for_config(const std::optional<std::vector<int>>& peers, int self, int world, std::string* why) {
    if (!peers) return every_other(self, world);
    PeerIndex x;
    if (make(*peers, self, world, &x, why) != Status::kOk) return PeerIndex();
    return x;
  }

  // The slot of `rank`, or -1 when it is not a peer.
  int slot(int rank) const {
    auto it = std::lower_bound(ranks_.begin(), ranks_.end(), rank);
    return it != ranks_.end() && *it == rank ? static_cast<int>(it - ranks_.begin()) : -1;
  }
  int rank(int slot) const { return ranks_[static_cast<size_t>(slot)]; }
  int size() const { return static_cast<int>(ranks_.size()); }
  const std::vector<int>& ranks() const { return ranks_; }

 private:
  std::vector<int> ranks_;  // ascending
};

}  // namespace weft::transport
