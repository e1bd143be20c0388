// ibverbs entry points for builds without libibverbs: the backend reports itself unavailable.
#include "base/log.h"
#include "transport/ibverbs_backend.h"
#include "transport/net_backend.h"

namespace weft::transport {

bool ibverbs_device_present(std::string* why) {
  *why = "weft was built without libibverbs";
  return false;
}

Status make_ibverbs_backend(const BackendConfig& config, std::unique_ptr<NetBackend>*, std::string* why) {
  WEFT_WARN(kNet, "rank %d: the ibverbs backend is not in this build (libibverbs was not found at configure time)",
            config.rank);
  if (why) *why = "the ibverbs backend is not in this build (libibverbs was not found at configure time)";
  return Status::kUnsupported;
}

Status make_ibverbs_backend(const BackendConfig& config, std::unique_ptr<NetBackend>* out) {
  return make_ibverbs_backend(config, out, nullptr);
}

void set_receiver_flush_off_for_testing(bool) {}

}  // namespace weft::transport
