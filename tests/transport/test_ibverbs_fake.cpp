// The ibverbs backend end to end against the fake verbs fabric (ibverbs_fake.h): connect, post, poll and
// close really run; QP state machine, masks, rkey bounds, send-queue depth and RC order are enforced.
#include <doctest/doctest.h>
#include <stdlib.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "ibverbs_fake.h"
#include "local_bootstrap.h"
#include "topology/topology.h"
#include "transport/ibverbs_api.h"
#include "transport/ibverbs_plan.h"
#include "transport/transport.h"
#include "transport/transport_bandwidth.h"
#include "transport/transport_check.h"

using weft::Status;
namespace tr = weft::transport;
namespace fake = weft::testing::fake_ibv;

namespace {

std::string data(const char* file) { return std::string(WEFT_SOURCE_DIR) + "/tests/data/" + file; }

struct Env {
  Env(const char* k, const std::string& v) : key(k) { setenv(k, v.c_str(), 1); }
  ~Env() { unsetenv(key); }
  const char* key;
};

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + "\n";
  return s;
}

// The JUWELS Booster node's four HCAs (tests/data/psmgmt-topo.jwb0004.xml), as the fake's devices.
std::vector<fake::DeviceSpec> jwb_hcas() {
  return {fake::ib_device("mlx5_0", 11), fake::ib_device("mlx5_1", 12), fake::ib_device("mlx5_2", 13),
          fake::ib_device("mlx5_3", 14)};
}

// Two QPs of one device connected to each other by hand, through the table.
struct Pair {
  const tr::ibv::Api& api;
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* q[2] = {};
  explicit Pair(const tr::ibv::Api& a, uint32_t depth = 16) : api(a) {
    int n = 0;
    ibv_device** list = api.get_device_list(&n);
    REQUIRE(n >= 1);
    ctx = api.open_device(list[0]);
    api.free_device_list(list);
    pd = api.alloc_pd(ctx);
    cq = api.create_cq(ctx, 256, nullptr, nullptr, 0);
    for (auto& x : q) {
      ibv_qp_init_attr i{};
      i.send_cq = i.recv_cq = cq;
      i.qp_type = IBV_QPT_RC;
      i.cap.max_send_wr = depth;
      i.cap.max_send_sge = 1;
      i.cap.max_inline_data = 64;
      x = api.create_qp(pd, &i);
      REQUIRE(x);
    }
  }
  int init(int k, int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    return api.modify_qp(q[k], &a, mask);
  }
  int rtr(int k, uint16_t dlid) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = q[1 - k]->qp_num;
    a.rq_psn = 7;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.dlid = dlid;
    a.ah_attr.port_num = 1;
    return api.modify_qp(q[k], &a,
                         IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  }
  int rts(int k) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 7;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    return api.modify_qp(
        q[k], &a,
        IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
  }
  int write(int k, ibv_mr* src, uint64_t off, ibv_mr* dst, uint64_t raddr, uint32_t len, bool signaled, uint64_t id) {
    ibv_sge sge{reinterpret_cast<uint64_t>(src->addr) + off, len, src->lkey};
    ibv_send_wr wr{};
    wr.wr_id = id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = dst->rkey;
    ibv_send_wr* bad = nullptr;
    return api.post_send(q[k], &wr, &bad);
  }
  ~Pair() {
    for (auto& x : q) api.destroy_qp(x);
    api.destroy_cq(cq);
    api.dealloc_pd(pd);
    api.close_device(ctx);
  }
};

}  // namespace

TEST_CASE("the fake refuses what real verbs refuse: transitions, attribute masks, routes, SQ depth, rkey bounds") {
  fake::Fabric fab({fake::ib_device("mlx5_0", 5)});
  const tr::ibv::Api& api = tr::ibv::api();
  CHECK(std::string(api.name) == "fake verbs");
  {
    Pair p(api, 4);
    std::vector<uint8_t> a(4096, 0xab), b(4096, 0);
    ibv_mr* ma = api.reg_mr(p.pd, a.data(), a.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    ibv_mr* mb = api.reg_mr(p.pd, b.data(), b.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    CHECK(api.reg_mr(p.pd, b.data(), 64, IBV_ACCESS_REMOTE_WRITE) == nullptr);  // remote write needs local write
    CHECK(p.rtr(0, 5) == EINVAL);                                               // RESET -> RTR skips INIT
    CHECK(p.init(0, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_ACCESS_FLAGS) == EINVAL);  // no IBV_QP_PORT
    REQUIRE(p.init(0) == 0);
    REQUIRE(p.init(1) == 0);
    CHECK(p.write(0, ma, 0, mb, reinterpret_cast<uint64_t>(b.data()), 8, true, 1) == EINVAL);  // INIT cannot send
    CHECK(p.rtr(0, 0) == EINVAL);  // InfiniBand without a destination LID
    REQUIRE(p.rtr(0, 5) == 0);
    REQUIRE(p.rtr(1, 5) == 0);
    REQUIRE(p.rts(0) == 0);
    REQUIRE(p.rts(1) == 0);
    // Depth 4: three unsignalled WRs and a signalled one fill it; nothing frees a slot until its CQE is polled.
    const uint64_t rb = reinterpret_cast<uint64_t>(b.data());
    for (int i = 0; i < 3; ++i) CHECK(p.write(0, ma, 8 * i, mb, rb + 8 * i, 8, false, 10 + i) == 0);
    CHECK(p.write(0, ma, 24, mb, rb + 24, 8, true, 13) == 0);
    CHECK(p.write(0, ma, 32, mb, rb + 32, 8, true, 14) == ENOMEM);
    ibv_wc wc[8];
    CHECK(api.poll_cq(p.cq, 8, wc) == 1);  // one CQE (the signalled WR) retires all four
    CHECK(wc[0].wr_id == 13);
    CHECK(wc[0].status == IBV_WC_SUCCESS);
    CHECK(b[31] == 0xab);
    CHECK(p.write(0, ma, 32, mb, rb + 32, 8, true, 14) == 0);
    CHECK(api.poll_cq(p.cq, 8, wc) == 1);
    // RC order with one WR executed per poll: the flag never lands before the data ahead of it.
    fab.set_exec_budget(1);
    std::memset(b.data(), 0, b.size());
    CHECK(p.write(0, ma, 0, mb, rb + 1024, 1024, false, 20) == 0);
    CHECK(p.write(0, ma, 0, mb, rb + 8, 8, true, 21) == 0);
    CHECK(api.poll_cq(p.cq, 8, wc) == 0);
    CHECK(b[1024] == 0xab);
    CHECK(b[8] == 0);
    CHECK(api.poll_cq(p.cq, 8, wc) == 1);
    CHECK(b[8] == 0xab);
    fab.set_exec_budget(0);
    // An rkey range one byte past the region: remote access error, the QP goes to ERR, later WRs flush.
    CHECK(p.write(0, ma, 0, mb, rb + 4096 - 7, 8, false, 30) == 0);
    CHECK(p.write(0, ma, 0, mb, rb, 8, false, 31) == 0);
    int n = api.poll_cq(p.cq, 8, wc);
    REQUIRE(n == 2);
    CHECK(wc[0].status == IBV_WC_REM_ACCESS_ERR);
    CHECK(wc[1].status == IBV_WC_WR_FLUSH_ERR);
    api.dereg_mr(ma);
    api.dereg_mr(mb);
  }
  CHECK(fab.live_objects() == 0);
  const std::string v = joined(fab.violations());
  CHECK(v.find("RESET -> RTR") != std::string::npos);
  CHECK(v.find("lacks required bits") != std::string::npos);
  CHECK(v.find("state INIT") != std::string::npos);
  CHECK(v.find("without a destination LID") != std::string::npos);
  CHECK(v.find("send queue overflow") != std::string::npos);
  CHECK(v.find("outside the rkey's region") != std::string::npos);
}

TEST_CASE("the whole ibverbs backend over the fake: 4 ranks on 2 nodes, every signal mode, bytes verified") {
  fake::Fabric fab(jwb_hcas());
  fab.set_exec_budget(3);  // WRITEs land a few per poll, not at post time
  Env topo("WEFT_TOPO_FILE", data("psmgmt-topo.jwb0004.xml"));
  for (const char* mode : {"serial", "fenced", "batched"}) {
    CAPTURE(mode);
    std::vector<tr::TransportCheckResult> res(4);
    auto st = weft::testing::run_threads(4, 2, [&](weft::bootstrap::Bootstrap& boot) -> Status {
      tr::TransportCheckOptions o;
      o.backend = "ibverbs";
      o.signal_mode = mode;
      o.block_bytes = 40000;  // not a multiple of anything
      o.iterations = 3;
      o.timeout_s = 20;
      return tr::run_transport_check(boot, o, &res[boot.info().rank]);
    });
    for (int r = 0; r < 4; ++r) {
      CAPTURE(r);
      CHECK(st[r] == Status::kOk);
      CHECK(res[r].backend == "ibverbs");
      // 3 iterations x 2 phases x 3 peers, then one block from the rail peer.
      CHECK(res[r].bytes_verified == 3ull * 2 * 3 * 40000 + 40000);
      CHECK(res[r].connections_opened == 3);
      CHECK(res[r].rails_opened == 1);
      // Local rank r % 2 uses GPU r % 2's NIC from the mapping: mlx5_0 (GPU 03:00.0), mlx5_1 (GPU 44:00.0).
      CHECK(res[r].placement.find(r % 2 ? "NIC mlx5_1 port 1 (ibverbs)" : "NIC mlx5_0 port 1 (ibverbs)") !=
            std::string::npos);
    }
    if (std::string(mode) == "fenced") CHECK(fab.counters().fenced > 0);
  }
  const fake::Counters c = fab.counters();
  CHECK(c.writes > 0);
  CHECK(c.inline_writes > 0);        // signals are inline
  CHECK(c.max_outstanding <= 1024);  // never past the send queue
  CHECK(fab.violations().empty());   // no refused call, no access error
  CHECK_MESSAGE(fab.live_objects() == 0, "close releases every QP, MR, CQ, PD and context");
  for (const auto& r : fab.routes()) {
    CHECK_FALSE(r.global);  // InfiniBand: LID routing
    CHECK((r.device == "mlx5_0" || r.device == "mlx5_1"));
  }
  INFO(joined(fab.violations()));
}

TEST_CASE("RoCE: the RoCE v2 GID of a netdev (not index 0), a global route, the traffic class overridable") {
  auto roce = [] {
    return std::vector<fake::DeviceSpec>{fake::roce_device("mlx5_0", 1), fake::roce_device("mlx5_1", 2),
                                         fake::roce_device("mlx5_2", 3), fake::roce_device("mlx5_3", 4)};
  };
  Env topo("WEFT_TOPO_FILE", data("psmgmt-topo.jwb0004.xml"));
  auto run = [](int ranks) {
    return weft::testing::run_threads(ranks, 1, [&](weft::bootstrap::Bootstrap& boot) -> Status {
      tr::TransportCheckOptions o;
      o.backend = "ibverbs";
      o.block_bytes = 4096;
      o.timeout_s = 20;
      tr::TransportCheckResult r;
      return tr::run_transport_check(boot, o, &r);
    });
  };
  SUBCASE("default: index 3 (RoCE v2, IPv4-mapped), traffic class 0 (no site default in sysfs here)") {
    fake::Fabric fab(roce());
    for (Status s : run(2)) CHECK(s == Status::kOk);
    REQUIRE(!fab.routes().empty());
    for (const auto& r : fab.routes()) {
      CHECK(r.global);
      CHECK(r.sgid_index == 3);
      CHECK(r.traffic_class == 0);
    }
    CHECK(fab.violations().empty());
  }
  SUBCASE("WEFT_IB_TC=106, and a provider without ibv_query_gid_table (walked with ibv_query_gid_ex)") {
    Env tc("WEFT_IB_TC", "106");
    fake::Fabric fab(roce());
    fab.set_gid_table_unsupported(true);
    for (Status s : run(2)) CHECK(s == Status::kOk);
    REQUIRE(!fab.routes().empty());
    for (const auto& r : fab.routes()) {
      CHECK(r.sgid_index == 3);
      CHECK(r.traffic_class == 106);
    }
  }
  SUBCASE("WEFT_IB_GID_INDEX=1 takes the RoCE v2 link-local GID") {
    Env gid("WEFT_IB_GID_INDEX", "1");
    fake::Fabric fab(roce());
    for (Status s : run(2)) CHECK(s == Status::kOk);
    for (const auto& r : fab.routes()) CHECK(r.sgid_index == 1);
  }
  SUBCASE("a port without a RoCE v2 GID fails before any QP is made, saying why") {
    auto devs = roce();
    for (auto& d : devs)
      for (auto& g : d.ports[0].gids) g.type = IBV_GID_TYPE_ROCE_V1;
    fake::Fabric fab(devs);
    for (Status s : run(2)) CHECK(s == Status::kUnsupported);
    CHECK(fab.routes().empty());
    CHECK(fab.live_objects() == 0);
  }
}

TEST_CASE("choose_gid ranks RoCE v2 GIDs: IPv4-mapped, then global IPv6, then link-local; never v1 or no netdev") {
  auto g = [](uint32_t index, uint32_t type, uint32_t ifindex, std::initializer_list<uint8_t> head, uint8_t last) {
    tr::ibv::GidCandidate c;
    c.index = index;
    c.type = type;
    c.ndev_ifindex = ifindex;
    size_t i = 0;
    for (uint8_t b : head) c.raw[i++] = b;
    c.raw[15] = last;
    return c;
  };
  const uint8_t v4[] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  auto mapped = [&](uint32_t index, uint32_t type, uint32_t ifindex) {
    tr::ibv::GidCandidate c;
    c.index = index;
    c.type = type;
    c.ndev_ifindex = ifindex;
    memcpy(c.raw, v4, sizeof v4);
    c.raw[12] = 10;
    c.raw[15] = 9;
    return c;
  };
  std::string why;
  std::vector<tr::ibv::GidCandidate> t = {g(0, 1, 5, {0xfe, 0x80}, 1),
                                          g(1, 2, 5, {0xfe, 0x80}, 1),
                                          g(2, 2, 5, {0x20, 0x01}, 1),
                                          mapped(3, 1, 5),
                                          mapped(4, 2, 0),
                                          mapped(5, 2, 5)};
  CHECK(tr::ibv::choose_gid(t, 1, -1, &why) == 5);
  CHECK(why.find("::ffff:10.0.0.9") != std::string::npos);
  t.pop_back();
  CHECK(tr::ibv::choose_gid(t, 1, -1, &why) == 2);  // global IPv6 before link-local
  t.erase(t.begin() + 2);
  CHECK(tr::ibv::choose_gid(t, 1, -1, &why) == 1);
  CHECK(tr::ibv::choose_gid(t, 2, -1, &why) == -1);  // nothing on port 2
  CHECK(why.find("no RoCE v2 GID") != std::string::npos);
  CHECK(tr::ibv::choose_gid(t, 1, 0, &why) == 0);  // forced
  CHECK(tr::ibv::choose_gid(t, 1, 9, &why) == -1);
}

TEST_CASE("dma-buf: the page-aligned export, the offset into it; peer memory as fallback; an error naming both") {
  // Offset math.
  auto r = tr::ibv::dmabuf_range(0x7f0000001234ull, 0x3000, 4096);
  CHECK(r.aligned_base == 0x7f0000001000ull);
  CHECK(r.offset == 0x234);
  CHECK(r.aligned_bytes == 0x4000);
  r = tr::ibv::dmabuf_range(0x200000, 0x200000, 65536);
  CHECK(r.offset == 0);
  CHECK(r.aligned_bytes == 0x200000);

  fake::Fabric fab({fake::ib_device("mlx5_0", 1), fake::ib_device("mlx5_1", 2)});
  // Rank 1's "GPU heap": 3 pages exported as one dma-buf; the heap starts 1000 bytes into them. In
  // this process the exported pages are host memory the fake maps the dma-buf to.
  alignas(4096) static uint8_t pages[3 * 4096];
  std::memset(pages, 0, sizeof pages);
  const uint64_t heap_bytes = 5000;
  uint8_t* gpu_heap = pages + 1000;
  auto dr = tr::ibv::dmabuf_range(reinterpret_cast<uint64_t>(gpu_heap), heap_bytes, 4096);
  REQUIRE(dr.aligned_base == reinterpret_cast<uint64_t>(pages));
  const int fd = fab.add_dmabuf(pages, dr.aligned_bytes);
  std::vector<uint8_t> host(heap_bytes);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint8_t>(i * 7 + 1);

  tr::BackendConfig c0, c1;
  c0.rank = 0, c1.rank = 1;
  c0.size = c1.size = 2;
  c0.nic_name = "mlx5_0", c1.nic_name = "mlx5_1";
  c0.timeout_s = c1.timeout_s = 10;
  std::unique_ptr<tr::NetBackend> b0, b1;
  REQUIRE(tr::make_ibverbs_backend(c0, &b0) == Status::kOk);
  REQUIRE(tr::make_ibverbs_backend(c1, &b1) == Status::kOk);
  REQUIRE(b0->register_region(tr::Region{host.data(), heap_bytes, tr::MemKind::kHost}) == Status::kOk);
  tr::Region dev{gpu_heap, heap_bytes, tr::MemKind::kDevice, fd, dr.offset};
  REQUIRE(b1->register_region(dev) == Status::kOk);
  CHECK(fab.counters().dmabuf_mrs == 1);
  tr::PeerInfo i0, i1;
  REQUIRE(b0->local_info(&i0) == Status::kOk);
  REQUIRE(b1->local_info(&i1) == Status::kOk);
  REQUIRE(b0->connect(1, i1) == Status::kOk);
  REQUIRE(b1->connect(0, i0) == Status::kOk);
  // Rank 0 writes bytes [100, 4100) of its heap to offset 300 of rank 1's, then a flag at 4992.
  tr::PostFlags f;
  f.need_completion = true;
  REQUIRE(b0->post_put(1, 100, 300, 4000, f, 1) == Status::kOk);
  REQUIRE(b0->post_signal(1, 4992, 0x1122334455667788ull, f, 2) == Status::kOk);
  std::vector<tr::Completion> done;
  for (int i = 0; i < 100 && done.size() < 2; ++i) REQUIRE(b0->poll(&done) == Status::kOk);
  REQUIRE(done.size() == 2);
  CHECK(std::memcmp(gpu_heap + 300, host.data() + 100, 4000) == 0);  // at base + offset, not at the page start
  CHECK(pages[300] == 0);
  uint64_t flag = 0;
  memcpy(&flag, gpu_heap + 4992, 8);
  CHECK(flag == 0x1122334455667788ull);
  CHECK(b0->close() == Status::kOk);
  CHECK(b1->close() == Status::kOk);

  // An fd the driver refuses: ibv_reg_mr through peer memory instead.
  std::unique_ptr<tr::NetBackend> b2;
  REQUIRE(tr::make_ibverbs_backend(c1, &b2) == Status::kOk);
  CHECK(b2->register_region(tr::Region{gpu_heap, heap_bytes, tr::MemKind::kDevice, 999, dr.offset}) == Status::kOk);
  CHECK(fab.counters().plain_mrs >= 2);
  b2->close();
  // Neither works: one error that names both attempts and what would fix them.
  fab.refuse_reg_mr_of(pages, sizeof pages);
  std::unique_ptr<tr::NetBackend> b3;
  REQUIRE(tr::make_ibverbs_backend(c1, &b3) == Status::kOk);
  CHECK(b3->register_region(tr::Region{gpu_heap, heap_bytes, tr::MemKind::kDevice, 999, dr.offset}) ==
        Status::kUnsupported);
  const std::string e = b3->error_message();
  CHECK(e.find("ibv_reg_dmabuf_mr") != std::string::npos);
  CHECK(e.find("peer memory") != std::string::npos);
  CHECK(e.find("nvidia-peermem") != std::string::npos);
  b3->close();
  CHECK(fab.violations().empty());  // relaxed ordering never asked for, no bad range
  CHECK(fab.live_objects() == 0);
}

TEST_CASE("without an RDMA subsystem (as in CI) the table says so and the backend is not made") {
  fake::Fabric fab({});
  fab.set_no_rdma_subsystem(true);
  std::string why;
  CHECK_FALSE(tr::ibverbs_device_present(&why));
  CHECK(why.find("Function not implemented") != std::string::npos);
  tr::BackendConfig c;
  std::unique_ptr<tr::NetBackend> b;
  CHECK(tr::make_ibverbs_backend(c, &b) == Status::kUnsupported);
}

namespace {

struct AutoRun {
  std::vector<Status> status;
  std::vector<tr::TransportCheckResult> result;
  double seconds = 0;
};

// 4 ranks, 2 per node (local ranks 0 and 1 map to mlx5_0 and mlx5_1 on jwb0004), backend `name`.
AutoRun run_check(const std::string& name, double timeout_s = 20) {
  AutoRun out;
  out.result.resize(4);
  auto t0 = std::chrono::steady_clock::now();
  out.status = weft::testing::run_threads(4, 2, [&](weft::bootstrap::Bootstrap& boot) -> Status {
    tr::TransportCheckOptions o;
    o.backend = name;
    o.block_bytes = 8192;
    o.timeout_s = timeout_s;
    return tr::run_transport_check(boot, o, &out.result[boot.info().rank]);
  });
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace

TEST_CASE("auto is collective: ibverbs only where every rank's mapped NIC opens and its preflight completes") {
  Env topo("WEFT_TOPO_FILE", data("psmgmt-topo.jwb0004.xml"));
  SUBCASE("every rank's NIC works: ibverbs everywhere") {
    fake::Fabric fab(jwb_hcas());
    AutoRun r = run_check("auto");
    for (int i = 0; i < 4; ++i) {
      CHECK(r.status[i] == Status::kOk);
      CHECK(r.result[i].backend == "ibverbs");
      CHECK(r.result[i].backend_reason == "auto: every rank can use ibverbs");
    }
  }
  SUBCASE("local rank 1's NIC (mlx5_1) is missing: sockets on every rank, saying why; explicit ibverbs fails all") {
    fake::Fabric fab({fake::ib_device("mlx5_0", 11)});
    AutoRun r = run_check("auto");
    for (int i = 0; i < 4; ++i) {
      CAPTURE(i);
      CHECK(r.status[i] == Status::kOk);
      CHECK(r.result[i].backend == "socket");  // the same backend on every rank, and the bytes verified
      CHECK(r.result[i].bytes_verified > 0);
      CHECK(r.result[i].backend_reason.find("auto chose socket: rank 1 ") != std::string::npos);
      CHECK(r.result[i].backend_reason.find("mlx5_1") != std::string::npos);
    }
    CHECK(fab.live_objects() == 0);  // rank 0's and 2's ibverbs backends were closed again
    AutoRun e = run_check("ibverbs");
    for (int i = 0; i < 4; ++i) CHECK(e.status[i] != Status::kOk);  // every rank, not just ranks 1 and 3
    CHECK(e.seconds < 10);                                          // at once, not after a timeout
  }
  SUBCASE("mlx5_1 opens but carries nothing: the preflight fails, sockets on every rank") {
    fake::Fabric fab(jwb_hcas());
    fab.set_unreachable("mlx5_1");
    AutoRun r = run_check("auto", 5);
    for (int i = 0; i < 4; ++i) {
      CAPTURE(i);
      CHECK(r.status[i] == Status::kOk);
      CHECK(r.result[i].backend == "socket");
      CHECK(r.result[i].backend_reason.find("auto chose socket") != std::string::npos);
      CHECK(r.result[i].backend_reason.find("retry counter exceeded") != std::string::npos);
    }
    CHECK(r.seconds < 10);
  }
  SUBCASE("mlx5_1's WRITEs vanish without an error: the preflight's bound ends it, naming who did not answer") {
    fake::Fabric fab(jwb_hcas());
    fab.set_unreachable("mlx5_1", true);
    AutoRun r = run_check("auto", 1);
    for (int i = 0; i < 4; ++i) {
      CAPTURE(i);
      CHECK(r.status[i] == Status::kOk);
      CHECK(r.result[i].backend == "socket");
      CHECK(r.result[i].backend_reason.find("not completed after 1s (WEFT_PROXY_TIMEOUT); no answer from rank") !=
            std::string::npos);
    }
    CHECK(r.seconds < 10);
  }
  SUBCASE("no RDMA subsystem anywhere: sockets, and the line says why") {
    fake::Fabric fab({});
    fab.set_no_rdma_subsystem(true);
    AutoRun r = run_check("auto");
    for (int i = 0; i < 4; ++i) {
      CHECK(r.status[i] == Status::kOk);
      CHECK(r.result[i].backend == "socket");
      CHECK(r.result[i].backend_reason.find("has no usable RDMA device (ibv_get_device_list: Function not "
                                            "implemented; libfabric") != std::string::npos);
    }
  }
}

TEST_CASE("channels rotate over the GPU's equally near NICs (mel2001): each channel's QPs are on its own HCA") {
  fake::Fabric fab({fake::ib_device("mlx5_0", 21), fake::ib_device("mlx5_1", 22)});
  Env topo("WEFT_TOPO_FILE", data("psmgmt-topo.mel2001.xml"));
  std::vector<std::vector<tr::ChannelUse>> use(2);
  auto st = weft::testing::run_threads(2, 1, [&](weft::bootstrap::Bootstrap& boot) -> Status {
    const int me = boot.info().rank, peer = 1 - me;
    std::vector<uint64_t> heap_mem(1024, 0);
    tr::Region heap{heap_mem.data(), heap_mem.size() * 8, tr::MemKind::kHost};
    for (size_t i = 0; i < 256; ++i) heap_mem[i] = 1000u * me + i;
    tr::TransportOptions o;
    o.backend = "ibverbs";
    o.channels = 2;
    o.timeout_s = 10;
    std::unique_ptr<tr::Transport> t;
    WEFT_CHECK(tr::Transport::create(boot, heap, o, &t));
    use[me] = t->channel_use();
    // Channel c carries words [128c, 128c + 128) to the peer's [256 + 128c, ...), flag at word 512 + c.
    for (int c = 0; c < 2; ++c)
      WEFT_CHECK(t->put_signal(c, peer, 8 * 128 * c, 8 * (256 + 128 * c), 8 * 128, 8 * (512 + c), 1));
    for (int c = 0; c < 2; ++c) WEFT_CHECK(t->wait_flag(8 * (512 + c), 1, "channel flag"));
    for (size_t i = 0; i < 256; ++i)
      if (heap_mem[256 + i] != 1000u * peer + i) return Status::kProtocolError;
    WEFT_CHECK(t->flush());
    WEFT_CHECK(boot.barrier("done"));
    return t->stop();
  });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(st[r] == Status::kOk);
    REQUIRE(use[r].size() == 2);
    // Local rank 0 -> GPU 0000:03:00.0, equally near mlx5_0 and mlx5_1; the primary is mlx5_0.
    CHECK(use[r][0].nic == "mlx5_0");
    CHECK(use[r][1].nic == "mlx5_1");
    CHECK(use[r][0].nic_used);
  }
  int on0 = 0, on1 = 0;
  for (const auto& r : fab.routes()) (r.device == "mlx5_0" ? on0 : on1)++;
  CHECK(on0 == 2);  // one QP per rank per channel
  CHECK(on1 == 2);
  CHECK(fab.violations().empty());
}

TEST_CASE("a device with a 64-deep send queue: the backend sizes its QPs to it and 2000 posts never overflow") {
  auto small = [](const char* name, uint16_t lid) {
    fake::DeviceSpec d = fake::ib_device(name, lid);
    d.max_qp_wr = 64;
    return d;
  };
  fake::Fabric fab({small("mlx5_0", 31), small("mlx5_1", 32)});
  fab.set_exec_budget(1);  // one WRITE per poll: the send queue fills up
  for (const char* mode : {"serial", "fenced", "batched"}) {
    CAPTURE(mode);
    auto st = weft::testing::run_threads(2, 1, [&](weft::bootstrap::Bootstrap& boot) -> Status {
      const int me = boot.info().rank, peer = 1 - me;
      std::vector<uint64_t> mem(4096, 0);
      for (int i = 0; i < 1000; ++i) mem[i] = 7 * i + me;
      tr::TransportOptions o;
      o.backend = "ibverbs";
      o.signal_mode = mode;
      o.timeout_s = 20;
      o.use_topology = false;
      std::unique_ptr<tr::Transport> t;
      WEFT_CHECK(tr::Transport::create(boot, tr::Region{mem.data(), mem.size() * 8, tr::MemKind::kHost}, o, &t));
      // 1000 one-word puts, each followed by a signal counting them: 2000 posts to one peer.
      for (uint64_t i = 0; i < 1000; ++i) WEFT_CHECK(t->put_signal(0, peer, 8 * i, 8 * (1024 + i), 8, 8 * 4000, i + 1));
      WEFT_CHECK(t->wait_flag(8 * 4000, 1000, "the last signal"));
      for (int i = 0; i < 1000; ++i)
        if (mem[1024 + i] != uint64_t(7 * i + peer)) return Status::kProtocolError;  // data before its flag
      WEFT_CHECK(t->flush());
      WEFT_CHECK(boot.barrier("done"));
      return t->stop();
    });
    CHECK(st[0] == Status::kOk);
    CHECK(st[1] == Status::kOk);
  }
  CHECK(fab.counters().max_outstanding <= 64);
  CHECK(fab.counters().max_outstanding > 32);  // the queue really filled: the depth rule was exercised
  CHECK(fab.violations().empty());
  INFO(joined(fab.violations()));
}

TEST_CASE("--bandwidth over the fake ibverbs backend: every mode, fences as the mode says") {
  fake::Fabric fab({fake::ib_device("mlx5_0", 41), fake::ib_device("mlx5_1", 42)});
  std::vector<tr::BandwidthRow> rows;
  auto st = weft::testing::run_threads(2, 1, [&](weft::bootstrap::Bootstrap& boot) -> Status {
    tr::BandwidthOptions o;
    o.backend = "ibverbs";
    o.sizes = {4096, 1 << 20};
    o.bytes_per_size = 4 << 20;
    o.repetitions = 1;
    o.latency_iters = 20;
    o.timeout_s = 20;
    std::vector<tr::BandwidthRow> mine;
    Status s = tr::run_transport_bandwidth(boot, o, &mine);
    if (boot.info().rank == 0) rows = mine;
    return s;
  });
  CHECK(st[0] == Status::kOk);
  CHECK(st[1] == Status::kOk);
  REQUIRE(rows.size() == 6);
  for (const auto& r : rows) {
    CHECK(r.backend == "ibverbs");
    if (r.signal_mode == "serial") CHECK(r.counters.fences == 0);
    if (r.signal_mode == "fenced") CHECK(r.counters.fences == r.counters.signals);
  }
  CHECK(fab.violations().empty());
}

TEST_CASE("Transport::create opens exactly the peer set: 2 nodes x 4, one QP per rank for rails, 7 for a full mesh") {
  fake::Fabric fab({fake::ib_device("mlx5_0", 51)});
  for (tr::PeerNeed need : {tr::PeerNeed::kRails, tr::PeerNeed::kEveryRank}) {
    CAPTURE(tr::to_string(need));
    const size_t routes_before = fab.routes().size();
    std::vector<int> opened(8, -1), planned(8, -2);
    std::vector<std::vector<int>> peers(8);
    size_t live = 0;
    auto st = weft::testing::run_threads(8, 4, [&](weft::bootstrap::Bootstrap& boot) -> Status {
      const int me = boot.info().rank;
      std::vector<uint64_t> mem(1024, 0);
      mem[0] = 100 + me;
      tr::TransportOptions o;
      o.backend = "ibverbs";
      o.timeout_s = 10;
      o.use_topology = false;
      o.peers = need;
      std::unique_ptr<tr::Transport> t;
      WEFT_CHECK(tr::Transport::create(boot, tr::Region{mem.data(), mem.size() * 8, tr::MemKind::kHost}, o, &t));
      opened[me] = t->connections_opened();
      peers[me] = t->peer_set().net;
      tr::ResourceInputs in;
      in.backend = "ibverbs";
      tr::RankResources r;
      std::string why;
      WEFT_CHECK(tr::rank_resources(t->layout(), me, need, in, &r, &why));
      planned[me] = r.queue_pairs;
      // Word 0 to every peer's word 8 + my rank, flagged at word 64 + my rank.
      for (int p : peers[me]) WEFT_CHECK(t->put_signal(0, p, 0, 8 * (8 + me), 8, 8 * (64 + me), 1));
      for (int p : peers[me]) {
        WEFT_CHECK(t->wait_flag(8 * (64 + p), 1, "a peer's word"));
        if (mem[8 + p] != uint64_t(100 + p)) return Status::kProtocolError;
      }
      WEFT_CHECK(t->flush());
      WEFT_CHECK(boot.barrier("sent"));
      if (me == 0) live = fab.live_objects();
      WEFT_CHECK(boot.barrier("counted"));
      return t->stop();
    });
    const int per_rank = need == tr::PeerNeed::kRails ? 1 : 7;
    for (int r = 0; r < 8; ++r) {
      CAPTURE(r);
      CHECK(st[r] == Status::kOk);
      CHECK(opened[r] == per_rank);
      CHECK(planned[r] == opened[r]);  // the report and the wiring come from one function
      if (need == tr::PeerNeed::kRails) CHECK(peers[r] == std::vector<int>{(r + 4) % 8});
    }
    // Every QP that exists was connected (RTR), and none more: 8 ranks x the peers each faces.
    CHECK(fab.routes().size() - routes_before == size_t(8 * per_rank));
    // Per rank: context, PD, CQ, heap MR, signal-word MR, and one QP per peer.
    CHECK(live == size_t(8 * (5 + per_rank)));
    CHECK(fab.live_objects() == 0);
  }
  CHECK(fab.violations().empty());
  INFO(joined(fab.violations()));
}

TEST_CASE("a put to a rank outside the peer set fails at once, naming the rank and the set") {
  fake::Fabric fab({fake::ib_device("mlx5_0", 61)});
  std::vector<std::string> errors(4);
  auto st = weft::testing::run_threads(4, 2, [&](weft::bootstrap::Bootstrap& boot) -> Status {
    const int me = boot.info().rank;
    std::vector<uint64_t> mem(256, 0);
    tr::TransportOptions o;
    o.backend = "ibverbs";
    o.timeout_s = 10;
    o.use_topology = false;
    std::unique_ptr<tr::Transport> t;
    WEFT_CHECK(tr::Transport::create(boot, tr::Region{mem.data(), mem.size() * 8, tr::MemKind::kHost}, o, &t));
    const int mate = me ^ 1;  // same node: NVLink's, not the NIC's
    Status s = t->put_signal(0, mate, 0, 64, 8, 128, 1);
    if (s == Status::kOk) s = t->flush();
    errors[me] = t->error_message();
    t->stop();
    return s;
  });
  for (int r = 0; r < 4; ++r) {
    CAPTURE(r);
    CHECK(st[r] != Status::kOk);
    CHECK(errors[r].find("post to rank " + std::to_string(r ^ 1) + ", which is not in this rank's peer set") !=
          std::string::npos);
  }
}
