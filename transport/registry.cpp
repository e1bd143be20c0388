// Backend registry (WEFT_NET_BACKEND, what `auto` picks) and the versioned endpoint blob every rank publishes.
#include <algorithm>
#include <cstring>

#include "base/log.h"
#include "base/params.h"
#include "transport/net_backend.h"
#if WEFT_HAVE_OFI
#include <rdma/fabric.h>

#include "transport/ofi_info.h"
#endif

namespace weft::transport {
namespace {

constexpr uint32_t kEndpointMagic = 0x45544657u;  // "WFTE"
// 2: ibverbs lists (peer, qpn, psn) for its peer set only; 3: ibverbs flags (signals by SEND)
constexpr uint16_t kEndpointVersion = 4;

class Writer {
 public:
  template <typename T>
  void put(T v) {
    size_t n = out.size();
    out.resize(n + sizeof v);
    memcpy(out.data() + n, &v, sizeof v);
  }
  void words(const std::vector<uint32_t>& v) {
    put<uint32_t>(static_cast<uint32_t>(v.size()));
    for (uint32_t x : v) put(x);
  }
  void bytes(const std::vector<uint8_t>& v) {
    put<uint32_t>(static_cast<uint32_t>(v.size()));
    out.insert(out.end(), v.begin(), v.end());
  }
  bootstrap::Blob out;
};

class Reader {
 public:
  explicit Reader(const bootstrap::Blob& b) : in_(b) {}
  template <typename T>
  bool get(T* v) {
    if (in_.size() - pos_ < sizeof *v) return false;
    memcpy(v, in_.data() + pos_, sizeof *v);
    pos_ += sizeof *v;
    return true;
  }
  bool words(std::vector<uint32_t>* v, uint32_t max) {
    uint32_t n = 0;
    if (!get(&n) || n > max || (in_.size() - pos_) / 4 < n) return false;
    v->resize(n);
    for (auto& x : *v) get(&x);
    return true;
  }
  bool bytes(std::vector<uint8_t>* v, uint32_t max) {
    uint32_t n = 0;
    if (!get(&n) || n > max || in_.size() - pos_ < n) return false;
    v->assign(in_.begin() + pos_, in_.begin() + pos_ + n);
    pos_ += n;
    return true;
  }
  bool done() const { return pos_ == in_.size(); }
  size_t left() const { return in_.size() - pos_; }

 private:
  const bootstrap::Blob& in_;
  size_t pos_ = 0;
};

}  // namespace

const IbvQpEntry* IbvPeerInfo::facing(int rank) const {
  auto it = std::lower_bound(qps.begin(), qps.end(), rank, [](const IbvQpEntry& e, int r) { return e.peer < r; });
  return it != qps.end() && it->peer == rank ? &*it : nullptr;
}

bootstrap::Blob encode_peer_info(int rank, int node, const PeerInfo& info) {
  Writer w;
  w.put(kEndpointMagic);
  w.put(kEndpointVersion);
  w.put(static_cast<uint16_t>(info.index()));
  w.put(static_cast<int32_t>(rank));
  w.put(static_cast<int32_t>(node));
  if (const auto* s = std::get_if<SocketPeerInfo>(&info)) {
    w.words(s->ipv4);
    w.put(s->port);
  } else if (const auto* v = std::get_if<IbvPeerInfo>(&info)) {
    w.put(v->lid);
    w.put(v->port_num);
    w.put(v->mtu);
    for (uint8_t g : v->gid) w.put(g);
    w.put(v->heap_addr);
    w.put(v->rkey);
    w.put(v->flags);
    w.put<uint32_t>(static_cast<uint32_t>(v->qps.size()));
    for (const IbvQpEntry& e : v->qps) {
      w.put(e.peer);
      w.put(e.qpn);
      w.put(e.psn);
    }
  } else if (const auto* l = std::get_if<LoopbackPeerInfo>(&info)) {
    w.put(l->fabric);
    w.put(l->pid);
  } else if (const auto* o = std::get_if<OfiPeerInfo>(&info)) {
    w.bytes(o->addr);
    w.bytes(std::vector<uint8_t>(o->provider.begin(), o->provider.end()));
    w.put(o->heap_base);
    w.put(o->heap_key);
    w.put(o->stage_slots);
    w.put(o->stage_slot_bytes);
    w.put(o->heap_memory);
  }
  return w.out;
}

Status decode_peer_info(const bootstrap::Blob& blob, int expect_rank, int* node, PeerInfo* info) {
  Reader r(blob);
  uint32_t magic = 0;
  uint16_t version = 0, kind = 0;
  int32_t rank = -1, nd = -1;
  bool ok = r.get(&magic) && r.get(&version) && r.get(&kind) && r.get(&rank) && r.get(&nd);
  const char* what = nullptr;
  if (!ok || magic != kEndpointMagic)
    what = "not a weft endpoint blob";
  else if (version != kEndpointVersion)
    what = "endpoint blob from a different weft version";
  else if (rank != expect_rank)
    what = "endpoint blob names another rank";
  if (!what) {
    if (kind == 0) {
      SocketPeerInfo s;
      ok = r.words(&s.ipv4, 64) && r.get(&s.port) && !s.ipv4.empty();
      *info = s;
    } else if (kind == 1) {
      IbvPeerInfo v;
      ok = r.get(&v.lid) && r.get(&v.port_num) && r.get(&v.mtu);
      for (auto& g : v.gid) ok = ok && r.get(&g);
      uint32_t n = 0;
      ok = ok && r.get(&v.heap_addr) && r.get(&v.rkey) && r.get(&v.flags) &&
           (v.flags & ~IbvPeerInfo::kIbvSignalsBySend) == 0 && r.get(&n) && n <= IbvPeerInfo::kMaxPeers &&
           r.left() / 12 >= n;
      if (ok) v.qps.resize(n);
      for (uint32_t i = 0; ok && i < n; ++i) {
        IbvQpEntry& e = v.qps[i];
        ok = r.get(&e.peer) && r.get(&e.qpn) && r.get(&e.psn) && e.peer >= 0 && e.peer != rank &&
             (i == 0 || e.peer > v.qps[i - 1].peer) && e.qpn <= 0xffffff && e.psn <= 0xffffff;
      }
      *info = v;
    } else if (kind == 2) {
      LoopbackPeerInfo l;
      ok = r.get(&l.fabric) && r.get(&l.pid);
      *info = l;
    } else if (kind == 3) {
      OfiPeerInfo o;
      std::vector<uint8_t> prov;
      ok = r.bytes(&o.addr, OfiPeerInfo::kMaxAddrBytes) && !o.addr.empty() &&
           r.bytes(&prov, OfiPeerInfo::kMaxProviderChars) && r.get(&o.heap_base) && r.get(&o.heap_key) &&
           r.get(&o.stage_slots) && r.get(&o.stage_slot_bytes) && o.stage_slots <= OfiPeerInfo::kMaxStageSlots &&
           o.stage_slot_bytes <= OfiPeerInfo::kMaxStageSlotBytes &&
           (o.stage_slots == 0 ? o.stage_slot_bytes == 0 : o.stage_slot_bytes > 32) && r.get(&o.heap_memory) &&
           o.heap_memory <= OfiPeerInfo::kDeviceHeapRegistered &&
           (o.stage_slots != 0) == (o.heap_memory == OfiPeerInfo::kDeviceHeapStaged);
      o.provider.assign(prov.begin(), prov.end());
      *info = o;
    } else {
      ok = false;
    }
    if (!ok || !r.done()) what = "truncated or malformed endpoint blob";
  }
  if (what) {
    WEFT_WARN(kTransport, "endpoint information of rank %d: %s (%zu bytes)", expect_rank, what, blob.size());
    return Status::kProtocolError;
  }
  *node = nd;
  return Status::kOk;
}

bool ofi_provider_is_rdma(const std::string& provider) {
  static const char* const kRdma[] = {"efa", "verbs", "cxi", "psm3"};
  for (size_t pos = 0; pos <= provider.size();) {
    size_t end = provider.find(';', pos);
    if (end == std::string::npos) end = provider.size();
    const std::string part = provider.substr(pos, end - pos);
    for (const char* r : kRdma)
      if (part == r) return true;
    pos = end + 1;
  }
  return false;
}

std::string auto_backend_choice(bool verbs_device, const std::string& verbs_why,
                                const std::vector<std::string>& ofi_providers, const std::string& ofi_named,
                                std::string* why) {
  if (verbs_device) {
    *why = "an RDMA device is present (libibverbs)";
    return "ibverbs";
  }
  const std::string no_verbs = verbs_why.empty() ? std::string("no RDMA device") : verbs_why;
  std::string listed, rdma_elsewhere;
  for (const auto& p : ofi_providers) {
    listed += (listed.empty() ? "" : ", ") + p;
    if (ofi_provider_is_rdma(p) && rdma_elsewhere.empty()) rdma_elsewhere = p;
  }
  if (ofi_providers.empty()) {
    *why = no_verbs + "; libfabric offers no provider with RDM and RMA here";
    return "socket";
  }
  // The ofi backend opens WEFT_OFI_PROVIDER, else libfabric's first choice: judge that one.
  const std::string& opens = ofi_named.empty() ? ofi_providers.front() : ofi_named;
  const bool offered = std::find(ofi_providers.begin(), ofi_providers.end(), opens) != ofi_providers.end();
  if (offered && ofi_provider_is_rdma(opens)) {
    *why = no_verbs + "; libfabric provider " + opens + " is RDMA-capable" +
           (ofi_named.empty() ? " (libfabric's first choice)" : " (WEFT_OFI_PROVIDER)");
    return "ofi";
  }
  *why = no_verbs + "; libfabric offers " + listed + ": ";
  if (!offered)
    *why += "not WEFT_OFI_PROVIDER=" + ofi_named;
  else if (rdma_elsewhere.empty())
    *why += "none RDMA-capable (efa, verbs, cxi, psm3)";
  else
    *why += "the ofi backend would open " + opens + ", which is not RDMA-capable (WEFT_OFI_PROVIDER=" + rdma_elsewhere +
            " would take " + rdma_elsewhere + ")";
  return "socket";
}

#if WEFT_HAVE_OFI
std::vector<std::string> ofi_provider_list() {
  std::vector<std::string> names;
  // First what the ofi backend opens with no provider named (libfabric's first choice), then the rest
  // in libfabric's order.
  fi_info* first = nullptr;
  if (ofi_lookup("", -1, &first) == 0 && first) {
    names.push_back(first->fabric_attr->prov_name);
    fi_freeinfo(first);
  }
  fi_info* hints = ofi_hints("", false, false, -1);
  fi_info* all = nullptr;
  if (hints && fi_getinfo(kOfiApiVersion, nullptr, nullptr, 0, hints, &all) == 0) {
    for (fi_info* i = all; i; i = i->next)
      if (std::find(names.begin(), names.end(), i->fabric_attr->prov_name) == names.end())
        names.push_back(i->fabric_attr->prov_name);
    fi_freeinfo(all);
  }
  if (hints) fi_freeinfo(hints);
  return names;
}
#else
std::vector<std::string> ofi_provider_list() { return {}; }
#endif

std::string auto_backend_here(std::string* why) {
  std::string verbs_why, named;
  const bool verbs = ibverbs_device_present(&verbs_why);
  if (get_param("WEFT_OFI_PROVIDER", &named) != Status::kOk) named.clear();
  return auto_backend_choice(verbs, verbs_why, verbs ? std::vector<std::string>() : ofi_provider_list(), named, why);
}

Status resolve_backend_name(const std::string& requested, std::string* resolved) {
  if (requested == "socket" || requested == "ibverbs" || requested == "ofi" || requested == "loopback") {
    *resolved = requested;
    return Status::kOk;
  }
  if (requested == "auto" || requested.empty()) {
    std::string why;
    *resolved = auto_backend_here(&why);
    WEFT_INFO(kTransport, "WEFT_NET_BACKEND=auto: %s (%s)", resolved->c_str(), why.c_str());
    return Status::kOk;
  }
  WEFT_WARN(kTransport, "net backend '%s' is not one of auto, ibverbs, ofi, socket, loopback (WEFT_NET_BACKEND)",
            requested.c_str());
  return Status::kInvalidArgument;
}

Status make_backend(const std::string& name, const BackendConfig& config, std::unique_ptr<NetBackend>* out) {
  if (name == "socket") {
    *out = make_socket_backend(config);
    return Status::kOk;
  }
  if (name == "loopback") {
    *out = make_loopback_backend(config);
    return Status::kOk;
  }
  if (name == "ibverbs") return make_ibverbs_backend(config, out);
  if (name == "ofi") return make_ofi_backend(config, out);
  WEFT_WARN(kTransport, "rank %d: unknown net backend '%s'", config.rank, name.c_str());
  return Status::kInvalidArgument;
}

}  // namespace weft::transport
