// The ofi backend's ordering choice, test switches and wiring record (no libfabric here: built and tested everywhere).
#include "transport/ofi_plan.h"

#include <map>
#include <mutex>

namespace weft::transport {
namespace {

std::mutex g_switch_mutex;
OfiTestSwitches g_switches;
std::map<int, OfiWiring> g_wiring;  // by rank, under g_switch_mutex

}  // namespace

const char* to_string(OfiOrdering o) {
  switch (o) {
    case OfiOrdering::kFence:
      return "FI_FENCE";
    case OfiOrdering::kWriteOrder:
      return "provider write-after-write order";
    case OfiOrdering::kDelivery:
      return "delivery complete (serial)";
  }
  return "?";
}

OfiOrdering choose_ofi_ordering(const OfiOrderTraits& t) {
  if (t.fence) return OfiOrdering::kFence;
  if (t.write_after_write && t.max_order_waw_size > 0) return OfiOrdering::kWriteOrder;
  return OfiOrdering::kDelivery;
}

bool ofi_fence_usable(const std::string& prov_name) { return prov_name.substr(0, prov_name.find(';')) != "sockets"; }

bool ofi_put_needs_delivery(OfiOrdering o, const OfiOrderTraits& t, uint64_t bytes, bool proxy_waits) {
  if (o != OfiOrdering::kDelivery && t.write_after_write && bytes <= t.max_order_waw_size) return false;
  if (proxy_waits) return true;
  return o != OfiOrdering::kFence;
}

void set_ofi_test_switches(const OfiTestSwitches& s) {
  std::lock_guard<std::mutex> lock(g_switch_mutex);
  g_switches = s;
}

OfiTestSwitches ofi_test_switches() {
  std::lock_guard<std::mutex> lock(g_switch_mutex);
  return g_switches;
}

void add_ofi_wiring(int rank, const OfiWiring& more) {
  std::lock_guard<std::mutex> lock(g_switch_mutex);
  OfiWiring& w = g_wiring[rank];
  w.endpoints += more.endpoints;
  w.completion_queues += more.completion_queues;
  w.completion_entries += more.completion_entries;
  w.address_entries += more.address_entries;
  w.registrations += more.registrations;
  w.registered_bytes += more.registered_bytes;
  w.staging_bytes += more.staging_bytes;
  w.receives_posted += more.receives_posted;
  w.receive_bytes += more.receive_bytes;
}

OfiWiring ofi_wiring(int rank) {
  std::lock_guard<std::mutex> lock(g_switch_mutex);
  auto it = g_wiring.find(rank);
  return it == g_wiring.end() ? OfiWiring{} : it->second;
}

void reset_ofi_wiring() {
  std::lock_guard<std::mutex> lock(g_switch_mutex);
  g_wiring.clear();
}

}  // namespace weft::transport
