// Implementation of netns_hosts.h: namespaces, veths and the bridge through `ip`, entered by setns.
#include "launcher/netns_hosts.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "base/log.h"

namespace weft::launcher {
namespace {

constexpr int kMaxNodes = 200;  // addresses .2 .. .201 of one /24

// Runs `ip ARGS`; false with its first line of output in *err when it fails.
bool ip(const std::string& args, std::string* err) {
  std::string cmd = "ip " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    *err = std::string("popen: ") + strerror(errno);
    return false;
  }
  char line[512] = "";
  std::string out;
  while (fgets(line, sizeof line, p))
    if (out.empty()) out = line;
  int st = pclose(p);
  if (st == 0) return true;
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  *err = "'ip " + args + "' failed" + (out.empty() ? "" : ": " + out);
  return false;
}

bool have_ip() { return system("command -v ip >/dev/null 2>&1") == 0; }

}  // namespace

Status NetnsHosts::create(int nodes, std::unique_ptr<NetnsHosts>* out, std::string* why) {
  if (nodes < 2 || nodes > kMaxNodes) {
    *why = "namespaces are made for 2 to " + std::to_string(kMaxNodes) + " emulated nodes";
    return Status::kInvalidArgument;
  }
  if (geteuid() != 0) {
    *why = "not root (creating network namespaces needs root)";
    return Status::kUnsupported;
  }
  if (!have_ip()) {
    *why = "no 'ip' command (apt-get install iproute2)";
    return Status::kUnsupported;
  }
  std::unique_ptr<NetnsHosts> self(new NetnsHosts());
  const int pid = static_cast<int>(getpid());
  self->bridge_ = "weftb" + std::to_string(pid);
  self->net_ = "198.19." + std::to_string(pid % 254 + 1);
  std::string err;
  auto fail = [&](const std::string& e) {
    *why = e;
    self->destroy();
    return Status::kSystemError;
  };
  if (!ip("link add " + self->bridge_ + " type bridge", &err)) return fail(err);
  if (!ip("addr add " + self->bridge_address() + "/24 dev " + self->bridge_, &err)) return fail(err);
  if (!ip("link set " + self->bridge_ + " up", &err)) return fail(err);
  for (int k = 0; k < nodes; ++k) {
    const std::string ns = "weft-e" + std::to_string(pid) + "-" + std::to_string(k);
    const std::string veth = "wv" + std::to_string(pid) + "_" + std::to_string(k);
    if (!ip("netns add " + ns, &err)) return fail(err);
    self->names_.push_back(ns);
    if (!ip("-n " + ns + " link set lo up", &err)) return fail(err);
    if (!ip("link add " + veth + " type veth peer name eth0 netns " + ns, &err)) return fail(err);
    if (!ip("link set " + veth + " master " + self->bridge_ + " up", &err)) return fail(err);
    if (!ip("-n " + ns + " addr add " + self->address(k) + "/24 dev eth0", &err)) return fail(err);
    if (!ip("-n " + ns + " link set eth0 up", &err)) return fail(err);
    int fd = open(("/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fail("cannot open /run/netns/" + ns + ": " + strerror(errno));
    self->fds_.push_back(fd);
  }
  WEFT_INFO(kLaunch, "%d emulated hosts in network namespaces weft-e%d-0..%d on bridge %s (%s)", nodes, pid, nodes - 1,
            self->bridge_.c_str(), self->bridge_address().c_str());
  *out = std::move(self);
  return Status::kOk;
}

bool NetnsHosts::enter(int ns_fd, const char* hostname) {
  if (setns(ns_fd, CLONE_NEWNET) != 0) return false;
  if (unshare(CLONE_NEWUTS) != 0) return false;
  return sethostname(hostname, strlen(hostname)) == 0;
}

void NetnsHosts::destroy() {
  std::string err;
  for (int fd : fds_) close(fd);
  fds_.clear();
  // Deleting a namespace deletes its end of the veth pair, and with it the pair.
  for (const auto& ns : names_)
    if (!ip("netns del " + ns, &err)) WEFT_WARN(kLaunch, "%s", err.c_str());
  names_.clear();
  if (!bridge_.empty()) ip("link del " + bridge_, &err);
  bridge_.clear();
}

NetnsHosts::~NetnsHosts() { destroy(); }

}  // namespace weft::launcher
