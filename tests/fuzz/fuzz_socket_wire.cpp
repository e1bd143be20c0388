// Fuzz target: bytes arriving on a socket backend's TCP stream (hello, put, signal, bye, abort
// headers and payloads), received by a real backend into a host region; plus the header validator.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <variant>
#include <vector>

#include "fuzz_common.h"
#include "transport/net_backend.h"
#include "transport/socket_wire.h"

using namespace weft;
using namespace weft::transport;

namespace {

constexpr uint64_t kSecret = 0x5eed5eed5eed5eedull;  // the seeds' headers carry it
constexpr uint64_t kRegionBytes = 1 << 16;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz_quiet_logs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The validator alone, on every whole header in the input, for both stream states.
  WireExpect e;
  e.secret = kSecret;
  e.region_bytes = kRegionBytes;
  e.self_rank = 0;
  e.world_size = 2;
  for (size_t off = 0; off + sizeof(WireHeader) <= size; off += sizeof(WireHeader)) {
    WireHeader h;
    memcpy(&h, data + off, sizeof h);
    for (int src : {-1, 1}) {
      e.stream_src = src;
      std::string why;
      if (!validate_wire_header(h, e, &why)) {
        FUZZ_ASSERT(!why.empty());
        continue;
      }
      const auto kind = static_cast<WireKind>(h.kind);
      if (kind == WireKind::kPut) FUZZ_ASSERT(h.offset + h.length <= kRegionBytes && h.length > 0);
      if (kind == WireKind::kSignal) FUZZ_ASSERT(h.offset % 8 == 0 && h.offset + 8 <= kRegionBytes);
      if (kind == WireKind::kAbort) FUZZ_ASSERT(h.length <= kMaxAbortText);
    }
  }

  // The whole stream into a real receiving backend (rank 0 of 2), over loopback TCP.
  std::vector<uint8_t> region(kRegionBytes);
  BackendConfig cfg;
  cfg.rank = 0;
  cfg.size = 2;
  cfg.secret = kSecret;
  cfg.timeout_s = 5;
  cfg.socket_ifname = "lo";
  auto backend = make_socket_backend(cfg);
  Region r;
  r.base = region.data();
  r.bytes = region.size();
  FUZZ_ASSERT(backend->register_region(r) == Status::kOk);
  PeerInfo info;
  FUZZ_ASSERT(backend->local_info(&info) == Status::kOk);
  const auto& si = std::get<SocketPeerInfo>(info);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  FUZZ_ASSERT(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = si.ipv4[0];
  a.sin_port = htons(si.port);
  // Close with a reset, not TIME_WAIT: thousands of connections a second would use up the ports.
  linger lg{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {  // the machine, not the input
    close(fd);
    backend->close("");
    return 0;
  }
  // Send and receive together (the input may exceed the socket buffers), then close our side and
  // poll until the backend has closed the stream or stopped on an error.
  size_t sent = 0;
  bool closed = false, shut = false;
  std::vector<Completion> done;
  for (int iter = 0; iter < 20000 && !closed; ++iter) {
    if (sent < size) {
      ssize_t w = send(fd, data + sent, size - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (w > 0) sent += static_cast<size_t>(w);
      if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) break;  // the backend dropped us
    } else if (!shut) {
      shutdown(fd, SHUT_WR);
      shut = true;
    }
    if (backend->poll(&done) != Status::kOk) break;
    pollfd p{fd, POLLIN, 0};
    char c;
    if (::poll(&p, 1, 0) > 0 && recv(fd, &c, 1, MSG_DONTWAIT) <= 0) closed = true;
  }
  close(fd);
  FUZZ_ASSERT(done.empty());  // a receiver posts nothing, so completes nothing
  backend->close("");
  return 0;
}
