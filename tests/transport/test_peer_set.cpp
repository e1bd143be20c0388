// The peer-set function (which ranks a rank connects to) and the resource report built on it,
// including the budget at 128 nodes x 8 GPUs: queue pairs per GPU grow with the nodes, not the ranks.
#include <doctest/doctest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "transport/ibverbs_sizes.h"
#include "transport/ofi_sizes.h"
#include "transport/peer_set.h"

using weft::Status;
using namespace weft::transport;
namespace ibv = weft::transport::ibv;
namespace ofi = weft::transport::ofi;

namespace {

PeerSet set_of(const RankLayout& l, int rank, PeerNeed need) {
  PeerSet s;
  std::string why;
  REQUIRE_MESSAGE(peer_set(l, rank, need, &s, &why) == Status::kOk, why);
  return s;
}

RankResources cost_of(const RankLayout& l, int rank, const ResourceInputs& in, PeerNeed need = PeerNeed::kRails) {
  RankResources r;
  std::string why;
  REQUIRE_MESSAGE(rank_resources(l, rank, need, in, &r, &why) == Status::kOk, why);
  return r;
}

// Both ends agree on every connection, and (rails) every other node is reached from every rank.
void check_symmetric_and_covering(const RankLayout& l, PeerNeed need) {
  const int world = int(l.node_of.size());
  std::vector<std::set<int>> net(world);
  for (int r = 0; r < world; ++r) {
    PeerSet s = set_of(l, r, need);
    net[r] = std::set<int>(s.net.begin(), s.net.end());
    CHECK(net[r].count(r) == 0);
    CHECK(std::is_sorted(s.net.begin(), s.net.end()));
  }
  for (int a = 0; a < world; ++a) {
    std::set<int> nodes;
    for (int b : net[a]) {
      CAPTURE(a);
      CAPTURE(b);
      CHECK(net[b].count(a) == 1);
      if (need == PeerNeed::kRails) CHECK(l.node_of[b] != l.node_of[a]);
      nodes.insert(l.node_of[b]);
    }
    std::set<int> all_nodes(l.node_of.begin(), l.node_of.end());
    int mates = 0;
    for (int r = 0; r < world; ++r) mates += r != a && l.node_of[r] == l.node_of[a];
    // Rails: every other node once or more; every rank: every node that holds another rank.
    const size_t want = all_nodes.size() - (need == PeerNeed::kRails || mates == 0 ? 1 : 0);
    CHECK(nodes.size() == want);
  }
}

}  // namespace

TEST_CASE("rails: the same local index on every other node over the NIC, node-mates over NVLink") {
  const RankLayout l = block_layout(3, 4);  // the diagram in peer_set.h
  PeerSet s = set_of(l, 5, PeerNeed::kRails);
  CHECK(s.node == 1);
  CHECK(s.local == 1);
  CHECK(s.net == std::vector<int>{1, 9});
  CHECK(s.nvlink == std::vector<int>{4, 6, 7});
  s = set_of(l, 0, PeerNeed::kRails);
  CHECK(s.net == std::vector<int>{4, 8});
  CHECK(s.nvlink == std::vector<int>{1, 2, 3});
  // One node: nothing crosses a NIC.
  CHECK(set_of(block_layout(1, 8), 3, PeerNeed::kRails).net.empty());
  // One GPU per node: every other rank is a rail peer.
  CHECK(set_of(block_layout(4, 1), 2, PeerNeed::kRails).net == std::vector<int>{0, 1, 3});
}

TEST_CASE("every rank: a full mesh, node-mates included") {
  PeerSet s = set_of(block_layout(2, 2), 1, PeerNeed::kEveryRank);
  CHECK(s.net == std::vector<int>{0, 2, 3});
  CHECK(s.nvlink == std::vector<int>{0});
}

TEST_CASE("placement other than blocks: the rail follows the local index, not the rank number") {
  // srun --distribution=cyclic on 2 nodes x 2: ranks 0, 2 on node 0, ranks 1, 3 on node 1.
  RankLayout l{{0, 1, 0, 1}, {0, 0, 1, 1}};
  CHECK(set_of(l, 0, PeerNeed::kRails).net == std::vector<int>{1});
  CHECK(set_of(l, 2, PeerNeed::kRails).net == std::vector<int>{3});
  CHECK(set_of(l, 2, PeerNeed::kRails).nvlink == std::vector<int>{0});
  check_symmetric_and_covering(l, PeerNeed::kRails);
}

TEST_CASE("uneven nodes (3 + 1): local l meets local l % c there, and both ends agree") {
  RankLayout l{{0, 0, 0, 1}, {0, 1, 2, 0}};
  CHECK(set_of(l, 3, PeerNeed::kRails).net == std::vector<int>{0, 1, 2});
  for (int r = 0; r < 3; ++r) CHECK(set_of(l, r, PeerNeed::kRails).net == std::vector<int>{3});
  // 4 + 2 + 3: every pair agrees, every rank reaches every other node.
  RankLayout m{{0, 0, 0, 0, 1, 1, 2, 2, 2}, {0, 1, 2, 3, 0, 1, 0, 1, 2}};
  check_symmetric_and_covering(m, PeerNeed::kRails);
}

TEST_CASE("a launcher's layout made well formed: sparse node ids, local ranks that are not 0..c-1") {
  RankLayout l{{7, 7, 3, 3}, {0, 1, 0, 1}};
  CHECK(normalize_layout(&l));
  CHECK(l.node_of == std::vector<int>{1, 1, 0, 0});
  CHECK(l.local_of == std::vector<int>{0, 1, 0, 1});
  RankLayout dup{{0, 0, 1, 1}, {0, 0, 5, 2}};  // local ranks of the physical host, say
  CHECK(normalize_layout(&dup));
  CHECK(dup.local_of == std::vector<int>{0, 1, 0, 1});
  std::string why;
  CHECK(check_layout(dup, &why) == Status::kOk);
  RankLayout fine = block_layout(2, 4);
  CHECK_FALSE(normalize_layout(&fine));
  CHECK(fine.node_of == block_layout(2, 4).node_of);
}

TEST_CASE("random layouts: symmetric, covering, never a node-mate over the NIC") {
  std::mt19937 rng(23);
  for (int trial = 0; trial < 200; ++trial) {
    const int nodes = 1 + int(rng() % 6);
    RankLayout l;
    std::vector<std::vector<int>> locals(nodes);
    for (int n = 0; n < nodes; ++n) {
      const int c = 1 + int(rng() % 8);
      for (int i = 0; i < c; ++i) locals[n].push_back(i);
      std::shuffle(locals[n].begin(), locals[n].end(), rng);
    }
    // Ranks interleaved over nodes in a random order (any srun distribution).
    std::vector<int> order;
    for (int n = 0; n < nodes; ++n)
      for (size_t i = 0; i < locals[n].size(); ++i) order.push_back(n);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<size_t> used(nodes, 0);
    for (int n : order) l.node_of.push_back(n), l.local_of.push_back(locals[n][used[n]++]);
    CAPTURE(trial);
    check_symmetric_and_covering(l, PeerNeed::kRails);
    check_symmetric_and_covering(l, PeerNeed::kEveryRank);
  }
}

TEST_CASE("malformed layouts are refused with the reason") {
  PeerSet s;
  std::string why;
  CHECK(peer_set(RankLayout{}, 0, PeerNeed::kRails, &s, &why) == Status::kInvalidArgument);
  CHECK(peer_set(RankLayout{{0, 0}, {0, 0}}, 0, PeerNeed::kRails, &s, &why) == Status::kInvalidArgument);
  CHECK(why.find("both claim local index 0 on node 0") != std::string::npos);
  CHECK(peer_set(RankLayout{{0, 2, 2}, {0, 0, 1}}, 0, PeerNeed::kRails, &s, &why) == Status::kInvalidArgument);
  CHECK(why.find("node 2 has ranks but node 1 has none") != std::string::npos);
  CHECK(peer_set(RankLayout{{0, 0, 1}, {0, 2, 0}}, 0, PeerNeed::kRails, &s, &why) == Status::kInvalidArgument);
  CHECK(why.find("node 0 has local index 2 but no 1") != std::string::npos);
  CHECK(peer_set(RankLayout{{0, -1}, {0, 0}}, 0, PeerNeed::kRails, &s, &why) == Status::kInvalidArgument);
  CHECK(peer_set(RankLayout{{0}, {0, 1}}, 0, PeerNeed::kRails, &s, &why) == Status::kInvalidArgument);
  CHECK(peer_set(block_layout(2, 2), 4, PeerNeed::kRails, &s, &why) == Status::kInvalidArgument);
  CHECK(why.find("not in a layout of 4 ranks") != std::string::npos);
}

// The budget a rank of a 128 x 8 job stays within, wired for its fused ops (rails, ibverbs, the
// default 4 channels, 8 chunks in flight per peer, a 1 GiB heap):
//   queue pairs          (N - 1) x channels            = 508   (a full mesh: (N G - 1) x channels = 4,092)
//   endpoint blob        16 + 36 + 12 (N - 1) per channel = 1,576 bytes (published once per channel)
//   FIFO                 pow2(ceil((N - 1) x chunks / channels)) = 256 slots per channel, 66,304 bytes in all
//   completion entries   (N - 1) x 1,024 + 64 per channel (every send queue full of signalled WRs)
//   registered memory    the heap and (N - 1) 16-byte signal records, per channel
// and where signals arrive as SENDs (a GPU below "owner" RDMA write ordering), per channel:
//   receives             (N - 1) x 128 = 16,256 posted, 16 bytes each registered (260,096 bytes)
//   receive CQ           (N - 1) x 128 + 64 = 16,320 entries
TEST_CASE("resource budget at 128 x 8: queue pairs per GPU grow with N, not N x G") {
  ResourceInputs in;
  in.backend = "ibverbs";
  in.channels = 4;
  in.heap_bytes = 1ull << 30;
  in.chunks_per_peer = 8;
  const int N = 128, G = 8;
  const RankLayout l = block_layout(N, G);
  for (int rank : {0, 7, 517, N * G - 1}) {
    CAPTURE(rank);
    const RankResources r = cost_of(l, rank, in);
    CHECK(r.net_peers == N - 1);
    CHECK(r.nvlink_peers == G - 1);
    CHECK(r.queue_pairs == (N - 1) * in.channels);
    CHECK(r.queue_pairs <= 512);
    CHECK(r.exchange_bytes == uint64_t(in.channels) * (16 + 40 + 12 * (N - 1)));
    CHECK(r.exchange_bytes / in.channels <= 2048);
    CHECK(r.fifo_depth == 256);
    CHECK(r.fifo_bytes <= 128 * 1024);
    CHECK(r.completion_entries == uint64_t(in.channels) * ((N - 1) * 1024 + 64));
    CHECK(r.completion_entries / in.channels < (1u << 22));  // mlx5's max_cqe
    CHECK(r.memory_registrations == 2 * in.channels);
    CHECK(r.registered_bytes == uint64_t(in.channels) * (in.heap_bytes + 16 * (N - 1)));
    CHECK(r.heap_bytes == in.heap_bytes);
    CHECK(r.receive_entries == 0);
  }
  ResourceInputs by_send = in;
  by_send.signals = SignalPath::kSend;
  const RankResources w = cost_of(l, 0, in), s = cost_of(l, 0, by_send);
  CHECK(s.queue_pairs == w.queue_pairs);
  CHECK(s.receive_entries == uint64_t(in.channels) * 16256);
  CHECK(s.receive_bytes == uint64_t(in.channels) * 260096);
  CHECK(s.registered_bytes == w.registered_bytes + s.receive_bytes);
  CHECK(s.completion_entries == w.completion_entries + uint64_t(in.channels) * 16320);
  CHECK(s.completion_entries / in.channels < (1u << 22));
  CHECK(s.memory_registrations == 3 * in.channels);
  // Grows with N: the same per GPU whatever G, and linear in N.
  CHECK(cost_of(block_layout(N, 1), 0, in).queue_pairs == cost_of(l, 0, in).queue_pairs);
  CHECK(cost_of(block_layout(64, G), 0, in).queue_pairs == 63 * in.channels);
  CHECK(cost_of(block_layout(2, G), 0, in).queue_pairs == in.channels);
  // The full mesh it replaces: N x G - 1 per channel.
  const RankResources mesh = cost_of(l, 0, in, PeerNeed::kEveryRank);
  CHECK(mesh.queue_pairs == (N * G - 1) * in.channels);
  CHECK(mesh.exchange_bytes > 7 * cost_of(l, 0, in).exchange_bytes);
}

TEST_CASE("resource report by backend, and inputs checked") {
  ResourceInputs in;
  in.channels = 2;
  in.heap_bytes = 4096;
  const RankLayout l = block_layout(4, 2);
  in.backend = "ofi";
  RankResources r = cost_of(l, 0, in);
  CHECK(r.queue_pairs == 0);
  CHECK(r.endpoints == 2);        // one RDM endpoint per channel ...
  CHECK(r.address_entries == 8);  // ... its address vector sized for 3 rail peers + 1
  in.backend = "socket";
  r = cost_of(l, 0, in);
  CHECK(r.endpoints == 6);  // a TCP stream per peer per channel
  CHECK(r.registered_bytes == 0);
  in.backend = "none";
  r = cost_of(l, 0, in);
  CHECK(r.net_peers == 0);
  CHECK(r.fifo_depth == 0);
  CHECK(r.nvlink_peers == 1);
  // One node: no connection, no FIFO, whatever the backend.
  in.backend = "ibverbs";
  CHECK(cost_of(block_layout(1, 8), 0, in).queue_pairs == 0);
  RankResources out;
  std::string why;
  in.channels = 0;
  CHECK(rank_resources(l, 0, PeerNeed::kRails, in, &out, &why) == Status::kInvalidArgument);
  in.channels = 1;
  in.backend = "carrier-pigeon";
  CHECK(rank_resources(l, 0, PeerNeed::kRails, in, &out, &why) == Status::kInvalidArgument);
  CHECK(why.find("carrier-pigeon") != std::string::npos);
}

// The SEND-signal path on a small layout, from the backend's own sizes (ibverbs_sizes.h): 3 nodes x 2,
// rails, 2 channels: every rank faces 2 peers per channel.
TEST_CASE("ibverbs with SEND signals: receives, their buffers and the receive CQ counted in the totals") {
  ResourceInputs in;
  in.backend = "ibverbs";
  in.channels = 2;
  in.heap_bytes = 1 << 20;
  const RankLayout l = block_layout(3, 2);
  const uint64_t ch = 2, peers = 2;
  const RankResources w = cost_of(l, 3, in);
  in.signals = SignalPath::kSend;
  const RankResources s = cost_of(l, 3, in);
  CHECK(w.net_peers == int(peers));
  CHECK(s.net_peers == int(peers));

  // Write signals: the heap and a staging record per peer; one send CQ per channel.
  CHECK(w.queue_pairs == int(ch * peers));
  CHECK(w.memory_registrations == int(2 * ch));
  CHECK(w.registered_bytes == ch * (in.heap_bytes + peers * ibv::kSignalRecordBytes));
  CHECK(w.completion_queues == int(ch));
  CHECK(w.completion_entries ==
        ch * std::max<uint64_t>(ibv::kSendCqFloor, peers * ibv::kSendQueueDepth + ibv::kCqSlack));
  CHECK(w.completion_entries == ch * 4096);  // 2 x 1,024 + 64 is under the floor
  CHECK(w.receive_entries == 0);
  CHECK(w.receive_bytes == 0);

  // Send signals: the same QPs, plus kRecvDepth receives per QP, their buffers (one more registration
  // per channel) and a receive CQ per channel that holds every one of them.
  CHECK(s.queue_pairs == w.queue_pairs);
  CHECK(s.receive_entries == ch * peers * ibv::kRecvDepth);
  CHECK(s.receive_entries == 512);
  CHECK(s.receive_bytes == ch * peers * ibv::kRecvDepth * ibv::kSignalRecordBytes);
  CHECK(s.receive_bytes == 8192);
  CHECK(s.memory_registrations == int(3 * ch));
  CHECK(s.registered_bytes == w.registered_bytes + s.receive_bytes);
  CHECK(s.completion_queues == int(2 * ch));
  CHECK(s.completion_entries ==
        w.completion_entries + ch * std::max<uint64_t>(ibv::kRecvCqFloor, peers * ibv::kRecvDepth + ibv::kCqSlack));
  CHECK(s.completion_entries == ch * (4096 + 320));
  // Nothing else moves.
  CHECK(s.fifo_depth == w.fifo_depth);
  CHECK(s.exchange_bytes == w.exchange_bytes);

  // Only ibverbs has a SEND path: the other backends report the same either way (ofi posts its own
  // control receives and has a CQ whatever the signals; socket and none have neither).
  for (const char* backend : {"ofi", "socket", "none"}) {
    CAPTURE(backend);
    in.backend = backend;
    in.signals = SignalPath::kWrite;
    const RankResources a = cost_of(l, 3, in);
    in.signals = SignalPath::kSend;
    const RankResources b = cost_of(l, 3, in);
    CHECK(a.registered_bytes == b.registered_bytes);
    CHECK(a.memory_registrations == b.memory_registrations);
    CHECK(a.receive_entries == b.receive_entries);
    CHECK(a.completion_entries == b.completion_entries);
    if (std::string(backend) != "ofi") {
      CHECK(b.receive_entries == 0);
      CHECK(b.completion_entries == 0);
    }
  }
  // One node: nothing is wired, whatever the signals.
  in.backend = "ibverbs";
  CHECK(cost_of(block_layout(1, 8), 0, in).receive_entries == 0);
}

// ofi on a small layout, from the backend's own sizes (ofi_sizes.h): 3 nodes x 2, rails, 2 channels, a
// 1 MiB heap: every rank faces 2 peers per channel in a 6-rank job. A host heap is registered; a device
// heap is staged through a pair of host rings per peer and is not registered itself.
TEST_CASE("ofi: control block, posted receives, CQ, address vector, and the heap or the staging rings") {
  ResourceInputs in;
  in.backend = "ofi";
  in.channels = 2;
  in.heap_bytes = 1 << 20;
  const RankLayout l = block_layout(3, 2);
  const uint64_t ch = 2, peers = 2, world = 6;
  const RankResources h = cost_of(l, 3, in);
  in.heap = HeapPlace::kDevice;
  const RankResources d = cost_of(l, 3, in);

  // The control block: a value slot per context (256 writes per faced peer, a credit each, 32 receives,
  // the hello), then the hello, 32 receive buffers and a credit message per rank of the job.
  CHECK(ofi::contexts(peers) == 256 * 3 + 3 + 32 + 1);
  CHECK(ofi::control_bytes(peers, world) == 804 * 8 + 64 * (1 + 32 + 6));
  CHECK(ofi::control_bytes(peers, world) == 8928);
  CHECK(ofi::stage_bytes_per_peer() == 2 * 8 * (128 << 10));

  // What does not depend on the heap: one endpoint, CQ and address vector per channel, 32 receives.
  for (const RankResources& r : {h, d}) {
    CHECK(r.net_peers == int(peers));
    CHECK(r.queue_pairs == 0);
    CHECK(r.endpoints == int(ch));
    CHECK(r.address_entries == int(ch * ofi::av_entries(peers)));
    CHECK(r.address_entries == 6);
    CHECK(r.completion_queues == int(ch));
    CHECK(r.completion_entries == ch * ofi::cq_entries(peers));
    CHECK(r.completion_entries == ch * (256 * 3 + 4 * 32));
    CHECK(r.receive_entries == ch * ofi::kRecvSlots);
    CHECK(r.receive_entries == 64);
    CHECK(r.receive_bytes == ch * ofi::kRecvSlots * ofi::kMsgBytes);
    CHECK(r.receive_bytes == 4096);
    CHECK(r.heap_bytes == in.heap_bytes);
  }
  // Host heap: the heap and the control block per channel.
  CHECK(h.memory_registrations == int(2 * ch));
  CHECK(h.registered_bytes == ch * (in.heap_bytes + ofi::control_bytes(peers, world)));
  CHECK(h.registered_bytes == 2 * ((1 << 20) + 8928));
  CHECK(h.staging_bytes == 0);
  // Device heap: the control block and a staging registration per peer, per channel; not the heap.
  CHECK(d.memory_registrations == int(ch * (1 + peers)));
  CHECK(d.memory_registrations == 6);
  CHECK(d.staging_bytes == ch * peers * ofi::stage_bytes_per_peer());
  CHECK(d.staging_bytes == 8ull << 20);
  CHECK(d.registered_bytes == ch * ofi::control_bytes(peers, world) + d.staging_bytes);
  CHECK(d.registered_bytes == 2 * 8928 + (8ull << 20));
  CHECK(d.fifo_depth == h.fifo_depth);
  CHECK(d.exchange_bytes == h.exchange_bytes);

  // The heap case is ofi's alone: ibverbs and socket report the same either way.
  for (const char* backend : {"ibverbs", "socket"}) {
    CAPTURE(backend);
    in.backend = backend;
    in.heap = HeapPlace::kHost;
    const RankResources a = cost_of(l, 3, in);
    in.heap = HeapPlace::kDevice;
    const RankResources b = cost_of(l, 3, in);
    CHECK(a.registered_bytes == b.registered_bytes);
    CHECK(a.memory_registrations == b.memory_registrations);
    CHECK(b.staging_bytes == 0);
  }
  // The CQ stops at its ceiling: a 1,024-rank full mesh asks for 65,536 entries, not 262,272.
  in.backend = "ofi";
  CHECK(cost_of(block_layout(128, 8), 0, in, PeerNeed::kEveryRank).completion_entries == ch * ofi::kCqCeiling);
  // The credit messages are indexed by rank: the control block grows with the job, not only the peers.
  CHECK(cost_of(block_layout(3, 4), 0, in).registered_bytes - d.registered_bytes == ch * 6 * ofi::kMsgBytes);
}

TEST_CASE("the JSON report: ranks of one cost share an entry; uneven layouts split") {
  ResourceInputs in;
  in.channels = 4;
  in.heap_bytes = 1 << 20;
  in.chunks_per_peer = 8;
  std::string text, why;
  REQUIRE(resources_json(block_layout(128, 8), PeerNeed::kRails, in, &text, &why) == Status::kOk);
  auto j = nlohmann::json::parse(text);
  CHECK(j["need"] == "rails");
  CHECK(j["world_size"] == 1024);
  REQUIRE(j["ranks"].size() == 1);
  CHECK(j["ranks"][0]["first_rank"] == 0);
  CHECK(j["ranks"][0]["last_rank"] == 1023);
  CHECK(j["ranks"][0]["queue_pairs"] == 127 * 4);
  CHECK(j["max"]["queue_pairs"] == 127 * 4);
  CHECK(j["signals"] == "write");
  CHECK(j["heap"] == "host");
  CHECK(j["max"]["receive_entries"] == 0);
  CHECK(j["max"]["completion_queues"] == 4);
  CHECK(j["max"]["staging_bytes"] == 0);
  CHECK(text.size() < 2000);
  // The SEND path: named, and its figures in every entry and in "max".
  ResourceInputs by_send = in;
  by_send.signals = SignalPath::kSend;
  REQUIRE(resources_json(block_layout(128, 8), PeerNeed::kRails, by_send, &text, &why) == Status::kOk);
  j = nlohmann::json::parse(text);
  CHECK(j["signals"] == "send");
  const RankResources s = cost_of(block_layout(128, 8), 0, by_send);
  for (const auto& row : {j["ranks"][0], j["max"]}) {
    CHECK(row["receive_entries"] == s.receive_entries);
    CHECK(row["receive_bytes"] == s.receive_bytes);
    CHECK(row["completion_queues"] == 8);
    CHECK(row["completion_entries"] == s.completion_entries);
    CHECK(row["memory_registrations"] == 12);
    CHECK(row["registered_bytes"] == s.registered_bytes);
  }
  // 3 + 1: ranks 0-2 face one peer, rank 3 faces three.
  REQUIRE(resources_json(RankLayout{{0, 0, 0, 1}, {0, 1, 2, 0}}, PeerNeed::kRails, in, &text, &why) == Status::kOk);
  j = nlohmann::json::parse(text);
  REQUIRE(j["ranks"].size() == 2);
  CHECK(j["ranks"][0]["last_rank"] == 2);
  CHECK(j["ranks"][1]["first_rank"] == 3);
  CHECK(j["ranks"][1]["net_peers"] == 3);
  CHECK(j["max"]["rank"] == 3);
  CHECK(resources_json(RankLayout{{0, 0}, {0, 0}}, PeerNeed::kRails, in, &text, &why) == Status::kInvalidArgument);
}

TEST_CASE("the plan's resources section: rails on the plan's layout, chunks in flight from the NIC bytes") {
  // 127 peers, 64 MiB out over the NIC in 1 MiB chunks: 64 / 127 -> 1 chunk per peer; WEFT_NET_CHANNELS = 4.
  auto j = nlohmann::json::parse(plan_resources_json(128, 8, "ibverbs", 1ull << 30, 64ull << 20, 1 << 20));
  REQUIRE_FALSE(j.contains("error"));
  CHECK(j["need"] == "rails");
  CHECK(j["max"]["queue_pairs"] == 127 * 4);
  CHECK(j["max"]["heap_bytes"] == 1ull << 30);
  CHECK(j["max"]["fifo_depth"] == 32);  // ceil(127 x 1 / 4)
  // The GPU's RDMA write ordering is known only at run time: the plan counts the SEND-signal wiring,
  // says so, and gives the costliest rank where the NIC writes the flags.
  CHECK(j["signals"] == "send");
  CHECK(j["max"]["receive_entries"] == 4 * 127 * ibv::kRecvDepth);
  CHECK(j["max"]["completion_queues"] == 8);
  REQUIRE(j.contains("max_write_signals"));
  CHECK(j["max_write_signals"]["receive_entries"] == 0);
  CHECK(j["max_write_signals"]["completion_queues"] == 4);
  CHECK(j["max_write_signals"]["queue_pairs"] == 127 * 4);
  CHECK(j["max"]["registered_bytes"].get<uint64_t>() ==
        j["max_write_signals"]["registered_bytes"].get<uint64_t>() + j["max"]["receive_bytes"].get<uint64_t>());
  // 8 chunks per peer: 127 x 8 MiB out.
  j = nlohmann::json::parse(plan_resources_json(128, 8, "ibverbs", 0, 127ull * 8 << 20, 1 << 20));
  CHECK(j["max"]["fifo_depth"] == 256);
  // One node: nothing is wired.
  j = nlohmann::json::parse(plan_resources_json(1, 8, "none", 4096, 0, 0));
  CHECK(j["max"]["queue_pairs"] == 0);
  CHECK(j["signals"] == "write");  // no ibverbs: no SEND path to count
  CHECK_FALSE(j.contains("max_write_signals"));
  j = nlohmann::json::parse(plan_resources_json(4, 8, "socket", 4096, 1 << 20, 1 << 16));
  CHECK(j["signals"] == "write");
  CHECK_FALSE(j.contains("max_write_signals"));
  CHECK(j["max"]["receive_entries"] == 0);
  CHECK(j["max"]["nvlink_peers"] == 7);
  j = nlohmann::json::parse(plan_resources_json(0, 8, "ibverbs", 0, 0, 0));
  CHECK(j["error"].get<std::string>().find("out of range") != std::string::npos);
}

TEST_CASE("the plan's resources section on ofi: a fused op's device heap, staged through host rings") {
  auto j = nlohmann::json::parse(plan_resources_json(128, 8, "ofi", 1ull << 30, 64ull << 20, 1 << 20));
  REQUIRE_FALSE(j.contains("error"));
  CHECK(j["heap"] == "device");
  CHECK_FALSE(j.contains("max_write_signals"));
  const auto& m = j["max"];
  const uint64_t ch = 4, peers = 127;
  CHECK(m["endpoints"] == ch);
  CHECK(m["address_entries"] == ch * 128);
  CHECK(m["memory_registrations"] == ch * (1 + peers));
  CHECK(m["staging_bytes"] == ch * peers * ofi::stage_bytes_per_peer());
  CHECK(m["staging_bytes"] == 1016ull << 20);  // 127 peers x 2 MiB x 4 channels of host memory per GPU
  CHECK(m["registered_bytes"] == ch * ofi::control_bytes(peers, 1024) + m["staging_bytes"].get<uint64_t>());
  CHECK(m["heap_bytes"] == 1ull << 30);  // held on the GPU, not registered
  CHECK(m["completion_entries"] == ch * ofi::cq_entries(peers));
  CHECK(m["receive_entries"] == ch * ofi::kRecvSlots);
}

TEST_CASE("the report of equal nodes is computed once: 16,384 x 8 ranks in one entry") {
  ResourceInputs in;
  in.channels = 4;
  std::string text, why;
  REQUIRE(resources_json(block_layout(16384, 8), PeerNeed::kRails, in, &text, &why) == Status::kOk);
  auto j = nlohmann::json::parse(text);
  REQUIRE(j["ranks"].size() == 1);
  CHECK(j["ranks"][0]["last_rank"] == 16384 * 8 - 1);
  CHECK(j["max"]["queue_pairs"] == 16383 * 4);
}
