// Fake verbs for tests: an in-process RDMA fabric behind the ibverbs function table. It enforces the QP
// state machine (RESET -> INIT -> RTR -> RTS with the required and allowed attribute masks), routes
// (LID on InfiniBand, a valid GID and global route on RoCE), lkey/rkey bounds and access, send- and
// receive-queue depth and inline size, and executes each QP's WRITEs and SENDs in order (RC), moving
// the bytes between ranks of one process; a SEND takes the peer's oldest posted receive and completes
// it on the peer's receive CQ, and waits (RNR) while there is none. Memory marked with
// defer_visibility() models a GPU whose kernels see RDMA writes in no particular order until a flush.
// Misuse fails the call as the real library would and is recorded in violations().
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "transport/ibverbs_api.h"

namespace weft::testing::fake_ibv {

struct Gid {
  uint32_t type = IBV_GID_TYPE_IB;  // IBV_GID_TYPE_IB / _ROCE_V1 / _ROCE_V2
  uint32_t ndev_ifindex = 0;
  std::array<uint8_t, 16> raw{};
};
struct PortSpec {
  ibv_port_state state = IBV_PORT_ACTIVE;
  uint8_t link_layer = IBV_LINK_LAYER_INFINIBAND;
  ibv_mtu mtu = IBV_MTU_4096;
  uint16_t lid = 0;
  std::vector<Gid> gids;
};
struct DeviceSpec {
  std::string name;
  std::vector<PortSpec> ports;
  int max_qp_wr = 16384;  // ibv_device_attr::max_qp_wr: the deepest send queue the device makes
};

// An InfiniBand HCA with one ACTIVE port: LID `lid`, GID 0 the port GID.
DeviceSpec ib_device(const std::string& name, uint16_t lid);
// A RoCE NIC with one ACTIVE port and the GID table mlx5 builds for a netdev with IPv4 10.0.0.`host`:
// 0 RoCE v1 fe80::, 1 RoCE v2 fe80::, 2 RoCE v1 ::ffff:10.0.0.host, 3 RoCE v2 ::ffff:10.0.0.host.
DeviceSpec roce_device(const std::string& name, uint8_t host);

// What the fabric saw a QP's RTR transition ask for.
struct RouteSeen {
  std::string device;
  int port = 0;
  bool global = false;
  int sgid_index = -1;
  int traffic_class = -1;
  uint32_t dest_qpn = 0;
};

struct Counters {
  uint64_t writes = 0;  // WRITEs executed
  uint64_t bytes = 0;
  uint64_t inline_writes = 0;
  uint64_t zero_length = 0;
  uint64_t fenced = 0;
  uint64_t signaled = 0;
  uint64_t max_outstanding = 0;  // deepest send queue seen (slots not yet freed by a polled CQE)
  uint64_t dmabuf_mrs = 0;
  uint64_t plain_mrs = 0;
  uint64_t sends = 0;          // SENDs executed (each completed a receive)
  uint64_t recvs_posted = 0;   // ibv_post_recv work requests accepted
  uint64_t rnr_waits = 0;      // times a SEND found no receive posted and waited
  uint64_t deferred = 0;       // WRITEs into deferred memory (not visible at once)
  uint64_t early_visible = 0;  // deferred WRITEs that became visible without a flush
  uint64_t flushes = 0;        // flush_deferred() calls
};

class Fabric {
 public:
  // Installs itself as the verbs table (ibv::set_api_for_testing) until destroyed. One at a time.
  explicit Fabric(std::vector<DeviceSpec> devices);
  ~Fabric();
  Fabric(const Fabric&) = delete;
  Fabric& operator=(const Fabric&) = delete;

  const transport::ibv::Api& api() const;
  std::vector<std::string> violations() const;  // every refused call, with why
  Counters counters() const;
  std::vector<RouteSeen> routes() const;
  size_t live_objects() const;  // contexts, PDs, CQs, MRs and QPs not yet released
  // What the live objects hold, summed over every context: what a resource report should count.
  struct Held {
    uint64_t queue_pairs = 0;
    uint64_t memory_registrations = 0;
    uint64_t registered_bytes = 0;
    uint64_t completion_queues = 0;
    uint64_t completion_entries = 0;  // the depths the CQs were created with
    uint64_t receives_posted = 0;     // receives posted and not yet consumed by a SEND
  };
  Held held() const;

  // Knobs.
  // 0 (default): a poll executes everything pending; n > 0: 1..n WRs per QP per poll (random), QPs in a
  // random order.
  void set_exec_budget(int wrs_per_qp_per_poll);
  void set_no_rdma_subsystem(bool on);      // ibv_get_device_list fails with ENOSYS (as in CI)
  void set_gid_table_unsupported(bool on);  // ibv_query_gid_table fails: the backend walks query_gid_ex
  // WRITEs to or from QPs of this device never arrive (a wrong route, a dead link): they fail with
  // retry exceeded, or with `silent` stay in the send queue, never completing.
  void set_unreachable(const std::string& device, bool silent = false);
  // ibv_reg_mr of memory overlapping [base, base + bytes) fails with EFAULT, as ibv_reg_mr of GPU
  // memory does without a peer-memory client.
  void refuse_reg_mr_of(const void* base, uint64_t bytes);
  // A dma-buf the fake accepts in ibv_reg_dmabuf_mr: `bytes` of host memory at `base` stand for the
  // exported pages. Returns its fd (not a real descriptor).
  int add_dmabuf(void* base, uint64_t bytes);
  // WRITEs landing in [base, base + bytes) are not visible there at once: each stays pending until a
  // later poll makes it visible at random (in any order, except that overlapping writes keep theirs),
  // or flush_deferred() makes every pending one visible. As a GPU below "owner" RDMA write ordering
  // treats the NIC's writes, as its kernels see them.
  void defer_visibility(const void* base, uint64_t bytes);
  // The flush (cuFlushGPUDirectRDMAWrites): every pending write visible now, oldest first. Returns how many.
  size_t flush_deferred();
  size_t deferred_pending() const;
  // SENDs never execute (a receiver that never gets a receive to them: RNR for ever).
  void set_hold_sends(bool on);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace weft::testing::fake_ibv
