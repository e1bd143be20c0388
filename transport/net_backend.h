// The inter-node net backend interface (socket, ibverbs, ofi, in-process loopback) and the registry that picks one.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "base/status.h"
#include "bootstrap/bootstrap.h"

namespace weft::transport {

enum class MemKind : int { kHost = 0, kDevice = 1 };

// Copies between host memory and a device-memory region (supplied by weft_transport_cuda); the
// socket backend stages through host memory with them when the registered region is on the GPU.
// Called from the proxy thread; `ctx` carries the device and stream (a copy must never queue behind
// a persistent kernel, so the CUDA hooks use a non-blocking stream of their own).
struct DeviceCopyHooks {
  Status (*to_region)(void* ctx, void* dst_in_region, const void* host_src, uint64_t bytes) = nullptr;
  Status (*from_region)(void* ctx, void* host_dst, const void* src_in_region, uint64_t bytes) = nullptr;
  void* ctx = nullptr;
  // Optional: page-locked host memory for the staging buffers (the copies then run at full PCIe speed
  // instead of bouncing through the driver's own buffer). Called when a peer is connected and at
  // close, never while the proxy runs. Null: ordinary heap memory.
  void* (*alloc_host)(void* ctx, uint64_t bytes) = nullptr;
  void (*free_host)(void* ctx, void* p) = nullptr;
  // Optional: makes the region's GPU current on the calling thread (the proxy thread starts with no
  // CUDA context, and a provider that takes device memory calls the CUDA driver on it).
  Status (*bind_thread)(void* ctx) = nullptr;
};

// The one memory region a backend serves: the rank's symmetric heap. Offsets index into it.
struct Region {
  void* base = nullptr;
  uint64_t bytes = 0;
  MemKind kind = MemKind::kHost;
  int dmabuf_fd = -1;          // device heap exported as dma-buf, when available (ibverbs)
  uint64_t dmabuf_offset = 0;  // where base lies in that dma-buf (it covers whole pages around the heap)
  // A device heap's GPU: CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING (0 none, 100 owner, 200
  // all devices; -1 not stated) and the flush that makes the NIC's earlier writes visible to that
  // GPU's kernels (cuFlushGPUDirectRDMAWrites). CudaHeap::region() fills both. Below owner, ibverbs
  // has the receiving proxy flush and then set each signal itself (ibverbs_backend.cpp).
  int rdma_writes_ordering = -1;
  std::function<Status()> flush_rdma_writes = nullptr;
  int cuda_device = -1;  // a device heap's CUDA ordinal (ofi registers it with FI_HMEM_CUDA); -1 unknown
};
// The attribute's "owner" level: the GPU's own kernels see RDMA writes in the order the NIC made them.
constexpr int kRdmaWritesOrderingOwner = 100;

// Per-backend endpoint information, published through the bootstrap (the modex blob).
struct SocketPeerInfo {
  std::vector<uint32_t> ipv4;  // addresses to try, network byte order, preferred first
  uint16_t port = 0;
};
// One RC QP of the publishing rank and the rank it faces.
struct IbvQpEntry {
  int32_t peer = -1;  // the rank this QP faces
  uint32_t qpn = 0;   // 24 bits
  uint32_t psn = 0;   // 24 bits: the publisher's send PSN, the peer's expected receive PSN
  bool operator==(const IbvQpEntry& o) const { return peer == o.peer && qpn == o.qpn && psn == o.psn; }
};
struct IbvPeerInfo {
  uint16_t lid = 0;
  uint8_t port_num = 1;
  uint8_t mtu = 0;                // enum ibv_mtu
  std::array<uint8_t, 16> gid{};  // RoCE / global routing
  uint64_t heap_addr = 0;         // remote virtual address of offset 0
  uint32_t rkey = 0;
  uint32_t flags = 0;  // kIbvSignalsBySend, nothing else (decode refuses other bits)
  // The publisher applies signals itself: send them as 16-byte SENDs (flag offset, value) to its
  // posted receives, never as WRITEs into its heap (its GPU needs a flush between data and flag).
  static constexpr uint32_t kIbvSignalsBySend = 1;
  // The QPs facing this rank's peer set (transport/peer_set.h), ascending by peer: O(peers), not
  // O(world). At most kMaxPeers; decode checks the count, the order and the 24-bit fields.
  std::vector<IbvQpEntry> qps;
  static constexpr uint32_t kMaxPeers = 16384;
  // The entry facing `rank`, or null.
  const IbvQpEntry* facing(int rank) const;
};
struct LoopbackPeerInfo {
  uint64_t fabric = 0;  // in-process fabric id
  int32_t pid = 0;      // loopback connects ranks of one process only
};
struct OfiPeerInfo {
  std::vector<uint8_t> addr;  // fi_getname of the rank's RDM endpoint (at most kMaxAddrBytes)
  std::string provider;       // the provider it was opened with (at most kMaxProviderChars): peers must agree
  uint64_t heap_base = 0;     // target address of heap offset 0 (0 where the provider takes offsets)
  uint64_t heap_key = 0;      // the heap's remote key
  // Device heaps staged through host memory (ofi_stage.h): the shape of the ring each pair of ranks
  // sets up at connect; stage_slots 0 = the heap is written directly.
  uint32_t stage_slots = 0, stage_slot_bytes = 0;
  // What the heap is (peers must agree): host memory, GPU memory staged (stage_slots > 0), or GPU
  // memory registered with the provider (FI_HMEM).
  static constexpr uint8_t kHostHeap = 0, kDeviceHeapStaged = 1, kDeviceHeapRegistered = 2;
  uint8_t heap_memory = kHostHeap;
  static constexpr uint32_t kMaxAddrBytes = 1024, kMaxProviderChars = 128;
  static constexpr uint32_t kMaxStageSlots = 1024, kMaxStageSlotBytes = 64u << 20;
};
using PeerInfo = std::variant<SocketPeerInfo, IbvPeerInfo, LoopbackPeerInfo, OfiPeerInfo>;

// Versioned serialisation of PeerInfo (kind, version and every length are checked on decode).
// Layout: magic u32, version u16, kind u16, rank i32, node i32 (kEndpointHeaderBytes), then the kind's fields.
constexpr uint64_t kEndpointHeaderBytes = 16;
// Bytes of an ibverbs endpoint blob facing `peers` ranks: lid, port, mtu, gid, heap address, rkey,
// flags (36 bytes), the entry count and 12 bytes per entry.
constexpr uint64_t ibv_peer_info_bytes(uint64_t peers) { return kEndpointHeaderBytes + 36 + 4 + 12 * peers; }
bootstrap::Blob encode_peer_info(int rank, int node, const PeerInfo& info);
Status decode_peer_info(const bootstrap::Blob& blob, int expect_rank, int* node, PeerInfo* info);

struct Completion {
  uint64_t wr_id = 0;
  int peer = -1;
};

struct BackendConfig {
  int rank = 0;
  int size = 1;
  int channel = 0;
  uint64_t secret = 0;        // job secret: every socket message carries it
  double timeout_s = 30;      // WEFT_PROXY_TIMEOUT
  std::string socket_ifname;  // WEFT_SOCKET_IFNAME
  std::string nic_name;       // ibverbs device for this channel ("mlx5_0"); "" = the first
  int nic_port = 0;           // its port (topology mapping); 0 = the first ACTIVE port
  DeviceCopyHooks copy_hooks;
  // The ranks this backend will connect to (the peer set's net list, ascending): backends that
  // allocate per-peer resources before connect (ibverbs QPs) allocate exactly these. Unset: every
  // other rank.
  std::optional<std::vector<int>> peers;
};

// Post flags, chosen by the proxy from the signal mode.
struct PostFlags {
  bool fence = false;            // NIC-side ordering: wait for earlier ops to this peer (IBV_SEND_FENCE)
  bool need_completion = false;  // the proxy will wait for this op: report it without later posts
  bool delivered = false;        // complete only once the target has it (the preflight's: a refused key
                                 // or a dead target fails the op); RC verbs always are
};

// One backend instance serves one channel of one rank. Nothing here blocks longer than
// BackendConfig::timeout_s, and nothing throws; a failed call logs once and returns its Status.
class NetBackend {
 public:
  virtual ~NetBackend() = default;
  virtual const char* name() const = 0;
  // Once, before local_info: the symmetric heap.
  virtual Status register_region(const Region& region) = 0;
  virtual Status local_info(PeerInfo* out) = 0;
  virtual Status connect(int peer, const PeerInfo& info) = 0;
  // Room for one more post to `peer` right now (otherwise poll first).
  virtual bool can_post(int peer) const = 0;
  virtual Status post_put(int peer, uint64_t local_offset, uint64_t remote_offset, uint64_t bytes, PostFlags flags,
                          uint64_t wr_id) = 0;
  // Stores `value` at the peer's flag_offset (8 bytes), visible only after this rank's earlier puts
  // to that peer (stream order for sockets; with flags.fence on RC QPs).
  virtual Status post_signal(int peer, uint64_t flag_offset, uint64_t value, PostFlags flags, uint64_t wr_id) = 0;
  // Makes progress on sends and receives; appends completed posts (each post completes once).
  virtual Status poll(std::vector<Completion>* done) = 0;
  // Idle: sleeps up to max_s, waking early on network activity.
  virtual void wait_activity(double max_s) = 0;
  // End: flushes posted work (bounded) and says goodbye to peers; after a failure (this backend's,
  // or `failure` from the caller) it tells them why instead, where the backend can. Releases resources.
  virtual Status close(const std::string& failure = "") = 0;
  // The first error, with the rank/peer it names ("" if none).
  virtual std::string error_message() const = 0;
  // How a fenced signal is kept behind earlier puts, for `weftrun check` ("stream order", "FI_FENCE",
  // "provider write-after-write order", "delivery complete"); "" where the backend has nothing to say.
  virtual std::string ordering() const { return ""; }
  // How the backend registers memory, for `weftrun check` (ofi: "mr_mode FI_MR_PROV_KEY: offsets,
  // the provider's keys, ..."); "" where the backend has nothing to say.
  virtual std::string memory_registration() const { return ""; }
  // Once, on the proxy thread, before it posts or polls (ofi with a GPU heap registered with the
  // provider: that GPU made current there).
  virtual void on_proxy_thread() {}
};

// WEFT_NET_BACKEND names: "auto" (this rank's candidate: auto_backend_choice), "ibverbs", "ofi"
// (libfabric, provider from WEFT_OFI_PROVIDER), "socket", and "loopback" (ranks of one process; tests).
Status resolve_backend_name(const std::string& requested, std::string* resolved);
// True for a libfabric provider name ("efa", "verbs;ofi_rxm", "tcp;ofi_rxm") that moves data by RDMA:
// one of its ';'-separated parts is efa, verbs, cxi or psm3 (tcp, udp, sockets, shm and utility
// providers layered over them are not).
bool ofi_provider_is_rdma(const std::string& provider);
// `auto` on one rank, as a pure function: ibverbs where a verbs device is present; else ofi where
// the provider the ofi backend would open is RDMA-capable (`ofi_named`, WEFT_OFI_PROVIDER, else
// libfabric's first choice, the first of `ofi_providers`, which lists what libfabric offers in its
// order); else socket. *why says why, naming the providers that were passed over.
std::string auto_backend_choice(bool verbs_device, const std::string& verbs_why,
                                const std::vector<std::string>& ofi_providers, const std::string& ofi_named,
                                std::string* why);
// The same on this machine (libibverbs' device list, libfabric's providers); logs nothing.
std::string auto_backend_here(std::string* why);
Status make_backend(const std::string& resolved_name, const BackendConfig& config, std::unique_ptr<NetBackend>* out);

// Factories (socket_backend.cpp, ibverbs_backend.cpp, loopback_backend.cpp).
std::unique_ptr<NetBackend> make_socket_backend(const BackendConfig& config);
std::unique_ptr<NetBackend> make_loopback_backend(const BackendConfig& config);
// kUnsupported (with a logged reason) where weft was built without libibverbs or no device opens.
Status make_ibverbs_backend(const BackendConfig& config, std::unique_ptr<NetBackend>* out);
// True when libibverbs lists at least one RDMA device; *why says why not.
bool ibverbs_device_present(std::string* why);
// kUnsupported where weft was built without libfabric; kNotFound (logged, naming the provider) where
// WEFT_OFI_PROVIDER names a provider libfabric does not offer here.
Status make_ofi_backend(const BackendConfig& config, std::unique_ptr<NetBackend>* out);
// True when weft was built with libfabric and it offers an RDM endpoint with RMA through `provider`
// ("" = any); *why says which provider it found or why none.
bool ofi_provider_present(const std::string& provider, std::string* why);
// The providers offering an RDM endpoint with RMA here, libfabric's first choice first (empty without
// libfabric, or where it offers none).
std::vector<std::string> ofi_provider_list();

}  // namespace weft::transport
