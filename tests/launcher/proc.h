// Test helper: run a shell command as its own process group, capture stdout/stderr, bound its time.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace weft::testing {

struct ProcResult {
  int exit_code = -1;  // 128+sig when killed by a signal; -2 when it ran past the limit
  std::string out, err;
  double seconds = 0;
};

class Proc {
 public:
  // `cmd` runs under /bin/sh -c; prefix it with `exec` so that pid() is the program itself.
  explicit Proc(const std::string& cmd) {
    int o[2], e[2];
    if (pipe(o) || pipe(e)) abort();
    t0_ = std::chrono::steady_clock::now();
    pid_ = fork();
    if (pid_ == 0) {
      setpgid(0, 0);
      dup2(o[1], 1);
      dup2(e[1], 2);
      close(o[0]);
      close(e[0]);
      if (o[1] > 2) close(o[1]);  // else daemons started by the command would hold our pipes open
      if (e[1] > 2) close(e[1]);
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    setpgid(pid_, pid_);
    close(o[1]);
    close(e[1]);
    out_fd_ = o[0];
    err_fd_ = e[0];
  }
  ~Proc() {
    if (!done_) {
      kill(-pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (out_fd_ >= 0) close(out_fd_);
    if (err_fd_ >= 0) close(err_fd_);
  }
  pid_t pid() const { return pid_; }
  const std::string& out() const { return r_.out; }
  const std::string& err() const { return r_.err; }

  // Reads output for up to `seconds` or until `until` appears in stdout+stderr (if not empty).
  bool read_until(const std::string& until, double seconds) {
    auto deadline = t0_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(elapsed() + seconds));
    while (std::chrono::steady_clock::now() < deadline) {
      if (!until.empty() && (r_.out.find(until) != std::string::npos || r_.err.find(until) != std::string::npos))
        return true;
      if (!pump(50)) break;
    }
    return !until.empty() && (r_.out.find(until) != std::string::npos || r_.err.find(until) != std::string::npos);
  }

  // Waits for exit, at most `seconds`; past it, kills the group and reports exit_code -2.
  ProcResult wait(double seconds) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                           std::chrono::duration<double>(seconds));
    int st = 0;
    bool exited = false;
    while (std::chrono::steady_clock::now() < deadline) {
      pump(50);
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        exited = true;
        break;
      }
    }
    if (!exited) {
      kill(-pid_, SIGKILL);
      waitpid(pid_, &st, 0);
      r_.exit_code = -2;
    } else {
      r_.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    // Drain what is left; a background grandchild may keep a pipe open, so bound it.
    for (int i = 0; i < 40 && pump(50) && (out_fd_ >= 0 || err_fd_ >= 0); ++i) {
    }
    done_ = true;
    r_.seconds = elapsed();
    return r_;
  }

  double elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }

 private:
  // One poll round; false once both pipes are at EOF.
  bool pump(int ms) {
    struct pollfd fds[2] = {{out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}};
    int open_fds = (out_fd_ >= 0) + (err_fd_ >= 0);
    if (!open_fds) {
      if (ms) usleep(ms * 1000);
      return false;
    }
    if (poll(fds, 2, ms) <= 0) return true;
    char buf[4096];
    for (int i = 0; i < 2; ++i) {
      int& fd = i == 0 ? out_fd_ : err_fd_;
      if (fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP))) continue;
      ssize_t n = read(fd, buf, sizeof buf);
      if (n <= 0) {
        close(fd);
        fd = -1;
      } else {
        (i == 0 ? r_.out : r_.err).append(buf, n);
      }
    }
    return true;
  }

  pid_t pid_ = -1;
  int out_fd_ = -1, err_fd_ = -1;
  bool done_ = false;
  ProcResult r_;
  std::chrono::steady_clock::time_point t0_;
};

inline ProcResult run(const std::string& cmd, double seconds) { return Proc(cmd).wait(seconds); }

// Direct children of `pid` (Linux /proc), e.g. the ranks weftrun started.
inline std::vector<pid_t> children_of(pid_t pid) {
  std::vector<pid_t> out;
  std::ifstream f("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
  pid_t c;
  while (f >> c) out.push_back(c);
  return out;
}

// The value of `name` in a running process's environment ("" if absent).
inline std::string env_of(pid_t pid, const std::string& name) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  std::string entry;
  while (std::getline(f, entry, '\0'))
    if (entry.rfind(name + "=", 0) == 0) return entry.substr(name.size() + 1);
  return "";
}

inline bool alive(pid_t pid) {
  // A zombie is not running any more; only count real processes.
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return false;
  size_t p = line.rfind(')');
  return p != std::string::npos && p + 2 < line.size() && line[p + 2] != 'Z';
}

inline int count_lines_starting(const std::string& text, const std::string& prefix) {
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) n += line.rfind(prefix, 0) == 0;
  return n;
}

inline std::string last_line(const std::string& text) {
  std::istringstream in(text);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  return last;
}

// Tests that start Slurm daemons or network namespaces on this machine take turns: each holds this
// lock (the same file the developer scripts use) until the process exits. Waits at most `max_s`;
// false when another holder kept it that long.
inline bool hold_cluster_lock(double max_s) {
  static int fd = -1;
  if (fd >= 0) return true;
  int f = open("/tmp/weft-cluster.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (f < 0) return false;
  const auto t0 = std::chrono::steady_clock::now();
  while (flock(f, LOCK_EX | LOCK_NB) != 0) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > max_s) {
      close(f);
      return false;
    }
    usleep(200000);
  }
  fd = f;  // kept open: the lock lasts as long as the test process
  return true;
}

}  // namespace weft::testing
