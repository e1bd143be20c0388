// Faults: a peer killed mid-transfer is named by the survivors within 30 s; raw bytes on a socket stream
// (garbage, wrong secret or version, out-of-bounds or misaligned writes) are rejected and write nothing;
// the socket backend listens only where it publishes.
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <variant>

#include "local_bootstrap.h"
#include "transport/heap.h"
#include "transport/net_backend.h"
#include "transport/socket_wire.h"
#include "transport/transport.h"

using namespace weft;
using namespace weft::transport;

TEST_CASE("a peer killed mid-transfer: survivors fail within 30 s with an error naming it") {
  constexpr uint64_t kBig = 48 << 20;
  auto res = testing::run_forked(
      3, 1,
      [&](testing::ForkBootstrap& boot) -> int {
        const int me = boot.info().rank;
        std::unique_ptr<HostHeap> heap;
        if (HostHeap::create(kBig + 4096, &heap) != Status::kOk) return 2;
        TransportOptions opt;
        opt.backend = "socket";
        opt.signal_mode = "fenced";
        opt.timeout_s = 120;  // longer than the test bound: detection must not come from a timeout
        std::unique_ptr<Transport> t;
        if (Transport::create(boot, heap->region(), opt, &t) != Status::kOk) return 3;
        if (boot.barrier("up") != Status::kOk) return 4;
        if (me == 2) {
          // Large puts to both peers, then die while they are on the wire.
          t->put(0, 0, 0, 0, kBig);
          t->put(0, 1, 0, 0, kBig);
          std::this_thread::sleep_for(std::chrono::milliseconds(30));
          raise(SIGKILL);
        }
        // The survivors wait for a signal from rank 2 that never comes.
        Status s = t->wait_flag(kBig, 1, "the signal from rank 2");
        boot.report(t->error_message());
        return s == Status::kOk ? 0 : 1;
      },
      60);
  REQUIRE(res.size() == 3);
  CHECK(res[2].term_signal == SIGKILL);
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CAPTURE(res[r].report);
    CHECK(res[r].exited);
    CHECK(res[r].exit_code == 1);
    CHECK(res[r].seconds < 30);
    CHECK(res[r].report.find("rank 2") != std::string::npos);
  }
}

namespace {

constexpr uint64_t kSecret = 0x5ec2e7;
constexpr uint64_t kRegion = 4096;

// A socket backend for rank 0 of 2 over a 4 KiB region filled with 0xAB, and a raw TCP client.
struct RawPeer {
  std::vector<uint8_t> region = std::vector<uint8_t>(kRegion, 0xAB);
  std::unique_ptr<NetBackend> backend;
  int fd = -1;
  RawPeer() {
    BackendConfig cfg;
    cfg.rank = 0;
    cfg.size = 2;
    cfg.secret = kSecret;
    cfg.timeout_s = 5;
    cfg.socket_ifname = "lo";
    backend = make_socket_backend(cfg);
    REQUIRE(backend->register_region(Region{region.data(), kRegion, MemKind::kHost, -1}) == Status::kOk);
    PeerInfo info;
    REQUIRE(backend->local_info(&info) == Status::kOk);
    const auto& si = std::get<SocketPeerInfo>(info);
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(si.port);
    a.sin_addr.s_addr = si.ipv4[0];
    REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  }
  ~RawPeer() {
    if (fd >= 0) close(fd);
    backend->close();
  }
  void send_raw(const void* p, size_t n) { REQUIRE(send(fd, p, n, MSG_NOSIGNAL) == static_cast<ssize_t>(n)); }
  void send_header(const WireHeader& h) { send_raw(&h, sizeof h); }
  // Polls the backend for a while; returns its final status.
  Status pump(double seconds = 0.3) {
    std::vector<Completion> done;
    Status s = Status::kOk;
    auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < end && s == Status::kOk) {
      s = backend->poll(&done);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return s;
  }
  // True when the backend closed our connection.
  bool closed_by_backend() {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 1000) <= 0) return false;
    char c;
    return recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
  }
  bool untouched() const {
    for (uint8_t b : region)
      if (b != 0xAB) return false;
    return true;
  }
};

WireHeader hello() { return make_wire_header(WireKind::kHello, 1, 0, kSecret, 0, 0); }

}  // namespace

TEST_CASE("raw bytes: strangers are dropped, the job goes on, nothing is written") {
  SUBCASE("garbage") {
    RawPeer p;
    uint8_t junk[48];
    for (int i = 0; i < 48; ++i) junk[i] = static_cast<uint8_t>(i * 37 + 1);
    p.send_raw(junk, sizeof junk);
    CHECK(p.pump() == Status::kOk);
    CHECK(p.closed_by_backend());
    CHECK(p.untouched());
  }
  SUBCASE("wrong secret, then a put") {
    RawPeer p;
    auto h = hello();
    h.secret ^= 1;
    p.send_header(h);
    p.send_header(make_wire_header(WireKind::kPut, 1, 0, kSecret ^ 1, 0, 8));
    p.send_raw("AAAAAAAA", 8);
    CHECK(p.pump() == Status::kOk);
    CHECK(p.closed_by_backend());
    CHECK(p.untouched());
  }
  SUBCASE("wrong version") {
    RawPeer p;
    auto h = hello();
    h.version = kWireVersion + 1;
    p.send_header(h);
    CHECK(p.pump() == Status::kOk);
    CHECK(p.closed_by_backend());
    CHECK(p.untouched());
  }
  SUBCASE("a put before any hello") {
    RawPeer p;
    p.send_header(make_wire_header(WireKind::kPut, 1, 0, kSecret, 0, 8));
    p.send_raw("AAAAAAAA", 8);
    CHECK(p.pump() == Status::kOk);
    CHECK(p.closed_by_backend());
    CHECK(p.untouched());
  }
  SUBCASE("a hello claiming this rank itself") {
    RawPeer p;
    p.send_header(make_wire_header(WireKind::kHello, 0, 0, kSecret, 0, 0));
    CHECK(p.pump() == Status::kOk);
    CHECK(p.closed_by_backend());
  }
}

TEST_CASE("raw bytes: a peer's bad message is a protocol error naming it, and writes nothing") {
  struct Case {
    const char* name;
    WireHeader h;
    size_t payload;
  };
  const Case cases[] = {
      {"put past the end", make_wire_header(WireKind::kPut, 1, 0, kSecret, kRegion - 100, 200), 200},
      {"put with offset overflow", make_wire_header(WireKind::kPut, 1, 0, kSecret, ~0ull - 7, 16), 16},
      {"put with huge length", make_wire_header(WireKind::kPut, 1, 0, kSecret, 8, ~0ull - 4), 64},
      {"misaligned flag", make_wire_header(WireKind::kSignal, 1, 0, kSecret, 12, 5), 0},
      {"flag past the end", make_wire_header(WireKind::kSignal, 1, 0, kSecret, kRegion, 5), 0},
      {"wrong source rank", make_wire_header(WireKind::kPut, 0, 0, kSecret, 0, 8), 8},
      {"wrong secret mid-stream", make_wire_header(WireKind::kPut, 1, 0, kSecret + 1, 0, 8), 8},
      {"wrong channel", make_wire_header(WireKind::kPut, 1, 3, kSecret, 0, 8), 8},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    RawPeer p;
    p.send_header(hello());
    p.send_header(c.h);
    std::vector<uint8_t> payload(c.payload, 0x11);
    if (!payload.empty()) p.send_raw(payload.data(), payload.size());
    CHECK(p.pump() == Status::kProtocolError);
    CHECK(p.backend->error_message().find("rank 1") != std::string::npos);
    CHECK(p.untouched());
  }
}

TEST_CASE("raw bytes: a peer leaving after a failure passes its reason on; an oversized reason is refused") {
  {
    RawPeer p;
    p.send_header(hello());
    const std::string why = "rank 1: lost rank 3";
    p.send_header(make_wire_header(WireKind::kAbort, 1, 0, kSecret, 0, why.size()));
    p.send_raw(why.data(), why.size());
    CHECK(p.pump() == Status::kPeerFailed);
    CHECK(p.backend->error_message().find("rank 1 failed and left the job: rank 1: lost rank 3") != std::string::npos);
    CHECK(p.untouched());
  }
  {
    RawPeer p;
    p.send_header(hello());
    p.send_header(make_wire_header(WireKind::kAbort, 1, 0, kSecret, 0, kMaxAbortText + 1));
    CHECK(p.pump() == Status::kProtocolError);
    CHECK(p.untouched());
  }
}

TEST_CASE("raw bytes: a stream cut mid-message is a dead peer; a well-formed stream does write (control)") {
  {
    RawPeer p;
    p.send_header(hello());
    auto h = make_wire_header(WireKind::kPut, 1, 0, kSecret, 0, 64);
    p.send_raw(&h, 20);  // half a header, then the peer vanishes
    close(p.fd);
    p.fd = -1;
    CHECK(p.pump() == Status::kPeerFailed);
    CHECK(p.backend->error_message().find("rank 1") != std::string::npos);
    CHECK(p.untouched());
  }
  {
    RawPeer p;
    p.send_header(hello());
    p.send_header(make_wire_header(WireKind::kPut, 1, 0, kSecret, 100, 16));
    std::vector<uint8_t> payload(16, 0x11);
    p.send_raw(payload.data(), payload.size());
    p.send_header(make_wire_header(WireKind::kSignal, 1, 0, kSecret, 4088, 77));
    p.send_header(make_wire_header(WireKind::kBye, 1, 0, kSecret, 0, 0));
    shutdown(p.fd, SHUT_WR);
    CHECK(p.pump() == Status::kOk);
    for (uint64_t i = 0; i < kRegion - 8; ++i) {
      CAPTURE(i);
      if (p.region[i] != ((i >= 100 && i < 116) ? 0x11 : 0xAB)) FAIL("byte outside the put changed or put missing");
    }
    uint64_t flag;
    memcpy(&flag, p.region.data() + 4088, 8);
    CHECK(flag == 77);
  }
}

namespace {

// A plain TCP connect with a short bound; true when the peer accepted.
bool can_connect(uint32_t ip_be, uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = ip_be;
  a.sin_port = htons(port);
  timeval tv{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  close(fd);
  return ok;
}

}  // namespace

TEST_CASE("the socket backend listens only on the addresses it publishes, all on one port") {
  std::vector<uint8_t> mem(4096);
  Region region;
  region.base = mem.data();
  region.bytes = mem.size();
  for (const char* ifname : {"", "lo"}) {
    CAPTURE(ifname);
    BackendConfig cfg;
    cfg.size = 2;
    cfg.socket_ifname = ifname;
    auto b = make_socket_backend(cfg);
    REQUIRE(b->register_region(region) == Status::kOk);
    PeerInfo pi;
    REQUIRE(b->local_info(&pi) == Status::kOk);
    const auto& info = std::get<SocketPeerInfo>(pi);
    REQUIRE_FALSE(info.ipv4.empty());
    for (uint32_t ip : info.ipv4) {
      char text[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &ip, text, sizeof text);
      CAPTURE(text);
      CHECK(can_connect(ip, info.port));
    }
    // 127.0.0.2 reaches this host (all of 127/8 is local) but is never published: a socket bound
    // to INADDR_ANY would accept there.
    const uint32_t unpublished = htonl(0x7f000002);
    REQUIRE(std::find(info.ipv4.begin(), info.ipv4.end(), unpublished) == info.ipv4.end());
    CHECK_FALSE(can_connect(unpublished, info.port));
    if (std::string(ifname) == "lo") {
      CHECK(info.ipv4.size() == 1);
      CHECK(info.ipv4[0] == htonl(0x7f000001));
    }
    b->close("");
  }
}
