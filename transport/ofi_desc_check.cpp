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
  fid_mr* mr;
  void* desc;
  uint64_t key;
  uintptr_t base;
  uint64_t bytes;
};

// A registration whose bind and enable the shim answers (take_binding).
struct Binding {
  fi_ops* provider = nullptr;  // the provider's table, restored at close
  fi_ops shim{};
  fid* bound = nullptr;  // the endpoint it was bound to
  bool enabled = false;
};

struct Wrapped {
  fi_ops_msg* msg = nullptr;  // the provider's tables
  fi_ops_rma* rma = nullptr;
  fi_ops_msg shim_msg{};  // what the endpoint points to while wrapped
  fi_ops_rma shim_rma{};
  bool required = false;
  bool bindings = false;  // FI_MR_ENDPOINT emulated: check bind and enable too
  int rank = 0, channel = 0;
  std::vector<Registration> regs;
};

std::mutex g_mu;
std::map<fid_ep*, std::unique_ptr<Wrapped>> g_eps;
std::map<fid*, std::unique_ptr<Binding>> g_bindings;  // by the registration's fid
DescCheckReport g_report;

void violation(const Wrapped& w, const std::string& what) {
  if (g_report.violations++ == 0)
    g_report.first = "rank " + std::to_string(w.rank) + " channel " + std::to_string(w.channel) + ": " + what;
}

// Why registration r may not serve a call on ep under FI_MR_ENDPOINT ("" if it may).
std::string unbound(const Registration& r, const fid_ep* ep) {
  auto it = g_bindings.find(&r.mr->fid);
  if (it == g_bindings.end()) return "its registration's binding was not recorded";
  if (!it->second->bound) return "its registration was never bound to an endpoint";
  if (ep && it->second->bound != &ep->fid) return "its registration is bound to another endpoint";
  if (!it->second->enabled) return "its registration was bound but never enabled";
  return "";
}

// The provider's table for ep, after checking buf..buf+len against desc or, given `key`, that remote
// key's registrations (bindings only) (under the lock).
template <class Table>
Table* check(fid_ep* ep, const char* call, const void* buf, size_t len, void* desc, Table* Wrapped::*table,
             const uint64_t* key = nullptr) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_eps.find(ep);
  if (it == g_eps.end()) return nullptr;
  Wrapped& w = *it->second;
  ++g_report.checked;
  const uintptr_t b = reinterpret_cast<uintptr_t>(buf);
  const std::string where = std::string(call) + " of " + std::to_string(len) + " bytes at " + std::to_string(b);
  if (w.required && !key) {  // a remote key's check names no local buffer
    bool covered = false;
    for (const Registration& r : w.regs)
      covered = covered || (desc && r.desc == desc && b >= r.base && b + len <= r.base + r.bytes);
    if (!covered)
      violation(w, where + (desc ? ": its descriptor is not one of a registration covering the buffer"
                                 : ": no descriptor (FI_MR_LOCAL needs one)"));
  }
  if (w.bindings && len > 0 && !key) {
    const Registration* local = nullptr;
    for (const Registration& r : w.regs)
      if (b >= r.base && b + len <= r.base + r.bytes && (!local || (desc && r.desc == desc))) local = &r;
    const std::string why = local ? unbound(*local, ep) : "no registration covers it";
    if (!why.empty()) violation(w, where + ": " + why + " (FI_MR_ENDPOINT)");
  }
  if (w.bindings && key) {  // every registration with that key, on any endpoint (ranks are threads here)
    bool found = false;
    for (const auto& [other, ow] : g_eps)
      for (const Registration& r : ow->regs)
        if (r.key == *key) {
          found = true;
          const std::string why = unbound(r, other);
          if (!why.empty()) {
            ++g_report.key_violations;
            violation(w, where + ", remote key " + std::to_string(*key) + ": " + why + " (FI_MR_ENDPOINT)");
          }
        }
    if (!found) {
      ++g_report.key_violations;
      violation(w, where + ": no registration has remote key " + std::to_string(*key));
    }
  }
  return w.*table;
}

int binding_bind(fid* f, fid* bfid, uint64_t) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_bindings.find(f);
  if (it == g_bindings.end() || bfid->fclass != FI_CLASS_EP) return -FI_EINVAL;
  it->second->bound = bfid;
  return 0;
}

int binding_control(fid* f, int command, void* arg) {
  fi_ops* provider = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_bindings.find(f);
    if (it == g_bindings.end()) return -FI_EINVAL;
    if (command == FI_ENABLE) {
      if (!it->second->bound) return -FI_EOPBADSTATE;  // enable before bind: refused, as a provider would
      it->second->enabled = true;
      return 0;
    }
    provider = it->second->provider;
  }
  return provider->control(f, command, arg);
}

int binding_close(fid* f) {
  fi_ops* provider = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_bindings.find(f);
    if (it == g_bindings.end()) return -FI_EINVAL;
    provider = it->second->provider;
    f->ops = provider;
    g_bindings.erase(it);
  }
  return provider->close(f);
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
  for (size_t i = 0; i < msg->rma_iov_count; ++i)
    t = check(ep, "fi_writemsg", nullptr, 0, nullptr, &Wrapped::rma, &msg->rma_iov[i].key);
  return t ? t->writemsg(ep, msg, flags) : -FI_EINVAL;
}

ssize_t shim_writedata(fid_ep* ep, const void* buf, size_t len, void* desc, uint64_t data, fi_addr_t dest,
                       uint64_t addr, uint64_t key, void* ctx) {
  check(ep, "fi_writedata", nullptr, 0, nullptr, &Wrapped::rma, &key);
  fi_ops_rma* t = check(ep, "fi_writedata", buf, len, desc, &Wrapped::rma);
  return t ? t->writedata(ep, buf, len, desc, data, dest, addr, key, ctx) : -FI_EINVAL;
}

}  // namespace

void desc_check_attach(fid_ep* ep, bool required, int rank, int channel, bool bindings) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto w = std::make_unique<Wrapped>();
  w->msg = ep->msg;
  w->rma = ep->rma;
  w->required = required;
  w->bindings = bindings;
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

void desc_check_add_registration(fid_ep* ep, fid_mr* mr, const void* base, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_eps.find(ep);
  if (it != g_eps.end())
    it->second->regs.push_back({mr, fi_mr_desc(mr), fi_mr_key(mr), reinterpret_cast<uintptr_t>(base), bytes});
}

void desc_check_take_binding(fid_mr* mr) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto b = std::make_unique<Binding>();
  b->provider = mr->fid.ops;
  b->shim = *mr->fid.ops;
  b->shim.close = binding_close;
  b->shim.bind = binding_bind;
  b->shim.control = binding_control;
  mr->fid.ops = &b->shim;
  g_bindings[&mr->fid] = std::move(b);
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
