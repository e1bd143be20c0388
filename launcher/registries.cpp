// The op-runner and check-transport registries (plain maps; filled once before ranks start work).
#include <map>
#include <mutex>

#include "launcher/check_hooks.h"
#include "launcher/op_registry.h"

namespace weft::launcher {
namespace {

std::mutex g_mu;
std::map<std::string, OpRunner>& ops() {
  static std::map<std::string, OpRunner> m;
  return m;
}
std::map<std::string, CheckTransportFn>& checks() {
  static std::map<std::string, CheckTransportFn> m;
  return m;
}
template <typename M>
std::vector<std::string> keys(const M& m) {
  std::vector<std::string> out;
  for (const auto& kv : m) out.push_back(kv.first);
  return out;
}

}  // namespace

void register_op(const std::string& op, OpRunner runner) {
  std::lock_guard<std::mutex> lock(g_mu);
  ops()[op] = runner;
}
OpRunner find_op(const std::string& op) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = ops().find(op);
  return it == ops().end() ? nullptr : it->second;
}
std::vector<std::string> registered_ops() {
  std::lock_guard<std::mutex> lock(g_mu);
  return keys(ops());
}

void register_check_transport(const std::string& name, CheckTransportFn fn) {
  std::lock_guard<std::mutex> lock(g_mu);
  checks()[name] = fn;
}
CheckTransportFn find_check_transport(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = checks().find(name);
  return it == checks().end() ? nullptr : it->second;
}
std::vector<std::string> check_transport_names() {
  std::lock_guard<std::mutex> lock(g_mu);
  return keys(checks());
}

}  // namespace weft::launcher
