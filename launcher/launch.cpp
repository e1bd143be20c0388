// The launcher loop: fork/exec ranks, serve them, reap them, and stop everything on the first failure.
#include "launcher/launch.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

#include "base/log.h"
#include "base/params.h"
#include "bootstrap/node_exchange.h"
#include "launcher/netns_hosts.h"
#include "launcher/pmix_server.h"

extern char** environ;

namespace weft::launcher {
namespace {

using Clock = std::chrono::steady_clock;

int g_sig_pipe[2] = {-1, -1};
volatile sig_atomic_t g_interrupts = 0;
volatile sig_atomic_t g_last_signal = 0;

void on_signal(int sig) {
  int saved = errno;
  if (sig != SIGCHLD) {
    g_interrupts = g_interrupts + 1;
    g_last_signal = sig;
  }
  char c = static_cast<char>(sig);
  (void)!write(g_sig_pipe[1], &c, 1);
  errno = saved;
}

struct Child {
  pid_t pid = -1;
  bool running = false;
  int status = 0;
};

std::string describe_exit(int status, bool finalized) {
  char buf[160];
  if (WIFSIGNALED(status))
    snprintf(buf, sizeof buf, "was killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
  else if (WEXITSTATUS(status) != 0)
    snprintf(buf, sizeof buf, "exited with status %d", WEXITSTATUS(status));
  else if (!finalized)
    snprintf(buf, sizeof buf, "exited with status 0 before finishing (it never called PMIx_Finalize)");
  else
    snprintf(buf, sizeof buf, "exited normally");
  return buf;
}

bool failed_exit(int status, bool finalized) { return WIFSIGNALED(status) || WEXITSTATUS(status) != 0 || !finalized; }

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep))
    if (!item.empty()) out.push_back(item);
  return out;
}

}  // namespace

std::string gpu_slice_for_node(int node, int nodes, int gpus, const std::string& visible) {
  if (nodes <= 1 || gpus < nodes) return "";
  std::vector<std::string> ids = split(visible, ',');
  if (ids.empty())
    for (int i = 0; i < gpus; ++i) ids.push_back(std::to_string(i));
  int n = std::min<int>(gpus, static_cast<int>(ids.size()));
  int lo = node * n / nodes, hi = (node + 1) * n / nodes;
  std::string out;
  for (int i = lo; i < hi; ++i) out += (out.empty() ? "" : ",") + ids[i];
  return out;
}

Status check_launch(const LaunchOptions& o, bool rank_per_gpu, std::string* why) {
  const int r = o.ranks, k = o.nodes, g = o.gpus;
  if (r < 1 || r > kMaxRanks) {
    *why = std::to_string(r) + " ranks: expected 1 to " + std::to_string(kMaxRanks);
    return Status::kInvalidArgument;
  }
  if (k < 1 || k > r) {
    *why = "cannot place " + std::to_string(r) + " rank" + (r == 1 ? "" : "s") + " on " + std::to_string(k) +
           " emulated nodes: expected 1 to " + std::to_string(r) + " nodes (every node needs a rank)";
    return Status::kInvalidArgument;
  }
  if (!rank_per_gpu || g <= 0) return Status::kOk;
  const std::string per = std::to_string((r + k - 1) / k) + " GPUs per node";
  if (r > g) {
    *why = "needs " + (k > 1 ? per + " on " + std::to_string(k) + " emulated nodes, " : per + ", ") +
           std::to_string(r) + " in all; this machine has " + std::to_string(g) + " (a GPU of its own for every rank)";
    return Status::kInvalidArgument;
  }
  // Ranks go to the first nodes first (make_layout), GPU slices grow towards the last nodes.
  for (int node = 0; node < k && k > 1; ++node) {
    const int ranks_here = r / k + (node < r % k ? 1 : 0);
    const int gpus_here = (node + 1) * g / k - node * g / k;
    if (ranks_here > gpus_here) {
      *why = "needs " + std::to_string(ranks_here) + " GPUs on emulated node " + std::to_string(node) + " of " +
             std::to_string(k) + ", which gets " + std::to_string(gpus_here) + " of this machine's " +
             std::to_string(g) + " (make the rank count a multiple of the node count)";
      return Status::kInvalidArgument;
    }
  }
  return Status::kOk;
}

int launch_ranks(const LaunchOptions& o) {
  // The command named in messages is the subcommand the user gave (the ranks get the same line).
  std::string command = "weftrun";
  for (const auto& a : o.rank_args)
    if (!a.empty() && a[0] != '-') {
      command += " " + a;
      break;
    }
  std::string why;
  if (check_launch(o, /*rank_per_gpu=*/false, &why) != Status::kOk) {
    fprintf(stderr, "%s: %s\n", command.c_str(), why.c_str());
    return 2;
  }
  double grace = 5;
  if (get_param("WEFT_LAUNCH_KILL_GRACE", &grace) != Status::kOk) return 2;
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  JobLayout layout;
  if (make_layout(o.ranks, o.nodes, host, &layout) != Status::kOk) return 2;

  if (pipe2(g_sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    WEFT_WARN(kLaunch, "pipe2 failed: %s", strerror(errno));
    return 1;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  struct sigaction old[4];
  const int sigs[4] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP};
  for (int i = 0; i < 4; ++i) sigaction(sigs[i], &sa, &old[i]);
  // libpmix writes to the socket of a rank that just died; that must not kill the launcher.
  struct sigaction ign, old_pipe;
  memset(&ign, 0, sizeof ign);
  ign.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ign, &old_pipe);
  auto restore = [&] {
    sigaction(SIGPIPE, &old_pipe, nullptr);
    for (int i = 0; i < 4; ++i) sigaction(sigs[i], &old[i], nullptr);
    close(g_sig_pipe[0]);
    close(g_sig_pipe[1]);
  };

  // Emulated nodes as hosts of their own (WEFT_EMULATE_NETNS=on), when this machine lets us.
  std::unique_ptr<NetnsHosts> hosts;
  std::string netns_mode = "off";
  if (get_param("WEFT_EMULATE_NETNS", &netns_mode) != Status::kOk) return 2;
  if (netns_mode == "on" && o.nodes > 1) {
    std::string no;
    if (NetnsHosts::create(o.nodes, &hosts, &no) != Status::kOk)
      fprintf(stderr, "%s: WEFT_EMULATE_NETNS=on: the %d emulated nodes share this host's network, no namespaces: %s\n",
              command.c_str(), o.nodes, no.c_str());
    else
      fprintf(stderr, "%s: %d emulated nodes in network namespaces, addresses %s..%s, PMIx server on %s\n",
              command.c_str(), o.nodes, hosts->address(0).c_str(), hosts->address(o.nodes - 1).c_str(),
              hosts->bridge_address().c_str());
  }

  std::unique_ptr<EmbeddedServer> server;
  if (EmbeddedServer::start(layout, &server, hosts ? hosts->bridge() : "") != Status::kOk) {
    restore();
    return 1;
  }

  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) {
    WEFT_WARN(kLaunch, "cannot find weftrun's own executable (/proc/self/exe): %s", strerror(errno));
    restore();
    return 1;
  }
  exe[n] = 0;
  std::vector<std::string> base;
  for (char** e = environ; *e; ++e)
    if (strncmp(*e, "CUDA_VISIBLE_DEVICES=", 21)) base.push_back(*e);
  const char* visible = getenv("CUDA_VISIBLE_DEVICES");
  // A job across (emulated) nodes loads every kernel when CUDA starts, unless the user chose: with
  // lazy loading (CUDA's default) a rank's first launch of a kernel while an op across nodes is in
  // flight waits for the device to go idle, while the proxy's staging copies wait behind that load:
  // a deadlock (transport/cuda_transport.h, preload_kernels). weft cannot preload a program's own
  // kernels. One node keeps CUDA's default (eager loading costs a framework seconds at start).
  if (o.nodes > 1 && !getenv("CUDA_MODULE_LOADING")) base.push_back("CUDA_MODULE_LOADING=EAGER");
  // And the most hardware work queues (CUDA's default is 8): streams beyond them share a queue, and a
  // proxy's copy queued behind a kernel that waits for that proxy never runs (the MoE op across
  // nodes with 4 proxy channels stalled so on 2 H200s until this was raised).
  if (o.nodes > 1 && !getenv("CUDA_DEVICE_MAX_CONNECTIONS")) base.push_back("CUDA_DEVICE_MAX_CONNECTIONS=32");

  std::vector<Child> kids(o.ranks);
  std::string cause;  // the first failure, as printed
  int exit_code = 0;
  Clock::time_point stop_at{}, term_at{}, kill_at{};
  bool stopping = false, termed = false, killed = false;
  pid_t pgid = 0;
  pid_t launcher = getpid();

  auto begin_stop = [&](const std::string& why, bool polite) {
    if (!cause.empty()) return;
    cause = why;
    exit_code = 1;
    stopping = true;
    stop_at = Clock::now();
    auto g = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace));
    // After a rank failure the others were told through PMIx: give them a moment to report it and
    // exit on their own, then SIGTERM, then SIGKILL `grace` later. After Ctrl-C: SIGTERM at once.
    auto notice = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(std::min(grace, 1.0)));
    term_at = polite ? stop_at + notice : stop_at;
    kill_at = term_at + g;
  };

  // Register every rank before starting any: libpmix holds a get for a peer's data until the whole
  // namespace is registered, so registering rank by rank would only slow the first exchange.
  std::vector<std::vector<std::string>> envs(o.ranks);
  std::vector<std::string> slices(o.ranks);
  for (int r = 0; r < o.ranks; ++r) {
    std::vector<std::string> b = base;
    slices[r] = gpu_slice_for_node(layout.node_of[r], o.nodes, o.gpus, visible ? visible : "");
    if (!slices[r].empty())
      b.push_back("CUDA_VISIBLE_DEVICES=" + slices[r]);
    else if (visible)
      b.push_back(std::string("CUDA_VISIBLE_DEVICES=") + visible);
    if (server->client_env(r, b, &envs[r]) != Status::kOk) {
      server.reset();
      restore();
      return 1;
    }
  }
  for (int r = 0; r < o.ranks && cause.empty(); ++r) {
    std::vector<std::string>& env_s = envs[r];
    const std::string& slice = slices[r];
    std::vector<char*> argv{exe};
    for (const auto& a : o.rank_args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    std::vector<char*> envp;
    for (auto& e : env_s) envp.push_back(e.data());
    envp.push_back(nullptr);
    const int ns_fd = hosts ? hosts->fd(layout.node_of[r]) : -1;
    const char* ns_host = layout.hostname_of_node[layout.node_of[r]].c_str();
    pid_t pid = fork();
    if (pid == 0) {
      if (ns_fd >= 0 && !NetnsHosts::enter(ns_fd, ns_host)) _exit(126);
      // Only async-signal-safe calls until exec. Ranks share one process group (so a stray
      // grandchild is reached too) and die with the launcher even if it is SIGKILLed.
      setpgid(0, pgid);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != launcher) _exit(127);
      int devnull = open("/dev/null", O_RDONLY);
      if (devnull >= 0) dup2(devnull, 0);
      signal(SIGPIPE, SIG_DFL);  // ignored dispositions survive exec
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      execve(exe, argv.data(), envp.data());
      _exit(127);
    }
    if (pid < 0) {
      WEFT_WARN(kLaunch, "fork for rank %d failed: %s", r, strerror(errno));
      begin_stop("could not start rank " + std::to_string(r), false);
      break;
    }
    setpgid(pid, pgid);  // also here: whichever runs first wins the race
    if (!pgid) pgid = pid;
    kids[r].pid = pid;
    kids[r].running = true;
    WEFT_INFO(kLaunch, "rank %d: pid %d on node %d (%s), local rank %d%s%s", r, pid, layout.node_of[r],
              layout.hostname_of_node[layout.node_of[r]].c_str(), layout.local_rank_of[r],
              slice.empty() ? "" : ", CUDA_VISIBLE_DEVICES=", slice.c_str());
  }

  int interrupts_seen = 0;
  while (true) {
    int live = 0;
    for (auto& k : kids) live += k.running;
    if (live == 0) break;
    struct pollfd fds[2] = {{g_sig_pipe[0], POLLIN, 0}, {server->wake_fd(), POLLIN, 0}};
    poll(fds, 2, 100);
    char buf[64];
    while (read(g_sig_pipe[0], buf, sizeof buf) > 0) {
    }
    server->run_pending();

    AbortRequest a;
    while (server->take_abort(&a)) {
      fprintf(stderr, "weftrun: rank %d aborted the job (status %d): %s\n", a.rank, a.status, a.message.c_str());
      server->notify_rank_failed(a.rank, a.status ? a.status : 1, "aborted: " + a.message);
      begin_stop("rank " + std::to_string(a.rank) + " aborted: " + a.message, true);
    }
    for (int r = 0; r < o.ranks; ++r) {
      Child& k = kids[r];
      if (!k.running) continue;
      int st = 0;
      pid_t got = waitpid(k.pid, &st, WNOHANG);
      if (got != k.pid) continue;
      k.running = false;
      k.status = st;
      bool fin = server->finalized(r);
      if (!failed_exit(st, fin)) continue;
      std::string what = describe_exit(st, fin);
      if (cause.empty()) {
        fprintf(stderr, "weftrun: rank %d (pid %d, node %d %s) %s; stopping the job\n", r, k.pid, layout.node_of[r],
                layout.hostname_of_node[layout.node_of[r]].c_str(), what.c_str());
        server->notify_rank_failed(r, WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), what);
        begin_stop("rank " + std::to_string(r) + " " + what, true);
      } else if (!(termed && WIFSIGNALED(st))) {
        fprintf(stderr, "weftrun: rank %d %s\n", r, what.c_str());
      }
    }
    if (g_interrupts > interrupts_seen) {
      interrupts_seen = g_interrupts;
      int sig = g_last_signal;
      if (cause.empty()) {
        fprintf(stderr, "weftrun: %s received; stopping %d ranks\n", strsignal(sig), live);
        begin_stop(std::string("interrupted by ") + strsignal(sig), false);
        exit_code = 128 + sig;
      } else if (interrupts_seen > 1) {
        kill_at = Clock::now();  // a second Ctrl-C: no more grace
      }
    }
    if (stopping) {
      auto now = Clock::now();
      if (!termed && now >= term_at) {
        termed = true;
        for (auto& k : kids)
          if (k.running) kill(k.pid, SIGTERM);
      }
      if (!killed && now >= kill_at) {
        killed = true;
        for (int r = 0; r < o.ranks; ++r)
          if (kids[r].running) {
            fprintf(stderr, "weftrun: rank %d (pid %d) ignored SIGTERM for %.1f s; SIGKILL\n", r, kids[r].pid, grace);
            kill(kids[r].pid, SIGKILL);
          }
      }
    }
  }
  // Ranks that died could not remove their node-local exchange folder (bootstrap/node_exchange.h).
  if (!envs.empty()) {
    auto lookup = [](const char* name, void* ctx) -> const char* {
      const std::string prefix = std::string(name) + "=";
      for (const auto& e : *static_cast<std::vector<std::string>*>(ctx))
        if (e.compare(0, prefix.size(), prefix) == 0) return e.c_str() + prefix.size();
      return nullptr;
    };
    std::error_code ec;
    if (!hosts) std::filesystem::remove_all(bootstrap::NodeExchange::job_dir(server->nspace(), lookup, &envs[0]), ec);
    for (int k = 0; hosts && k < o.nodes; ++k)  // one folder per emulated host (its own hostname)
      std::filesystem::remove_all(
          bootstrap::NodeExchange::job_dir(server->nspace(), lookup, &envs[0], layout.hostname_of_node[k]), ec);
  }
  if (!cause.empty()) {
    double took = std::chrono::duration<double>(Clock::now() - stop_at).count();
    fprintf(stderr, "weftrun: job failed: %s (all %d ranks stopped %.1f s later)\n", cause.c_str(), o.ranks, took);
  }
  fflush(stdout);
  fflush(stderr);
  // Every rank is gone. Shutting the PMIx server down must not hang the exit either (a progress
  // thread wedged by a killed client would): bound it, and leave without it if it does not return.
  std::mutex mu;
  std::condition_variable cv;
  bool finalized = false;
  std::thread([&] {
    server.reset();
    std::lock_guard<std::mutex> lock(mu);
    finalized = true;
    cv.notify_all();
  }).detach();
  {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, std::chrono::seconds(10), [&] { return finalized; })) {
      fprintf(stderr, "weftrun: the PMIx server did not shut down within 10 s; exiting without it\n");
      _exit(exit_code ? exit_code : 1);
    }
  }
  restore();
  return exit_code;
}

}  // namespace weft::launcher

namespace weft::launcher {

std::vector<std::string> own_args() {
  std::vector<std::string> out;
  FILE* f = fopen("/proc/self/cmdline", "rb");
  if (!f) return out;
  std::string cur;
  int c;
  while ((c = fgetc(f)) != EOF) {
    if (c == 0) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(static_cast<char>(c));
    }
  }
  fclose(f);
  if (!out.empty()) out.erase(out.begin());
  return out;
}

int default_rank_count(int gpus, int nodes) { return std::max({1, gpus, nodes}); }

}  // namespace weft::launcher
