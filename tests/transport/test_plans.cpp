// Pure transport logic: Perseus fence choice and batching, ibverbs WR plans and completion ledger, socket wire
// validation, endpoint blobs, cpu lists, the symmetric heap allocator.
#include <doctest/doctest.h>

#include <limits>

#include "transport/heap.h"
#include "transport/ibverbs_plan.h"
#if WEFT_HAVE_IBVERBS
#include "transport/ibverbs_wr.h"
#endif
#include "transport/net_backend.h"
#include "transport/proxy.h"
#include "transport/signal_plan.h"
#include "transport/socket_wire.h"

using namespace weft;
using namespace weft::transport;

TEST_CASE("fence choice per signal mode") {
  CHECK_FALSE(signal_fence(SignalMode::kSerial, true));
  CHECK(signal_fence(SignalMode::kFenced, true));
  CHECK(signal_fence(SignalMode::kFenced, false));
  CHECK(signal_fence(SignalMode::kBatched, true));
  CHECK_FALSE(signal_fence(SignalMode::kBatched, false));
  CHECK(proxy_waits_before_signal(SignalMode::kSerial));
  CHECK_FALSE(proxy_waits_before_signal(SignalMode::kFenced));
  CHECK_FALSE(proxy_waits_before_signal(SignalMode::kBatched));
  SignalMode m;
  CHECK(parse_signal_mode("fenced", &m) == Status::kOk);
  CHECK(m == SignalMode::kFenced);
  CHECK(parse_signal_mode("eventually", &m) == Status::kInvalidArgument);
}

TEST_CASE("batcher: per-destination batches, coalescing to the newest epoch, one fence per batch") {
  SignalBatcher b(3, 4);
  CHECK_FALSE(b.add(1, 64, 1));
  CHECK_FALSE(b.add(2, 64, 1));
  CHECK_FALSE(b.add(1, 64, 3));  // same flag: coalesced
  CHECK_FALSE(b.add(1, 64, 2));  // older epoch never lowers it
  CHECK_FALSE(b.add(1, 72, 1));
  CHECK(b.pending() == 3);
  CHECK(b.pending(1) == 2);
  auto batch = b.take(1);
  REQUIRE(batch.size() == 2);
  CHECK(batch[0].flag == 64);
  CHECK(batch[0].value == 3);
  CHECK(batch[0].fence);
  CHECK(batch[1].flag == 72);
  CHECK_FALSE(batch[1].fence);
  CHECK(b.pending() == 1);
  CHECK(b.take(1).empty());
  for (uint64_t f = 0; f < 3; ++f) CHECK_FALSE(b.add(0, 8 * f, 1));
  CHECK(b.add(0, 24, 1));  // the fourth distinct flag fills the batch
}

TEST_CASE("batcher: a batch is posted before a put that would leave more than the byte bound behind it") {
  SignalBatcher b(2, 64, 4 << 20);
  CHECK_FALSE(b.close_before_put(1, 64 << 20));  // nothing pending: any put goes
  CHECK_FALSE(b.add(1, 8, 1));                   // chunk 0's signal waits
  CHECK_FALSE(b.close_before_put(1, 3 << 20));   // 3 MiB behind it
  CHECK_FALSE(b.close_before_put(1, 1 << 20));   // 4 MiB: at the bound
  CHECK(b.close_before_put(1, 1));               // one byte more: post the batch first
  CHECK_FALSE(b.close_before_put(0, 1 << 30));   // other peers have their own batches
  CHECK(b.take(1).size() == 1);
  CHECK_FALSE(b.close_before_put(1, 1));  // the bound counts from the new batch
  CHECK_FALSE(b.add(1, 16, 2));
  CHECK(b.close_before_put(1, 5 << 20));  // a single put larger than the bound
  CHECK(b.take(1).size() == 1);
  CHECK_FALSE(b.add(1, 24, 3));
  CHECK_FALSE(b.close_before_put(1, 4 << 20));  // counted from zero again after take()
  SignalBatcher unbounded(2, 64);               // default: only the FIFO running dry or a full batch close it
  CHECK_FALSE(unbounded.add(1, 8, 1));
  CHECK_FALSE(unbounded.close_before_put(1, uint64_t{1} << 40));
  CHECK_FALSE(unbounded.close_before_put(1, uint64_t{1} << 40));
}

TEST_CASE("ibverbs: a put splits into WRITEs of at most 1 GiB; only the last reports the caller's id") {
  ibv::SignalPolicy policy(32, 1024);
  uint64_t seq = 5;
  const uint64_t bytes = 2 * ibv::kMaxWriteBytes + 100;
  auto plan = ibv::plan_put(3, 0x10000, 7, 4096, 0x90000, 9, 128, bytes, true, 42, &seq, 0, &policy);
  REQUIRE(plan.size() == 3);
  CHECK(seq == 8);
  uint64_t total = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    CHECK(ibv::wr_peer(plan[i].wr_id) == 3);
    CHECK(ibv::wr_seq(plan[i].wr_id) == 5 + i);
    CHECK(plan[i].local_addr == 0x10000 + 4096 + total);
    CHECK(plan[i].remote_addr == 0x90000 + 128 + total);
    CHECK(plan[i].lkey == 7);
    CHECK(plan[i].rkey == 9);
    CHECK_FALSE(plan[i].fence);
    CHECK_FALSE(plan[i].inline_data);
    CHECK(plan[i].report == (i == 2));
    total += plan[i].length;
  }
  CHECK(total == bytes);
  CHECK(plan[2].signaled);  // need_completion: the last WR produces a CQE
  CHECK(plan[2].user_wr_id == 42);
}

TEST_CASE("ibverbs: signals are inline 8-byte WRITEs to heap base + flag offset, fenced when asked") {
  ibv::SignalPolicy policy(32, 1024);
  uint64_t seq = 0;
  auto w = ibv::plan_signal(1, 0x5000, 11, 0x80000, 12, 256, true, false, 7, &seq, 0, &policy);
  CHECK(w.inline_data);
  CHECK(w.fence);
  CHECK(w.length == 8);
  CHECK(w.remote_addr == 0x80000 + 256);
  CHECK(w.report);
  CHECK_FALSE(w.signaled);  // first of 32: not signalled
  auto u = ibv::plan_signal(1, 0x5000, 11, 0x80000, 12, 256, false, false, 8, &seq, 0, &policy);
  CHECK_FALSE(u.fence);
}

TEST_CASE("ibverbs: selective signalling every N, on demand, and when the send queue fills") {
  ibv::SignalPolicy p(4, 16);
  int signaled = 0;
  for (int i = 0; i < 12; ++i) signaled += p.choose(false, 1);
  CHECK(signaled == 3);
  CHECK(p.choose(true, 1));
  ibv::SignalPolicy q(1000, 16);
  CHECK_FALSE(q.choose(false, 15));
  CHECK(q.choose(false, 16));  // the WR that fills the queue must report room coming back
}

TEST_CASE("ibverbs: the ledger retires unsignalled WRs with the next signalled one, in order") {
  ibv::SignalPolicy policy(3, 1024);
  ibv::CompletionLedger ledger;
  uint64_t seq = 0;
  std::vector<uint64_t> signaled_ids;
  for (uint64_t user = 100; user < 106; ++user) {
    auto w = ibv::plan_signal(2, 0, 0, 0, 0, 8 * user, false, false, user, &seq, ledger.in_flight(), &policy);
    ledger.posted(w);
    if (w.signaled) signaled_ids.push_back(w.wr_id);
  }
  REQUIRE(signaled_ids.size() == 2);
  CHECK(ledger.in_flight() == 6);
  std::vector<uint64_t> done;
  std::string why;
  CHECK(ledger.retire(signaled_ids[0], &done, &why) == Status::kOk);
  CHECK(done == std::vector<uint64_t>{100, 101, 102});
  CHECK(ledger.in_flight() == 3);
  CHECK(ledger.retire(signaled_ids[0], &done, &why) == Status::kProtocolError);  // already retired
  CHECK(ledger.retire(signaled_ids[1], &done, &why) == Status::kOk);
  CHECK(done.size() == 6);
  CHECK(ledger.in_flight() == 0);
}

TEST_CASE("ibverbs: failed completions are described with the peer and a likely cause") {
  auto s = ibv::describe_wc_failure("transport retry counter exceeded", 12, 0x81, 5);
  CHECK(s.find("rank 5") != std::string::npos);
  CHECK(s.find("retry") != std::string::npos);
  CHECK(s.find("0x81") != std::string::npos);
}

TEST_CASE("ibverbs: the backend is made where an RDMA device is present, else fails cleanly with the reason") {
  std::string why;
  const bool present = ibverbs_device_present(&why);
  std::unique_ptr<NetBackend> b;
  BackendConfig cfg;
  std::string name;
  CHECK(resolve_backend_name("auto", &name) == Status::kOk);
  if (present) {
    // A machine with a NIC: auto picks it, and the backend opens the device.
    CHECK(name == "ibverbs");
    CHECK(make_ibverbs_backend(cfg, &b) == Status::kOk);
    REQUIRE(b != nullptr);
    CHECK(std::string(b->name()) == "ibverbs");
    return;
  }
  CHECK_FALSE(why.empty());
  CHECK(make_ibverbs_backend(cfg, &b) == Status::kUnsupported);
  CHECK(b == nullptr);
  CHECK(name == "socket");
}

TEST_CASE("socket wire: every header is validated before anything is written") {
  WireExpect e;
  e.secret = 0x1234;
  e.region_bytes = 4096;
  e.self_rank = 0;
  e.world_size = 4;
  e.channel = 1;
  std::string why;
  auto h = make_wire_header(WireKind::kHello, 2, 1, 0x1234, 0, 0);
  CHECK(validate_wire_header(h, e, &why));
  auto bad = h;
  bad.secret = 0x1235;
  CHECK_FALSE(validate_wire_header(bad, e, &why));
  CHECK(why.find("secret") != std::string::npos);
  bad = h;
  bad.version = 2;
  CHECK_FALSE(validate_wire_header(bad, e, &why));
  bad = h;
  bad.magic = 0;
  CHECK_FALSE(validate_wire_header(bad, e, &why));
  bad = h;
  bad.src_rank = 0;  // myself
  CHECK_FALSE(validate_wire_header(bad, e, &why));
  bad = h;
  bad.src_rank = 4;
  CHECK_FALSE(validate_wire_header(bad, e, &why));
  CHECK_FALSE(validate_wire_header(make_wire_header(WireKind::kPut, 2, 1, 0x1234, 0, 8), e, &why));  // no hello yet

  e.stream_src = 2;
  CHECK(validate_wire_header(make_wire_header(WireKind::kPut, 2, 1, 0x1234, 4000, 96), e, &why));
  CHECK_FALSE(validate_wire_header(make_wire_header(WireKind::kPut, 2, 1, 0x1234, 4000, 97), e, &why));
  CHECK_FALSE(validate_wire_header(make_wire_header(WireKind::kPut, 2, 1, 0x1234, ~0ull - 10, 20), e, &why));
  CHECK_FALSE(validate_wire_header(make_wire_header(WireKind::kPut, 2, 1, 0x1234, 8, ~0ull), e, &why));
  CHECK_FALSE(validate_wire_header(make_wire_header(WireKind::kPut, 2, 1, 0x1234, 0, 0), e, &why));
  CHECK_FALSE(validate_wire_header(make_wire_header(WireKind::kPut, 3, 1, 0x1234, 0, 8), e, &why));  // wrong source
  CHECK(validate_wire_header(make_wire_header(WireKind::kSignal, 2, 1, 0x1234, 4088, 7), e, &why));
  CHECK_FALSE(validate_wire_header(make_wire_header(WireKind::kSignal, 2, 1, 0x1234, 4092, 7), e, &why));
  CHECK_FALSE(validate_wire_header(make_wire_header(WireKind::kSignal, 2, 1, 0x1234, 4096, 7), e, &why));
  CHECK_FALSE(validate_wire_header(make_wire_header(WireKind::kHello, 2, 1, 0x1234, 0, 0), e, &why));
  auto k = make_wire_header(WireKind::kPut, 2, 1, 0x1234, 0, 8);
  k.kind = 99;
  CHECK_FALSE(validate_wire_header(k, e, &why));
}

TEST_CASE("endpoint blobs round-trip and reject truncation, wrong rank and wrong version") {
  SocketPeerInfo s;
  s.ipv4 = {0x0100007f, 0x0200000a};
  s.port = 4242;
  auto blob = encode_peer_info(3, 1, s);
  int node = -1;
  PeerInfo back;
  REQUIRE(decode_peer_info(blob, 3, &node, &back) == Status::kOk);
  CHECK(node == 1);
  REQUIRE(std::holds_alternative<SocketPeerInfo>(back));
  CHECK(std::get<SocketPeerInfo>(back).port == 4242);
  CHECK(std::get<SocketPeerInfo>(back).ipv4 == s.ipv4);
  CHECK(decode_peer_info(blob, 2, &node, &back) == Status::kProtocolError);
  auto cut = blob;
  cut.pop_back();
  CHECK(decode_peer_info(cut, 3, &node, &back) == Status::kProtocolError);
  auto ver = blob;
  ver[4] = 9;
  CHECK(decode_peer_info(ver, 3, &node, &back) == Status::kProtocolError);

  IbvPeerInfo v;
  v.lid = 7;
  v.gid[15] = 1;
  v.heap_addr = 0xdead0000;
  v.rkey = 99;
  v.qps = {{1, 11, 21}, {2, 12, 22}};
  REQUIRE(decode_peer_info(encode_peer_info(0, 0, v), 0, &node, &back) == Status::kOk);
  CHECK(std::get<IbvPeerInfo>(back).qps == v.qps);
  CHECK(std::get<IbvPeerInfo>(back).heap_addr == v.heap_addr);
  CHECK(encode_peer_info(0, 0, v).size() == ibv_peer_info_bytes(2));
  // The entries are checked: ascending peers, none naming the publisher, 24-bit numbers, a bounded count.
  for (auto bad : {std::vector<IbvQpEntry>{{2, 12, 22}, {1, 11, 21}}, std::vector<IbvQpEntry>{{1, 11, 21}, {1, 12, 22}},
                   std::vector<IbvQpEntry>{{0, 11, 21}}, std::vector<IbvQpEntry>{{-1, 11, 21}},
                   std::vector<IbvQpEntry>{{1, 1u << 24, 21}}, std::vector<IbvQpEntry>{{1, 11, 1u << 24}}}) {
    IbvPeerInfo b = v;
    b.qps = bad;
    CHECK(decode_peer_info(encode_peer_info(0, 0, b), 0, &node, &back) == Status::kProtocolError);
  }
  IbvPeerInfo big = v;
  for (uint32_t p = 3; p <= IbvPeerInfo::kMaxPeers + 1; ++p) big.qps.push_back({int32_t(p), p, p});
  CHECK(decode_peer_info(encode_peer_info(0, 0, big), 0, &node, &back) == Status::kProtocolError);
  big.qps.pop_back();
  CHECK(decode_peer_info(encode_peer_info(0, 0, big), 0, &node, &back) == Status::kOk);
  CHECK(std::get<IbvPeerInfo>(back).facing(7)->qpn == 7);
  CHECK(std::get<IbvPeerInfo>(back).facing(0) == nullptr);
}

TEST_CASE("cpu lists in hwloc form") {
  std::vector<int> cpus;
  CHECK(parse_cpu_list("0-3,8,10-11", &cpus) == Status::kOk);
  CHECK(cpus == std::vector<int>{0, 1, 2, 3, 8, 10, 11});
  CHECK(parse_cpu_list("", &cpus) == Status::kOk);
  CHECK(cpus.empty());
  CHECK(parse_cpu_list("3-1", &cpus) == Status::kInvalidArgument);
  CHECK(parse_cpu_list("x", &cpus) == Status::kInvalidArgument);
}

TEST_CASE("heap allocator: aligned offsets, the same sequence gives the same offsets, overflow refused") {
  HeapAllocator a(1 << 20), b(1 << 20);
  uint64_t x, y, z, x2, y2;
  REQUIRE(a.allocate(100, 8, "flags", &x) == Status::kOk);
  REQUIRE(a.allocate(4096, 4096, "tile", &y) == Status::kOk);
  REQUIRE(b.allocate(100, 8, "flags", &x2) == Status::kOk);
  REQUIRE(b.allocate(4096, 4096, "tile", &y2) == Status::kOk);
  CHECK(x == 0);
  CHECK(y == 4096);
  CHECK(x == x2);
  CHECK(y == y2);
  CHECK(a.allocate(1 << 20, 8, "too big", &z) == Status::kInvalidArgument);
  CHECK(a.allocate(8, 3, "bad align", &z) == Status::kInvalidArgument);
  CHECK(a.allocate(std::numeric_limits<uint64_t>::max() - 4, 8, "overflow", &z) == Status::kInvalidArgument);
}

TEST_CASE("counters add up and print in one line") {
  ProxyCounters a{1, 2, 3, 4, 5}, b{10, 20, 30, 40, 50};
  a += b;
  CHECK(to_string(a) == "puts 11 signals 22 fences 33 batches 44 stalls 55");
}

TEST_CASE("ibverbs: an unsignalled tail gets a probe, whose completion retires everything before it") {
  ibv::SignalPolicy policy(32, 1024);
  ibv::CompletionLedger ledger;
  uint64_t seq = 0;
  for (uint64_t user = 1; user <= 3; ++user) {
    auto w = ibv::plan_signal(4, 0, 0, 0, 0, 8, false, false, user, &seq, ledger.in_flight(), &policy);
    REQUIRE_FALSE(w.signaled);
    ledger.posted(w);
  }
  CHECK(ledger.tail_unsignaled());
  auto probe = ibv::plan_probe(4, &seq);
  CHECK(probe.signaled);
  CHECK_FALSE(probe.report);
  CHECK(probe.length == 0);
  ledger.posted(probe);
  CHECK_FALSE(ledger.tail_unsignaled());
  std::vector<uint64_t> done;
  std::string why;
  CHECK(ledger.retire(probe.wr_id, &done, &why) == Status::kOk);
  CHECK(done == std::vector<uint64_t>{1, 2, 3});  // the probe itself reports nothing
  CHECK(ledger.in_flight() == 0);
}

#if WEFT_HAVE_IBVERBS
TEST_CASE("ibverbs: work requests and QP transitions built from plans") {
  ibv::SignalPolicy policy(1, 1024);  // signal everything
  uint64_t seq = 0;
  auto w = ibv::plan_signal(2, 0x7000, 5, 0x100000, 6, 64, true, false, 9, &seq, 0, &policy);
  ibv_sge sge;
  ibv_send_wr wr;
  ibv::to_send_wr(w, &sge, &wr);
  CHECK(wr.opcode == IBV_WR_RDMA_WRITE);
  CHECK(wr.send_flags == (IBV_SEND_SIGNALED | IBV_SEND_FENCE | IBV_SEND_INLINE));
  CHECK(wr.num_sge == 1);
  CHECK(wr.sg_list == &sge);
  CHECK(sge.addr == 0x7000);
  CHECK(sge.length == 8);
  CHECK(sge.lkey == 5);
  CHECK(wr.wr.rdma.remote_addr == 0x100040);
  CHECK(wr.wr.rdma.rkey == 6);
  CHECK(wr.wr_id == w.wr_id);
  CHECK(wr.next == nullptr);
  ibv::to_send_wr(ibv::plan_probe(2, &seq), &sge, &wr);
  CHECK(wr.num_sge == 0);
  CHECK(wr.send_flags == IBV_SEND_SIGNALED);

  IbvPeerInfo peer;
  peer.lid = 17;
  peer.mtu = IBV_MTU_4096;
  peer.qps = {{1, 101, 201}, {2, 102, 202}};
  ibv_qp_attr a;
  CHECK(ibv::rtr_attr(peer, 3, 1, IBV_MTU_1024, ibv::Route{}, &a) == 0);  // no QP faces rank 3
  int mask = ibv::rtr_attr(peer, 1, 1, IBV_MTU_1024, ibv::Route{}, &a);
  CHECK(a.qp_state == IBV_QPS_RTR);
  CHECK(a.dest_qp_num == 101);  // the peer's QP that faces rank 1
  CHECK(a.rq_psn == 201);
  CHECK(a.path_mtu == IBV_MTU_1024);  // the smaller of the two ends
  CHECK(a.ah_attr.dlid == 17);
  CHECK(a.ah_attr.is_global == 0);  // InfiniBand, no GID: local route
  CHECK((mask & IBV_QP_AV) != 0);
  CHECK((mask & IBV_QP_DEST_QPN) != 0);
  peer.gid[15] = 7;
  ibv::Route roce;
  roce.global = true;
  roce.sgid_index = 3;
  roce.traffic_class = 106;
  ibv::rtr_attr(peer, 1, 1, IBV_MTU_4096, roce, &a);
  CHECK(a.ah_attr.is_global == 1);  // RoCE: global route header with the peer's GID
  CHECK(a.ah_attr.grh.dgid.raw[15] == 7);
  CHECK(a.ah_attr.grh.sgid_index == 3);
  CHECK(a.ah_attr.grh.traffic_class == 106);
  mask = ibv::rts_attr(12345, &a);
  CHECK(a.qp_state == IBV_QPS_RTS);
  CHECK(a.sq_psn == 12345);
  CHECK((mask & IBV_QP_SQ_PSN) != 0);
  CHECK(a.retry_cnt == 7);
}
#endif
