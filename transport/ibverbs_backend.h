// The ibverbs backend's factory with the reason a device did not open (net_backend.h has the plain one).
#pragma once

#include <memory>
#include <string>

#include "transport/net_backend.h"

namespace weft::transport {

// As make_ibverbs_backend; on failure *why holds the message the backend logged (naming rank,
// channel, device and cause), so that a collective choice can tell every rank.
Status make_ibverbs_backend(const BackendConfig& config, std::unique_ptr<NetBackend>* out, std::string* why);

}  // namespace weft::transport
