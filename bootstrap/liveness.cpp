// Implementation of liveness.h: the heartbeat ring, its failure notices and the bounded give-up.
#include "bootstrap/liveness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <vector>

#include "base/log.h"
#include "bootstrap/blob.h"

namespace weft::bootstrap {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint16_t kAddrKind = 7;
constexpr uint16_t kAddrVersion = 2;           // 2: the network stack id
constexpr uint32_t kFrameMagic = 0x4c564557u;  // "WEVL"
constexpr uint32_t kMaxText = 256;
constexpr size_t kMaxAddrs = 64;

enum Kind : uint32_t { kHello = 1, kBeat = 2, kBye = 3, kFailed = 4 };

struct Frame {
  uint32_t magic;
  uint32_t kind;
  uint64_t token;   // the receiver's token (kHello); 0 otherwise
  int32_t from;     // sender's rank
  int32_t subject;  // kFailed: the rank that failed
  uint32_t len;     // bytes of text that follow (kFailed), at most kMaxText
  uint32_t pad;
};
static_assert(sizeof(Frame) == 32, "frame layout");

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Which network stack this process is in: the kernel's boot id and the network namespace. Two ranks
// with the same id reach each other over loopback; otherwise a peer's loopback address is this
// host's own, where any other process may listen, and is never tried.
uint64_t network_stack_id() {
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  struct stat st {};
  const uint64_t ns = stat("/proc/self/ns/net", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
  return std::hash<std::string>{}(boot) ^ (ns * 0x9e3779b97f4a7c15ull);
}

bool is_loopback(uint32_t ip_be) { return (ntohl(ip_be) >> 24) == 127; }

// Addresses to listen on and publish, as the socket transport picks them.
std::vector<uint32_t> pick_addresses(const std::string& ifname) {
  std::vector<uint32_t> out, loopback;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET || !(a->ifa_flags & IFF_UP)) continue;
    if (!ifname.empty() && ifname != a->ifa_name) continue;
    uint32_t ip = reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr;
    auto& v = (a->ifa_flags & IFF_LOOPBACK) && ifname.empty() ? loopback : out;
    if (std::find(v.begin(), v.end(), ip) == v.end() && out.size() + loopback.size() < kMaxAddrs) v.push_back(ip);
  }
  freeifaddrs(list);
  out.insert(out.end(), loopback.begin(), loopback.end());
  return out;
}

std::string ip_text(uint32_t ip) {
  char t[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &ip, t, sizeof t);
  return t;
}

// Non-blocking connect bounded by `max_s`; returns the fd (blocking mode off) or -1 with *err.
int connect_bounded(uint32_t ip, uint16_t port, double max_s, int* err) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return *err = errno, -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = ip;
  a.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    if (errno != EINPROGRESS) {
      *err = errno;
      close(fd);
      return -1;
    }
    pollfd p{fd, POLLOUT, 0};
    int n = poll(&p, 1, std::max(1, static_cast<int>(max_s * 1000)));
    int soerr = 0;
    socklen_t len = sizeof soerr;
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len);
    if (n <= 0 || soerr) {
      *err = n <= 0 ? ETIMEDOUT : soerr;
      close(fd);
      return -1;
    }
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

// Rings still open at exit(): a program that ends with exit() and never destroys its bootstrap
// (the C++ API's context leaked, say) has still finished, not died; say goodbye for it.
std::mutex g_open_mu;
std::vector<Liveness*> g_open;
void goodbye_all_at_exit();

}  // namespace

struct Liveness::Link {
  int fd = -1;
  int peer = -1;          // rank at the other end (known once its hello arrived, for the accepted link)
  bool ready = false;     // hello exchanged: heartbeats are expected
  bool said_bye = false;  // the peer left the job: its end of stream is expected
  // Seconds of silence this monitor saw, counted only while it was itself running (each pass adds at
  // most two heartbeat periods): a host that freezes every process at once (an overloaded machine,
  // a paused VM) does not make every peer look stalled.
  double silent_s = 0;
  uint64_t frames = 0;  // frames received on this link (a stall message says whether any ever came)
  std::string rx;       // bytes received, not yet a whole frame
};

Status Liveness::start(Bootstrap& boot, const Options& options, FailFn on_failure, FailFn on_give_up,
                       std::unique_ptr<Liveness>* out) {
  const RankInfo& me = boot.info();
  if (me.size < 2) return Status::kInvalidArgument;
  std::unique_ptr<Liveness> self(new Liveness());
  self->rank_ = me.rank;
  self->size_ = me.size;
  self->opt_ = options;
  self->on_failure_ = std::move(on_failure);
  self->on_give_up_ = std::move(on_give_up);
  self->token_ = std::random_device{}() * 0x100000001ull ^ std::random_device{}();

  std::vector<uint32_t> ips = pick_addresses(options.ifname);
  if (ips.empty()) {
    WEFT_WARN(kBoot, "rank %d: liveness: no IPv4 interface is up%s%s", me.rank, options.ifname.empty() ? "" : " named ",
              options.ifname.c_str());
    return Status::kNotFound;
  }
  // One listening socket per published address (never INADDR_ANY), all on one port; the token in
  // the hello is what admits rank-1.
  uint16_t port = 0;
  for (int attempt = 0; attempt < 32 && self->listen_fds_.size() < ips.size(); ++attempt) {
    for (int f : self->listen_fds_) close(f);
    self->listen_fds_.clear();
    port = 0;
    for (uint32_t ip : ips) {
      int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (lfd < 0) return Status::kSystemError;
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = ip;
      a.sin_port = htons(port);
      if (bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(lfd, 16) != 0) {
        int e = errno;
        close(lfd);
        if (e == EADDRINUSE && port != 0) break;  // the port is taken on this address: start over
        WEFT_WARN(kBoot, "rank %d: liveness: cannot listen on %s: %s", me.rank, ip_text(ip).c_str(), strerror(e));
        return Status::kSystemError;
      }
      self->listen_fds_.push_back(lfd);
      if (port == 0) {
        socklen_t len = sizeof a;
        getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
        port = ntohs(a.sin_port);
      }
    }
  }
  if (self->listen_fds_.size() < ips.size()) {
    WEFT_WARN(kBoot, "rank %d: liveness: no port was free on all %zu addresses", me.rank, ips.size());
    return Status::kSystemError;
  }
  if (pipe2(self->wake_, O_CLOEXEC | O_NONBLOCK) != 0) return Status::kSystemError;

  BlobWriter w;
  const uint64_t stack = network_stack_id();
  w.u32(port);
  w.u64(self->token_);
  w.u64(stack);
  w.u32(static_cast<uint32_t>(ips.size()));
  for (uint32_t ip : ips) w.u32(ip);
  std::vector<Blob> all;
  WEFT_CHECK(boot.allgather("liveness", seal_blob(kAddrKind, kAddrVersion, w.blob()), &all));

  const int right = (me.rank + 1) % me.size;
  Blob payload;
  WEFT_CHECK(open_blob(all[right], kAddrKind, kAddrVersion, right, "liveness addresses", &payload));
  BlobReader r(payload);
  uint32_t rport = 0, n = 0;
  uint64_t rtoken = 0, rstack = 0;
  std::vector<uint32_t> rips;
  bool ok = r.u32(&rport) && rport > 0 && rport < 65536 && r.u64(&rtoken) && r.u64(&rstack) && r.u32(&n) && n >= 1 &&
            n <= kMaxAddrs;
  for (uint32_t i = 0; ok && i < n; ++i) {
    uint32_t ip = 0;
    ok = r.u32(&ip);
    if (ok && (rstack == stack || !is_loopback(ip))) rips.push_back(ip);
  }
  if (!ok || !r.done()) {
    WEFT_WARN(kBoot, "rank %d: liveness: rank %d's addresses are malformed", me.rank, right);
    return Status::kProtocolError;
  }
  if (rips.empty()) {
    WEFT_WARN(kBoot,
              "rank %d: liveness: rank %d is on another host and published only loopback addresses (set "
              "WEFT_SOCKET_IFNAME to an interface both hosts reach)",
              me.rank, right);
    return Status::kNotFound;
  }
  // Connect to rank+1, every address in its order, until one answers or timeout_s passes.
  const auto t0 = Clock::now();
  int fd = -1, err = 0;
  uint32_t answered = rips[0];
  while (fd < 0 && seconds_since(t0) < options.timeout_s) {
    for (uint32_t ip : rips) {
      fd = connect_bounded(ip, static_cast<uint16_t>(rport), std::min(2.0, options.timeout_s), &err);
      if (fd >= 0) {
        answered = ip;
        break;
      }
    }
    if (fd < 0) usleep(50000);
  }
  if (fd < 0) {
    WEFT_WARN(kBoot, "rank %d: liveness: cannot connect to rank %d at %s:%u (+%zu other addresses) within %.0f s: %s",
              me.rank, right, ip_text(rips[0]).c_str(), rport, rips.size() - 1, options.timeout_s, strerror(err));
    return Status::kPeerFailed;
  }
  Frame hello{kFrameMagic, kHello, rtoken, me.rank, -1, 0, 0};
  if (send(fd, &hello, sizeof hello, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof hello)) {
    WEFT_WARN(kBoot, "rank %d: liveness: hello to rank %d failed: %s", me.rank, right, strerror(errno));
    close(fd);
    return Status::kPeerFailed;
  }
  self->links_[0].reset(new Link());
  self->links_[0]->fd = fd;
  self->links_[0]->peer = right;
  self->links_[0]->ready = true;
  self->links_[1].reset(new Link());
  self->links_[1]->peer = (me.rank + me.size - 1) % me.size;
  WEFT_INFO(kBoot, "rank %d: liveness ring up: to rank %d at %s:%u, heartbeat %.1f s, stall after %.1f s", me.rank,
            right, ip_text(answered).c_str(), rport, options.heartbeat_s, options.timeout_s);
  Liveness* raw = self.get();
  self->thread_ = std::thread([raw] { raw->run(); });
  static std::once_flag once;
  std::call_once(once, [] { atexit(goodbye_all_at_exit); });
  {
    std::lock_guard<std::mutex> g(g_open_mu);
    g_open.push_back(raw);
  }
  *out = std::move(self);
  return Status::kOk;
}

namespace {
void goodbye_all_at_exit() {
  std::lock_guard<std::mutex> g(g_open_mu);
  for (Liveness* l : g_open) l->goodbye();
}
}  // namespace

void Liveness::goodbye() {
  std::lock_guard<std::mutex> g(mu_);
  if (failed_rank_ == -1) send_all(kBye, rank_, "", -1);
}

Liveness::~Liveness() {
  {
    std::lock_guard<std::mutex> g(g_open_mu);
    g_open.erase(std::remove(g_open.begin(), g_open.end(), this), g_open.end());
  }
  goodbye();
  stop_ = true;
  if (wake_[1] >= 0) (void)!write(wake_[1], "x", 1);
  if (thread_.joinable()) thread_.join();
  for (auto& l : links_)
    if (l && l->fd >= 0) close(l->fd);
  for (int f : listen_fds_) close(f);
  for (int f : wake_)
    if (f >= 0) close(f);
}

bool Liveness::failure(int* rank, std::string* why) {
  std::lock_guard<std::mutex> g(mu_);
  if (failed_rank_ == -1) return false;
  *rank = failed_rank_;
  *why = failed_why_;
  return true;
}

void Liveness::announce_own_failure(const std::string& why) { fail(rank_, why, -1); }

// Sends a frame on every ready link but `except_link`; the caller holds mu_. Failures are left to
// the reader to notice (a dead peer's end of stream).
void Liveness::send_all(uint32_t kind, int subject, const std::string& text, int except_link) {
  std::string buf(sizeof(Frame), '\0');
  Frame f{kFrameMagic, kind, 0, rank_, subject, static_cast<uint32_t>(std::min<size_t>(text.size(), kMaxText)), 0};
  memcpy(&buf[0], &f, sizeof f);
  buf.append(text, 0, f.len);
  for (int i = 0; i < 2; ++i) {
    Link* l = links_[i].get();
    if (i == except_link || !l || l->fd < 0 || !l->ready) continue;
    // Non-blocking: a stalled peer's full buffer must not stall us; a lost heartbeat is harmless.
    (void)!send(l->fd, buf.data(), buf.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }
}

void Liveness::fail(int rank, const std::string& why, int from_link) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (failed_rank_ != -1) return;  // the first failure is the cause
    failed_rank_ = rank;
    failed_why_ = why;
    send_all(kFailed, rank, why, from_link);
  }
  if (rank != rank_ && on_failure_) on_failure_(rank, why);
}

void Liveness::run() {
  auto last_beat = Clock::now() - std::chrono::hours(1);
  Clock::time_point failed_at{};
  bool gave_up = false;
  auto last_loop = Clock::now();
  double ran_s = 0;  // time this monitor ran, counted as silent_s is
  while (!stop_) {
    const double gap = seconds_since(last_loop);
    if (gap > 2 * opt_.heartbeat_s)
      WEFT_INFO(kBoot, "rank %d: the liveness thread did not run for %.1f s (an overloaded host?)", rank_, gap);
    last_loop = Clock::now();
    ran_s += std::min(gap, 2 * opt_.heartbeat_s);
    for (auto& l : links_) l->silent_s += std::min(gap, 2 * opt_.heartbeat_s);
    if (seconds_since(last_beat) >= opt_.heartbeat_s) {
      std::lock_guard<std::mutex> g(mu_);
      send_all(kBeat, rank_, "", -1);
      last_beat = Clock::now();
    }
    std::vector<pollfd> p;
    p.push_back({wake_[0], POLLIN, 0});
    Link* in = links_[1].get();
    if (in->fd < 0)
      for (int f : listen_fds_) p.push_back({f, POLLIN, 0});
    for (auto& l : links_)
      if (l->fd >= 0) p.push_back({l->fd, POLLIN, 0});
    poll(p.data(), p.size(), 200);
    if (stop_) break;
    for (int f : listen_fds_) {
      if (in->fd >= 0) break;
      int fd = accept4(f, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd >= 0) {
        in->fd = fd;
        in->rx.clear();
        in->silent_s = 0;
        in->said_bye = false;  // a connection dropped before its hello does not end monitoring
      }
    }
    for (int i = 0; i < 2; ++i) {
      Link* l = links_[i].get();
      if (l->fd < 0) continue;
      char buf[4096];
      ssize_t n;
      bool eof = false;
      while ((n = recv(l->fd, buf, sizeof buf, MSG_DONTWAIT)) > 0) {
        l->rx.append(buf, n);
        if (l->rx.size() > 64 * 1024) break;  // a peer flooding us: treated as a broken link below
      }
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) eof = true;
      bool bad = false;
      while (l->rx.size() >= sizeof(Frame)) {
        Frame f;
        memcpy(&f, l->rx.data(), sizeof f);
        if (f.magic != kFrameMagic || f.len > kMaxText) {
          bad = true;
          break;
        }
        if (l->rx.size() < sizeof f + f.len) break;
        std::string text = l->rx.substr(sizeof f, f.len);
        l->rx.erase(0, sizeof f + f.len);
        if (!l->ready) {  // the accepted link: the first frame must be rank-1's hello with our token
          if (f.kind != kHello || f.token != token_ || f.from != l->peer) {
            bad = true;
            break;
          }
          l->ready = true;
          l->silent_s = 0;
          continue;
        }
        l->silent_s = 0;
        ++l->frames;
        if (f.kind == kBye) l->said_bye = true;
        if (f.kind == kFailed && f.subject >= 0 && f.subject < size_) fail(f.subject, text, i);
      }
      if ((bad || eof) && !l->ready) {  // a stranger, a port scan, or a dropped attempt: listen again
        close(l->fd);
        l->fd = -1;
        continue;
      }
      if (bad || eof) {
        close(l->fd);
        l->fd = -1;
        if (!l->said_bye && l->ready)
          fail(l->peer,
               "rank " + std::to_string(l->peer) +
                   "'s liveness connection closed without a goodbye: the process died (killed or crashed)",
               i);
        l->ready = false;
        l->said_bye = true;  // nothing more is expected on this link
      }
    }
    // Stalls: a ready link silent for timeout_s, or rank-1 that never connected.
    for (int i = 0; i < 2; ++i) {
      Link* l = links_[i].get();
      if (l->said_bye) continue;
      if (!l->ready && l->fd >= 0 && l->silent_s > 5) {  // accepted, but no hello: not rank-1
        close(l->fd);
        l->fd = -1;
      }
      const double silent = l->ready ? l->silent_s : ran_s;
      if (silent >= opt_.timeout_s) {
        char why[240];
        if (!l->ready)
          snprintf(why, sizeof why,
                   "rank %d did not open its liveness connection within %.1f s (WEFT_LIVENESS_TIMEOUT=%.1f)", l->peer,
                   silent, opt_.timeout_s);
        else if (l->frames == 0)
          snprintf(why, sizeof why,
                   "rank %d sent nothing on its liveness connection in %.1f s (WEFT_LIVENESS_TIMEOUT=%.1f): stopped "
                   "or hung since the ring came up, or its host unreachable",
                   l->peer, silent, opt_.timeout_s);
        else
          snprintf(why, sizeof why,
                   "rank %d sent no heartbeat for %.1f s (WEFT_LIVENESS_TIMEOUT=%.1f): stopped, hung, or its host "
                   "unreachable",
                   l->peer, silent, opt_.timeout_s);
        fail(l->peer, why, -1);
        l->said_bye = true;
      }
    }
    int rank;
    std::string why;
    {
      std::lock_guard<std::mutex> g(mu_);
      rank = failed_rank_;
      why = failed_why_;
    }
    if (rank != -1 && rank != rank_ && !gave_up) {
      if (failed_at == Clock::time_point{}) failed_at = Clock::now();
      if (seconds_since(failed_at) >= opt_.grace_s) {
        gave_up = true;
        if (on_give_up_) on_give_up_(rank, why);
      }
    }
  }
}

}  // namespace weft::bootstrap
