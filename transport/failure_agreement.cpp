// Failure agreement in two rounds: node-mates first, then one entry per node.
#include "transport/failure_agreement.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "base/log.h"

namespace weft::transport {
namespace {

constexpr size_t kMaxWhy = 4096;  // a failure's text, as published (longer text is cut)

struct Shape {
  std::vector<int> mates;    // this rank's node-mates, ascending, not itself
  std::vector<int> leaders;  // local index 0 of every node, by node; -1 where a node has none
  int nodes = 0;
  bool one_per_node = true;
};

Shape shape_of(const RankLayout& l, int rank) {
  Shape s;
  for (int n : l.node_of) s.nodes = std::max(s.nodes, n + 1);
  s.leaders.assign(static_cast<size_t>(s.nodes), -1);
  for (size_t r = 0; r < l.node_of.size(); ++r) {
    if (l.local_of[r] == 0) s.leaders[static_cast<size_t>(l.node_of[r])] = static_cast<int>(r);
    if (l.local_of[r] > 0) s.one_per_node = false;
    if (static_cast<int>(r) != rank && l.node_of[r] == l.node_of[static_cast<size_t>(rank)])
      s.mates.push_back(static_cast<int>(r));
  }
  return s;
}

std::string named(int rank, const std::string& why) {
  const std::string prefix = "rank " + std::to_string(rank) + " ";
  return why.rfind(prefix, 0) == 0 ? why : "rank " + std::to_string(rank) + ": " + why;
}

bootstrap::Blob encode(int rank, const std::string& why) {
  bootstrap::Blob b(4 + why.size());
  const int32_t r = rank;
  memcpy(b.data(), &r, 4);
  memcpy(b.data() + 4, why.data(), why.size());
  return b;
}

}  // namespace

int failure_agreement_reads(const RankLayout& layout, int rank) {
  const Shape s = shape_of(layout, rank);
  if (s.nodes <= 1) return static_cast<int>(s.mates.size());
  // Every other node's leader (this node's result is already known after round 1).
  return static_cast<int>(s.mates.size()) + s.nodes - 1;
}

Status agree_on_failure(bootstrap::Bootstrap& boot, const RankLayout& layout, const std::string& key,
                        const std::string& failure, std::string* first) {
  first->clear();
  const int me = boot.info().rank;
  const int world = boot.info().size;
  if (layout.node_of.size() != static_cast<size_t>(world) || layout.local_of.size() != layout.node_of.size() ||
      me < 0 || me >= world) {
    WEFT_WARN(kTransport, "rank %d: failure agreement '%s': the layout has %zu ranks, the job %d", me, key.c_str(),
              layout.node_of.size(), world);
    return Status::kInvalidArgument;
  }
  const Shape s = shape_of(layout, me);
  const std::string mine = failure.substr(0, kMaxWhy);

  // Round 1: the lowest failing rank of this node (skipped with one rank per node).
  int low = mine.empty() ? -1 : me;
  std::string low_why = mine;
  std::vector<bootstrap::Blob> all;
  if (!(s.one_per_node && s.nodes > 1)) {
    WEFT_CHECK(boot.allgather_from(key + ".node", bootstrap::Blob(mine.begin(), mine.end()), s.mates, &all));
    if (all.size() != static_cast<size_t>(world)) {
      WEFT_WARN(kTransport, "rank %d: failure agreement '%s': %zu entries for %d ranks", me, key.c_str(), all.size(),
                world);
      return Status::kProtocolError;
    }
    for (int r : s.mates)
      if (!all[static_cast<size_t>(r)].empty() && (low < 0 || r < low)) {
        low = r;
        low_why.assign(all[static_cast<size_t>(r)].begin(), all[static_cast<size_t>(r)].end());
        if (low_why.size() > kMaxWhy) low_why.resize(kMaxWhy);
      }
    if (s.nodes <= 1) {
      if (low >= 0) *first = named(low, low_why);
      return Status::kOk;
    }
  }

  // Round 2: one entry per node, from its leader; this node's result is known from round 1.
  const bool leader = layout.local_of[static_cast<size_t>(me)] == 0;
  const int my_node = layout.node_of[static_cast<size_t>(me)];
  std::vector<int> from;
  for (int n = 0; n < s.nodes; ++n)
    if (n != my_node && s.leaders[static_cast<size_t>(n)] >= 0) from.push_back(s.leaders[static_cast<size_t>(n)]);
  std::sort(from.begin(), from.end());
  WEFT_CHECK(
      boot.allgather_from(key + ".job", leader && low >= 0 ? encode(low, low_why) : bootstrap::Blob(), from, &all));
  if (all.size() != static_cast<size_t>(world)) {
    WEFT_WARN(kTransport, "rank %d: failure agreement '%s': %zu entries for %d ranks", me, key.c_str(), all.size(),
              world);
    return Status::kProtocolError;
  }
  for (int r : from) {
    const bootstrap::Blob& b = all[static_cast<size_t>(r)];
    if (b.empty()) continue;  // nobody failed on that node
    int32_t who = -1;
    if (b.size() >= 4) memcpy(&who, b.data(), 4);
    // A node's entry names one of its own ranks, and its text is bounded.
    if (b.size() < 4 || b.size() > 4 + kMaxWhy || who < 0 || who >= world ||
        layout.node_of[static_cast<size_t>(who)] != layout.node_of[static_cast<size_t>(r)]) {
      WEFT_WARN(kTransport, "rank %d: failure agreement '%s': rank %d's entry (%zu bytes, rank field %d) is malformed",
                me, key.c_str(), r, b.size(), static_cast<int>(who));
      return Status::kProtocolError;
    }
    if (low < 0 || who < low) {
      low = who;
      low_why.assign(b.begin() + 4, b.end());
    }
  }
  if (low >= 0) *first = named(low, low_why);
  return Status::kOk;
}

}  // namespace weft::transport
