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
