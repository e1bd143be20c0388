// The ofi backend's ordering choice and test switches (no libfabric here: built and tested everywhere).
#include "transport/ofi_plan.h"

#include <mutex>

namespace weft::transport {
namespace {

std::mutex g_switch_mutex;
OfiTestSwitches g_switches;

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

}  // namespace weft::transport
