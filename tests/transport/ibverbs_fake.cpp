// The fake verbs fabric: objects, QP state machine, send and receive queues, in-order execution of RDMA
// WRITEs and SENDs, deferred visibility.
#include "ibverbs_fake.h"

#include <errno.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>

namespace weft::testing::fake_ibv {

DeviceSpec ib_device(const std::string& name, uint16_t lid) {
  DeviceSpec d;
  d.name = name;
  PortSpec p;
  p.lid = lid;
  Gid g;
  g.raw[0] = 0xfe;
  g.raw[1] = 0x80;
  g.raw[14] = static_cast<uint8_t>(lid >> 8);
  g.raw[15] = static_cast<uint8_t>(lid);
  p.gids.push_back(g);
  d.ports.push_back(p);
  return d;
}

DeviceSpec roce_device(const std::string& name, uint8_t host) {
  DeviceSpec d;
  d.name = name;
  PortSpec p;
  p.link_layer = IBV_LINK_LAYER_ETHERNET;
  p.mtu = IBV_MTU_1024;
  Gid ll;
  ll.ndev_ifindex = 10u + host;
  ll.raw[0] = 0xfe;
  ll.raw[1] = 0x80;
  ll.raw[15] = host;
  Gid v4 = ll;
  v4.raw = {};
  v4.raw[10] = v4.raw[11] = 0xff;
  v4.raw[12] = 10;
  v4.raw[15] = host;
  for (const Gid& base : {ll, v4})
    for (uint32_t type : {uint32_t(IBV_GID_TYPE_ROCE_V1), uint32_t(IBV_GID_TYPE_ROCE_V2)}) {
      Gid g = base;
      g.type = type;
      p.gids.push_back(g);
    }
  d.ports.push_back(p);
  return d;
}

namespace {

struct FDevice {
  ibv_device dev{};
  DeviceSpec spec;
};
struct FContext {
  ibv_context ctx{};
  FDevice* dev = nullptr;
};
struct FPd {
  ibv_pd pd{};
  FContext* c = nullptr;
};
struct Cqe {
  ibv_wc wc{};
  ibv_qp* qp = nullptr;
  uint64_t slot = 0;  // the WR's send-queue sequence: a polled CQE frees the slots up to it
  bool recv = false;  // a receive's completion: frees no send slot
};
struct FCq {
  ibv_cq cq{};
  int depth = 0;
  std::deque<Cqe> q;
};
struct FMr {
  ibv_mr mr{};
  FPd* pd = nullptr;
  int access = 0;
  uint64_t start = 0;  // address peers and the lkey use (iova for dma-buf)
  uint64_t len = 0;
  uint8_t* host = nullptr;  // where `start` lives in this process
};
struct Wr {
  uint64_t wr_id = 0, slot = 0;
  uint32_t len = 0, lkey = 0, rkey = 0;
  uint64_t laddr = 0, raddr = 0;
  bool signaled = false, fence = false, inl = false, send = false;
  std::vector<uint8_t> data;  // inline payload, copied at post time
};
struct RecvWr {
  uint64_t wr_id = 0, addr = 0;
  uint32_t len = 0, lkey = 0;
};
// A WRITE into deferred memory, not yet visible there.
struct Pending {
  uint8_t* dst = nullptr;
  std::vector<uint8_t> bytes;
};
struct FQp {
  ibv_qp qp{};
  FPd* pd = nullptr;
  FCq* scq = nullptr;
  FCq* rcq = nullptr;
  std::deque<RecvWr> recvs;  // posted receives, oldest first
  ibv_qp_init_attr init{};
  ibv_qp_state state = IBV_QPS_RESET;
  ibv_qp_attr attr{};
  int port = 0;
  bool checked_peer = false;
  uint64_t next_slot = 0;
  std::deque<Wr> pending;     // posted, not executed
  std::deque<uint64_t> busy;  // slots not yet freed (executed or not)
};

const char* state_name(int s) {
  static const char* const n[] = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"};
  return s >= 0 && s <= 6 ? n[s] : "?";
}

}  // namespace

struct Fabric::Impl {
  mutable std::mutex m;
  std::vector<std::unique_ptr<FDevice>> devices;
  std::map<ibv_context*, std::unique_ptr<FContext>> contexts;
  std::map<ibv_pd*, std::unique_ptr<FPd>> pds;
  std::map<ibv_cq*, std::unique_ptr<FCq>> cqs;
  std::map<ibv_mr*, std::unique_ptr<FMr>> mrs;
  std::map<ibv_qp*, std::unique_ptr<FQp>> qps;
  std::map<uint32_t, FMr*> by_key;
  std::map<uint32_t, FQp*> by_qpn;
  std::map<int, std::pair<uint8_t*, uint64_t>> dmabufs;
  std::vector<std::string> violations;
  std::vector<std::string> errors;  // failed WRs that are no misuse (a peer gone)
  std::vector<RouteSeen> routes;
  Counters counters;
  uint32_t next_key = 0x1000, next_qpn = 0x40;
  int next_fd = 1000;
  int budget = 0;
  std::mt19937 rng{12345};  // fixed seed: a failing interleaving repeats
  bool no_subsystem = false, no_gid_table = false;
  uint64_t refuse_lo = 0, refuse_hi = 0;
  std::string unreachable;
  bool silent = false;
  bool hold_sends = false;
  uint64_t defer_lo = 0, defer_hi = 0;
  std::deque<Pending> pending_writes;  // oldest first
  transport::ibv::Api api{};

  int refuse(int err, const std::string& why) {
    violations.push_back(why);
    errno = err;
    return err;
  }
  const PortSpec* port_of(FContext* c, int port) const {
    if (!c || port < 1 || port > static_cast<int>(c->dev->spec.ports.size())) return nullptr;
    return &c->dev->spec.ports[port - 1];
  }
  FQp* qp(ibv_qp* q) {
    auto it = qps.find(q);
    return it == qps.end() ? nullptr : it->second.get();
  }

  void complete(FQp* q, const Wr& w, ibv_wc_status st) {
    Cqe e;
    e.wc.wr_id = w.wr_id;
    e.wc.status = st;
    e.wc.opcode = w.send ? IBV_WC_SEND : IBV_WC_RDMA_WRITE;
    e.wc.qp_num = q->qp.qp_num;
    e.qp = &q->qp;
    e.slot = w.slot;
    if (static_cast<int>(q->scq->q.size()) >= q->scq->depth) {
      violations.push_back("CQ overrun (depth " + std::to_string(q->scq->depth) + ")");
      return;
    }
    q->scq->q.push_back(e);
  }
  // A receive's completion on the QP's receive CQ.
  void complete_recv(FQp* q, const RecvWr& r, ibv_wc_status st, uint32_t byte_len) {
    Cqe e;
    e.wc.wr_id = r.wr_id;
    e.wc.status = st;
    e.wc.opcode = IBV_WC_RECV;
    e.wc.byte_len = byte_len;
    e.wc.qp_num = q->qp.qp_num;
    e.qp = &q->qp;
    e.recv = true;
    if (!q->rcq) return;
    if (static_cast<int>(q->rcq->q.size()) >= q->rcq->depth) {
      violations.push_back("receive CQ overrun (depth " + std::to_string(q->rcq->depth) + ")");
      return;
    }
    q->rcq->q.push_back(e);
  }
  // A QP in ERR flushes its posted receives.
  void flush_recvs(FQp* q) {
    for (const RecvWr& r : q->recvs) complete_recv(q, r, IBV_WC_WR_FLUSH_ERR, 0);
    q->recvs.clear();
  }
  // A failed WR: error CQE, QP to ERR. `misuse` (not a peer that went away) is also a violation.
  void to_error(FQp* q, const Wr& w, ibv_wc_status st, const std::string& why, bool misuse = true) {
    if (misuse)
      violations.push_back("QP " + std::to_string(q->qp.qp_num) + ": " + why);
    else
      errors.push_back("QP " + std::to_string(q->qp.qp_num) + ": " + why);
    complete(q, w, st);
    q->state = IBV_QPS_ERR;
    flush_recvs(q);
  }
  // Bytes arriving at `dst`: visible at once, or pending where the memory defers visibility.
  void place(uint8_t* dst, const uint8_t* src, uint32_t len) {
    const uint64_t a = reinterpret_cast<uint64_t>(dst);
    if (a < defer_hi && a + len > defer_lo) {
      pending_writes.push_back(Pending{dst, std::vector<uint8_t>(src, src + len)});
      ++counters.deferred;
      return;
    }
    memmove(dst, src, len);
  }
  static bool overlap(const Pending& x, const Pending& y) {
    return x.dst < y.dst + y.bytes.size() && y.dst < x.dst + x.bytes.size();
  }
  // Some pending writes become visible, in a random order: each with probability 1/4, unless an older
  // pending write overlaps it (the later bytes must win).
  void drain_some() {
    if (pending_writes.empty()) return;
    std::vector<size_t> order(pending_writes.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<bool> done(order.size(), false);
    for (size_t j : order) {
      if (rng() % 4) continue;
      bool blocked = false;
      for (size_t k = 0; k < j && !blocked; ++k) blocked = !done[k] && overlap(pending_writes[k], pending_writes[j]);
      if (blocked) continue;
      memmove(pending_writes[j].dst, pending_writes[j].bytes.data(), pending_writes[j].bytes.size());
      done[j] = true;
      ++counters.early_visible;
    }
    std::deque<Pending> left;
    for (size_t i = 0; i < done.size(); ++i)
      if (!done[i]) left.push_back(std::move(pending_writes[i]));
    pending_writes.swap(left);
  }
  // Local source bytes of a non-inline WR, or nullptr.
  uint8_t* local(FQp* q, const Wr& w) {
    auto it = by_key.find(w.lkey);
    if (it == by_key.end() || it->second->pd != q->pd) return nullptr;
    FMr* mr = it->second;
    if (w.laddr < mr->start || w.len > mr->len || w.laddr - mr->start > mr->len - w.len) return nullptr;
    return mr->host + (w.laddr - mr->start);
  }

  // Runs one WR of q; false when it cannot run yet (the peer is not ready).
  bool execute(FQp* q, const Wr& w) {
    auto rit = by_qpn.find(q->attr.dest_qp_num);
    if (rit == by_qpn.end()) {
      to_error(q, w, IBV_WC_RETRY_EXC_ERR, "peer QP " + std::to_string(q->attr.dest_qp_num) + " does not exist", false);
      return true;
    }
    FQp* r = rit->second;
    if (!unreachable.empty() && (r->pd->c->dev->spec.name == unreachable || q->pd->c->dev->spec.name == unreachable)) {
      if (silent) return false;
      to_error(q, w, IBV_WC_RETRY_EXC_ERR, "unreachable", false);
      return true;
    }
    if (r->state == IBV_QPS_RESET || r->state == IBV_QPS_INIT) return false;  // the NIC would retry
    if (r->state == IBV_QPS_ERR) {
      to_error(q, w, IBV_WC_RETRY_EXC_ERR, "peer QP is in the error state", false);
      return true;
    }
    if (!q->checked_peer) {
      std::string bad;
      if (r->attr.dest_qp_num != q->qp.qp_num) bad = "peer QP points at another QP";
      if (r->attr.rq_psn != q->attr.sq_psn) bad = "send PSN differs from the peer's receive PSN";
      FContext* rc = r->pd->c;
      const PortSpec* rp = port_of(rc, r->port);
      const PortSpec* lp = port_of(q->pd->c, q->port);
      if (lp && rp && lp->link_layer == IBV_LINK_LAYER_ETHERNET) {
        const int ri = r->attr.ah_attr.grh.sgid_index;
        if (ri >= static_cast<int>(rp->gids.size()) ||
            memcmp(rp->gids[ri].raw.data(), q->attr.ah_attr.grh.dgid.raw, 16) != 0)
          bad = "destination GID is not the peer's source GID";
      } else if (lp && rp && !q->attr.ah_attr.is_global && q->attr.ah_attr.dlid != rp->lid) {
        bad = "destination LID " + std::to_string(q->attr.ah_attr.dlid) + " is not the peer port's LID " +
              std::to_string(rp->lid);
      }
      if (!bad.empty()) {
        to_error(q, w, IBV_WC_RETRY_EXC_ERR, bad);
        return true;
      }
      q->checked_peer = true;
    }
    if (w.send) {
      if (hold_sends) return false;
      if (r->recvs.empty()) {  // RNR: the NIC retries until the responder posts a receive
        ++counters.rnr_waits;
        return false;
      }
      const uint8_t* src = w.inl ? w.data.data() : (w.len ? local(q, w) : nullptr);
      if (w.len && !src) {
        to_error(q, w, IBV_WC_LOC_PROT_ERR, "lkey " + std::to_string(w.lkey) + " does not cover the source");
        return true;
      }
      const RecvWr rw = r->recvs.front();
      r->recvs.pop_front();
      auto kit = by_key.find(rw.lkey);
      FMr* mr = kit == by_key.end() ? nullptr : kit->second;
      if (!mr || mr->pd != r->pd || !(mr->access & IBV_ACCESS_LOCAL_WRITE) || rw.addr < mr->start || rw.len > mr->len ||
          rw.addr - mr->start > mr->len - rw.len) {
        violations.push_back("QP " + std::to_string(r->qp.qp_num) + ": receive buffer outside its lkey's region");
        complete_recv(r, rw, IBV_WC_LOC_PROT_ERR, 0);
        to_error(q, w, IBV_WC_REM_OP_ERR, "the peer's receive failed", false);
        return true;
      }
      if (w.len > rw.len) {
        violations.push_back("QP " + std::to_string(r->qp.qp_num) + ": a " + std::to_string(w.len) +
                             "-byte SEND into a " + std::to_string(rw.len) + "-byte receive");
        complete_recv(r, rw, IBV_WC_LOC_LEN_ERR, 0);
        to_error(q, w, IBV_WC_REM_INV_REQ_ERR, "the peer's receive is too short", false);
        return true;
      }
      if (w.len) memmove(mr->host + (rw.addr - mr->start), src, w.len);
      complete_recv(r, rw, IBV_WC_SUCCESS, w.len);
      ++counters.sends;
      if (w.inl) ++counters.inline_writes;
      if (w.fence) ++counters.fenced;
      if (w.signaled || q->init.sq_sig_all) {
        ++counters.signaled;
        complete(q, w, IBV_WC_SUCCESS);
      }
      return true;
    }
    if (w.len > 0) {
      const uint8_t* src = w.inl ? w.data.data() : local(q, w);
      if (!src) {
        to_error(q, w, IBV_WC_LOC_PROT_ERR, "lkey " + std::to_string(w.lkey) + " does not cover the source");
        return true;
      }
      auto kit = by_key.find(w.rkey);
      FMr* mr = kit == by_key.end() ? nullptr : kit->second;
      std::string bad;
      if (!mr || mr->pd != r->pd)
        bad = "rkey " + std::to_string(w.rkey) + " is not registered at the peer";
      else if (!(mr->access & IBV_ACCESS_REMOTE_WRITE) || !(r->attr.qp_access_flags & IBV_ACCESS_REMOTE_WRITE))
        bad = "remote write not allowed";
      else if (w.raddr < mr->start || w.len > mr->len || w.raddr - mr->start > mr->len - w.len)
        bad = "remote range outside the rkey's region";
      if (!bad.empty()) {
        to_error(q, w, IBV_WC_REM_ACCESS_ERR, bad);
        return true;
      }
      place(mr->host + (w.raddr - mr->start), src, w.len);
    } else {
      ++counters.zero_length;
    }
    ++counters.writes;
    counters.bytes += w.len;
    if (w.inl) ++counters.inline_writes;
    if (w.fence) ++counters.fenced;
    if (w.signaled || q->init.sq_sig_all) {
      ++counters.signaled;
      complete(q, w, IBV_WC_SUCCESS);
    }
    return true;
  }

  // Runs pending WRITEs of the QPs on `cq`: each QP's strictly in order (RC), the QPs in a random order
  // with a random share of the budget, so nothing may rely on order across QPs.
  void progress(FCq* cq) {
    std::vector<FQp*> on_cq;
    for (auto& [h, q] : qps)
      if (q->scq == cq) on_cq.push_back(q.get());
    std::shuffle(on_cq.begin(), on_cq.end(), rng);
    for (FQp* q : on_cq) {
      const int limit = budget == 0 ? 0 : 1 + static_cast<int>(rng() % static_cast<unsigned>(budget));
      int done = 0;
      while (!q->pending.empty() && (limit == 0 || done < limit)) {
        if (q->state == IBV_QPS_ERR) {
          complete(q, q->pending.front(), IBV_WC_WR_FLUSH_ERR);
        } else if (!execute(q, q->pending.front())) {
          break;
        }
        q->pending.pop_front();
        ++done;
      }
    }
    drain_some();
  }
};

namespace {

Fabric::Impl* g = nullptr;

using Lock = std::lock_guard<std::mutex>;

// Required and allowed attribute masks of the transitions an RC QP makes.
struct Transition {
  ibv_qp_state from, to;
  int required, optional;
};
const Transition kTransitions[] = {
    {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0},
    {IBV_QPS_INIT, IBV_QPS_RTR,
     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
         IBV_QP_MIN_RNR_TIMER,
     IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX},
    {IBV_QPS_RTR, IBV_QPS_RTS,
     IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC,
     IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE},
};

int modify_qp(ibv_qp* h, ibv_qp_attr* a, int mask) {
  Lock l(g->m);
  FQp* q = g->qp(h);
  if (!q) return g->refuse(EINVAL, "ibv_modify_qp on an unknown QP");
  if (!(mask & IBV_QP_STATE)) return g->refuse(EINVAL, "ibv_modify_qp without IBV_QP_STATE");
  const ibv_qp_state to = a->qp_state;
  if (to == IBV_QPS_ERR || to == IBV_QPS_RESET) {
    if (mask != IBV_QP_STATE) return g->refuse(EINVAL, "to ERR/RESET takes IBV_QP_STATE only");
    q->state = to;
    if (to == IBV_QPS_ERR) g->flush_recvs(q);
    if (to == IBV_QPS_RESET) q->recvs.clear();
    return 0;
  }
  const Transition* t = nullptr;
  for (const auto& x : kTransitions)
    if (x.from == q->state && x.to == to) t = &x;
  const std::string what = std::string("QP ") + state_name(q->state) + " -> " + state_name(to);
  if (!t) return g->refuse(EINVAL, what + ": not a transition an RC QP makes");
  if ((mask & t->required) != t->required)
    return g->refuse(EINVAL, what + ": attribute mask lacks required bits 0x" + std::to_string((t->required & ~mask)));
  if (mask & ~(t->required | t->optional))
    return g->refuse(EINVAL, what + ": attribute mask has bits not allowed here: " +
                                 std::to_string(mask & ~(t->required | t->optional)));
  FContext* c = q->pd->c;
  if (to == IBV_QPS_INIT) {
    if (!g->port_of(c, a->port_num)) return g->refuse(EINVAL, what + ": no port " + std::to_string(a->port_num));
    q->port = a->port_num;
    q->attr.qp_access_flags = a->qp_access_flags;
  } else if (to == IBV_QPS_RTR) {
    const PortSpec* p = g->port_of(c, q->port);
    if (a->path_mtu > p->mtu) return g->refuse(EINVAL, what + ": path MTU above the port's active MTU");
    if (a->ah_attr.port_num != q->port) return g->refuse(EINVAL, what + ": address vector names another port");
    if (p->link_layer == IBV_LINK_LAYER_ETHERNET && !a->ah_attr.is_global)
      return g->refuse(EINVAL, what + ": RoCE needs a global route (is_global)");
    if (a->ah_attr.is_global) {
      const int i = a->ah_attr.grh.sgid_index;
      bool zero = true;
      for (uint8_t b : a->ah_attr.grh.dgid.raw) zero = zero && !b;
      if (i >= static_cast<int>(p->gids.size())) return g->refuse(EINVAL, what + ": sgid_index beyond the GID table");
      if (zero) return g->refuse(EINVAL, what + ": zero destination GID");
    } else if (a->ah_attr.dlid == 0) {
      return g->refuse(EINVAL, what + ": InfiniBand route without a destination LID");
    }
    q->attr.ah_attr = a->ah_attr;
    q->attr.dest_qp_num = a->dest_qp_num;
    q->attr.rq_psn = a->rq_psn;
    q->attr.path_mtu = a->path_mtu;
    RouteSeen r;
    r.device = c->dev->spec.name;
    r.port = q->port;
    r.global = a->ah_attr.is_global;
    r.sgid_index = a->ah_attr.is_global ? a->ah_attr.grh.sgid_index : -1;
    r.traffic_class = a->ah_attr.is_global ? a->ah_attr.grh.traffic_class : -1;
    r.dest_qpn = a->dest_qp_num;
    g->routes.push_back(r);
  } else if (to == IBV_QPS_RTS) {
    if (a->retry_cnt > 7 || a->rnr_retry > 7 || a->timeout > 31)
      return g->refuse(EINVAL, what + ": retry count, RNR retry or timeout out of range");
    q->attr.sq_psn = a->sq_psn;
  }
  q->state = to;
  return 0;
}

int post_send(ibv_qp* h, ibv_send_wr* wr, ibv_send_wr** bad) {
  Lock l(g->m);
  FQp* q = g->qp(h);
  if (!q) return *bad = wr, g->refuse(EINVAL, "ibv_post_send on an unknown QP");
  for (; wr; wr = wr->next) {
    *bad = wr;
    if (q->state != IBV_QPS_RTS && q->state != IBV_QPS_ERR)  // in ERR, WRs are accepted and flushed
      return g->refuse(EINVAL, std::string("ibv_post_send on a QP in state ") + state_name(q->state));
    if (wr->opcode != IBV_WR_RDMA_WRITE && wr->opcode != IBV_WR_SEND)
      return g->refuse(EINVAL, "the fake runs RDMA WRITE and SEND only");
    if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > q->init.cap.max_send_sge)
      return g->refuse(EINVAL, "more SGEs than the QP was created with");
    if (q->busy.size() + 1 > q->init.cap.max_send_wr)
      return g->refuse(ENOMEM, "send queue overflow: " + std::to_string(q->busy.size()) + " WRs not yet retired of " +
                                   std::to_string(q->init.cap.max_send_wr));
    Wr w;
    w.wr_id = wr->wr_id;
    w.slot = q->next_slot++;
    for (int i = 0; i < wr->num_sge; ++i) w.len += wr->sg_list[i].length;
    if (wr->num_sge > 0) {
      w.laddr = wr->sg_list[0].addr;
      w.lkey = wr->sg_list[0].lkey;
    }
    w.raddr = wr->wr.rdma.remote_addr;
    w.rkey = wr->wr.rdma.rkey;
    w.signaled = wr->send_flags & IBV_SEND_SIGNALED;
    w.fence = wr->send_flags & IBV_SEND_FENCE;
    w.inl = wr->send_flags & IBV_SEND_INLINE;
    w.send = wr->opcode == IBV_WR_SEND;
    if (w.inl) {
      if (w.len > q->init.cap.max_inline_data) return g->refuse(EINVAL, "inline WRITE above max_inline_data");
      for (int i = 0; i < wr->num_sge; ++i) {
        const uint8_t* p = reinterpret_cast<const uint8_t*>(wr->sg_list[i].addr);
        w.data.insert(w.data.end(), p, p + wr->sg_list[i].length);
      }
    }
    q->pending.push_back(std::move(w));
    q->busy.push_back(q->next_slot - 1);
    g->counters.max_outstanding = std::max<uint64_t>(g->counters.max_outstanding, q->busy.size());
  }
  *bad = nullptr;
  return 0;
}

int post_recv(ibv_qp* h, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  Lock l(g->m);
  FQp* q = g->qp(h);
  if (!q) return *bad = wr, g->refuse(EINVAL, "ibv_post_recv on an unknown QP");
  for (; wr; wr = wr->next) {
    *bad = wr;
    if (q->state == IBV_QPS_RESET) return g->refuse(EINVAL, "ibv_post_recv on a QP in state RESET");
    if (!q->rcq) return g->refuse(EINVAL, "ibv_post_recv on a QP without a receive CQ");
    if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > q->init.cap.max_recv_sge)
      return g->refuse(EINVAL, "more receive SGEs than the QP was created with");
    if (q->recvs.size() + 1 > q->init.cap.max_recv_wr)
      return g->refuse(ENOMEM, "receive queue overflow: " + std::to_string(q->recvs.size()) + " receives posted of " +
                                   std::to_string(q->init.cap.max_recv_wr));
    RecvWr r;
    r.wr_id = wr->wr_id;
    if (wr->num_sge > 0) {
      r.addr = wr->sg_list[0].addr;
      r.len = wr->sg_list[0].length;
      r.lkey = wr->sg_list[0].lkey;
    }
    if (q->state == IBV_QPS_ERR) {  // accepted and flushed at once
      g->complete_recv(q, r, IBV_WC_WR_FLUSH_ERR, 0);
      continue;
    }
    q->recvs.push_back(r);
    ++g->counters.recvs_posted;
  }
  *bad = nullptr;
  return 0;
}

int poll_cq(ibv_cq* h, int n, ibv_wc* wc) {
  Lock l(g->m);
  auto it = g->cqs.find(h);
  if (it == g->cqs.end()) return g->refuse(EINVAL, "ibv_poll_cq on an unknown CQ"), -1;
  FCq* cq = it->second.get();
  g->progress(cq);
  int got = 0;
  while (got < n && !cq->q.empty()) {
    Cqe e = cq->q.front();
    cq->q.pop_front();
    wc[got++] = e.wc;
    FQp* q = e.recv ? nullptr : g->qp(e.qp);
    if (q)  // a send CQE frees its WR's slot and every earlier one
      while (!q->busy.empty() && q->busy.front() <= e.slot) q->busy.pop_front();
  }
  return got;
}

ibv_device** get_device_list(int* n) {
  Lock l(g->m);
  if (g->no_subsystem) {
    errno = ENOSYS;
    return nullptr;
  }
  auto** list = new ibv_device*[g->devices.size() + 1];
  for (size_t i = 0; i < g->devices.size(); ++i) list[i] = &g->devices[i]->dev;
  list[g->devices.size()] = nullptr;
  if (n) *n = static_cast<int>(g->devices.size());
  return list;
}

ibv_context* open_device(ibv_device* d) {
  Lock l(g->m);
  for (auto& dev : g->devices)
    if (&dev->dev == d) {
      auto c = std::make_unique<FContext>();
      c->dev = dev.get();
      c->ctx.device = d;
      ibv_context* h = &c->ctx;
      g->contexts[h] = std::move(c);
      return h;
    }
  g->refuse(EINVAL, "ibv_open_device on an unknown device");
  return nullptr;
}

FContext* ctx_of(ibv_context* h) {
  auto it = g->contexts.find(h);
  return it == g->contexts.end() ? nullptr : it->second.get();
}

int query_port(ibv_context* h, uint8_t port, ibv_port_attr* a) {
  Lock l(g->m);
  const PortSpec* p = g->port_of(ctx_of(h), port);
  if (!p) return g->refuse(EINVAL, "ibv_query_port: no port " + std::to_string(port));
  *a = ibv_port_attr{};
  a->state = p->state;
  a->active_mtu = p->mtu;
  a->max_mtu = p->mtu;
  a->lid = p->lid;
  a->link_layer = p->link_layer;
  a->gid_tbl_len = static_cast<int>(p->gids.size());
  return 0;
}

void fill(ibv_gid_entry* e, const Gid& gid, uint32_t port, uint32_t index) {
  *e = ibv_gid_entry{};
  memcpy(e->gid.raw, gid.raw.data(), 16);
  e->gid_index = index;
  e->port_num = port;
  e->gid_type = gid.type;
  e->ndev_ifindex = gid.ndev_ifindex;
}

ibv_mr* add_mr(ibv_pd* pd, uint64_t start, uint64_t len, uint8_t* host, int access, bool dmabuf) {
  auto it = g->pds.find(pd);
  if (it == g->pds.end()) return g->refuse(EINVAL, "memory registration on an unknown PD"), nullptr;
  if (len == 0) return g->refuse(EINVAL, "zero-length memory registration"), nullptr;
  if ((access & IBV_ACCESS_REMOTE_WRITE) && !(access & IBV_ACCESS_LOCAL_WRITE))
    return g->refuse(EINVAL, "IBV_ACCESS_REMOTE_WRITE without IBV_ACCESS_LOCAL_WRITE"), nullptr;
  if (access & IBV_ACCESS_RELAXED_ORDERING)
    return g->refuse(EINVAL, "relaxed ordering would let a flag overtake its data (weft never asks for it)"), nullptr;
  auto mr = std::make_unique<FMr>();
  mr->pd = it->second.get();
  mr->access = access;
  mr->start = start;
  mr->len = len;
  mr->host = host;
  mr->mr.pd = pd;
  mr->mr.context = pd->context;
  mr->mr.addr = reinterpret_cast<void*>(start);
  mr->mr.length = len;
  mr->mr.lkey = mr->mr.rkey = g->next_key++;
  ibv_mr* h = &mr->mr;
  g->by_key[h->lkey] = mr.get();
  g->mrs[h] = std::move(mr);
  ++(dmabuf ? g->counters.dmabuf_mrs : g->counters.plain_mrs);
  return h;
}

}  // namespace

Fabric::Fabric(std::vector<DeviceSpec> devices) : impl_(std::make_unique<Impl>()) {
  for (auto& spec : devices) {
    auto d = std::make_unique<FDevice>();
    snprintf(d->dev.name, sizeof d->dev.name, "%s", spec.name.c_str());
    d->dev.node_type = IBV_NODE_CA;
    d->dev.transport_type = IBV_TRANSPORT_IB;
    d->spec = std::move(spec);
    impl_->devices.push_back(std::move(d));
  }
  transport::ibv::Api& a = impl_->api;
  a.name = "fake verbs";
  a.get_device_list = get_device_list;
  a.free_device_list = [](ibv_device** l) { delete[] l; };
  a.get_device_name = [](ibv_device* d) -> const char* { return d->name; };
  a.open_device = open_device;
  a.close_device = [](ibv_context* h) {
    Lock l(g->m);
    for (auto& [p, pd] : g->pds)
      if (pd->c == ctx_of(h)) return g->refuse(EBUSY, "ibv_close_device with a PD still allocated");
    return g->contexts.erase(h) ? 0 : g->refuse(EINVAL, "ibv_close_device on an unknown context");
  };
  a.query_device = [](ibv_context* h, ibv_device_attr* attr) {
    Lock l(g->m);
    FContext* c = ctx_of(h);
    if (!c) return g->refuse(EINVAL, "ibv_query_device on an unknown context");
    *attr = ibv_device_attr{};
    attr->max_qp_wr = c->dev->spec.max_qp_wr;
    attr->max_cqe = 1 << 20;
    attr->max_sge = 30;
    attr->phys_port_cnt = static_cast<uint8_t>(c->dev->spec.ports.size());
    return 0;
  };
  a.query_port = query_port;
  a.query_gid_ex = [](ibv_context* h, uint32_t port, uint32_t index, ibv_gid_entry* e, uint32_t) {
    Lock l(g->m);
    const PortSpec* p = g->port_of(ctx_of(h), static_cast<int>(port));
    if (!p || index >= p->gids.size()) return g->refuse(EINVAL, "ibv_query_gid_ex: no such port or index");
    fill(e, p->gids[index], port, index);
    return 0;
  };
  a.query_gid_table = [](ibv_context* h, ibv_gid_entry* e, size_t max, uint32_t) -> ssize_t {
    Lock l(g->m);
    FContext* c = ctx_of(h);
    if (!c) return -g->refuse(EINVAL, "ibv_query_gid_table on an unknown context");
    if (g->no_gid_table) return -EOPNOTSUPP;
    size_t n = 0;
    for (size_t p = 0; p < c->dev->spec.ports.size(); ++p)
      for (size_t i = 0; i < c->dev->spec.ports[p].gids.size(); ++i) {
        if (n == max) return -g->refuse(EINVAL, "ibv_query_gid_table: the table is larger than the buffer");
        fill(&e[n++], c->dev->spec.ports[p].gids[i], static_cast<uint32_t>(p + 1), static_cast<uint32_t>(i));
      }
    return static_cast<ssize_t>(n);
  };
  a.alloc_pd = [](ibv_context* h) -> ibv_pd* {
    Lock l(g->m);
    FContext* c = ctx_of(h);
    if (!c) return g->refuse(EINVAL, "ibv_alloc_pd on an unknown context"), nullptr;
    auto pd = std::make_unique<FPd>();
    pd->c = c;
    pd->pd.context = h;
    ibv_pd* p = &pd->pd;
    g->pds[p] = std::move(pd);
    return p;
  };
  a.dealloc_pd = [](ibv_pd* p) {
    Lock l(g->m);
    for (auto& [k, mr] : g->mrs)
      if (mr->mr.pd == p) return g->refuse(EBUSY, "ibv_dealloc_pd with a memory region still registered");
    for (auto& [k, q] : g->qps)
      if (q->qp.pd == p) return g->refuse(EBUSY, "ibv_dealloc_pd with a QP still alive");
    return g->pds.erase(p) ? 0 : g->refuse(EINVAL, "ibv_dealloc_pd on an unknown PD");
  };
  a.create_cq = [](ibv_context* h, int cqe, void*, ibv_comp_channel*, int) -> ibv_cq* {
    Lock l(g->m);
    if (!ctx_of(h) || cqe < 1 || cqe > (1 << 20))
      return g->refuse(EINVAL, "ibv_create_cq: bad context or depth"), nullptr;
    auto cq = std::make_unique<FCq>();
    cq->depth = cqe;
    cq->cq.context = h;
    cq->cq.cqe = cqe;
    ibv_cq* c = &cq->cq;
    g->cqs[c] = std::move(cq);
    return c;
  };
  a.destroy_cq = [](ibv_cq* c) {
    Lock l(g->m);
    auto it = g->cqs.find(c);
    if (it == g->cqs.end()) return g->refuse(EINVAL, "ibv_destroy_cq on an unknown CQ");
    for (auto& [k, q] : g->qps)
      if (q->scq == it->second.get() || q->rcq == it->second.get())
        return g->refuse(EBUSY, "ibv_destroy_cq with a QP still using it");
    g->cqs.erase(it);
    return 0;
  };
  a.reg_mr = [](ibv_pd* pd, void* addr, size_t len, int access) -> ibv_mr* {
    Lock l(g->m);
    const uint64_t lo = reinterpret_cast<uint64_t>(addr);
    if (lo < g->refuse_hi && lo + len > g->refuse_lo) {
      errno = EFAULT;  // what ibv_reg_mr of GPU memory gives without a peer-memory client
      return nullptr;
    }
    return add_mr(pd, reinterpret_cast<uint64_t>(addr), len, static_cast<uint8_t*>(addr), access, false);
  };
  a.reg_dmabuf_mr = [](ibv_pd* pd, uint64_t offset, size_t len, uint64_t iova, int fd, int access) -> ibv_mr* {
    Lock l(g->m);
    auto it = g->dmabufs.find(fd);
    if (it == g->dmabufs.end()) {
      errno = EBADF;
      return nullptr;
    }
    if (offset > it->second.second || len > it->second.second - offset)
      return g->refuse(EINVAL, "ibv_reg_dmabuf_mr: offset + length beyond the dma-buf"), nullptr;
    return add_mr(pd, iova, len, it->second.first + offset, access, true);
  };
  a.dereg_mr = [](ibv_mr* m) {
    Lock l(g->m);
    auto it = g->mrs.find(m);
    if (it == g->mrs.end()) return g->refuse(EINVAL, "ibv_dereg_mr on an unknown MR");
    g->by_key.erase(m->lkey);
    g->mrs.erase(it);
    return 0;
  };
  a.create_qp = [](ibv_pd* pd, ibv_qp_init_attr* init) -> ibv_qp* {
    Lock l(g->m);
    auto it = g->pds.find(pd);
    if (it == g->pds.end()) return g->refuse(EINVAL, "ibv_create_qp on an unknown PD"), nullptr;
    if (init->qp_type != IBV_QPT_RC) return g->refuse(EINVAL, "the fake makes RC QPs only"), nullptr;
    if (!g->cqs.count(init->send_cq)) return g->refuse(EINVAL, "ibv_create_qp: unknown send CQ"), nullptr;
    if (init->cap.max_recv_wr > 0 && !g->cqs.count(init->recv_cq))
      return g->refuse(EINVAL, "ibv_create_qp: receives without a known receive CQ"), nullptr;
    const auto* dev = g->pds[pd]->c->dev;
    if (init->cap.max_send_wr < 1 || init->cap.max_send_wr > static_cast<uint32_t>(dev->spec.max_qp_wr) ||
        init->cap.max_inline_data > 256)
      return g->refuse(EINVAL, "ibv_create_qp: send queue depth or inline size beyond the device"), nullptr;
    auto q = std::make_unique<FQp>();
    q->pd = it->second.get();
    q->scq = g->cqs[init->send_cq].get();
    q->rcq = init->cap.max_recv_wr > 0 ? g->cqs[init->recv_cq].get() : nullptr;
    q->init = *init;
    q->qp.context = pd->context;
    q->qp.pd = pd;
    q->qp.send_cq = init->send_cq;
    q->qp.recv_cq = init->recv_cq;
    q->qp.qp_type = IBV_QPT_RC;
    q->qp.qp_num = g->next_qpn++;
    q->qp.state = IBV_QPS_RESET;
    ibv_qp* h = &q->qp;
    g->by_qpn[h->qp_num] = q.get();
    g->qps[h] = std::move(q);
    return h;
  };
  a.modify_qp = modify_qp;
  a.destroy_qp = [](ibv_qp* h) {
    Lock l(g->m);
    auto it = g->qps.find(h);
    if (it == g->qps.end()) return g->refuse(EINVAL, "ibv_destroy_qp on an unknown QP");
    g->by_qpn.erase(h->qp_num);
    g->qps.erase(it);
    return 0;
  };
  a.post_send = post_send;
  a.poll_cq = poll_cq;
  a.post_recv = post_recv;
  a.wc_status_str = [](ibv_wc_status s) { return ibv_wc_status_str(s); };
  g = impl_.get();
  transport::ibv::set_api_for_testing(&impl_->api);
}

Fabric::~Fabric() {
  transport::ibv::set_api_for_testing(nullptr);
  g = nullptr;
}

const transport::ibv::Api& Fabric::api() const { return impl_->api; }
std::vector<std::string> Fabric::violations() const {
  Lock l(impl_->m);
  return impl_->violations;
}
Counters Fabric::counters() const {
  Lock l(impl_->m);
  return impl_->counters;
}
std::vector<RouteSeen> Fabric::routes() const {
  Lock l(impl_->m);
  return impl_->routes;
}
size_t Fabric::live_objects() const {
  Lock l(impl_->m);
  return impl_->contexts.size() + impl_->pds.size() + impl_->cqs.size() + impl_->mrs.size() + impl_->qps.size();
}
Fabric::Held Fabric::held() const {
  Lock l(impl_->m);
  Held h;
  h.queue_pairs = impl_->qps.size();
  h.memory_registrations = impl_->mrs.size();
  h.completion_queues = impl_->cqs.size();
  for (const auto& [k, mr] : impl_->mrs) h.registered_bytes += mr->len;
  for (const auto& [k, cq] : impl_->cqs) h.completion_entries += static_cast<uint64_t>(cq->depth);
  for (const auto& [k, q] : impl_->qps) h.receives_posted += q->recvs.size();
  return h;
}
void Fabric::set_exec_budget(int n) {
  Lock l(impl_->m);
  impl_->budget = n < 0 ? 0 : n;
}
void Fabric::set_no_rdma_subsystem(bool on) {
  Lock l(impl_->m);
  impl_->no_subsystem = on;
}
void Fabric::set_gid_table_unsupported(bool on) {
  Lock l(impl_->m);
  impl_->no_gid_table = on;
}
void Fabric::refuse_reg_mr_of(const void* base, uint64_t bytes) {
  Lock l(impl_->m);
  impl_->refuse_lo = reinterpret_cast<uint64_t>(base);
  impl_->refuse_hi = impl_->refuse_lo + bytes;
}
void Fabric::set_unreachable(const std::string& device, bool silent) {
  Lock l(impl_->m);
  impl_->unreachable = device;
  impl_->silent = silent;
}
int Fabric::add_dmabuf(void* base, uint64_t bytes) {
  Lock l(impl_->m);
  int fd = impl_->next_fd++;
  impl_->dmabufs[fd] = {static_cast<uint8_t*>(base), bytes};
  return fd;
}

}  // namespace weft::testing::fake_ibv

namespace weft::testing::fake_ibv {

void Fabric::defer_visibility(const void* base, uint64_t bytes) {
  Lock l(impl_->m);
  impl_->defer_lo = reinterpret_cast<uint64_t>(base);
  impl_->defer_hi = impl_->defer_lo + bytes;
}
size_t Fabric::flush_deferred() {
  Lock l(impl_->m);
  const size_t n = impl_->pending_writes.size();
  for (const Pending& p : impl_->pending_writes) memmove(p.dst, p.bytes.data(), p.bytes.size());
  impl_->pending_writes.clear();
  ++impl_->counters.flushes;
  return n;
}
size_t Fabric::deferred_pending() const {
  Lock l(impl_->m);
  return impl_->pending_writes.size();
}
void Fabric::set_hold_sends(bool on) {
  Lock l(impl_->m);
  impl_->hold_sends = on;
}

}  // namespace weft::testing::fake_ibv
