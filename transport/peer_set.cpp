// The peer-set function and the per-rank resource report built on it.
#include "transport/peer_set.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "base/params.h"
#include "transport/fifo_command.h"
#include "transport/ibverbs_sizes.h"
#include "transport/net_backend.h"
#include "transport/ofi_sizes.h"

namespace weft::transport {
namespace {

uint32_t pow2_at_least(uint64_t v) {
  uint64_t p = 2;
  while (p < v && p < (uint64_t{1} << 24)) p <<= 1;
  return static_cast<uint32_t>(p);
}

// ranks_at[node][local] = rank, once check_layout passed.
std::vector<std::vector<int>> index_layout(const RankLayout& l) {
  int nodes = 0;
  for (int n : l.node_of) nodes = std::max(nodes, n + 1);
  std::vector<std::vector<int>> at(nodes);
  for (size_t r = 0; r < l.node_of.size(); ++r) {
    auto& v = at[l.node_of[r]];
    if (static_cast<int>(v.size()) <= l.local_of[r]) v.resize(l.local_of[r] + 1, -1);
    v[l.local_of[r]] = static_cast<int>(r);
  }
  return at;
}

}  // namespace

const char* to_string(PeerNeed need) { return need == PeerNeed::kRails ? "rails" : "every_rank"; }
const char* to_string(SignalPath path) { return path == SignalPath::kSend ? "send" : "write"; }
const char* to_string(HeapPlace place) { return place == HeapPlace::kDevice ? "device" : "host"; }

RankLayout block_layout(int nodes, int per_node) {
  RankLayout l;
  for (int n = 0; n < nodes; ++n)
    for (int i = 0; i < per_node; ++i) l.node_of.push_back(n), l.local_of.push_back(i);
  return l;
}

Status check_layout(const RankLayout& l, std::string* why) {
  const size_t world = l.node_of.size();
  if (world == 0 || l.local_of.size() != world) {
    *why = "the layout has no ranks, or its node and local lists differ in length";
    return Status::kInvalidArgument;
  }
  for (size_t r = 0; r < world; ++r)
    if (l.node_of[r] < 0 || l.node_of[r] >= static_cast<int>(world) || l.local_of[r] < 0 ||
        l.local_of[r] >= static_cast<int>(world)) {
      *why = "rank " + std::to_string(r) + " has node " + std::to_string(l.node_of[r]) + ", local index " +
             std::to_string(l.local_of[r]) + " (each must lie in 0.." + std::to_string(world - 1) + ")";
      return Status::kInvalidArgument;
    }
  std::vector<std::vector<int>> seen(world);
  for (size_t r = 0; r < world; ++r) {
    auto& v = seen[l.node_of[r]];
    if (static_cast<int>(v.size()) <= l.local_of[r]) v.resize(l.local_of[r] + 1, -1);
    if (v[l.local_of[r]] >= 0) {
      *why = "ranks " + std::to_string(v[l.local_of[r]]) + " and " + std::to_string(r) + " both claim local index " +
             std::to_string(l.local_of[r]) + " on node " + std::to_string(l.node_of[r]);
      return Status::kInvalidArgument;
    }
    v[l.local_of[r]] = static_cast<int>(r);
  }
  bool ended = false;  // nodes 0..N-1 without gaps
  for (size_t n = 0; n < world; ++n) {
    if (seen[n].empty()) {
      ended = true;
      continue;
    }
    if (ended) {
      *why = "node " + std::to_string(n) + " has ranks but node " + std::to_string(n - 1) + " has none";
      return Status::kInvalidArgument;
    }
    for (size_t i = 0; i < seen[n].size(); ++i)
      if (seen[n][i] < 0) {
        *why = "node " + std::to_string(n) + " has local index " + std::to_string(seen[n].size() - 1) + " but no " +
               std::to_string(i);
        return Status::kInvalidArgument;
      }
  }
  return Status::kOk;
}

bool normalize_layout(RankLayout* l) {
  const size_t world = l->node_of.size();
  l->local_of.resize(world, -1);
  std::vector<int> ids(l->node_of);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  bool changed = false;
  std::vector<std::vector<int>> members(ids.size());
  for (size_t r = 0; r < world; ++r) {
    const int dense = static_cast<int>(std::lower_bound(ids.begin(), ids.end(), l->node_of[r]) - ids.begin());
    changed = changed || dense != l->node_of[r];
    l->node_of[r] = dense;
    members[dense].push_back(static_cast<int>(r));
  }
  for (const auto& m : members) {
    std::vector<int> locals;
    for (int r : m) locals.push_back(l->local_of[r]);
    std::sort(locals.begin(), locals.end());
    bool ok = true;
    for (size_t i = 0; i < locals.size() && ok; ++i) ok = locals[i] == static_cast<int>(i);
    if (ok) continue;
    changed = true;
    for (size_t i = 0; i < m.size(); ++i) l->local_of[m[i]] = static_cast<int>(i);
  }
  return changed;
}

Status peer_set(const RankLayout& l, int rank, PeerNeed need, PeerSet* out, std::string* why) {
  WEFT_CHECK(check_layout(l, why));
  const int world = static_cast<int>(l.node_of.size());
  if (rank < 0 || rank >= world) {
    *why = "rank " + std::to_string(rank) + " is not in a layout of " + std::to_string(world) + " ranks";
    return Status::kInvalidArgument;
  }
  PeerSet s;
  s.rank = rank;
  s.node = l.node_of[rank];
  s.local = l.local_of[rank];
  for (int r = 0; r < world; ++r)
    if (r != rank && l.node_of[r] == s.node) s.nvlink.push_back(r);
  if (need == PeerNeed::kEveryRank) {
    for (int r = 0; r < world; ++r)
      if (r != rank) s.net.push_back(r);
  } else {
    // a -- b when b is a's rail partner on b's node, or a is b's on a's node (symmetric by construction).
    const auto at = index_layout(l);
    const int here = static_cast<int>(at[s.node].size());
    for (int r = 0; r < world; ++r) {
      const int n = l.node_of[r];
      if (n == s.node) continue;
      const int there = static_cast<int>(at[n].size());
      if (l.local_of[r] == s.local % there || s.local == l.local_of[r] % here) s.net.push_back(r);
    }
  }
  *out = std::move(s);
  return Status::kOk;
}

Status rank_resources(const RankLayout& l, int rank, PeerNeed need, const ResourceInputs& in, RankResources* out,
                      std::string* why) {
  if (in.channels < 1 || in.channels > 64 || in.chunks_per_peer < 1 || in.chunks_per_peer > (1 << 20)) {
    *why = "the report needs 1..64 channels and 1..2^20 chunks per peer (got " + std::to_string(in.channels) + ", " +
           std::to_string(in.chunks_per_peer) + ")";
    return Status::kInvalidArgument;
  }
  const bool ibv = in.backend == "ibverbs", ofi = in.backend == "ofi", sock = in.backend == "socket";
  if (!ibv && !ofi && !sock && in.backend != "loopback" && in.backend != "none") {
    *why = "unknown backend '" + in.backend + "' (ibverbs, ofi, socket, loopback, none)";
    return Status::kInvalidArgument;
  }
  PeerSet s;
  WEFT_CHECK(peer_set(l, rank, need, &s, why));
  RankResources r;
  r.rank = s.rank;
  r.node = s.node;
  r.local = s.local;
  r.nvlink_peers = static_cast<int>(s.nvlink.size());
  r.heap_bytes = in.heap_bytes;
  if (in.backend == "none" || s.net.empty()) {  // nothing crosses a NIC: no transport is wired
    *out = r;
    return Status::kOk;
  }
  const uint64_t peers = s.net.size(), ch = static_cast<uint64_t>(in.channels);
  r.net_peers = static_cast<int>(peers);
  r.channels = in.channels;
  r.queue_pairs = ibv ? static_cast<int>(peers * ch) : 0;
  r.endpoints = ofi ? in.channels : sock ? static_cast<int>(peers * ch) : 0;
  r.address_entries = ofi ? static_cast<int>(ofi::av_entries(peers) * ch) : 0;
  // ibverbs per channel: the heap, a staging record per peer and, where signals arrive as SENDs,
  // kRecvDepth receive buffers per QP in one registration with a receive CQ of their own
  // (ibverbs_backend.cpp, ibverbs_signal_rx.cpp; the sizes are ibverbs_sizes.h's).
  const bool by_send = ibv && in.signals == SignalPath::kSend;
  const uint64_t recv_depth = ibv::kRecvDepth;
  if (ibv) {
    r.memory_registrations = (by_send ? 3 : 2) * in.channels;
    r.receive_entries = by_send ? ch * peers * recv_depth : 0;
    r.receive_bytes = by_send ? ch * ibv::recv_buffer_bytes(peers, recv_depth) : 0;
    r.registered_bytes = ch * (in.heap_bytes + ibv::signal_staging_bytes(peers)) + r.receive_bytes;
    r.completion_queues = (by_send ? 2 : 1) * in.channels;
    r.completion_entries = ch * (ibv::send_cq_entries(peers, ibv::kSendQueueDepth) +
                                 (by_send ? ibv::recv_cq_entries(peers, recv_depth) : 0));
  } else if (ofi) {
    // ofi per channel (ofi_backend.cpp; the sizes are ofi_sizes.h's): the control block, with the posted
    // receives' buffers in it, and the heap (host) or a staging registration per peer (device).
    const bool staged = in.heap == HeapPlace::kDevice;
    const uint64_t world = l.node_of.size();
    r.memory_registrations = static_cast<int>(ch * (1 + (staged ? peers : 1)));
    r.staging_bytes = staged ? ch * peers * ofi::stage_bytes_per_peer() : 0;
    r.registered_bytes = ch * (ofi::control_bytes(peers, world) + (staged ? 0 : in.heap_bytes)) + r.staging_bytes;
    r.receive_entries = ch * ofi::kRecvSlots;
    r.receive_bytes = ch * ofi::receive_bytes();
    r.completion_queues = in.channels;
    r.completion_entries = ch * ofi::cq_entries(peers);
  }
  // Each chunk to each peer is one put+signal command; a channel carries its share of them.
  const uint64_t in_flight = (peers * static_cast<uint64_t>(in.chunks_per_peer) + ch - 1) / ch;
  r.fifo_depth = pow2_at_least(in_flight);
  r.fifo_bytes = ch * (uint64_t{r.fifo_depth} * sizeof(FifoCommand) + sizeof(FifoRingHeader));
  const uint64_t blob = ibv   ? ibv_peer_info_bytes(peers)
                        : ofi ? kEndpointHeaderBytes + 8 + OfiPeerInfo::kMaxAddrBytes + OfiPeerInfo::kMaxProviderChars +
                                    24                             // upper bound: the address varies
                        : sock ? kEndpointHeaderBytes + 4 + 4 + 2  // one address
                               : kEndpointHeaderBytes + 12;
  r.exchange_bytes = ch * blob;
  *out = r;
  return Status::kOk;
}

Status resources_json(const RankLayout& l, PeerNeed need, const ResourceInputs& in, std::string* text,
                      std::string* why) {
  using nlohmann::json;
  auto row = [](const RankResources& r) {
    return json{{"node", r.node},
                {"local", r.local},
                {"net_peers", r.net_peers},
                {"nvlink_peers", r.nvlink_peers},
                {"channels", r.channels},
                {"queue_pairs", r.queue_pairs},
                {"endpoints", r.endpoints},
                {"address_entries", r.address_entries},
                {"memory_registrations", r.memory_registrations},
                {"registered_bytes", r.registered_bytes},
                {"heap_bytes", r.heap_bytes},
                {"staging_bytes", r.staging_bytes},
                {"fifo_depth", r.fifo_depth},
                {"fifo_bytes", r.fifo_bytes},
                {"completion_queues", r.completion_queues},
                {"completion_entries", r.completion_entries},
                {"receive_entries", r.receive_entries},
                {"receive_bytes", r.receive_bytes},
                {"exchange_bytes", r.exchange_bytes}};
  };
  // Node and local index differ between ranks by definition; rows group on the rest.
  auto same_cost = [](const RankResources& a, const RankResources& b) {
    return a.net_peers == b.net_peers && a.nvlink_peers == b.nvlink_peers && a.queue_pairs == b.queue_pairs &&
           a.endpoints == b.endpoints && a.registered_bytes == b.registered_bytes && a.fifo_depth == b.fifo_depth &&
           a.exchange_bytes == b.exchange_bytes && a.completion_entries == b.completion_entries &&
           a.memory_registrations == b.memory_registrations && a.completion_queues == b.completion_queues &&
           a.receive_entries == b.receive_entries && a.address_entries == b.address_entries;
  };
  json ranks = json::array();
  RankResources first, prev, worst;
  worst.rank = -1;
  const int world = static_cast<int>(l.node_of.size());
  // Every node the same size: every rank has the same peers in number, so rank 0 speaks for all
  // (O(world), where the walk below is O(world^2): a plan for 65,536 nodes stays instant).
  WEFT_CHECK(check_layout(l, why));
  std::vector<int> per_node(world, 0);
  for (int n : l.node_of) ++per_node[n];
  bool uniform = true;
  for (int n = 1; n < world && per_node[n] > 0; ++n) uniform = uniform && per_node[n] == per_node[0];
  if (uniform) {
    WEFT_CHECK(rank_resources(l, 0, need, in, &first, why));
    json entry{{"first_rank", 0}, {"last_rank", world - 1}};
    json j = row(first);
    j.erase("node");
    j.erase("local");
    entry.update(j);
    ranks.push_back(entry);
    worst = first;
  }
  for (int r = 0; r <= world && !uniform; ++r) {
    RankResources cur;
    if (r < world) WEFT_CHECK(rank_resources(l, r, need, in, &cur, why));
    if (r > 0 && (r == world || !same_cost(cur, first))) {
      json j = row(first);
      j.erase("node");
      j.erase("local");
      json entry{{"first_rank", first.rank}, {"last_rank", prev.rank}};
      entry.update(j);
      ranks.push_back(entry);
    }
    if (r == world) break;
    if (r == 0 || !same_cost(cur, first)) first = cur;
    prev = cur;
    if (worst.rank < 0 || cur.net_peers > worst.net_peers) worst = cur;  // every count grows with the net peers
  }
  json max = row(worst);
  max["rank"] = worst.rank;
  *text = json{
      {"need", to_string(need)},
      {"backend", in.backend},
      {"signals", to_string(in.signals)},
      {"heap", to_string(in.heap)},
      {"world_size", world},
      {"ranks", ranks},
      {"max",
       max}}.dump();
  return Status::kOk;
}

std::string plan_resources_json(int nodes, int per_node, const std::string& backend, uint64_t heap_bytes,
                                uint64_t nic_bytes_out, uint64_t nic_chunk_bytes) {
  std::string why, text;
  int64_t channels = 1;
  if (nodes < 1 || per_node < 1 || int64_t{nodes} * per_node > (1 << 20)) {
    why = "layout " + std::to_string(nodes) + " x " + std::to_string(per_node) + " is out of range";
  } else if (get_param("WEFT_NET_CHANNELS", &channels) != Status::kOk) {
    why = "WEFT_NET_CHANNELS is malformed";
  } else {
    ResourceInputs in;
    in.backend = backend.empty() ? "none" : backend;
    in.channels = static_cast<int>(std::clamp<int64_t>(channels, 1, 64));
    in.heap_bytes = heap_bytes;
    in.heap = HeapPlace::kDevice;  // a fused op's heap is GPU memory (ofi: staged through host rings)
    const uint64_t peers = static_cast<uint64_t>(nodes - 1), chunk = std::max<uint64_t>(nic_chunk_bytes, 1);
    const uint64_t chunks = peers ? (nic_bytes_out + chunk * peers - 1) / (chunk * peers) : 1;
    in.chunks_per_peer = static_cast<int>(std::clamp<uint64_t>(chunks, 1, 1 << 20));
    // ibverbs: count the SEND-signal wiring (the larger), and say what the NIC-written case needs.
    const RankLayout layout = block_layout(nodes, per_node);
    std::string write_text;
    in.signals = in.backend == "ibverbs" ? SignalPath::kSend : SignalPath::kWrite;
    if (resources_json(layout, PeerNeed::kRails, in, &text, &why) == Status::kOk) {
      if (in.signals == SignalPath::kWrite) return text;
      in.signals = SignalPath::kWrite;
      if (resources_json(layout, PeerNeed::kRails, in, &write_text, &why) == Status::kOk) {
        auto j = nlohmann::json::parse(text);
        j["max_write_signals"] = nlohmann::json::parse(write_text)["max"];
        return j.dump();
      }
    }
  }
  return nlohmann::json{{"error", why}}.dump();
}

}  // namespace weft::transport
