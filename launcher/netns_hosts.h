// Emulated nodes as separate hosts for weftrun's own launcher: one network namespace each, on a bridge.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/status.h"

namespace weft::launcher {

// With WEFT_EMULATE_NETNS=on and --emulate-nodes K > 1, node k's ranks run in a network namespace
// of their own (loopback up, a veth pair to a bridge in weftrun's namespace, address 198.19.N.(k+2)/24
// from the benchmarking range, N from weftrun's pid) and a UTS namespace named after the node, so
// they reach each other only through the bridge and a real network stack. The embedded PMIx server
// listens on the bridge's address (198.19.N.1). Everything is created with `ip` before the ranks
// start and deleted when weftrun ends (the namespaces and veths, the bridge).
class NetnsHosts {
 public:
  // Creates `nodes` namespaces and the bridge. On failure (not root, no `ip`, a kernel that refuses)
  // returns an error and *why says what was missing, in one phrase; nothing is left behind.
  static Status create(int nodes, std::unique_ptr<NetnsHosts>* out, std::string* why);
  ~NetnsHosts();

  const std::string& bridge() const { return bridge_; }
  std::string bridge_address() const { return net_ + ".1"; }
  std::string address(int node) const { return net_ + "." + std::to_string(node + 2); }
  const std::string& name(int node) const { return names_[node]; }
  // An fd on /run/netns/<name> of node `node` (for setns in the forked rank), kept open.
  int fd(int node) const { return fds_[node]; }
  // setns + a UTS namespace named `hostname`: async-signal-safe, for the child between fork and exec.
  // Returns false if any step failed.
  static bool enter(int ns_fd, const char* hostname);

  NetnsHosts(const NetnsHosts&) = delete;
  NetnsHosts& operator=(const NetnsHosts&) = delete;

 private:
  NetnsHosts() = default;
  void destroy();
  std::string bridge_, net_;
  std::vector<std::string> names_;
  std::vector<int> fds_;
};

}  // namespace weft::launcher
