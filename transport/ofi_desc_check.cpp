// The descriptor-checking shim (ofi_desc_check.h): a table of the wrapped endpoints, the shims.
#include "transport/ofi_desc_check.h"

#include <rdma/fi_rma.h>

#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace weft::transport::ofi {
namespace {

struct Registration {
  void* desc;
  uintptr_t base;
  uint64_t bytes;
};

struct Wrapped {
  fi_ops_msg* msg = nullptr;  // the provider's tables
  fi_ops_rma* rma = nullptr;
  fi_ops_msg shim_msg{};  // what the endpoint points to while wrapped
  fi_ops_rma shim_rma{};
  bool required = false;
  int rank = 0, channel = 0;
  std::vector<Registration> regs;
};

std::mutex g_mu;
std::map<fid_ep*, std::unique_ptr<Wrapped>> g_eps;
DescCheckReport g_report;

// The provider's table for ep, after checking buf..buf+len against desc (under the lock).
template <class Table>
Table* check(fid_ep* ep, const char* call, const void* buf, size_t len, void* desc, Table* Wrapped::*table) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_eps.find(ep);
  if (it == g_eps.end()) return nullptr;
  Wrapped& w = *it->second;
  ++g_report.checked;
  if (w.required) {
    const uintptr_t b = reinterpret_cast<uintptr_t>(buf);
    bool covered = false;
    for (const Registration& r : w.regs)
      covered = covered || (desc && r.desc == desc && b >= r.base && b + len <= r.base + r.bytes);
    if (!covered) {
      if (g_report.violations++ == 0)
        g_report.first = "rank " + std::to_string(w.rank) + " channel " + std::to_string(w.channel) + ": " + call +
                         " of " + std::to_string(len) + " bytes at " + std::to_string(b) +
                         (desc ? ": its descriptor is not one of a registration covering the buffer"
                               : ": no descriptor (FI_MR_LOCAL needs one)");
    }
  }
  return w.*table;
}

ssize_t shim_recv(fid_ep* ep, void* buf, size_t len, void* desc, fi_addr_t src, void* ctx) {
  fi_ops_msg* t = check(ep, "fi_recv", buf, len, desc, &Wrapped::msg);
  return t ? t->recv(ep, buf, len, desc, src, ctx) : -FI_EINVAL;
}

ssize_t shim_send(fid_ep* ep, const void* buf, size_t len, void* desc, fi_addr_t dest, void* ctx) {
  fi_ops_msg* t = check(ep, "fi_send", buf, len, desc, &Wrapped::msg);
  return t ? t->send(ep, buf, len, desc, dest, ctx) : -FI_EINVAL;
}

ssize_t shim_writemsg(fid_ep* ep, const fi_msg_rma* msg, uint64_t flags) {
  fi_ops_rma* t = nullptr;
  for (size_t i = 0; i < msg->iov_count; ++i)
    t = check(ep, "fi_writemsg", msg->msg_iov[i].iov_base, msg->msg_iov[i].iov_len, msg->desc ? msg->desc[i] : nullptr,
              &Wrapped::rma);
  if (msg->iov_count == 0) t = check(ep, "fi_writemsg", nullptr, 0, nullptr, &Wrapped::rma);
  return t ? t->writemsg(ep, msg, flags) : -FI_EINVAL;
}

ssize_t shim_writedata(fid_ep* ep, const void* buf, size_t len, void* desc, uint64_t data, fi_addr_t dest,
                       uint64_t addr, uint64_t key, void* ctx) {
  fi_ops_rma* t = check(ep, "fi_writedata", buf, len, desc, &Wrapped::rma);
  return t ? t->writedata(ep, buf, len, desc, data, dest, addr, key, ctx) : -FI_EINVAL;
}

}  // namespace

void desc_check_attach(fid_ep* ep, bool required, int rank, int channel) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto w = std::make_unique<Wrapped>();
  w->msg = ep->msg;
  w->rma = ep->rma;
  w->required = required;
  w->rank = rank;
  w->channel = channel;
  if (ep->msg) {
    w->shim_msg = *ep->msg;
    w->shim_msg.recv = shim_recv;
    w->shim_msg.send = shim_send;
    ep->msg = &w->shim_msg;
  }
  if (ep->rma) {
    w->shim_rma = *ep->rma;
    w->shim_rma.writemsg = shim_writemsg;
    w->shim_rma.writedata = shim_writedata;
    ep->rma = &w->shim_rma;
  }
  g_eps[ep] = std::move(w);
}

void desc_check_add_registration(fid_ep* ep, void* desc, const void* base, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_eps.find(ep);
  if (it != g_eps.end()) it->second->regs.push_back({desc, reinterpret_cast<uintptr_t>(base), bytes});
}

void desc_check_detach(fid_ep* ep) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_eps.find(ep);
  if (it == g_eps.end()) return;
  ep->msg = it->second->msg;
  ep->rma = it->second->rma;
  g_eps.erase(it);
}

DescCheckReport desc_check_report() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_report;
}

void desc_check_reset() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_report = DescCheckReport{};
}

}  // namespace weft::transport::ofi
