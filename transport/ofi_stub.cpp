// The ofi backend where weft was built without libfabric: says so.
#include "base/log.h"
#include "transport/net_backend.h"

namespace weft::transport {

Status make_ofi_backend(const BackendConfig& config, std::unique_ptr<NetBackend>*) {
  WEFT_WARN(kNet, "rank %d: the ofi backend is not built (libfabric was not found when weft was configured)",
            config.rank);
  return Status::kUnsupported;
}

bool ofi_provider_present(const std::string&, std::string* why) {
  *why = "weft was built without libfabric";
  return false;
}

}  // namespace weft::transport
