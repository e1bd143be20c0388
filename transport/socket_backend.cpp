// socket net backend: one TCP stream per (sender, receiver, channel); the receiver validates and applies in order.
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <vector>

#include "base/log.h"
#include "transport/net_backend.h"
#include "transport/socket_wire.h"

namespace weft::transport {

bool validate_wire_header(const WireHeader& h, const WireExpect& e, std::string* why) {
  auto fail = [&](std::string s) {
    *why = std::move(s);
    return false;
  };
  if (h.magic != kWireMagic) return fail("bad magic (not a weft stream)");
  if (h.version != kWireVersion)
    return fail("wire version " + std::to_string(h.version) + ", expected " + std::to_string(kWireVersion));
  if (h.secret != e.secret) return fail("wrong job secret");
  if (h.channel != static_cast<uint32_t>(e.channel))
    return fail("channel " + std::to_string(h.channel) + ", expected " + std::to_string(e.channel));
  if (h.reserved != 0) return fail("reserved field not zero");
  const auto kind = static_cast<WireKind>(h.kind);
  if (e.stream_src < 0) {
    if (kind != WireKind::kHello) return fail("first message is not a hello");
    if (h.src_rank >= static_cast<uint32_t>(e.world_size) || h.src_rank == static_cast<uint32_t>(e.self_rank))
      return fail("hello from invalid rank " + std::to_string(h.src_rank));
    return true;
  }
  if (h.src_rank != static_cast<uint32_t>(e.stream_src))
    return fail("source rank " + std::to_string(h.src_rank) + " on the stream of rank " + std::to_string(e.stream_src));
  switch (kind) {
    case WireKind::kPut:
      if (h.length == 0) return fail("empty put");
      if (h.offset > e.region_bytes || h.length > e.region_bytes - h.offset)
        return fail("put [" + std::to_string(h.offset) + ", +" + std::to_string(h.length) + ") outside the " +
                    std::to_string(e.region_bytes) + "-byte region");
      return true;
    case WireKind::kSignal:
      if (h.offset % 8) return fail("flag offset " + std::to_string(h.offset) + " not 8-byte aligned");
      if (e.region_bytes < 8 || h.offset > e.region_bytes - 8)
        return fail("flag offset " + std::to_string(h.offset) + " outside the region");
      return true;
    case WireKind::kBye:
      return true;
    case WireKind::kAbort:
      if (h.length > kMaxAbortText) return fail("abort text of " + std::to_string(h.length) + " bytes");
      return true;
    case WireKind::kHello:
      return fail("second hello on one stream");
  }
  return fail("unknown message kind " + std::to_string(h.kind));
}

WireHeader make_wire_header(WireKind kind, int src_rank, int channel, uint64_t secret, uint64_t offset,
                            uint64_t length) {
  WireHeader h{};
  h.magic = kWireMagic;
  h.version = kWireVersion;
  h.kind = static_cast<uint16_t>(kind);
  h.src_rank = static_cast<uint32_t>(src_rank);
  h.channel = static_cast<uint32_t>(channel);
  h.secret = secret;
  h.offset = offset;
  h.length = length;
  return h;
}

namespace {

constexpr size_t kMaxQueuedPerPeer = 4096;
// Connections that have not said hello yet (strangers, or peers just connecting) beyond the job's own.
constexpr size_t kMaxStrangers = 64;
constexpr uint64_t kStageBytes = 4u << 20;          // staging chunk for device regions
constexpr uint64_t kRecvBudgetPerPoll = 16u << 20;  // fairness between incoming streams

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::string errno_text(int e) { return std::string(strerror(e)); }

struct SendOp {
  WireHeader hdr;
  uint64_t local_offset = 0;
  uint64_t payload = 0;  // bytes after the header (puts)
  uint64_t sent = 0;     // header + payload bytes sent so far
  uint64_t wr_id = 0;
};

// A staging buffer between the socket and a device region: page-locked when the copy hooks can
// allocate it (set up when the peer is connected), else ordinary memory on first use.
struct Stage {
  uint8_t* p = nullptr;
  bool pinned = false;
  std::vector<uint8_t> heap;
};

struct OutConn {
  int fd = -1;
  std::deque<SendOp> queue;
  uint64_t stage_begin = 0, stage_len = 0;  // device regions: the part of the payload in the stage
  const SendOp* staged_for = nullptr;
};

struct InConn {
  int fd = -1;
  int src = -1;  // rank after a valid hello
  double hello_deadline = 0;
  WireHeader hdr{};
  size_t hdr_got = 0;
  bool in_payload = false;
  uint64_t payload_got = 0;
  bool bye = false;
  std::vector<uint8_t> stage;  // abort text
  uint64_t fill = 0;           // device regions: payload bytes in the stage, not yet copied in
};

class SocketBackend final : public NetBackend {
 public:
  explicit SocketBackend(const BackendConfig& c)
      : cfg_(c), out_(c.size), in_by_rank_(c.size, -1), out_stage_(c.size), in_stage_(c.size) {}
  ~SocketBackend() override { release_all(); }

  const char* name() const override { return "socket"; }

  Status register_region(const Region& r) override {
    if (r.kind == MemKind::kDevice && !(cfg_.copy_hooks.to_region && cfg_.copy_hooks.from_region))
      return fail(Status::kUnsupported, "a device-memory region needs the device copy hooks (weft_transport_cuda)");
    region_ = r;
    return Status::kOk;
  }

  Status local_info(PeerInfo* out) override {
    SocketPeerInfo info;
    WEFT_CHECK(pick_addresses(&info.ipv4));
    WEFT_CHECK(listen_on(info.ipv4, &info.port));
    *out = info;
    return Status::kOk;
  }

  Status connect(int peer, const PeerInfo& pinfo) override {
    const auto* info = std::get_if<SocketPeerInfo>(&pinfo);
    if (!info || peer < 0 || peer >= cfg_.size || peer == cfg_.rank)
      return fail(Status::kInvalidArgument, "connect: bad peer " + std::to_string(peer) + " or endpoint kind");
    const double deadline = now_s() + cfg_.timeout_s;
    int last_errno = 0;
    // Every advertised address is tried in the sender's order until one connects or time runs out:
    // a peer whose listening socket is not up yet answers ECONNREFUSED, which is retried.
    while (now_s() < deadline) {
      for (uint32_t ip : info->ipv4) {
        int fd = try_connect(ip, info->port, std::min(2.0, deadline - now_s()), &last_errno);
        if (fd < 0) continue;
        WireHeader hello = make_wire_header(WireKind::kHello, cfg_.rank, cfg_.channel, cfg_.secret, 0, 0);
        if (!send_all_blocking(fd, &hello, sizeof hello, deadline)) {
          last_errno = errno;
          ::close(fd);
          continue;
        }
        out_[peer].fd = fd;
        // Connections are symmetric (a peer sends to me when I send to it): stage both ways.
        prepare_stage(&out_stage_[peer]);
        prepare_stage(&in_stage_[peer]);
        return Status::kOk;
      }
      usleep(20000);
    }
    char ip[INET_ADDRSTRLEN] = "?";
    if (!info->ipv4.empty()) inet_ntop(AF_INET, &info->ipv4[0], ip, sizeof ip);
    return fail(Status::kPeerFailed, "cannot connect to rank " + std::to_string(peer) + " at " + ip + ":" +
                                         std::to_string(info->port) + " (+" + std::to_string(info->ipv4.size() - 1) +
                                         " other addresses) within " + std::to_string((int)cfg_.timeout_s) +
                                         "s: " + errno_text(last_errno));
  }

  bool can_post(int peer) const override { return out_[peer].queue.size() < kMaxQueuedPerPeer; }

  Status post_put(int peer, uint64_t local_offset, uint64_t remote_offset, uint64_t bytes, PostFlags,
                  uint64_t wr_id) override {
    WEFT_CHECK(check_post(peer));
    if (bytes == 0 || local_offset > region_.bytes || bytes > region_.bytes - local_offset)
      return fail(Status::kInvalidArgument, "put of " + std::to_string(bytes) + " bytes from offset " +
                                                std::to_string(local_offset) + " outside the local region");
    SendOp op;
    op.hdr = make_wire_header(WireKind::kPut, cfg_.rank, cfg_.channel, cfg_.secret, remote_offset, bytes);
    op.local_offset = local_offset;
    op.payload = bytes;
    op.wr_id = wr_id;
    out_[peer].queue.push_back(op);
    return Status::kOk;
  }

  Status post_signal(int peer, uint64_t flag_offset, uint64_t value, PostFlags, uint64_t wr_id) override {
    // A TCP stream is applied in order by the receiver, so a fence costs nothing here.
    WEFT_CHECK(check_post(peer));
    SendOp op;
    op.hdr = make_wire_header(WireKind::kSignal, cfg_.rank, cfg_.channel, cfg_.secret, flag_offset, value);
    op.wr_id = wr_id;
    out_[peer].queue.push_back(op);
    return Status::kOk;
  }

  Status poll(std::vector<Completion>* done) override {
    if (status_ != Status::kOk) return status_;
    for (int p = 0; p < cfg_.size; ++p)
      if (out_[p].fd >= 0 && !out_[p].queue.empty()) WEFT_CHECK(progress_send(p, done));
    WEFT_CHECK(accept_new());
    for (size_t i = 0; i < in_.size(); ++i) WEFT_CHECK(progress_recv(&in_[i]));
    in_.erase(std::remove_if(in_.begin(), in_.end(), [](const InConn& c) { return c.fd < 0; }), in_.end());
    const double t = now_s();
    for (auto& c : in_)
      if (c.src < 0 && t > c.hello_deadline) reject(&c, "no hello within the timeout");
    return Status::kOk;
  }

  void wait_activity(double max_s) override {
    std::vector<pollfd> fds;
    for (int fd : listen_fds_) fds.push_back({fd, POLLIN, 0});
    for (auto& c : in_) fds.push_back({c.fd, POLLIN, 0});
    for (auto& o : out_)
      if (o.fd >= 0 && !o.queue.empty()) fds.push_back({o.fd, POLLOUT, 0});
    timespec ts{static_cast<time_t>(max_s), static_cast<long>((max_s - (time_t)max_s) * 1e9)};
    ppoll(fds.data(), fds.size(), &ts, nullptr);
  }

  Status close(const std::string& failure) override {
    Status result = status_;
    if (result == Status::kOk && !failure.empty()) {
      result = Status::kPeerFailed;  // this rank failed elsewhere: no flush, no goodbye
      error_ = failure;
    }
    const double deadline = now_s() + cfg_.timeout_s;
    std::vector<Completion> ignored;
    bool pending = true;
    while (result == Status::kOk && pending) {
      pending = false;
      for (int p = 0; p < cfg_.size; ++p)
        if (out_[p].fd >= 0 && !out_[p].queue.empty()) {
          pending = true;
          result = progress_send(p, &ignored);
          if (result != Status::kOk) break;
        }
      if (pending && now_s() > deadline) {
        result = fail(Status::kTimeout, "close: queued sends not drained within the timeout");
        break;
      }
      if (pending) wait_activity(0.001);
    }
    for (int p = 0; p < cfg_.size; ++p) {
      if (out_[p].fd < 0) continue;
      if (result != Status::kOk && (out_[p].queue.empty() || out_[p].queue.front().sent == 0)) {
        // Leaving after a failure: tell the peer why (at a message boundary only), so it reports
        // the first cause rather than this rank's disappearance.
        std::string why = error_.substr(0, kMaxAbortText);
        WireHeader ab = make_wire_header(WireKind::kAbort, cfg_.rank, cfg_.channel, cfg_.secret, 0, why.size());
        if (send_all_blocking(out_[p].fd, &ab, sizeof ab, now_s() + 1.0))
          send_all_blocking(out_[p].fd, why.data(), why.size(), now_s() + 1.0);
      }
      if (result == Status::kOk) {
        WireHeader bye = make_wire_header(WireKind::kBye, cfg_.rank, cfg_.channel, cfg_.secret, 0, 0);
        send_all_blocking(out_[p].fd, &bye, sizeof bye, now_s() + 2.0);  // best effort: the peer may be gone
      }
      shutdown(out_[p].fd, SHUT_WR);
    }
    release_all();
    return result;
  }

  std::string error_message() const override { return error_; }

 private:
  Status fail(Status s, const std::string& what) {
    if (status_ == Status::kOk) {
      status_ = s;
      error_ = "rank " + std::to_string(cfg_.rank) + " channel " + std::to_string(cfg_.channel) + ": socket: " + what;
      WEFT_WARN(kNet, "%s", error_.c_str());
    }
    return status_;
  }
  Status fail_errno(const char* call) {
    return fail(Status::kSystemError, std::string(call) + ": " + errno_text(errno));
  }

  Status check_post(int peer) {
    if (status_ != Status::kOk) return status_;
    if (peer < 0 || peer >= cfg_.size || out_[peer].fd < 0)
      return fail(Status::kInvalidArgument, "post to rank " + std::to_string(peer) + ", which is not connected");
    return Status::kOk;
  }

  // The addresses this rank publishes, and listens on: those of WEFT_SOCKET_IFNAME, else every
  // interface that is up, routable ones first, loopback last (enough for ranks on one host, the
  // emulated-node case). Each once.
  Status pick_addresses(std::vector<uint32_t>* out) {
    ifaddrs* list = nullptr;
    if (getifaddrs(&list) != 0) return fail_errno("getifaddrs()");
    std::string seen;
    std::vector<uint32_t> loopback;
    auto add = [](std::vector<uint32_t>* v, uint32_t ip) {
      if (std::find(v->begin(), v->end(), ip) == v->end()) v->push_back(ip);
    };
    for (ifaddrs* a = list; a; a = a->ifa_next) {
      if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET || !(a->ifa_flags & IFF_UP)) continue;
      uint32_t ip = reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr;
      seen += std::string(seen.empty() ? "" : ", ") + a->ifa_name;
      if (!cfg_.socket_ifname.empty()) {
        if (cfg_.socket_ifname == a->ifa_name) add(out, ip);
      } else if (a->ifa_flags & IFF_LOOPBACK) {
        add(&loopback, ip);
      } else {
        add(out, ip);
      }
    }
    freeifaddrs(list);
    if (!cfg_.socket_ifname.empty()) {
      if (out->empty())
        return fail(Status::kNotFound, "WEFT_SOCKET_IFNAME=" + cfg_.socket_ifname +
                                           ": no IPv4 address on that interface (interfaces: " + seen + ")");
      out->resize(1);
      return Status::kOk;
    }
    for (uint32_t ip : loopback) add(out, ip);
    if (out->empty()) return fail(Status::kNotFound, "no IPv4 interface is up");
    return Status::kOk;
  }

  // One listening socket per published address, never INADDR_ANY: a peer reaches this rank only
  // at an address it published. All share one port (the endpoint blob carries one): the first
  // socket picks it, the others take the same; a clash on another address starts over.
  Status listen_on(const std::vector<uint32_t>& ips, uint16_t* port) {
    for (int attempt = 0; attempt < 32; ++attempt) {
      close_listeners();
      uint16_t p = 0;
      bool clash = false;
      for (uint32_t ip : ips) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) return fail_errno("socket()");
        listen_fds_.push_back(fd);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = ip;
        a.sin_port = htons(p);
        if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
          if (errno == EADDRINUSE && p != 0) {
            clash = true;
            break;
          }
          char text[INET_ADDRSTRLEN] = "?";
          inet_ntop(AF_INET, &ip, text, sizeof text);
          return fail_errno((std::string("bind(") + text + ")").c_str());
        }
        if (listen(fd, 1024) != 0) return fail_errno("listen()");
        if (p == 0) {
          socklen_t len = sizeof a;
          if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return fail_errno("getsockname()");
          p = ntohs(a.sin_port);
        }
      }
      if (!clash) {
        *port = p;
        return Status::kOk;
      }
    }
    close_listeners();
    return fail(Status::kSystemError, "no port was free on all " + std::to_string(ips.size()) + " published addresses");
  }

  void close_listeners() {
    for (int fd : listen_fds_) ::close(fd);
    listen_fds_.clear();
  }

  static int try_connect(uint32_t ip, uint16_t port, double max_s, int* err) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return *err = errno, -1;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = ip;
    a.sin_port = htons(port);
    int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    if (rc != 0 && errno != EINPROGRESS) {
      *err = errno;
      ::close(fd);
      return -1;
    }
    if (rc != 0) {
      pollfd p{fd, POLLOUT, 0};
      int n = ::poll(&p, 1, std::max(1, static_cast<int>(max_s * 1000)));
      int soerr = 0;
      socklen_t len = sizeof soerr;
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len);
      if (n <= 0 || soerr) {
        *err = n <= 0 ? ETIMEDOUT : soerr;
        ::close(fd);
        return -1;
      }
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
  }

  static bool send_all_blocking(int fd, const void* p, size_t n, double deadline) {
    const char* c = static_cast<const char*>(p);
    while (n) {
      ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
      if (w > 0) {
        c += w, n -= w;
        continue;
      }
      if (w < 0 && errno != EAGAIN && errno != EINTR) return false;
      if (now_s() > deadline) return errno = ETIMEDOUT, false;
      pollfd pf{fd, POLLOUT, 0};
      ::poll(&pf, 1, 10);
    }
    return true;
  }

  Status progress_send(int peer, std::vector<Completion>* done) {
    OutConn& o = out_[peer];
    while (!o.queue.empty()) {
      SendOp& op = o.queue.front();
      iovec iov[2];
      int n = 0;
      if (op.sent < sizeof(WireHeader)) {
        iov[n++] = {reinterpret_cast<char*>(&op.hdr) + op.sent, sizeof(WireHeader) - op.sent};
      }
      uint64_t pay_done = op.sent > sizeof(WireHeader) ? op.sent - sizeof(WireHeader) : 0;
      if (op.payload > pay_done) {
        if (region_.kind == MemKind::kDevice) {
          uint8_t* stage = stage_buffer(&out_stage_[peer]);
          if (o.staged_for != &op || pay_done >= o.stage_begin + o.stage_len) {
            o.stage_begin = pay_done;
            o.stage_len = std::min<uint64_t>(kStageBytes, op.payload - pay_done);
            o.staged_for = &op;
            Status s = cfg_.copy_hooks.from_region(
                cfg_.copy_hooks.ctx, stage, static_cast<char*>(region_.base) + op.local_offset + pay_done, o.stage_len);
            if (s != Status::kOk) return fail(s, "copy from the device region failed");
          }
          iov[n++] = {stage + (pay_done - o.stage_begin), o.stage_begin + o.stage_len - pay_done};
        } else {
          iov[n++] = {static_cast<char*>(region_.base) + op.local_offset + pay_done, op.payload - pay_done};
        }
      }
      msghdr m{};
      m.msg_iov = iov;
      m.msg_iovlen = n;
      ssize_t w = sendmsg(o.fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return Status::kOk;
        return fail(Status::kPeerFailed, "connection to rank " + std::to_string(peer) + " lost while sending (" +
                                             errno_text(errno) + "): rank " + std::to_string(peer) +
                                             " failed or exited");
      }
      op.sent += static_cast<uint64_t>(w);
      if (op.sent < sizeof(WireHeader) + op.payload) return Status::kOk;  // socket buffer full
      done->push_back({op.wr_id, peer});
      o.staged_for = nullptr;
      o.queue.pop_front();
    }
    return Status::kOk;
  }

  Status accept_new() {
    for (int lfd : listen_fds_) {
      for (;;) {
        int fd = accept4(lfd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
          if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) break;
          return fail_errno("accept()");
        }
        InConn c;
        c.fd = fd;
        c.hello_deadline = now_s() + cfg_.timeout_s;
        in_.push_back(std::move(c));
        // Strangers hold a slot until their hello deadline: bound how many may wait at once.
        size_t waiting = 0;
        for (const auto& w : in_) waiting += w.src < 0 && w.fd >= 0;
        if (waiting > kMaxStrangers + static_cast<size_t>(cfg_.size))
          reject(&in_.back(), "too many connections without a hello");
      }
    }
    return Status::kOk;
  }

  // A stranger (no valid hello yet) is dropped and logged; the job goes on. A peer's established
  // stream that breaks the protocol is a fatal protocol error naming that rank.
  void reject(InConn* c, const std::string& why) {
    WEFT_WARN(kNet, "rank %d channel %d: rejected connection (%s); closed it, nothing written", cfg_.rank, cfg_.channel,
              why.c_str());
    ++rejected_;
    ::close(c->fd);
    c->fd = -1;
  }

  Status progress_recv(InConn* c) {
    uint64_t budget = kRecvBudgetPerPoll;
    while (c->fd >= 0 && budget) {
      void* dst;
      uint64_t want;
      if (!c->in_payload) {
        dst = reinterpret_cast<char*>(&c->hdr) + c->hdr_got;
        want = sizeof(WireHeader) - c->hdr_got;
      } else if (static_cast<WireKind>(c->hdr.kind) == WireKind::kAbort) {
        c->stage.resize(c->hdr.length);
        dst = c->stage.data() + c->payload_got;
        want = c->hdr.length - c->payload_got;
      } else {
        uint64_t left = c->hdr.length - c->payload_got;
        if (region_.kind == MemKind::kDevice) {
          // Fill the stage (or the rest of the put) before one copy: a copy per recv() would cost
          // a CUDA round trip per socket read.
          dst = stage_buffer(&in_stage_[c->src]) + c->fill;
          want = std::min<uint64_t>(left, kStageBytes) - c->fill;
        } else {
          dst = static_cast<char*>(region_.base) + c->hdr.offset + c->payload_got;
          want = left;
        }
      }
      ssize_t r = recv(c->fd, dst, std::min<uint64_t>(want, budget), MSG_DONTWAIT);
      if (r < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return Status::kOk;
        if (c->src < 0) return reject(c, "recv: " + errno_text(errno)), Status::kOk;
        return fail(Status::kPeerFailed, "connection from rank " + std::to_string(c->src) + " lost (" +
                                             errno_text(errno) + "): rank " + std::to_string(c->src) + " failed");
      }
      if (r == 0) {
        if (c->src < 0) return reject(c, "closed before a hello"), Status::kOk;
        if (c->bye && !c->in_payload && c->hdr_got == 0) {
          ::close(c->fd);
          c->fd = -1;
          return Status::kOk;
        }
        return fail(Status::kPeerFailed, "rank " + std::to_string(c->src) +
                                             " closed its connection without a goodbye (process died?) " +
                                             (c->in_payload ? "in the middle of a put"
                                              : c->hdr_got  ? "in the middle of a header"
                                                            : "between messages"));
      }
      budget -= static_cast<uint64_t>(r);
      if (!c->in_payload) {
        c->hdr_got += static_cast<size_t>(r);
        if (c->hdr_got < sizeof(WireHeader)) continue;
        c->hdr_got = 0;
        WEFT_CHECK(on_header(c));
      } else if (static_cast<WireKind>(c->hdr.kind) == WireKind::kAbort) {
        c->payload_got += static_cast<uint64_t>(r);
        if (c->payload_got == c->hdr.length)
          return fail(Status::kPeerFailed, "rank " + std::to_string(c->src) + " failed and left the job: " +
                                               std::string(c->stage.begin(), c->stage.end()));
      } else {
        if (region_.kind == MemKind::kDevice) {
          c->fill += static_cast<uint64_t>(r);
          if (c->fill == std::min<uint64_t>(c->hdr.length - c->payload_got, kStageBytes)) {
            Status s = cfg_.copy_hooks.to_region(cfg_.copy_hooks.ctx,
                                                 static_cast<char*>(region_.base) + c->hdr.offset + c->payload_got,
                                                 stage_buffer(&in_stage_[c->src]), c->fill);
            if (s != Status::kOk) return fail(s, "copy into the device region failed");
            c->payload_got += c->fill;
            c->fill = 0;
          }
        } else {
          c->payload_got += static_cast<uint64_t>(r);
        }
        if (c->payload_got == c->hdr.length) c->in_payload = false;
      }
    }
    return Status::kOk;
  }

  Status on_header(InConn* c) {
    WireExpect e;
    e.secret = cfg_.secret;
    e.region_bytes = region_.bytes;
    e.self_rank = cfg_.rank;
    e.world_size = cfg_.size;
    e.channel = cfg_.channel;
    e.stream_src = c->src;
    std::string why;
    if (!validate_wire_header(c->hdr, e, &why)) {
      if (c->src < 0) return reject(c, why), Status::kOk;
      ++rejected_;
      ::close(c->fd);
      c->fd = -1;
      return fail(Status::kProtocolError,
                  "rejected a message from rank " + std::to_string(c->src) + ": " + why + "; nothing written");
    }
    switch (static_cast<WireKind>(c->hdr.kind)) {
      case WireKind::kHello: {
        int src = static_cast<int>(c->hdr.src_rank);
        if (in_by_rank_[src] >= 0)
          return reject(c, "a second stream claiming rank " + std::to_string(src)), Status::kOk;
        in_by_rank_[src] = 1;
        c->src = src;
        return Status::kOk;
      }
      case WireKind::kPut:
        c->in_payload = true;
        c->payload_got = 0;
        c->fill = 0;
        return Status::kOk;
      case WireKind::kSignal: {
        // Everything earlier on this stream is already in the region: release-store the flag.
        char* flag = static_cast<char*>(region_.base) + c->hdr.offset;
        uint64_t v = c->hdr.length;
        if (region_.kind == MemKind::kDevice) {
          Status s = cfg_.copy_hooks.to_region(cfg_.copy_hooks.ctx, flag, &v, sizeof v);
          if (s != Status::kOk) return fail(s, "flag store into the device region failed");
        } else {
          __atomic_store_n(reinterpret_cast<uint64_t*>(flag), v, __ATOMIC_RELEASE);
        }
        return Status::kOk;
      }
      case WireKind::kBye:
        c->bye = true;
        return Status::kOk;
      case WireKind::kAbort:
        if (c->hdr.length == 0)
          return fail(Status::kPeerFailed, "rank " + std::to_string(c->src) + " failed and left the job");
        c->in_payload = true;
        c->payload_got = 0;
        return Status::kOk;
    }
    return Status::kInternal;
  }

  void prepare_stage(Stage* s) {
    if (s->p || region_.kind != MemKind::kDevice || !cfg_.copy_hooks.alloc_host) return;
    if (void* p = cfg_.copy_hooks.alloc_host(cfg_.copy_hooks.ctx, kStageBytes)) {
      s->p = static_cast<uint8_t*>(p);
      s->pinned = true;
    }
  }
  static uint8_t* stage_buffer(Stage* s) {
    if (!s->p) {
      s->heap.resize(kStageBytes);
      s->p = s->heap.data();
    }
    return s->p;
  }
  void free_stages() {
    for (auto* v : {&out_stage_, &in_stage_})
      for (Stage& s : *v) {
        if (s.pinned && cfg_.copy_hooks.free_host) cfg_.copy_hooks.free_host(cfg_.copy_hooks.ctx, s.p);
        s = Stage();
      }
  }

  void release_all() {
    free_stages();
    for (auto& o : out_)
      if (o.fd >= 0) ::close(o.fd), o.fd = -1;
    for (auto& c : in_)
      if (c.fd >= 0) ::close(c.fd), c.fd = -1;
    in_.clear();
    close_listeners();
  }

  BackendConfig cfg_;
  Region region_;
  std::vector<int> listen_fds_;  // one per published address
  std::vector<OutConn> out_;
  std::vector<InConn> in_;
  std::vector<int> in_by_rank_;
  std::vector<Stage> out_stage_, in_stage_;  // per peer rank (device regions)
  uint64_t rejected_ = 0;
  Status status_ = Status::kOk;
  std::string error_;
};

}  // namespace

std::unique_ptr<NetBackend> make_socket_backend(const BackendConfig& config) {
  return std::make_unique<SocketBackend>(config);
}

}  // namespace weft::transport
