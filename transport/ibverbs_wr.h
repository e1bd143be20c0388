// verbs structs from weft's plans (needs <infiniband/verbs.h>, no device): WR conversion and QP transitions.
#pragma once

#include <infiniband/verbs.h>

#include <algorithm>
#include <cstring>

#include "transport/ibverbs_plan.h"
#include "transport/net_backend.h"

namespace weft::transport::ibv {

// Fills `wr` (and its one SGE, none for a zero-length probe) from a plan: RDMA WRITE (or SEND, for a
// signal record) with the plan's signalled / fenced / inline flags.
inline void to_send_wr(const WrPlan& w, ibv_sge* sge, ibv_send_wr* wr) {
  *sge = ibv_sge{w.local_addr, w.length, w.lkey};
  *wr = ibv_send_wr{};
  wr->wr_id = w.wr_id;
  wr->sg_list = w.length ? sge : nullptr;
  wr->num_sge = w.length ? 1 : 0;
  wr->opcode = w.send ? IBV_WR_SEND : IBV_WR_RDMA_WRITE;
  wr->send_flags =
      (w.signaled ? IBV_SEND_SIGNALED : 0) | (w.fence ? IBV_SEND_FENCE : 0) | (w.inline_data ? IBV_SEND_INLINE : 0);
  if (!w.send) {
    wr->wr.rdma.remote_addr = w.remote_addr;
    wr->wr.rdma.rkey = w.rkey;
  }
}

// How this side's QPs route: RoCE (an Ethernet link layer) always needs the global route header with
// this port's chosen GID (sgid_index) and the traffic class; InfiniBand inside one subnet uses LIDs.
struct Route {
  bool global = false;
  uint8_t sgid_index = 0;
  uint8_t traffic_class = 0;  // WEFT_IB_TC, else the site's default
  uint8_t hop_limit = 64;
};

// INIT -> RTR toward `peer`'s QP that faces `my_rank`; returns the attribute mask, or 0 when the
// peer published no QP facing `my_rank` (the two ranks' peer sets disagree).
inline int rtr_attr(const IbvPeerInfo& peer, int my_rank, uint8_t port, ibv_mtu active_mtu, const Route& route,
                    ibv_qp_attr* m) {
  *m = ibv_qp_attr{};
  const IbvQpEntry* facing = peer.facing(my_rank);
  if (!facing) return 0;
  m->qp_state = IBV_QPS_RTR;
  m->path_mtu = static_cast<ibv_mtu>(std::min<int>(peer.mtu, active_mtu));
  m->dest_qp_num = facing->qpn;
  m->rq_psn = facing->psn;
  m->max_dest_rd_atomic = 1;
  m->min_rnr_timer = 12;
  m->ah_attr.dlid = peer.lid;
  m->ah_attr.port_num = port;
  if (route.global) {
    m->ah_attr.is_global = 1;
    memcpy(m->ah_attr.grh.dgid.raw, peer.gid.data(), 16);
    m->ah_attr.grh.sgid_index = route.sgid_index;
    m->ah_attr.grh.hop_limit = route.hop_limit;
    m->ah_attr.grh.traffic_class = route.traffic_class;
  }
  return IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
         IBV_QP_MIN_RNR_TIMER;
}

// RTR -> RTS with this side's send PSN; retries bounded (timeout 14 ~ 67 ms x 7 retries).
inline int rts_attr(uint32_t my_psn, ibv_qp_attr* s) {
  *s = ibv_qp_attr{};
  s->qp_state = IBV_QPS_RTS;
  s->sq_psn = my_psn;
  s->timeout = 14;
  s->retry_cnt = 7;
  s->rnr_retry = 7;
  s->max_rd_atomic = 1;
  return IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
}

}  // namespace weft::transport::ibv
