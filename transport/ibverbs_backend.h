// The ibverbs backend's factory with the reason a device did not open (net_backend.h has the plain one).
#pragma once

#include <memory>
#include <string>

#include "transport/net_backend.h"

namespace weft::transport {

// As make_ibverbs_backend; on failure *why holds the message the backend logged (naming rank,
// channel, device and cause), so that a collective choice can tell every rank.
Status make_ibverbs_backend(const BackendConfig& config, std::unique_ptr<NetBackend>* out, std::string* why);

// Tests only: backends registered afterwards keep signals as RDMA WRITEs even where the GPU heap's
// ordering asks for the receiver-side flush (to show what that flush prevents). Not a parameter.
void set_receiver_flush_off_for_testing(bool off);

}  // namespace weft::transport
