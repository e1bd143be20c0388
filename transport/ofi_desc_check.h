// Test-only: a checking shim over a real provider's endpoint. With FI_MR_LOCAL every local buffer
// weft hands libfabric (a write's source, a send, a receive) must come with the descriptor of a
// registration that covers it; providers that do not need descriptors (tcp, sockets) accept a
// missing or wrong one silently, so without this nothing here would notice weft getting it wrong.
//
//   attach(ep, required)        replaces the endpoint's message and RMA operation tables with shims
//                               that check each call's buffers, then call the provider's own
//   add_registration(ep, ...)   each fi_mr_reg the backend made for that endpoint's domain
//   detach(ep)                  before fi_close: the provider's tables back, the registrations gone
//
// FI_MR_ENDPOINT, emulated (no provider here binds a registration to an endpoint: tcp does not
// implement fi_mr_bind, sockets binds only queues and counters):
//   take_binding(mr)            each registration's fi_mr_bind / fi_mr_enable (FI_ENABLE) are answered
//                               by the shim, which records them; close and other controls go to the
//                               provider. attach(..., bindings = true) then also checks, for every
//                               local buffer and every remote key a call names, that its registration
//                               was bound to an endpoint (the local one: this endpoint) and enabled
//                               before the call.
//
// Counts are process-wide (every backend of every rank thread) until reset; the first violation is
// kept as text naming the call, the buffer and what was wrong. Switched on by
// OfiTestSwitches::check_descriptors and emulate_mr_binding (transport/ofi_plan.h).
#pragma once

#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <cstdint>
#include <string>

namespace weft::transport::ofi {

struct DescCheckReport {
  uint64_t checked = 0;         // buffers checked
  uint64_t violations = 0;      // without a covering registration's descriptor where one was required, or
                                // (FI_MR_ENDPOINT emulated) a registration not bound and enabled first
  uint64_t key_violations = 0;  // of those, a remote key's registration (the rest: local buffers)
  std::string first;            // the first violation
};

void desc_check_attach(fid_ep* ep, bool required, int rank, int channel, bool bindings = false);
void desc_check_add_registration(fid_ep* ep, fid_mr* mr, const void* base, uint64_t bytes);
void desc_check_take_binding(fid_mr* mr);
void desc_check_detach(fid_ep* ep);
DescCheckReport desc_check_report();
void desc_check_reset();

}  // namespace weft::transport::ofi
