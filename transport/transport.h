// weft's transport as one object: backend per channel, FIFO per channel, proxy per channel, wired through the
// bootstrap.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "bootstrap/bootstrap.h"
#include "transport/fifo.h"
#include "transport/net_backend.h"
#include "transport/nic_placement.h"
#include "transport/peer_set.h"
#include "transport/proxy.h"

namespace weft::transport {

struct TransportOptions {
  // Backend: this explicit choice, else WEFT_NET_BACKEND if set, else workload_backend, else auto.
  std::string backend;               // auto | ibverbs | socket | loopback
  std::string workload_backend;      // the workload's transport.inter_node, "" if unset
  std::string signal_mode;           // "" = WEFT_SIGNAL_MODE, else workload_signal_mode, else "batched"
  std::string workload_signal_mode;  // the workload's transport.signal_mode ("" if unset)
  int channels = 1;                  // NIC channels, one proxy each
  uint32_t fifo_depth = 0;           // 0 = WEFT_FIFO_DEPTH
  double timeout_s = 0;              // 0 = WEFT_PROXY_TIMEOUT
  // Placement per channel. Left empty, each comes from the topology mapping (WEFT_TOPO_FILE, else
  // the live machine) for this rank's GPU: gpu_pci_bus_id, else the GPU the launcher bound, else
  // local rank % GPUs (transport/nic_placement.h). Set use_topology = false to place nothing.
  std::vector<std::string> channel_cpusets;  // proxy CPUs per channel (topology Mapping::proxy_cpuset)
  std::vector<std::string> channel_nics;     // RDMA device per channel (topology Nic::name)
  std::vector<int> channel_ports;            // its port (1-based); 0 = the first ACTIVE port
  std::string gpu_pci_bus_id;                // the rank's GPU; "" = bound_gpu()
  bool use_topology = true;
  // Which ranks get a connection (transport/peer_set.h): the rail peer on every other node (the
  // fused ops' inter-node path), or every other rank (CPU tests, `weftrun check`, host-heap benchmarks).
  PeerNeed peers = PeerNeed::kRails;
  FifoMemory fifo_memory;      // cuda_fifo_memory() for device producers
  DeviceCopyHooks copy_hooks;  // cuda_copy_hooks() when the heap is device memory (socket backend)
};

using TransportCounters = ProxyCounters;

// Lifetime: create (collective) -> push / device pushes -> [application barrier] -> stop (collective
// in effect: call it after every rank has received what it waits for) -> destroy.
class Transport {
 public:
  // Collective over the bootstrap. `heap` is this rank's symmetric heap (same size on every rank).
  // Two phases: create backends and listen -> allgather endpoint blobs -> connect.
  static Status create(bootstrap::Bootstrap& boot, const Region& heap, const TransportOptions& options,
                       std::unique_ptr<Transport>* out);
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return size_; }
  int channels() const { return static_cast<int>(fifos_.size()); }
  const std::string& backend_name() const { return backend_name_; }
  // Why this backend: "requested", "auto: every rank can use ibverbs", or "auto chose socket: <why>".
  const std::string& backend_reason() const { return backend_reason_; }
  // How the backend keeps a fenced signal behind earlier puts (NetBackend::ordering(); "" if it does not say).
  std::string ordering() const { return backends_.empty() ? std::string() : backends_[0]->ordering(); }
  // How the backend registers the heap (NetBackend::memory_registration(); "" if it does not say).
  std::string memory_registration() const {
    return backends_.empty() ? std::string() : backends_[0]->memory_registration();
  }
  SignalMode signal_mode() const { return mode_; }
  // Per channel: the NIC, port and proxy CPUs this rank used, and the GPU they were chosen for.
  const std::vector<ChannelUse>& channel_use() const { return channel_use_; }
  const topology::RankPlacement& placement() const { return placement_; }
  // describe_placement() of the above: "GPU ..., NIC mlx5_0 port 1 (ibverbs), proxy CPUs 18-23".
  std::string placement_summary() const;
  double timeout_s() const { return timeout_s_; }
  const Region& heap() const { return heap_; }
  // Peers this rank is connected to through the net backend.
  bool connected(int peer) const { return peer >= 0 && peer < size_ && connected_[peer]; }
  // The job's layout as every rank reported it, and this rank's peer set from it (what create connected).
  const RankLayout& layout() const { return layout_; }
  const PeerSet& peer_set() const { return peer_set_; }
  // Connections the backends opened: one per peer per channel (a QP each on ibverbs).
  int connections_opened() const { return connections_opened_; }

  // The ring device producers push into (map it with cuda_fifo_device_handle()).
  FifoRingHeader* fifo_ring(int channel) const { return fifos_[channel]->ring(); }

  // Host producers (thread-safe): put / signal / put+signal on a channel.
  Status put(int channel, int peer, uint64_t src_offset, uint64_t dst_offset, uint64_t bytes);
  Status signal(int channel, int peer, uint64_t flag_offset, uint64_t value);
  Status put_signal(int channel, int peer, uint64_t src_offset, uint64_t dst_offset, uint64_t bytes,
                    uint64_t flag_offset, uint64_t value);
  Status push(int channel, const FifoCommand& cmd);
  // Completes everything pushed on every channel before the call.
  Status flush();

  // Waits (bounded by the proxy timeout) until the 8-byte flag at heap offset `flag_offset` reaches
  // `at_least`, failing early if a proxy fails; `what` names the wait in the timeout message.
  Status wait_flag(uint64_t flag_offset, uint64_t at_least, const char* what) const;

  // Kernel-side and API-side health check: the first proxy error, else kOk.
  Status status() const;
  std::string error_message() const;
  TransportCounters counters() const;
  uint64_t producer_stalls() const;

  // Drains every channel, stops the proxies, says goodbye to peers. Idempotent.
  Status stop();

 private:
  Transport() = default;
  int rank_ = 0, size_ = 1;
  std::string backend_name_;
  std::string backend_reason_;
  SignalMode mode_ = SignalMode::kBatched;
  double timeout_s_ = 30;
  Region heap_;
  std::vector<bool> connected_;
  RankLayout layout_;
  PeerSet peer_set_;
  int connections_opened_ = 0;
  topology::RankPlacement placement_;
  std::vector<ChannelUse> channel_use_;
  std::vector<std::unique_ptr<Fifo>> fifos_;
  std::vector<std::unique_ptr<NetBackend>> backends_;
  std::vector<std::unique_ptr<Proxy>> proxies_;
  bool stopped_ = false;
};

// The bootstrap's next exchange number (Bootstrap::next_exchange_id), for exchange keys.
int next_exchange_id(bootstrap::Bootstrap* boot);

// Resolves the signal mode: WEFT_SIGNAL_MODE, else the workload's value, else batched.
Status resolve_signal_mode(const std::string& explicit_mode, const std::string& workload_mode, SignalMode* out);

}  // namespace weft::transport
