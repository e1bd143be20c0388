// Test-only bootstraps over threads and over forked processes (socketpairs to a hub in the parent).
#include "local_bootstrap.h"

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "base/log.h"
#include "bootstrap/group_bootstrap.h"

namespace weft::testing {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// --- threads ---
struct ThreadHub {
  std::mutex m;
  std::condition_variable cv;
  struct Round {
    std::vector<bootstrap::Blob> blobs;
    int count = 0;
  };
  std::map<std::string, Round> rounds;
  int size = 0;
};

// Also a SubsetExchange: a rank group's exchange waits for its members only, under its scope's key.
class ThreadBootstrap : public bootstrap::Bootstrap, public bootstrap::SubsetExchange {
 public:
  ThreadBootstrap(ThreadHub* hub, const bootstrap::RankInfo& info, double timeout_s)
      : hub_(hub), info_(info), timeout_s_(timeout_s) {}
  const bootstrap::RankInfo& info() const override { return info_; }
  Status allgather(const std::string& key, const bootstrap::Blob& mine, std::vector<bootstrap::Blob>* all) override {
    std::unique_lock<std::mutex> lock(hub_->m);
    auto& r = hub_->rounds[key];
    if (r.blobs.empty()) r.blobs.resize(hub_->size);
    r.blobs[info_.rank] = mine;
    if (++r.count == hub_->size) hub_->cv.notify_all();
    if (!hub_->cv.wait_for(lock, std::chrono::duration<double>(timeout_s_), [&] { return r.count >= hub_->size; })) {
      WEFT_WARN(kBoot, "rank %d: test bootstrap: allgather '%s' timed out (%d of %d ranks)", info_.rank, key.c_str(),
                r.count, hub_->size);
      return Status::kTimeout;
    }
    *all = r.blobs;
    return Status::kOk;
  }
  Status barrier(const std::string& tag) override {
    std::vector<bootstrap::Blob> all;
    return allgather("barrier:" + tag, {}, &all);
  }
  Status subset_allgather(const std::string& scope, const std::string& key, const std::vector<int>& members,
                          const bootstrap::Blob& mine, std::vector<bootstrap::Blob>* all) override {
    int me = -1;
    for (size_t i = 0; i < members.size(); ++i)
      if (members[i] == info_.rank) me = static_cast<int>(i);
    if (me < 0) return Status::kInvalidArgument;
    const int n = static_cast<int>(members.size());
    std::unique_lock<std::mutex> lock(hub_->m);
    auto& r = hub_->rounds[scope + "/" + key];
    if (r.blobs.empty()) r.blobs.resize(static_cast<size_t>(n));
    r.blobs[static_cast<size_t>(me)] = mine;
    if (++r.count == n) hub_->cv.notify_all();
    if (!hub_->cv.wait_for(lock, std::chrono::duration<double>(timeout_s_), [&] { return r.count >= n; })) {
      WEFT_WARN(kBoot, "rank %d: test bootstrap: %s allgather '%s' timed out (%d of %d members)", info_.rank,
                scope.c_str(), key.c_str(), r.count, n);
      return Status::kTimeout;
    }
    *all = r.blobs;
    return Status::kOk;
  }
  void abort(const std::string& why) override { WEFT_WARN(kBoot, "rank %d: abort: %s", info_.rank, why.c_str()); }

 private:
  ThreadHub* hub_;
  bootstrap::RankInfo info_;
  double timeout_s_;
};

// --- processes: framing ---
enum : uint32_t { kAllgather = 1, kReport = 2, kAbort = 3, kResult = 10, kError = 11 };

bool write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w, n -= w;
  }
  return true;
}

bool read_all(int fd, void* p, size_t n, double deadline) {
  char* c = static_cast<char*>(p);
  while (n) {
    pollfd pf{fd, POLLIN, 0};
    int left_ms = static_cast<int>((deadline - now_s()) * 1000);
    if (left_ms <= 0) return false;
    if (::poll(&pf, 1, left_ms) <= 0) continue;
    ssize_t r = read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r, n -= r;
  }
  return true;
}

bool send_msg(int fd, uint32_t type, const std::string& key, const bootstrap::Blob& blob) {
  uint32_t hdr[2] = {type, static_cast<uint32_t>(key.size())};
  uint64_t len = blob.size();
  return write_all(fd, hdr, sizeof hdr) && write_all(fd, &len, sizeof len) && write_all(fd, key.data(), key.size()) &&
         write_all(fd, blob.data(), blob.size());
}

bool recv_msg(int fd, uint32_t* type, std::string* key, bootstrap::Blob* blob, double deadline) {
  uint32_t hdr[2];
  uint64_t len = 0;
  if (!read_all(fd, hdr, sizeof hdr, deadline) || !read_all(fd, &len, sizeof len, deadline)) return false;
  if (hdr[1] > (1u << 20) || len > (1ull << 30)) return false;
  *type = hdr[0];
  key->resize(hdr[1]);
  blob->resize(len);
  return read_all(fd, &(*key)[0], hdr[1], deadline) && read_all(fd, blob->data(), len, deadline);
}

}  // namespace

bootstrap::RankInfo make_rank_info(int rank, int size, int ranks_per_node) {
  bootstrap::RankInfo ri;
  ri.rank = rank;
  ri.size = size;
  ri.local_rank = rank % ranks_per_node;
  ri.local_size = ranks_per_node;
  ri.node = rank / ranks_per_node;
  ri.num_nodes = (size + ranks_per_node - 1) / ranks_per_node;
  ri.hostname = "node" + std::to_string(ri.node);
  ri.nspace = "weft-test";
  return ri;
}

std::vector<Status> run_threads(int n, int ranks_per_node, const std::function<Status(bootstrap::Bootstrap&)>& body,
                                double timeout_s) {
  ThreadHub hub;
  hub.size = n;
  std::vector<Status> out(n, Status::kInternal);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      // Exchanges are numbered per bootstrap object, from 0 in each new one (test_bootstrap), so a
      // later test's bootstrap may reuse this one's storage.
      auto boot = std::make_unique<ThreadBootstrap>(&hub, make_rank_info(r, n, ranks_per_node), timeout_s);
      out[r] = body(*boot);
    });
  for (auto& t : threads) t.join();
  return out;
}

Status ForkBootstrap::allgather(const std::string& key, const bootstrap::Blob& mine,
                                std::vector<bootstrap::Blob>* all) {
  if (!send_msg(fd_, kAllgather, key, mine)) {
    WEFT_WARN(kBoot, "rank %d: test bootstrap: the parent is gone", info_.rank);
    return Status::kPeerFailed;
  }
  uint32_t type = 0;
  std::string text;
  bootstrap::Blob reply;
  if (!recv_msg(fd_, &type, &text, &reply, now_s() + timeout_s_)) {
    WEFT_WARN(kBoot, "rank %d: test bootstrap: no answer to allgather '%s' within %.0fs", info_.rank, key.c_str(),
              timeout_s_);
    return Status::kTimeout;
  }
  if (type == kError) {
    WEFT_WARN(kBoot, "rank %d: test bootstrap: allgather '%s': %s", info_.rank, key.c_str(), text.c_str());
    return Status::kPeerFailed;
  }
  // reply: n x (u64 length, bytes)
  all->assign(info_.size, {});
  size_t pos = 0;
  for (int r = 0; r < info_.size; ++r) {
    uint64_t len = 0;
    if (reply.size() - pos < sizeof len) return Status::kProtocolError;
    memcpy(&len, reply.data() + pos, sizeof len);
    pos += sizeof len;
    if (reply.size() - pos < len) return Status::kProtocolError;
    (*all)[r].assign(reply.begin() + pos, reply.begin() + pos + len);
    pos += len;
  }
  return Status::kOk;
}

Status ForkBootstrap::barrier(const std::string& tag) {
  std::vector<bootstrap::Blob> all;
  return allgather("barrier:" + tag, {}, &all);
}

void ForkBootstrap::abort(const std::string& why) {
  send_msg(fd_, kAbort, why, {});
  _exit(3);
}

void ForkBootstrap::report(const std::string& text) { send_msg(fd_, kReport, text, {}); }

std::vector<ForkResult> run_forked(int n, int ranks_per_node, const std::function<int(ForkBootstrap&)>& body,
                                   double timeout_s) {
  std::vector<ForkResult> res(n);
  std::vector<int> fds(n, -1);
  const double t0 = now_s();
  fflush(nullptr);
  for (int r = 0; r < n; ++r) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return res;
    pid_t pid = fork();
    if (pid == 0) {
      close(sv[0]);
      for (int q = 0; q < r; ++q) close(fds[q]);
      log::set_rank(r);
      ForkBootstrap boot(sv[1], make_rank_info(r, n, ranks_per_node), timeout_s);
      int rc = body(boot);
      fflush(nullptr);
      _exit(rc);
    }
    close(sv[1]);
    fds[r] = sv[0];
    res[r].rank = r;
    res[r].pid = pid;
  }

  struct Round {
    std::vector<bootstrap::Blob> blobs;
    std::vector<bool> have;
    int count = 0;
  };
  std::map<std::string, Round> rounds;
  std::vector<bool> gone(n, false);  // channel closed: exited or died
  int running = n;
  auto fail_rounds = [&]() {
    for (auto it = rounds.begin(); it != rounds.end();) {
      int dead = -1;
      for (int r = 0; r < n; ++r)
        if (gone[r] && !it->second.have[r]) dead = r;
      if (dead < 0) {
        ++it;
        continue;
      }
      std::string why = "rank " + std::to_string(dead) + " exited before joining '" + it->first + "'";
      for (int r = 0; r < n; ++r)
        if (it->second.have[r] && !gone[r]) send_msg(fds[r], kError, why, {});
      it = rounds.erase(it);
    }
  };
  // After the last exit, the channels still hold whatever the ranks sent just before: read on until
  // every channel reports EOF (bounded), or a report sent right before _exit would be lost.
  double all_exited_at = -1;
  auto any_open = [&] { return std::find(gone.begin(), gone.end(), false) != gone.end(); };
  while (running > 0 || (any_open() && now_s() - all_exited_at < 5.0)) {
    if (now_s() - t0 > timeout_s) {
      for (int r = 0; r < n; ++r)
        if (!res[r].exited && !res[r].term_signal) {
          kill(res[r].pid, SIGKILL);
          res[r].timed_out = true;
        }
    }
    std::vector<pollfd> pfs;
    std::vector<int> who;
    for (int r = 0; r < n; ++r)
      if (!gone[r]) pfs.push_back({fds[r], POLLIN, 0}), who.push_back(r);
    if (!pfs.empty()) ::poll(pfs.data(), pfs.size(), 20);
    for (size_t i = 0; i < pfs.size(); ++i) {
      if (!(pfs[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const int r = who[i];
      uint32_t type = 0;
      std::string key;
      bootstrap::Blob blob;
      if (!recv_msg(fds[r], &type, &key, &blob, now_s() + 5)) {
        gone[r] = true;
        continue;
      }
      if (type == kReport || type == kAbort) {
        res[r].report += (res[r].report.empty() ? "" : "\n") + key;
      } else if (type == kAllgather) {
        auto& rd = rounds[key];
        if (rd.have.empty()) rd.have.assign(n, false), rd.blobs.resize(n);
        if (!rd.have[r]) rd.have[r] = true, rd.blobs[r] = std::move(blob), ++rd.count;
        if (rd.count == n) {
          bootstrap::Blob reply;
          for (const auto& b : rd.blobs) {
            uint64_t len = b.size();
            const uint8_t* lp = reinterpret_cast<const uint8_t*>(&len);
            reply.insert(reply.end(), lp, lp + sizeof len);
            reply.insert(reply.end(), b.begin(), b.end());
          }
          for (int q = 0; q < n; ++q) send_msg(fds[q], kResult, key, reply);
          rounds.erase(key);
        }
      }
    }
    fail_rounds();
    int status = 0;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
      for (auto& x : res)
        if (x.pid == pid) {
          x.seconds = now_s() - t0;
          if (WIFEXITED(status)) x.exited = true, x.exit_code = WEXITSTATUS(status);
          if (WIFSIGNALED(status)) x.term_signal = WTERMSIG(status);
          --running;  // its channel reports EOF after any last messages
        }
    }
    if (pid < 0 && errno == ECHILD) running = 0;
    if (running == 0 && all_exited_at < 0) all_exited_at = now_s();
  }
  for (int fd : fds) close(fd);
  return res;
}

}  // namespace weft::testing
