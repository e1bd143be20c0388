// libfabric lookups for the ofi backend: the hints weft asks with, the provider it takes, the providers present.
#pragma once

#include <rdma/fabric.h>

#include <string>

namespace weft::transport {

constexpr uint32_t kOfiApiVersion = FI_VERSION(1, 9);

// "Connection refused (-111)": libfabric's text and the code.
std::string ofi_error(int rc);

// An RDM endpoint with RMA writes and messages (the hello, staging credits), every mr_mode bit weft
// honours (FI_MR_VIRT_ADDR unless virt_addr_switch is 0), contexts supplied by weft; with
// FI_FENCE in the caps and FI_ORDER_WAW in msg_order where asked; with `hmem`, FI_HMEM in the caps
// and FI_MR_HMEM in mr_mode (device memory registered with the provider, its descriptor passed in
// every data call). Null when out of memory.
fi_info* ofi_hints(const std::string& provider, bool fence, bool waw, int virt_addr_switch, bool hmem = false);

// The provider's entries that offer what weft needs, preferring FI_FENCE, then write-after-write
// order (no provider named: libfabric's first choice of provider, then the same preference within
// it): fi_getinfo's return code, *out to be freed with fi_freeinfo.
// With `hmem`, only entries that also take device memory (FI_HMEM).
int ofi_lookup(const std::string& provider, int virt_addr_switch, fi_info** out, bool hmem = false);

// The mr_mode bits weft acts on, by name ("FI_MR_VIRT_ADDR|FI_MR_PROV_KEY", "none"), and what weft does
// for each ("offsets, weft's keys, no local descriptors, registrations on the domain").
std::string ofi_mr_mode_names(uint64_t mr_mode);
std::string ofi_mr_mode_meaning(uint64_t mr_mode);

// Every provider offering an RDM endpoint with RMA here ("none" if none), for the error that names
// a missing one.
std::string ofi_providers_here();

}  // namespace weft::transport
