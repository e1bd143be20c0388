// ibverbs work-request planning, selective signalling and completion accounting (no device needed).
#include "transport/ibverbs_plan.h"

#include <algorithm>
#include <cstdio>

namespace weft::transport::ibv {

bool SignalPolicy::choose(bool need_completion, uint64_t in_flight_after_post) {
  ++since_;
  bool sig = need_completion || since_ >= interval_ || in_flight_after_post >= static_cast<uint64_t>(depth_);
  if (sig) since_ = 0;
  return sig;
}

std::vector<WrPlan> plan_put(int peer, uint64_t local_base, uint32_t lkey, uint64_t local_offset, uint64_t remote_base,
                             uint32_t rkey, uint64_t remote_offset, uint64_t bytes, bool need_completion,
                             uint64_t user_wr_id, uint64_t* next_seq, uint64_t in_flight, SignalPolicy* policy) {
  std::vector<WrPlan> out;
  for (uint64_t done = 0; done < bytes;) {
    uint64_t n = std::min(kMaxWriteBytes, bytes - done);
    WrPlan w;
    w.wr_id = make_wr_id(peer, (*next_seq)++);
    w.local_addr = local_base + local_offset + done;
    w.length = static_cast<uint32_t>(n);
    w.lkey = lkey;
    w.remote_addr = remote_base + remote_offset + done;
    w.rkey = rkey;
    done += n;
    w.report = done == bytes;
    w.user_wr_id = user_wr_id;
    w.signaled = policy->choose(w.report && need_completion, in_flight + out.size() + 1);
    out.push_back(w);
  }
  return out;
}

WrPlan plan_signal(int peer, uint64_t value_addr, uint32_t lkey, uint64_t remote_base, uint32_t rkey,
                   uint64_t flag_offset, bool fence, bool need_completion, uint64_t user_wr_id, uint64_t* next_seq,
                   uint64_t in_flight, SignalPolicy* policy) {
  WrPlan w;
  w.wr_id = make_wr_id(peer, (*next_seq)++);
  w.local_addr = value_addr;
  w.length = sizeof(uint64_t);
  w.lkey = lkey;
  w.remote_addr = remote_base + flag_offset;
  w.rkey = rkey;
  w.inline_data = true;
  w.fence = fence;
  w.report = true;
  w.user_wr_id = user_wr_id;
  w.signaled = policy->choose(need_completion, in_flight + 1);
  return w;
}

WrPlan plan_signal_send(int peer, uint64_t record_addr, uint32_t lkey, bool fence, bool need_completion,
                        uint64_t user_wr_id, uint64_t* next_seq, uint64_t in_flight, SignalPolicy* policy) {
  WrPlan w;
  w.wr_id = make_wr_id(peer, (*next_seq)++);
  w.local_addr = record_addr;
  w.length = sizeof(SignalRecord);
  w.lkey = lkey;
  w.inline_data = true;
  w.send = true;
  w.fence = fence;
  w.report = true;
  w.user_wr_id = user_wr_id;
  w.signaled = policy->choose(need_completion, in_flight + 1);
  return w;
}

bool signal_record_ok(uint32_t byte_len, const SignalRecord& r, uint64_t heap_bytes, std::string* why) {
  if (byte_len != sizeof(SignalRecord)) {
    *why = "a signal of " + std::to_string(byte_len) + " bytes (a signal record is 16)";
    return false;
  }
  if (r.flag_offset % 8 || heap_bytes < 8 || r.flag_offset > heap_bytes - 8) {
    *why = "a signal for flag offset " + std::to_string(r.flag_offset) + ", not an aligned word of the " +
           std::to_string(heap_bytes) + "-byte heap";
    return false;
  }
  return true;
}

SignalApply choose_signal_apply(bool device_heap, int ordering, bool force_off, std::string* why) {
  const std::string attr = "CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING = " + std::to_string(ordering);
  if (!device_heap) {
    *why = "host heap: signals are RDMA WRITEs, placed after their data by RC order";
    return SignalApply::kNicWrite;
  }
  if (ordering < 0) {
    *why = "GPU heap whose RDMA write ordering was not stated: signals are RDMA WRITEs";
    return SignalApply::kNicWrite;
  }
  if (ordering >= 100) {
    *why = "GPU orders RDMA writes for its own kernels (" + attr + "): signals are RDMA WRITEs";
    return SignalApply::kNicWrite;
  }
  if (force_off) {
    *why = "GPU needs a flush (" + attr +
           "), but the receiver-side flush is switched off (tests only): signals "
           "are RDMA WRITEs and a kernel may see a flag before its data";
    return SignalApply::kNicWrite;
  }
  *why = "GPU needs a flush (" + attr +
         "): signals arrive as SENDs; the proxy flushes GPUDirect RDMA writes, then "
         "sets the flag";
  return SignalApply::kProxyAfterFlush;
}

WrPlan plan_probe(int peer, uint64_t* next_seq) {
  WrPlan w;
  w.wr_id = make_wr_id(peer, (*next_seq)++);
  w.signaled = true;  // length 0, no report: it only retires what precedes it
  return w;
}

void CompletionLedger::posted(const WrPlan& wr) {
  queue_.push_back({wr_seq(wr.wr_id), wr.signaled, wr.report, wr.user_wr_id});
}

Status CompletionLedger::retire(uint64_t wr_id, std::vector<uint64_t>* user_ids, std::string* why) {
  const uint64_t seq = wr_seq(wr_id);
  auto it = std::find_if(queue_.begin(), queue_.end(), [&](const Entry& e) { return e.seq == seq; });
  if (it == queue_.end() || !it->signaled) {
    *why = "completion for work request " + std::to_string(seq) +
           (it == queue_.end() ? ", which is not in flight" : ", which was not signalled");
    return Status::kProtocolError;
  }
  ++it;
  for (auto e = queue_.begin(); e != it; ++e)
    if (e->report) user_ids->push_back(e->user_wr_id);
  queue_.erase(queue_.begin(), it);
  return Status::kOk;
}

namespace {

bool is_ipv4_mapped(const uint8_t* g) {
  for (int i = 0; i < 10; ++i)
    if (g[i]) return false;
  return g[10] == 0xff && g[11] == 0xff;
}
bool is_link_local(const uint8_t* g) { return g[0] == 0xfe && (g[1] & 0xc0) == 0x80; }
bool is_zero(const uint8_t* g) {
  for (int i = 0; i < 16; ++i)
    if (g[i]) return false;
  return true;
}

}  // namespace

std::string gid_text(const uint8_t raw[16]) {
  char buf[64];
  if (is_ipv4_mapped(raw)) {
    snprintf(buf, sizeof buf, "::ffff:%u.%u.%u.%u", raw[12], raw[13], raw[14], raw[15]);
    return buf;
  }
  std::string s;
  for (int i = 0; i < 16; i += 2) {
    snprintf(buf, sizeof buf, "%s%x", i ? ":" : "", (raw[i] << 8) | raw[i + 1]);
    s += buf;
  }
  return s;
}

int choose_gid(const std::vector<GidCandidate>& table, uint32_t port, int forced, std::string* why) {
  if (forced >= 0) {
    for (size_t i = 0; i < table.size(); ++i)
      if (table[i].port == port && table[i].index == static_cast<uint32_t>(forced) && !is_zero(table[i].raw)) {
        *why = "GID index " + std::to_string(forced) + " (WEFT_IB_GID_INDEX): " + gid_text(table[i].raw) +
               (table[i].type == kGidTypeRoceV2 ? ", RoCE v2"
                : table[i].type == 1            ? ", RoCE v1"
                                                : ", IB");
        return static_cast<int>(i);
      }
    *why = "WEFT_IB_GID_INDEX=" + std::to_string(forced) + " is not a valid GID of port " + std::to_string(port);
    return -1;
  }
  // Rank: IPv4-mapped 0, global IPv6 1, link-local 2; RoCE v2 with a netdev only.
  int best = -1, best_rank = 3;
  for (size_t i = 0; i < table.size(); ++i) {
    const GidCandidate& g = table[i];
    if (g.port != port || g.type != kGidTypeRoceV2 || g.ndev_ifindex == 0 || is_zero(g.raw)) continue;
    int rank = is_ipv4_mapped(g.raw) ? 0 : is_link_local(g.raw) ? 2 : 1;
    if (rank < best_rank || (rank == best_rank && g.index < table[best].index))
      best = static_cast<int>(i), best_rank = rank;
  }
  if (best < 0) {
    *why = "port " + std::to_string(port) + " has no RoCE v2 GID bound to a network device (" +
           std::to_string(table.size()) + " GID entries; is an IP address configured on the NIC's netdev?)";
    return -1;
  }
  static const char* const kinds[] = {"IPv4-mapped", "global IPv6", "link-local"};
  *why = "GID index " + std::to_string(table[best].index) + ": " + gid_text(table[best].raw) + " (RoCE v2, " +
         kinds[best_rank] + ", netdev ifindex " + std::to_string(table[best].ndev_ifindex) + ")";
  return best;
}

DmabufRange dmabuf_range(uint64_t base, uint64_t bytes, uint64_t page) {
  DmabufRange r;
  r.aligned_base = base & ~(page - 1);
  const uint64_t end = (base + bytes + page - 1) & ~(page - 1);
  r.aligned_bytes = end - r.aligned_base;
  r.offset = base - r.aligned_base;
  return r;
}

std::string describe_wc_failure(const char* status_str, int status, uint32_t vendor_err, int peer) {
  std::string s = "work request to rank " + std::to_string(peer) + " failed: " + status_str + " (status " +
                  std::to_string(status) + ", vendor error 0x";
  char hex[16];
  snprintf(hex, sizeof hex, "%x", vendor_err);
  s += hex;
  s += ")";
  // The usual causes, so a user has somewhere to start.
  const std::string st(status_str);
  if (st.find("retry") != std::string::npos)
    s += ": the peer stopped answering (rank " + std::to_string(peer) + " died, or the link/GID is wrong)";
  else if (st.find("protection") != std::string::npos || st.find("access") != std::string::npos)
    s += ": rkey/lkey or address outside a registered region";
  else if (st.find("flush") != std::string::npos)
    s += ": the queue pair went to the error state after an earlier failure";
  return s;
}

}  // namespace weft::transport::ibv
