// Implementation of node_exchange.h: the checked, flock-owned same-host exchange folder.
#include "bootstrap/node_exchange.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "base/log.h"
#include "bootstrap/blob.h"

namespace weft::bootstrap {
namespace {

constexpr const char* kLockName = "lock";  // keys never produce it: every file name ends in ".<rank>"
constexpr const char* kNewMark = ".new.";  // a folder being set up under a private name
constexpr double kJoinTimeoutS = 5.0;      // bound on waiting for a cleaner's exclusive lock to go

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string safe(const std::string& key) {
  std::string out;
  for (char c : key) out += (isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-') ? c : '_';
  return out;
}

std::string base_dir() {
  if (access("/dev/shm", W_OK) == 0) return "/dev/shm";
  const char* t = getenv("TMPDIR");
  return t && *t ? t : "/tmp";
}

std::string prefix() { return "weft-" + std::to_string(geteuid()) + "-"; }

// Why the folder open as `fd` is not ours to use, or "" when it is.
std::string not_ours(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return std::string("fstat: ") + strerror(errno);
  if (!S_ISDIR(st.st_mode)) return "not a directory";
  if (st.st_uid != geteuid())
    return "owned by uid " + std::to_string(st.st_uid) + ", not this user (" + std::to_string(geteuid()) + ")";
  if ((st.st_mode & 07777) != 0700) {
    char m[16];
    snprintf(m, sizeof m, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return std::string("mode ") + m + ", not 0700";
  }
  return "";
}

// Empties the folder open as `dir_fd` (files only: we never make subfolders), the lock last.
void remove_contents(int dir_fd) {
  int fd = dup(dir_fd);
  DIR* d = fd >= 0 ? fdopendir(fd) : nullptr;
  if (!d) {
    if (fd >= 0) close(fd);
    return;
  }
  std::vector<std::string> names;
  while (struct dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != ".." && n != kLockName) names.push_back(n);
  }
  closedir(d);
  for (const auto& n : names) unlinkat(dir_fd, n.c_str(), 0);
  unlinkat(dir_fd, kLockName, 0);
}

// True when `path` still names the folder open as `dir_fd` (not replaced since we opened it).
bool same_dir(const std::string& path, int dir_fd) {
  struct stat a {
  }, b{};
  return lstat(path.c_str(), &a) == 0 && fstat(dir_fd, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// Exchanges still open at exit(): their last member must still remove the folder.
std::mutex g_open_mu;
std::vector<NodeExchange*> g_open;

void leave_all_at_exit() {
  std::vector<NodeExchange*> open;
  {
    std::lock_guard<std::mutex> g(g_open_mu);
    open = g_open;
  }
  for (NodeExchange* x : open) x->leave();
}

}  // namespace

std::string NodeExchange::job_dir(const std::string& nspace, const char* (*env)(const char*, void*), void* ctx,
                                  const std::string& host) {
  // The server's URI (address, port, pid) makes the folder unique to this job's server instance.
  std::string id = nspace;
  if (host.empty()) {
    char h[256] = "";
    gethostname(h, sizeof h - 1);
    id += "@" + std::string(h);
  } else {
    id += "@" + host;
  }
  for (const char* v : {"PMIX_SERVER_URI41", "PMIX_SERVER_URI4", "PMIX_SERVER_URI3", "PMIX_SERVER_URI2"})
    if (const char* u = env(v, ctx)) {
      id += u;
      break;
    }
  char hash[32];
  snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(fnv1a(id)));
  return base_dir() + "/" + prefix() + hash;
}

int NodeExchange::remove_stale(const std::string& base) {
  DIR* d = opendir(base.c_str());
  if (!d) return 0;
  const std::string mine = prefix();
  std::vector<std::string> candidates;
  while (struct dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n.compare(0, mine.size(), mine) == 0) candidates.push_back(n);
  }
  closedir(d);
  int removed = 0;
  for (const auto& n : candidates) {
    const std::string path = base + "/" + n;
    int dir_fd = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dir_fd < 0) continue;  // a symlink or something else: not ours to judge
    if (!not_ours(dir_fd).empty()) {
      close(dir_fd);
      continue;
    }
    int lock_fd = openat(dir_fd, kLockName, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    bool stale = false;
    if (lock_fd >= 0) {
      stale = flock(lock_fd, LOCK_EX | LOCK_NB) == 0;  // no member holds it
    } else {
      // A published folder always has its lock (it is made before the rename that publishes the
      // folder, and removed last); one being set up may not have it yet.
      stale = errno == ENOENT && n.find(kNewMark) == std::string::npos;
    }
    if (stale && same_dir(path, dir_fd)) {
      remove_contents(dir_fd);
      if (rmdir(path.c_str()) == 0) ++removed;
    }
    if (lock_fd >= 0) close(lock_fd);
    close(dir_fd);
  }
  if (removed)
    WEFT_INFO(kBoot, "removed %d stale node-exchange folder(s) of killed ranks under %s", removed, base.c_str());
  return removed;
}

Status NodeExchange::join(int* dir_fd, int* lock_fd, std::string* why) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(kJoinTimeoutS);
  while (std::chrono::steady_clock::now() < deadline) {
    int dfd = open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0 && errno == ENOENT) {
      // Set the folder up under a private name, lock held, then publish it by rename: no one
      // ever sees the folder under its real name without a held lock.
      const std::string tmp = dir_ + kNewMark + std::to_string(getpid()) + "." + std::to_string(rank_);
      if (mkdir(tmp.c_str(), 0700) != 0) return *why = std::string("mkdir: ") + strerror(errno), Status::kSystemError;
      int tfd = open(tmp.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      int lfd = tfd < 0 ? -1 : openat(tfd, kLockName, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
      if (tfd < 0 || lfd < 0 || fchmod(tfd, 0700) != 0 || flock(lfd, LOCK_SH) != 0) {
        *why = std::string("setting up ") + tmp + ": " + strerror(errno);
        if (lfd >= 0) close(lfd);
        if (tfd >= 0) unlinkat(tfd, kLockName, 0), close(tfd);
        rmdir(tmp.c_str());
        return Status::kSystemError;
      }
      if (rename(tmp.c_str(), dir_.c_str()) == 0) {
        *dir_fd = tfd;
        *lock_fd = lfd;
        return Status::kOk;
      }
      // Another rank published it first: join theirs.
      close(lfd);
      unlinkat(tfd, kLockName, 0);
      close(tfd);
      rmdir(tmp.c_str());
      continue;
    }
    if (dfd < 0) {
      *why = errno == ELOOP || errno == ENOTDIR ? std::string("a symlink or not a directory")
                                                : std::string("open: ") + strerror(errno);
      return Status::kUnsupported;
    }
    std::string bad = not_ours(dfd);
    if (!bad.empty()) {
      close(dfd);
      *why = bad;
      return Status::kUnsupported;
    }
    int lfd = openat(dfd, kLockName, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    struct stat ls {};
    if (lfd >= 0 && (fstat(lfd, &ls) != 0 || !S_ISREG(ls.st_mode) || ls.st_uid != geteuid())) {
      close(lfd);
      close(dfd);
      *why = "its lock is not a regular file of this user";
      return Status::kUnsupported;
    }
    // A cleaner holds the lock exclusively only while it removes a stale folder: wait it out, then
    // check the lock and folder are still the ones published (else start over).
    bool locked = false;
    while (lfd >= 0 && !(locked = flock(lfd, LOCK_SH | LOCK_NB) == 0) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    struct stat now {};
    if (locked && fstatat(dfd, kLockName, &now, AT_SYMLINK_NOFOLLOW) == 0 && now.st_ino == ls.st_ino &&
        same_dir(dir_, dfd)) {
      *dir_fd = dfd;
      *lock_fd = lfd;
      return Status::kOk;
    }
    if (lfd >= 0) close(lfd);
    close(dfd);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  *why = "could not join it within " + std::to_string(static_cast<int>(kJoinTimeoutS)) + " s";
  return Status::kTimeout;
}

Status NodeExchange::init(const std::string& nspace, int rank) {
  rank_ = rank;
  dir_ = job_dir(
      nspace, [](const char* name, void*) -> const char* { return getenv(name); }, nullptr);
  remove_stale(base_dir());
  std::string why;
  Status s = join(&dir_fd_, &lock_fd_, &why);
  if (s != Status::kOk) {
    WEFT_WARN(kBoot, "rank %d: not using %s for the same-host exchange (%s); using the PMIx exchange alone", rank,
              dir_.c_str(), why.c_str());
    dir_.clear();
    return s;
  }
  static std::once_flag once;
  std::call_once(once, [] { atexit(leave_all_at_exit); });
  std::lock_guard<std::mutex> g(g_open_mu);
  g_open.push_back(this);
  return Status::kOk;
}

std::string NodeExchange::name(const std::string& key, int rank) const {
  return safe(key) + "." + std::to_string(rank);
}

Status NodeExchange::publish(const std::string& key, const Blob& sealed) {
  if (dir_fd_ < 0) return Status::kInternal;
  const std::string final_name = name(key, rank_), tmp = final_name + ".tmp";
  // O_EXCL: a name planted in the folder (even by this user) is removed, never written through.
  int fd = openat(dir_fd_, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0 && errno == EEXIST && unlinkat(dir_fd_, tmp.c_str(), 0) == 0)
    fd = openat(dir_fd_, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  bool ok = fd >= 0;
  size_t done = 0;
  while (ok && done < sealed.size()) {
    ssize_t n = write(fd, sealed.data() + done, sealed.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += size_t(n);
  }
  if (fd >= 0) ok = (close(fd) == 0) && ok;
  if (!ok || renameat(dir_fd_, tmp.c_str(), dir_fd_, final_name.c_str()) != 0) {
    WEFT_WARN(kBoot, "rank %d: cannot write %s/%s: %s", rank_, dir_.c_str(), final_name.c_str(), strerror(errno));
    unlinkat(dir_fd_, tmp.c_str(), 0);
    return Status::kSystemError;
  }
  published_.push_back(key);
  return Status::kOk;
}

bool NodeExchange::fetch(const std::string& key, int peer, Blob* sealed) const {
  if (dir_fd_ < 0) return false;
  int fd = openat(dir_fd_, name(key, peer).c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  // A put entry is a sealed blob around a sealed blob: at most two headers and a rank past the cap.
  constexpr size_t kMaxFile = kMaxBlobBytes + 2 * kBlobHeaderBytes + 8;
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
      static_cast<uint64_t>(st.st_size) > kMaxFile) {
    WEFT_WARN(kBoot, "rank %d: ignoring %s/%s (not a regular file of this user of at most %zu bytes)", rank_,
              dir_.c_str(), name(key, peer).c_str(), kMaxFile);
    close(fd);
    return false;
  }
  sealed->assign(static_cast<size_t>(st.st_size), 0);
  size_t got = 0;
  while (got < sealed->size()) {
    ssize_t n = read(fd, sealed->data() + got, sealed->size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  close(fd);
  sealed->resize(got);  // a short file fails the blob's own length check
  return true;
}

void NodeExchange::retire_all_but(const std::string& keep) {
  std::vector<std::string> still;
  for (const auto& k : published_) {
    if (k == keep)
      still.push_back(k);
    else if (dir_fd_ >= 0)
      unlinkat(dir_fd_, name(k, rank_).c_str(), 0);
  }
  published_.swap(still);
}

void NodeExchange::leave() {
  {
    std::lock_guard<std::mutex> g(g_open_mu);
    g_open.erase(std::remove(g_open.begin(), g_open.end(), this), g_open.end());
  }
  if (dir_fd_ < 0) return;
  // Deleting this rank's last files here raced with slower peers still reading them (they then fell
  // back to a PMIx get of an exited rank's data, which does not answer on libpmix 4's hash store).
  // So only the last member removes anything: after dropping our shared lock, an exclusive one is
  // granted only when no member is left (of two leaving at once, at least one gets it).
  flock(lock_fd_, LOCK_UN);
  if (flock(lock_fd_, LOCK_EX | LOCK_NB) == 0 && same_dir(dir_, dir_fd_)) {
    remove_contents(dir_fd_);
    rmdir(dir_.c_str());
  }
  close(lock_fd_);
  close(dir_fd_);
  lock_fd_ = dir_fd_ = -1;
}

NodeExchange::~NodeExchange() { leave(); }

}  // namespace weft::bootstrap
