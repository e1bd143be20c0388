// libfabric lookups for the ofi backend: hints, provider choice, the providers present.
#include "transport/ofi_info.h"

#include <rdma/fi_errno.h>

#include <cstring>
#include <set>
#include <utility>

#include "transport/net_backend.h"

namespace weft::transport {

std::string ofi_error(int rc) { return std::string(fi_strerror(rc < 0 ? -rc : rc)) + " (" + std::to_string(rc) + ")"; }

fi_info* ofi_hints(const std::string& provider, bool fence, bool waw, int virt_addr_switch, bool hmem) {
  fi_info* h = fi_allocinfo();
  if (!h) return nullptr;
  h->caps =
      FI_RMA | FI_WRITE | FI_REMOTE_WRITE | FI_MSG | FI_SEND | FI_RECV | (fence ? FI_FENCE : 0) | (hmem ? FI_HMEM : 0);
  h->mode = FI_CONTEXT | FI_CONTEXT2 | FI_RX_CQ_DATA;  // receives stay posted: remote CQ data may take them
  h->ep_attr->type = FI_EP_RDM;
  h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT |
                            (virt_addr_switch == 0 ? 0 : FI_MR_VIRT_ADDR) | (hmem ? FI_MR_HMEM : 0);
  h->domain_attr->threading = FI_THREAD_DOMAIN;
  h->tx_attr->msg_order = waw ? FI_ORDER_WAW : 0;
  if (!provider.empty()) h->fabric_attr->prov_name = strdup(provider.c_str());
  return h;
}

int ofi_lookup(const std::string& provider, int virt_addr_switch, fi_info** out, bool hmem) {
  int rc = -FI_ENODATA;
  if (provider.empty()) {
    // No provider named: libfabric's own first choice, whether or not it offers FI_FENCE (asking
    // for the fence first would prefer a slow reference provider to the site's NIC provider).
    for (int attempt = 1; attempt < 3 && rc == -FI_ENODATA; ++attempt) {
      fi_info* hints = ofi_hints("", false, attempt == 1, virt_addr_switch, hmem);
      if (!hints) return -FI_ENOMEM;
      fi_info* any = nullptr;
      rc = fi_getinfo(kOfiApiVersion, nullptr, nullptr, 0, hints, &any);
      fi_freeinfo(hints);
      if (rc == 0) {
        const std::string first = any->fabric_attr->prov_name;
        fi_freeinfo(any);
        return ofi_lookup(first, virt_addr_switch, out, hmem);
      }
    }
    return rc;
  }
  for (int attempt = 0; attempt < 3; ++attempt) {
    fi_info* hints = ofi_hints(provider, attempt == 0, attempt < 2, virt_addr_switch, hmem);
    if (!hints) return -FI_ENOMEM;
    rc = fi_getinfo(kOfiApiVersion, nullptr, nullptr, 0, hints, out);
    fi_freeinfo(hints);
    if (rc != -FI_ENODATA) return rc;
  }
  return rc;
}

std::string ofi_mr_mode_names(uint64_t mr_mode) {
  static const std::pair<uint64_t, const char*> kBits[] = {
      {FI_MR_LOCAL, "FI_MR_LOCAL"},         {FI_MR_RAW, "FI_MR_RAW"},           {FI_MR_VIRT_ADDR, "FI_MR_VIRT_ADDR"},
      {FI_MR_ALLOCATED, "FI_MR_ALLOCATED"}, {FI_MR_PROV_KEY, "FI_MR_PROV_KEY"}, {FI_MR_MMU_NOTIFY, "FI_MR_MMU_NOTIFY"},
      {FI_MR_RMA_EVENT, "FI_MR_RMA_EVENT"}, {FI_MR_ENDPOINT, "FI_MR_ENDPOINT"}, {FI_MR_HMEM, "FI_MR_HMEM"},
  };
  std::string s;
  for (const auto& [bit, name] : kBits)
    if (mr_mode & bit) s += (s.empty() ? "" : "|") + std::string(name);
  return s.empty() ? "none" : s;
}

std::string ofi_mr_mode_meaning(uint64_t mr_mode) {
  return std::string(mr_mode & FI_MR_VIRT_ADDR ? "virtual addresses" : "offsets") +
         (mr_mode & FI_MR_PROV_KEY ? ", the provider's keys" : ", weft's keys") +
         (mr_mode & FI_MR_LOCAL ? ", local descriptors" : ", no local descriptors") +
         (mr_mode & FI_MR_ENDPOINT ? ", registrations bound to the endpoint" : ", registrations on the domain");
}

std::string ofi_providers_here() {
  std::set<std::string> names;
  for (int attempt = 0; attempt < 3; ++attempt) {
    fi_info* hints = ofi_hints("", attempt == 0, attempt < 2, -1);
    fi_info* all = nullptr;
    if (hints && fi_getinfo(kOfiApiVersion, nullptr, nullptr, 0, hints, &all) == 0) {
      for (fi_info* i = all; i; i = i->next) names.insert(i->fabric_attr->prov_name);
      fi_freeinfo(all);
    }
    if (hints) fi_freeinfo(hints);
  }
  if (names.empty()) return "none";
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

bool ofi_provider_present(const std::string& provider, std::string* why) {
  fi_info* found = nullptr;
  int rc = ofi_lookup(provider, -1, &found);
  if (rc) {
    *why = "libfabric offers no RDM endpoint with RMA through " +
           (provider.empty() ? std::string("any provider") : "provider '" + provider + "'") + " (" + ofi_error(rc) +
           ")";
    return false;
  }
  *why = std::string("provider ") + found->fabric_attr->prov_name;
  fi_freeinfo(found);
  return true;
}

}  // namespace weft::transport
