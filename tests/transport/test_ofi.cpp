// The ofi backend: ordering choice and addressing (pure), its endpoint blob, and over libfabric's tcp provider:
// FI_MR_VIRT_ADDR set and clear, FI_MR_PROV_KEY, FI_MR_LOCAL and FI_MR_ENDPOINT forced on and off, the
// delivery-complete fallback, a peer that never connects, a missing provider.
#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/backoff.h"
#include "base/log.h"
#include "local_bootstrap.h"
#include "tests/skip_report.h"
#include "transport/heap.h"
#include "transport/ofi_desc_check.h"
#include "transport/ofi_info.h"
#include "transport/ofi_plan.h"
#include "transport/ofi_sizes.h"
#include "transport/ofi_stage.h"
#include "transport/peer_set.h"
#include "transport/transport.h"
#include "transport/transport_check.h"

using namespace weft;
using namespace weft::transport;

namespace {

// A transport over ofi to every rank of the job, in `mode`, every wait bounded by timeout_s.
TransportOptions ofi_options(const std::string& mode, double timeout_s) {
  TransportOptions opt;
  opt.backend = "ofi";
  opt.signal_mode = mode;
  opt.peers = PeerNeed::kEveryRank;
  opt.timeout_s = timeout_s;
  return opt;
}

// Tests stay on the loopback interface, whatever other interfaces come and go (libfabric reads these
// when it first loads its providers).
const bool kLoopbackOnly = [] {
  setenv("FI_TCP_IFACE", "lo", 0);
  setenv("FI_SOCKETS_IFACE", "lo", 0);
  return true;
}();

// The provider the tests use: WEFT_OFI_PROVIDER if set, else libfabric's tcp provider under rxm.
std::string test_provider() {
  setenv("WEFT_OFI_PROVIDER", "tcp;ofi_rxm", 0);
  return getenv("WEFT_OFI_PROVIDER");
}

bool have_provider() {
  std::string why;
  if (ofi_provider_present(test_provider(), &why)) return true;
  weft::testing::skip_executable("no libfabric provider '" + std::string(test_provider()) + "' here (" + why +
                                 "): the ofi backend's cases did not run");
  return false;
}

uint8_t byte_of(int src, int round, uint64_t i) {
  return static_cast<uint8_t>(src * 37 + round * 11 + i * 7 + (i >> 9));
}

// 3 ranks, every one sends every peer blocks of several sizes (two puts and a signal each) and
// checks what arrives (`one_way`: only rank 0 sends, the others only receive); `ordering` receives
// rank 0's ordering line.
Status exchange(bootstrap::Bootstrap& boot, const std::string& mode, std::string* ordering, bool one_way,
                double timeout_s = 20) {
  const int me = boot.info().rank, n = boot.info().size;
  const uint64_t kBlock = 1 << 20;
  std::unique_ptr<HostHeap> heap;
  WEFT_CHECK(HostHeap::create(2 * n * kBlock + 4096, &heap));
  const uint64_t recv0 = n * kBlock, flags0 = 2 * n * kBlock;
  TransportOptions opt = ofi_options(mode, timeout_s);
  opt.fifo_depth = 32;
  std::unique_ptr<Transport> t;
  WEFT_CHECK(Transport::create(boot, heap->region(), opt, &t));
  int round = 0;
  for (uint64_t size : {uint64_t{8}, uint64_t{4097}, kBlock}) {
    ++round;
    for (int d = 0; d < n; ++d)
      for (uint64_t i = 0; i < size; ++i) heap->at(d * kBlock)[i] = byte_of(me, round, i);
    for (int d = 0; d < n; ++d) {
      if (d == me || (one_way && me != 0)) continue;
      const uint64_t half = size / 2;
      WEFT_CHECK(t->put(0, d, d * kBlock, recv0 + me * kBlock, half));
      WEFT_CHECK(
          t->put_signal(0, d, d * kBlock + half, recv0 + me * kBlock + half, size - half, flags0 + 8 * me, round));
    }
    for (int s = 0; s < n; ++s) {
      if (s == me || (one_way && s != 0)) continue;
      WEFT_CHECK(t->wait_flag(flags0 + 8 * s, round, "an ofi block"));
      for (uint64_t i = 0; i < size; ++i)
        if (heap->at(recv0 + s * kBlock)[i] != byte_of(s, round, i)) {
          WEFT_WARN(kTransport, "rank %d: byte %llu of %llu from rank %d is wrong", me, (unsigned long long)i,
                    (unsigned long long)size, s);
          return Status::kProtocolError;
        }
    }
    WEFT_CHECK(t->flush());
    WEFT_CHECK(boot.barrier("ofi round " + std::to_string(round)));
  }
  if (me == 0) *ordering = t->ordering();
  return t->stop();
}

void run_exchange(const OfiTestSwitches& sw, const char* expect_ordering, bool one_way = false) {
  set_ofi_test_switches(sw);
  for (std::string mode : {"serial", "fenced", "batched"}) {
    CAPTURE(mode);
    std::string ordering;
    auto st =
        testing::run_threads(3, 1, [&](bootstrap::Bootstrap& b) { return exchange(b, mode, &ordering, one_way); });
    for (int r = 0; r < 3; ++r) {
      CAPTURE(r);
      CHECK(st[r] == Status::kOk);
    }
    if (expect_ordering) CHECK(ordering == expect_ordering);
  }
  set_ofi_test_switches(OfiTestSwitches{});
}

// run_exchange under the checking shim (transport/ofi_desc_check.h): its report for that run alone.
ofi::DescCheckReport checked_exchange(const OfiTestSwitches& sw) {
  ofi::desc_check_reset();
  run_exchange(sw, nullptr);
  return ofi::desc_check_report();
}

}  // namespace

TEST_CASE("ofi ordering: FI_FENCE where offered, else write-after-write order covering the size, else delivery") {
  OfiOrderTraits fence{true, false, 0}, waw{false, true, 4096}, none{false, false, 0}, waw0{false, true, 0};
  CHECK(choose_ofi_ordering(fence) == OfiOrdering::kFence);
  CHECK(choose_ofi_ordering(OfiOrderTraits{true, true, ~0ull}) == OfiOrdering::kFence);
  CHECK(choose_ofi_ordering(waw) == OfiOrdering::kWriteOrder);
  CHECK(choose_ofi_ordering(none) == OfiOrdering::kDelivery);
  CHECK(choose_ofi_ordering(waw0) == OfiOrdering::kDelivery);
  // The sockets provider's FI_FENCE can hang two ranks fencing towards each other: not relied on.
  CHECK_FALSE(ofi_fence_usable("sockets"));
  CHECK(ofi_fence_usable("tcp;ofi_rxm"));
  CHECK(ofi_fence_usable("cxi"));
  // Write order covers puts up to its size; past it a put must be delivered before a fenced signal.
  CHECK_FALSE(ofi_put_needs_delivery(OfiOrdering::kWriteOrder, waw, 4096, false));
  CHECK(ofi_put_needs_delivery(OfiOrdering::kWriteOrder, waw, 4097, false));
  CHECK_FALSE(ofi_put_needs_delivery(OfiOrdering::kWriteOrder, waw, 4096, true));  // serial: order covers it
  // A fence orders any size; serial mode does not fence, so there completion must mean delivery.
  CHECK_FALSE(ofi_put_needs_delivery(OfiOrdering::kFence, fence, 1 << 30, false));
  CHECK(ofi_put_needs_delivery(OfiOrdering::kFence, fence, 8, true));
  CHECK(ofi_put_needs_delivery(OfiOrdering::kDelivery, none, 8, false));
  CHECK(ofi_put_needs_delivery(OfiOrdering::kDelivery, waw, 8, false));  // forced: the order is not relied on
  CHECK(ofi_target_addr(true, 0x7f0000001000, 64) == 0x7f0000001040);
  CHECK(ofi_target_addr(false, 0, 64) == 64);
}

TEST_CASE("ofi endpoint blob: round trip, bounds, and the kind is checked") {
  OfiPeerInfo o;
  o.addr = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  o.provider = "tcp;ofi_rxm";
  o.heap_base = 0x7f0012340000;
  o.heap_key = 0xabcdef;
  bootstrap::Blob b = encode_peer_info(2, 1, o);
  int node = -1;
  PeerInfo back;
  REQUIRE(decode_peer_info(b, 2, &node, &back) == Status::kOk);
  CHECK(node == 1);
  const auto* d = std::get_if<OfiPeerInfo>(&back);
  REQUIRE(d);
  CHECK(d->addr == o.addr);
  CHECK(d->provider == o.provider);
  CHECK(d->heap_base == o.heap_base);
  CHECK(d->heap_key == o.heap_key);
  CHECK(d->heap_memory == OfiPeerInfo::kHostHeap);
  {  // a GPU heap registered with the provider, and a staged one: what the heap is travels
    OfiPeerInfo g = o;
    g.heap_memory = OfiPeerInfo::kDeviceHeapRegistered;
    PeerInfo gb;
    REQUIRE(decode_peer_info(encode_peer_info(2, 1, g), 2, &node, &gb) == Status::kOk);
    CHECK(std::get<OfiPeerInfo>(gb).heap_memory == OfiPeerInfo::kDeviceHeapRegistered);
    g.heap_memory = OfiPeerInfo::kDeviceHeapStaged;  // staged without a staging ring: refused
    CHECK(decode_peer_info(encode_peer_info(2, 1, g), 2, &node, &gb) != Status::kOk);
    g.heap_memory = 3;  // no such kind
    CHECK(decode_peer_info(encode_peer_info(2, 1, g), 2, &node, &gb) != Status::kOk);
  }
  for (size_t cut = 0; cut < b.size(); ++cut) {
    bootstrap::Blob shorter(b.begin(), b.begin() + cut);
    CHECK(decode_peer_info(shorter, 2, &node, &back) != Status::kOk);
  }
  o.addr.assign(OfiPeerInfo::kMaxAddrBytes + 1, 0);  // longer than any endpoint address weft accepts
  CHECK(decode_peer_info(encode_peer_info(2, 1, o), 2, &node, &back) == Status::kProtocolError);
  o.addr.clear();
  CHECK(decode_peer_info(encode_peer_info(2, 1, o), 2, &node, &back) == Status::kProtocolError);
}

TEST_CASE("ofi over tcp: data and signals in every mode, with the provider's own ordering and addressing") {
  if (!have_provider()) return;
  run_exchange(OfiTestSwitches{}, "provider write-after-write order");
}

// The published heap base says how the provider addresses the heap: 0 for offsets, the heap's
// address for virtual addresses.
uint64_t published_base(const std::vector<uint64_t>& mem) {
  BackendConfig cfg;
  cfg.size = 2;
  std::unique_ptr<NetBackend> b;
  if (make_ofi_backend(cfg, &b) != Status::kOk) return 1;
  PeerInfo info;
  if (b->register_region(Region{const_cast<uint64_t*>(mem.data()), mem.size() * 8, MemKind::kHost, -1}) !=
          Status::kOk ||
      b->local_info(&info) != Status::kOk)
    return 1;
  b->close("");
  return std::get<OfiPeerInfo>(info).heap_base;
}

TEST_CASE("ofi: heap addressed by offsets (FI_MR_VIRT_ADDR clear) and by virtual addresses (set)") {
  if (!have_provider()) return;
  std::vector<uint64_t> mem(512);
  OfiTestSwitches sw;
  sw.virt_addr = 0;  // hints without FI_MR_VIRT_ADDR: the provider must take offsets
  set_ofi_test_switches(sw);
  CHECK(published_base(mem) == 0);
  run_exchange(sw, nullptr);
  // Virtual addresses: the sockets provider honours FI_MR_VIRT_ADDR on its domain (tcp;ofi_rxm
  // keeps its own core domain's mode, so it cannot be asked to).
  const std::string saved = test_provider();
  setenv("WEFT_OFI_PROVIDER", "sockets", 1);
  std::string why;
  if (ofi_provider_present("sockets", &why)) {
    sw.virt_addr = 1;
    set_ofi_test_switches(sw);
    CHECK(published_base(mem) == reinterpret_cast<uint64_t>(mem.data()));
    run_exchange(sw, nullptr);
  } else {
    MESSAGE("SKIPPED: FI_MR_VIRT_ADDR set: no 'sockets' provider here (" << why << ")");
  }
  setenv("WEFT_OFI_PROVIDER", saved.c_str(), 1);
  set_ofi_test_switches(OfiTestSwitches{});
}

// --- mr_mode bits beyond addressing ------------------------------------------------------------
// No provider here asks for FI_MR_PROV_KEY, FI_MR_LOCAL or FI_MR_ENDPOINT through hints, so the test
// switches open the domain with the bit and weft takes that path (ofi_plan.h). sockets honours a
// domain opened with FI_MR_PROV_KEY (it hands out keys 1, 2, 3... and refuses writes under any other
// key); tcp;ofi_rxm does not, and neither provider lets a registration be bound to an endpoint.

// What rank 0 of a 2-rank job publishes for its heap under the current switches (kOk and the blob,
// or the status of the first call that failed and its error).
Status publish(std::vector<uint64_t>& mem, OfiPeerInfo* out, std::string* error, std::string* registration) {
  BackendConfig cfg;
  cfg.size = 2;
  std::unique_ptr<NetBackend> b;
  WEFT_CHECK(make_ofi_backend(cfg, &b));
  PeerInfo info;
  Status s = b->register_region(Region{mem.data(), mem.size() * 8, MemKind::kHost, -1});
  if (s == Status::kOk) s = b->local_info(&info);
  *error = b->error_message();
  if (registration) *registration = b->memory_registration();
  b->close(s == Status::kOk ? "" : "failed");
  if (s == Status::kOk) *out = std::get<OfiPeerInfo>(info);
  return s;
}

// Swaps WEFT_OFI_PROVIDER for the scope; says SKIPPED where libfabric does not offer it here.
struct WithProvider {
  explicit WithProvider(const char* prov) : saved(test_provider()) {
    std::string why;
    present = ofi_provider_present(prov, &why);
    if (present)
      setenv("WEFT_OFI_PROVIDER", prov, 1);
    else
      MESSAGE("SKIPPED: no '" << prov << "' provider here (" << why << ")");
  }
  ~WithProvider() {
    setenv("WEFT_OFI_PROVIDER", saved.c_str(), 1);
    set_ofi_test_switches(OfiTestSwitches{});
  }
  std::string saved;
  bool present = false;
};

TEST_CASE(
    "ofi FI_MR_PROV_KEY over sockets: off, weft's keys; on, the key fi_mr_reg returned; the requested key fails the "
    "preflight") {
  WithProvider with("sockets");
  if (!with.present) return;
  std::vector<uint64_t> mem(512);
  OfiPeerInfo pub;
  std::string err, reg;
  // Off: the provider takes the key weft asks for, and weft publishes it.
  set_ofi_test_switches(OfiTestSwitches{});
  REQUIRE(publish(mem, &pub, &err, &reg) == Status::kOk);
  CHECK(pub.heap_key == ofi::kHeapKey);
  CHECK(reg.find("FI_MR_PROV_KEY") == std::string::npos);
  run_exchange(OfiTestSwitches{}, nullptr);
  // On: the provider chooses (its own count, not weft's key), and that key is what peers write with.
  OfiTestSwitches sw;
  sw.prov_key = 1;
  set_ofi_test_switches(sw);
  REQUIRE(publish(mem, &pub, &err, &reg) == Status::kOk);
  CHECK(pub.heap_key != ofi::kHeapKey);
  CHECK(reg.find("FI_MR_PROV_KEY") != std::string::npos);
  CHECK(reg.find("the provider's keys") != std::string::npos);
  run_exchange(sw, nullptr);
  // On, but publishing the requested key: the target refuses every write, the preflight's first
  // (zero-length) write included, so Transport::create fails on every rank, within its bound, before
  // any op could run (the ranks agree on the failure; rank 0 logs it naming the peer).
  sw.publish_requested_key = 1;
  set_ofi_test_switches(sw);
  // The log (stderr) into a file for the duration: the agreed failure is logged by rank 0.
  char log_path[] = "/tmp/weft-test-ofi-preflight-XXXXXX";
  const int log_fd = mkstemp(log_path);
  REQUIRE(log_fd >= 0);
  fflush(stderr);
  const int saved_stderr = dup(2);
  dup2(log_fd, 2);
  std::vector<int> created(2, -1);
  std::vector<double> took(2, 0);
  auto st = testing::run_threads(
      2, 1,
      [&](bootstrap::Bootstrap& boot) -> Status {
        const int me = boot.info().rank;
        std::unique_ptr<HostHeap> heap;
        WEFT_CHECK(HostHeap::create(1 << 16, &heap));
        const TransportOptions opt = ofi_options("fenced", 3);
        std::unique_ptr<Transport> t;
        const auto t0 = std::chrono::steady_clock::now();
        const Status s = Transport::create(boot, heap->region(), opt, &t);
        took[me] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        created[me] = t != nullptr;
        if (t) t->stop();
        return s;
      },
      /*timeout_s=*/30);
  fflush(stderr);
  dup2(saved_stderr, 2);
  close(saved_stderr);
  std::string log;
  {
    std::ifstream f(log_path);
    log.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  close(log_fd);
  unlink(log_path);
  CAPTURE(log);
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(st[r] == Status::kUnsupported);  // opened and connected everywhere; the agreed preflight failed
    CHECK(created[r] == 0);
    CHECK(took[r] < 10);
  }
  CHECK(log.find("preflight: rank ") != std::string::npos);
  CHECK((log.find("a put to rank 1 failed") != std::string::npos ||
         log.find("a put to rank 0 failed") != std::string::npos));
}

TEST_CASE("ofi preflight: a rank that starts its preflight late still completes it (the others keep progressing)") {
  if (!have_provider()) return;
  // Rank 2's preflight writes start 1.5 s after the others', which by then have finished theirs and
  // wait for the agreement: their endpoints must still be driven for rank 2's writes to complete
  // (tcp;ofi_rxm's progress is manual), else rank 2's preflight times out and the job has no ofi.
  OfiTestSwitches sw;
  sw.delay_first_put_rank = 2;
  sw.first_put_delay_s = 1.5;
  set_ofi_test_switches(sw);
  std::vector<std::string> backend(3);
  auto st = testing::run_threads(
      3, 1,
      [&](bootstrap::Bootstrap& boot) -> Status {
        std::unique_ptr<HostHeap> heap;
        WEFT_CHECK(HostHeap::create(1 << 16, &heap));
        // A bound shorter than rank 2's delay: without progress its writes would time out.
        const TransportOptions opt = ofi_options("fenced", 1);
        std::unique_ptr<Transport> t;
        WEFT_CHECK(Transport::create(boot, heap->region(), opt, &t));
        backend[size_t(boot.info().rank)] = t->backend_name();
        t->stop();
        return Status::kOk;
      },
      /*timeout_s=*/30);
  set_ofi_test_switches(OfiTestSwitches{});
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(st[r] == Status::kOk);
    CHECK(backend[size_t(r)] == "ofi");
  }
}

TEST_CASE("ofi FI_MR_LOCAL over tcp: descriptors for every local buffer, off and on (host heap)") {
  if (!have_provider()) return;
  std::vector<uint64_t> mem(512);
  OfiPeerInfo pub;
  std::string err, reg;
  set_ofi_test_switches(OfiTestSwitches{});
  REQUIRE(publish(mem, &pub, &err, &reg) == Status::kOk);
  CHECK(reg.find("no local descriptors") != std::string::npos);
  run_exchange(OfiTestSwitches{}, nullptr);
  OfiTestSwitches sw;
  sw.mr_local = 1;
  set_ofi_test_switches(sw);
  REQUIRE(publish(mem, &pub, &err, &reg) == Status::kOk);
  CHECK(reg.find("FI_MR_LOCAL") != std::string::npos);
  CHECK(reg.find(", local descriptors") != std::string::npos);
  run_exchange(sw, nullptr);
  set_ofi_test_switches(OfiTestSwitches{});
}

TEST_CASE("ofi FI_MR_LOCAL, checked: every buffer weft hands tcp comes with a covering registration's descriptor") {
  if (!have_provider()) return;
  // Forced FI_MR_LOCAL under the checking shim: the writes, sends and receives of three ranks in
  // every signal mode, none without its descriptor.
  OfiTestSwitches sw;
  sw.mr_local = 1;
  sw.check_descriptors = 1;
  ofi::DescCheckReport rep = checked_exchange(sw);
  CAPTURE(rep.first);
  CHECK(rep.checked > 100);
  CHECK(rep.violations == 0);
  MESSAGE("FI_MR_LOCAL forced: " << rep.checked << " buffers checked, none without its descriptor");
  // The same, the heap's descriptor left off on purpose: tcp moves the bytes anyway; the shim
  // names the first write that had none.
  sw.drop_heap_descriptor = 1;
  rep = checked_exchange(sw);
  CAPTURE(rep.first);
  CHECK(rep.violations > 0);
  CHECK(rep.first.find("fi_writemsg") != std::string::npos);
  CHECK(rep.first.find("no descriptor (FI_MR_LOCAL needs one)") != std::string::npos);
  MESSAGE("heap descriptor dropped: " << rep.violations << " of " << rep.checked << "; first: " << rep.first);
  // Without FI_MR_LOCAL nothing is required: the dropped descriptor is no violation.
  sw.mr_local = 0;
  rep = checked_exchange(sw);
  CHECK(rep.checked > 100);
  CHECK(rep.violations == 0);
  set_ofi_test_switches(OfiTestSwitches{});
}

TEST_CASE("ofi FI_MR_ENDPOINT: weft binds and enables each registration; no provider here accepts that") {
  if (!have_provider()) return;
  std::vector<uint64_t> mem(512);
  OfiPeerInfo pub;
  std::string err, reg;
  for (const char* prov : {"tcp;ofi_rxm", "sockets"}) {
    CAPTURE(prov);
    WithProvider with(prov);
    if (!with.present) continue;
    set_ofi_test_switches(OfiTestSwitches{});
    REQUIRE(publish(mem, &pub, &err, &reg) == Status::kOk);
    CHECK(reg.find("registrations on the domain") != std::string::npos);
    OfiTestSwitches sw;
    sw.mr_endpoint = 1;
    set_ofi_test_switches(sw);
    CHECK(publish(mem, &pub, &err, &reg) == Status::kSystemError);
    CAPTURE(err);
    CHECK(err.find("rank 0 channel 0") != std::string::npos);
    CHECK(err.find("binding the heap to the endpoint and enabling it (FI_MR_ENDPOINT)") != std::string::npos);
  }
}

TEST_CASE("ofi FI_MR_ENDPOINT, emulated: every buffer and remote key is bound to an endpoint and enabled first") {
  if (!have_provider()) return;
  // The shim answers fi_mr_bind / fi_mr_enable for tcp (which implements neither for registrations)
  // and checks every write's source, every send and receive and every remote key of three ranks in
  // every signal mode against what was bound and enabled before the call.
  OfiTestSwitches sw;
  sw.mr_endpoint = 1;
  sw.emulate_mr_binding = 1;
  ofi::DescCheckReport rep = checked_exchange(sw);
  CAPTURE(rep.first);
  CHECK(rep.checked > 100);
  CHECK(rep.violations == 0);
  MESSAGE("FI_MR_ENDPOINT emulated: " << rep.checked << " calls checked, every registration bound and enabled first");
  // With FI_MR_LOCAL and its descriptor check as well.
  sw.mr_local = 1;
  sw.check_descriptors = 1;
  rep = checked_exchange(sw);
  CAPTURE(rep.first);
  CHECK(rep.checked > 100);
  CHECK(rep.violations == 0);
  // Registrations bound but never enabled: tcp moves the bytes anyway; the shim names the first call.
  sw.mr_local = -1;
  sw.check_descriptors = 0;
  sw.skip_mr_enable = 1;
  rep = checked_exchange(sw);
  CAPTURE(rep.first);
  CHECK(rep.violations > rep.key_violations);  // local buffers (the first: a receive posted at open)
  CHECK(rep.key_violations > 0);               // and the targets of the writes
  CHECK(rep.first.find("bound but never enabled (FI_MR_ENDPOINT)") != std::string::npos);
  CHECK(rep.first.find("rank ") == 0);
  MESSAGE("enable left out: " << rep.violations << " violations, " << rep.key_violations << " of them remote keys");
  set_ofi_test_switches(OfiTestSwitches{});
}

TEST_CASE("ofi: weftrun check's transport line says which mr_mode bits were used") {
  if (!have_provider()) return;
  std::vector<std::string> summary(2), json(2);
  auto st = testing::run_threads(2, 1, [&](bootstrap::Bootstrap& boot) {
    const int me = boot.info().rank;
    return run_transport_check_report("ofi", boot, 1, &summary[me], &json[me]);
  });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(summary[r]);
    CHECK(st[r] == Status::kOk);
    CHECK(summary[r].find("memory: mr_mode ") != std::string::npos);
    CHECK(json[r].find("\"registration\": \"mr_mode ") != std::string::npos);
  }
  MESSAGE(summary[0]);
}

// The sockets provider offers FI_FENCE, but ranks fencing towards each other can hang there
// (ofi_fence_usable): its write-after-write order orders the signals. FI_FENCE itself is still
// exercised, forced, with data going one way only (a receiver posts no fenced write that could hold
// back its acknowledgements).
TEST_CASE("ofi over sockets: its write-after-write order, not its FI_FENCE; FI_FENCE forced, one way") {
  std::string why;
  if (!ofi_provider_present("sockets", &why)) {
    MESSAGE("SKIPPED: no 'sockets' provider here (" << why << ")");
    return;
  }
  const std::string saved = test_provider();
  setenv("WEFT_OFI_PROVIDER", "sockets", 1);
  run_exchange(OfiTestSwitches{}, "provider write-after-write order");
  OfiTestSwitches sw;
  sw.force_ordering = static_cast<int>(OfiOrdering::kFence);
  run_exchange(sw, "FI_FENCE", /*one_way=*/true);
  setenv("WEFT_OFI_PROVIDER", saved.c_str(), 1);
}

// tcp;ofi_rxm makes progress only inside libfabric calls (FI_PROGRESS_MANUAL): a rank that only
// receives must still read its completion queue, or what is written to it never lands.
TEST_CASE("ofi over tcp (manual progress): ranks that only receive are progressed by their idle proxies") {
  if (!have_provider()) return;
  fi_info* info = nullptr;
  REQUIRE(ofi_lookup(test_provider(), -1, &info) == 0);
  const bool manual = info->domain_attr->data_progress == FI_PROGRESS_MANUAL;
  fi_freeinfo(info);
  run_exchange(OfiTestSwitches{}, nullptr, /*one_way=*/true);  // only rank 0 sends; 1 and 2 post nothing
  if (!manual) {
    MESSAGE("SKIPPED the half without idle progress: provider '" << test_provider() << "' progresses by itself here");
    return;
  }
  // Reading the queue only while a rank has operations of its own: the receivers' flags never come.
  OfiTestSwitches sw;
  sw.idle_progress = 0;
  set_ofi_test_switches(sw);
  std::string ordering;
  auto st = testing::run_threads(
      3, 1,
      [&](bootstrap::Bootstrap& b) { return exchange(b, "serial", &ordering, /*one_way=*/true, /*timeout_s=*/3); },
      /*timeout_s=*/8);  // rank 0 then waits in its round's barrier for the receivers that gave up
  set_ofi_test_switches(OfiTestSwitches{});
  CHECK(st[1] == Status::kTimeout);  // waiting for rank 0's flag, which never lands
  CHECK(st[2] == Status::kTimeout);
}

TEST_CASE("ofi over tcp: the delivery-complete fallback orders fenced and batched signals") {
  if (!have_provider()) return;
  OfiTestSwitches sw;
  sw.force_ordering = static_cast<int>(OfiOrdering::kDelivery);
  run_exchange(sw, "delivery complete (serial)");
}

TEST_CASE("ofi: a peer that never connects times out, naming it") {
  if (!have_provider()) return;
  BackendConfig cfg;
  cfg.size = 2;
  cfg.secret = 42;
  cfg.timeout_s = 1;
  std::unique_ptr<NetBackend> a, silent;
  REQUIRE(make_ofi_backend(cfg, &a) == Status::kOk);
  cfg.rank = 1;
  REQUIRE(make_ofi_backend(cfg, &silent) == Status::kOk);
  std::vector<uint64_t> ma(64), mb(64);
  REQUIRE(a->register_region(Region{ma.data(), 512, MemKind::kHost, -1}) == Status::kOk);
  REQUIRE(silent->register_region(Region{mb.data(), 512, MemKind::kHost, -1}) == Status::kOk);
  PeerInfo ia, ib;
  REQUIRE(a->local_info(&ia) == Status::kOk);
  REQUIRE(silent->local_info(&ib) == Status::kOk);
  // Rank 1 published its endpoint but never connects, polls or answers.
  CHECK(a->connect(1, ib) == Status::kTimeout);
  const std::string err = a->error_message();
  CAPTURE(err);
  CHECK(err.find("rank 0") != std::string::npos);
  CHECK(err.find("rank 1 did not connect") != std::string::npos);
  a->close("timeout");
  silent->close("");
}

TEST_CASE("ofi: a provider libfabric does not have fails with a clear error; so does a peer on another provider") {
  std::string why;
  setenv("WEFT_OFI_PROVIDER", "weft-no-such-provider", 1);
  BackendConfig cfg;
  cfg.size = 2;
  std::unique_ptr<NetBackend> b;
  Status made = make_ofi_backend(cfg, &b);
  unsetenv("WEFT_OFI_PROVIDER");
  if (made == Status::kUnsupported) {
    MESSAGE("SKIPPED: weft was built without libfabric");
    return;
  }
  REQUIRE(made == Status::kOk);
  std::vector<uint64_t> mem(64);
  CHECK(b->register_region(Region{mem.data(), 512, MemKind::kHost, -1}) == Status::kNotFound);
  CHECK(b->error_message().find("weft-no-such-provider") != std::string::npos);
  CHECK(b->error_message().find("WEFT_OFI_PROVIDER") != std::string::npos);
  CHECK_FALSE(ofi_provider_present("weft-no-such-provider", &why));

  if (!have_provider()) return;
  std::unique_ptr<NetBackend> a;
  REQUIRE(make_ofi_backend(cfg, &a) == Status::kOk);
  REQUIRE(a->register_region(Region{mem.data(), 512, MemKind::kHost, -1}) == Status::kOk);
  PeerInfo info;
  REQUIRE(a->local_info(&info) == Status::kOk);
  std::get<OfiPeerInfo>(info).provider = "efa";
  CHECK(a->connect(1, info) == Status::kInvalidArgument);
  CHECK(a->error_message().find("efa") != std::string::npos);
  a->close("");
}

TEST_CASE("ofi staging rings: slots apply in sequence whatever order they arrive in; credit bounds the sender") {
  StageSender tx(4);
  StageReceiver rx(4);
  uint64_t seq = 0;
  std::vector<uint32_t> slots;
  for (int i = 0; i < 4; ++i) {
    REQUIRE(tx.can_take());
    slots.push_back(tx.take(&seq));
    CHECK(seq == uint64_t(i));
  }
  CHECK_FALSE(tx.can_take());  // four in flight, no credit yet
  uint32_t slot = 0;
  CHECK(rx.arrived(slots[2]));
  CHECK(rx.arrived(slots[1]));
  CHECK_FALSE(rx.next(&slot, &seq));  // slot of sequence 0 missing: nothing applies
  CHECK_FALSE(rx.arrived(slots[1]));  // twice: a sender overran its credit
  CHECK_FALSE(rx.arrived(9));         // out of range
  CHECK(rx.arrived(slots[0]));
  for (uint64_t want = 0; want < 3; ++want) {
    REQUIRE(rx.next(&slot, &seq));
    CHECK(seq == want);
    rx.consume();
  }
  CHECK_FALSE(rx.next(&slot, &seq));
  CHECK(rx.credit_due());
  CHECK_FALSE(tx.credit(5));  // more than was sent
  CHECK(tx.credit(rx.consumed()));
  rx.credit_sent(rx.consumed());
  CHECK_FALSE(tx.can_take());  // credit returned, but slot 0's own write has not completed
  tx.local_complete(slots[0]);
  REQUIRE(tx.can_take());
  const uint32_t again = tx.take(&seq);
  CHECK(again == slots[0]);
  CHECK(seq == 4);
  tx.untake(again);
  CHECK(tx.in_flight() == 1);
  int sender = -1;
  stage_cq_split(stage_cq_data(77, 5), &sender, &slot);
  CHECK(sender == 77);
  CHECK(slot == 5);
}

namespace {

// A device heap on the CPU: reached only through these hooks (CUDA copies on a GPU).
std::atomic<uint64_t> g_to_bytes{0}, g_from_bytes{0};
Status to_dev(void*, void* dst, const void* src, uint64_t bytes) {
  if (bytes == 8 && reinterpret_cast<uintptr_t>(dst) % 8 == 0) {
    uint64_t v;
    memcpy(&v, src, 8);
    __atomic_store_n(static_cast<uint64_t*>(dst), v, __ATOMIC_RELEASE);
  } else {
    memcpy(dst, src, bytes);
  }
  g_to_bytes += bytes;
  return Status::kOk;
}
Status from_dev(void*, void* dst, const void* src, uint64_t bytes) {
  memcpy(dst, src, bytes);
  g_from_bytes += bytes;
  return Status::kOk;
}

// cuda_device >= 0: the region says it is that GPU's memory (it is host memory here), so a provider
// that lists FI_HMEM is asked to register it as CUDA memory first.
Status staged_exchange(bootstrap::Bootstrap& boot, const std::string& mode, int cuda_device = -1) {
  const int me = boot.info().rank, n = boot.info().size;
  const uint64_t kBlock = 3 << 20;  // past one ring of staging slots: credits must come back
  std::vector<uint64_t> mem((2 * n * kBlock + 4096) / 8, 0);
  Region heap{mem.data(), mem.size() * 8, MemKind::kDevice, -1};
  heap.cuda_device = cuda_device;
  char* base = reinterpret_cast<char*>(mem.data());
  const uint64_t recv0 = n * kBlock, flags0 = 2 * n * kBlock;
  TransportOptions opt = ofi_options(mode, 20);
  opt.fifo_depth = 32;
  opt.copy_hooks.to_region = to_dev;
  opt.copy_hooks.from_region = from_dev;
  std::unique_ptr<Transport> t;
  WEFT_CHECK(Transport::create(boot, heap, opt, &t));
  int round = 0;
  for (uint64_t size : {uint64_t{8}, uint64_t{300000}, kBlock}) {
    ++round;
    for (int d = 0; d < n; ++d)
      for (uint64_t i = 0; i < size; ++i) base[d * kBlock + i] = static_cast<char>(byte_of(me, round, i));
    for (int d = 0; d < n; ++d) {
      if (d == me) continue;
      WEFT_CHECK(t->put(0, d, d * kBlock, recv0 + me * kBlock, size / 2));
      WEFT_CHECK(t->put_signal(0, d, d * kBlock + size / 2, recv0 + me * kBlock + size / 2, size - size / 2,
                               flags0 + 8 * me, round));
    }
    for (int s = 0; s < n; ++s) {
      if (s == me) continue;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      Backoff backoff;
      while (__atomic_load_n(reinterpret_cast<uint64_t*>(base + flags0 + 8 * s), __ATOMIC_ACQUIRE) <
             static_cast<uint64_t>(round)) {
        if (t->status() != Status::kOk) return t->status();
        if (std::chrono::steady_clock::now() > deadline) return Status::kTimeout;
        backoff.pause();
      }
      for (uint64_t i = 0; i < size; ++i)
        if (static_cast<uint8_t>(base[recv0 + s * kBlock + i]) != byte_of(s, round, i)) return Status::kProtocolError;
    }
    WEFT_CHECK(t->flush());
    WEFT_CHECK(boot.barrier("staged round " + std::to_string(round)));
  }
  return t->stop();
}

}  // namespace

TEST_CASE("ofi over tcp: a device heap goes through host staging, applied in order by the receiving proxy") {
  if (!have_provider()) return;
  for (std::string mode : {"serial", "fenced", "batched"}) {
    CAPTURE(mode);
    g_to_bytes = g_from_bytes = 0;
    auto st = testing::run_threads(3, 1, [&](bootstrap::Bootstrap& b) { return staged_exchange(b, mode); });
    for (int r = 0; r < 3; ++r) {
      CAPTURE(r);
      CHECK(st[r] == Status::kOk);
    }
    const uint64_t payload = 3ull * 2 * (8 + 300000 + (3 << 20));  // every rank to both peers
    CHECK(g_from_bytes == payload);
    CHECK(g_to_bytes == payload + 3ull * 2 * 3 * 8);  // and the flags, copied in by the receiver
  }
}

TEST_CASE("ofi: a peer whose heap is another kind (host, GPU staged) is refused at connect, naming both") {
  if (!have_provider()) return;
  std::vector<uint64_t> host_mem(512), dev_mem(512);
  std::unique_ptr<NetBackend> host, dev;
  BackendConfig cfg;
  cfg.size = 2;
  cfg.rank = 0;
  REQUIRE(make_ofi_backend(cfg, &host) == Status::kOk);
  cfg.rank = 1;
  cfg.copy_hooks.to_region = to_dev;
  cfg.copy_hooks.from_region = from_dev;
  REQUIRE(make_ofi_backend(cfg, &dev) == Status::kOk);
  REQUIRE(host->register_region(Region{host_mem.data(), host_mem.size() * 8, MemKind::kHost, -1}) == Status::kOk);
  REQUIRE(dev->register_region(Region{dev_mem.data(), dev_mem.size() * 8, MemKind::kDevice, -1}) == Status::kOk);
  PeerInfo host_info, dev_info;
  REQUIRE(host->local_info(&host_info) == Status::kOk);
  REQUIRE(dev->local_info(&dev_info) == Status::kOk);
  CHECK(std::get<OfiPeerInfo>(host_info).heap_memory == OfiPeerInfo::kHostHeap);
  CHECK(std::get<OfiPeerInfo>(dev_info).heap_memory == OfiPeerInfo::kDeviceHeapStaged);
  CHECK(host->connect(1, dev_info) == Status::kInvalidArgument);
  const std::string why = host->error_message();
  CAPTURE(why);
  CHECK(why.find("rank 1's heap is GPU memory staged through host memory") != std::string::npos);
  CHECK(why.find("this rank's host memory") != std::string::npos);
  host->close("");
  dev->close("");
}

TEST_CASE("ofi: a provider that lists FI_HMEM but cannot register CUDA memory stages the GPU heap") {
  // This machine's libfabric has no CUDA; its shm provider lists FI_HMEM all the same, and refuses
  // the CUDA registration (ENOSYS). The backend must stage then, as before FI_HMEM was used.
  WithProvider w("shm");
  if (!w.present) return;
  fi_info* hm = nullptr;
  const bool listed = ofi_lookup("shm", -1, &hm, true) == 0 && (hm->caps & FI_HMEM);
  if (hm) fi_freeinfo(hm);
  const std::string path = listed ? "yes (the fallback is what runs)" : "no (staged from the start)";
  MESSAGE("shm lists FI_HMEM here: " << path);
  g_to_bytes = g_from_bytes = 0;
  auto st = testing::run_threads(3, 1, [&](bootstrap::Bootstrap& b) { return staged_exchange(b, "fenced", 0); });
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(st[r] == Status::kOk);
  }
  CHECK(g_from_bytes == 3ull * 2 * (8 + 300000 + (3 << 20)));  // staged: every put through the copy hooks
}

TEST_CASE("ofi FI_MR_LOCAL over tcp: a device heap's staging rings go with their descriptors") {
  if (!have_provider()) return;
  OfiTestSwitches sw;
  sw.mr_local = 1;
  set_ofi_test_switches(sw);
  auto st = testing::run_threads(3, 1, [&](bootstrap::Bootstrap& b) { return staged_exchange(b, "fenced"); });
  set_ofi_test_switches(OfiTestSwitches{});
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(st[r] == Status::kOk);
  }
}

TEST_CASE("ofi over tcp: a peer killed mid-transfer: the rank writing to it fails within the bound, naming it") {
  if (!have_provider()) return;
  constexpr uint64_t kBig = 16 << 20;
  auto res = testing::run_forked(
      2, 1,
      [&](testing::ForkBootstrap& boot) -> int {
        const int me = boot.info().rank;
        std::unique_ptr<HostHeap> heap;
        if (HostHeap::create(kBig + 4096, &heap) != Status::kOk) return 2;
        const TransportOptions opt = ofi_options("fenced", 10);
        std::unique_ptr<Transport> t;
        if (Transport::create(boot, heap->region(), opt, &t) != Status::kOk) return 3;
        if (boot.barrier("up") != Status::kOk) return 4;
        if (me == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          raise(SIGKILL);
        }
        // Rank 0 keeps writing to rank 1 until its transport fails (bounded by the harness).
        for (int i = 0; t->status() == Status::kOk && i < 100000; ++i) {
          if (t->put_signal(0, 1, 0, 0, kBig, kBig, i + 1) != Status::kOk) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        boot.report(t->error_message());
        return t->status() == Status::kOk ? 0 : 1;
      },
      40);
  REQUIRE(res.size() == 2);
  CHECK(res[1].term_signal == SIGKILL);
  CAPTURE(res[0].report);
  CHECK(res[0].exited);
  CHECK(res[0].exit_code == 1);
  CHECK(res[0].seconds < 15);
  CHECK(res[0].report.find("rank 1") != std::string::npos);
  MESSAGE("rank 0 after " << res[0].seconds << " s: " << res[0].report);
}

namespace {

// Opens an ofi transport on a host or device heap and holds what the backend asked libfabric for (its
// wiring record) against the resource report for this rank. `what` gets the first difference.
Status wiring_matches_report(bootstrap::Bootstrap& boot, HeapPlace place, PeerNeed need, std::string* what) {
  const int me = boot.info().rank;
  std::vector<uint64_t> mem(8192, 0);
  Region heap{mem.data(), mem.size() * 8, place == HeapPlace::kDevice ? MemKind::kDevice : MemKind::kHost, -1};
  TransportOptions opt;
  opt.backend = "ofi";
  opt.peers = need;
  opt.channels = 2;
  opt.fifo_depth = 32;
  opt.timeout_s = 20;
  opt.use_topology = false;
  opt.copy_hooks.to_region = to_dev;
  opt.copy_hooks.from_region = from_dev;
  std::unique_ptr<Transport> t;
  WEFT_CHECK(Transport::create(boot, heap, opt, &t));
  // Every peer is connected (and its staging rings set up) once create returns; one flagged word to each
  // shows this wiring is the one that carries data.
  for (int p : t->peer_set().net) WEFT_CHECK(t->put_signal(0, p, 0, 8 * (16 + me), 8, 8 * (64 + me), 1));
  for (int p : t->peer_set().net) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    Backoff backoff;
    while (__atomic_load_n(&mem[64 + p], __ATOMIC_ACQUIRE) < 1) {
      if (t->status() != Status::kOk) return t->status();
      if (std::chrono::steady_clock::now() > deadline) return Status::kTimeout;
      backoff.pause();
    }
  }
  WEFT_CHECK(t->flush());
  WEFT_CHECK(boot.barrier("wired"));
  ResourceInputs in;
  in.backend = "ofi";
  in.channels = opt.channels;
  in.heap_bytes = heap.bytes;
  in.heap = place;
  RankResources planned;
  std::string why;
  WEFT_CHECK(rank_resources(t->layout(), me, need, in, &planned, &why));
  const OfiWiring w = ofi_wiring(me);
  const std::pair<const char*, std::pair<uint64_t, uint64_t>> pairs[] = {
      {"endpoints", {w.endpoints, uint64_t(planned.endpoints)}},
      {"completion_queues", {w.completion_queues, uint64_t(planned.completion_queues)}},
      {"completion_entries", {w.completion_entries, planned.completion_entries}},
      {"address_entries", {w.address_entries, uint64_t(planned.address_entries)}},
      {"memory_registrations", {w.registrations, uint64_t(planned.memory_registrations)}},
      {"registered_bytes", {w.registered_bytes, planned.registered_bytes}},
      {"staging_bytes", {w.staging_bytes, planned.staging_bytes}},
      {"receive_entries", {w.receives_posted, planned.receive_entries}},
      {"receive_bytes", {w.receive_bytes, planned.receive_bytes}},
  };
  for (const auto& [name, v] : pairs)
    if (v.first != v.second && what->empty())
      *what = "rank " + std::to_string(me) + " " + name + ": the backend asked for " + std::to_string(v.first) +
              ", the report counts " + std::to_string(v.second);
  WEFT_CHECK(t->stop());
  return what->empty() ? Status::kOk : Status::kInternal;
}

}  // namespace

TEST_CASE("ofi over tcp: the resource report counts what the backend registered, for a host and a device heap") {
  if (!have_provider()) return;
  for (HeapPlace place : {HeapPlace::kHost, HeapPlace::kDevice})
    for (PeerNeed need : {PeerNeed::kRails, PeerNeed::kEveryRank}) {
      CAPTURE(to_string(place));
      CAPTURE(to_string(need));
      reset_ofi_wiring();
      std::vector<std::string> what(4);
      // 2 nodes x 2: rails face 1 peer, the full mesh 3, in a 4-rank job (the control block counts the job).
      auto st = testing::run_threads(
          4, 2, [&](bootstrap::Bootstrap& b) { return wiring_matches_report(b, place, need, &what[b.info().rank]); });
      for (int r = 0; r < 4; ++r) {
        CAPTURE(r);
        CHECK_MESSAGE(st[r] == Status::kOk, what[r]);
      }
      // The record is real: both channels' registrations, more on a device heap (a ring per peer).
      const OfiWiring w = ofi_wiring(0);
      const uint64_t peers = need == PeerNeed::kRails ? 1 : 3;
      CHECK(w.endpoints == 2);
      CHECK(w.registrations == (place == HeapPlace::kHost ? 4 : 2 * (1 + peers)));
    }
  reset_ofi_wiring();
}
