// Which ranks a rank connects to (the peer set), and what those connections cost it (the resource report).
// CUDA-free and pure: Transport::create opens exactly this set, `weftrun plan --json` reports from it.
//
//   3 nodes x 4 GPUs, rank = (node, local). Rail peers share a local index; node-mates share a node:
//
//            local 0   local 1   local 2   local 3
//   node 0:  r0 ═════ r1 ═════ r2 ═════ r3        ═══ NVLink / CUDA IPC (node-mates, no NIC)
//            │         │         │         │
//   node 1:  r4 ═════ r5 ═════ r6 ═════ r7        │   rail: one NIC connection per pair of
//            │         │         │         │           rail peers (a QP per channel on ibverbs)
//   node 2:  r8 ═════ r9 ═════ r10 ════ r11
//
//   peer set of r5 (kRails): net = {r1, r9} (its rail on every other node), nvlink = {r4, r6, r7}.
//
// Why the rails are enough, op by op:
// - AllGather+GEMM: a shard crosses each node boundary once, to the rail peer, who forwards it over
//   NVLink to its node-mates (kernels/ag_gemm_nodes_plan.h).
// - GEMM+ReduceScatter / AllReduce: an owner's rows are reduced inside each other node first, on the
//   owner's rail peer there, which sends the node sum to the owner over the rail
//   (kernels/gemm_reduce_nodes_plan.h).
// - MoE (expert-parallel all-to-all over up to the whole job): a token for an expert on rank (n, l')
//   leaves rank (m, l) through the rail to (n, l), which forwards it over NVLink to (n, l'). Every
//   other node is reached, but through one connection per remote node, not one per remote rank:
//   N - 1 queue pairs per channel instead of N x G - 1.
// - kEveryRank (the transport check, host-heap tests and benchmarks) puts to every rank directly
//   through the net backend, node-mates included: a full mesh, W - 1 connections per rank.
//
// Uneven nodes (3 + 1): the rail partner of local index l on a node with c ranks is local l % c, and
// the set is made symmetric (a connects to b exactly when b connects to a), so both ends of every
// connection agree without a second exchange. With equal nodes this is "same local index".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace weft::transport {

enum class PeerNeed : int {
  kRails = 0,      // fused ops (AllGather+GEMM, GEMM+RS/AR, MoE): the rail peer on every other node
  kEveryRank = 1,  // every other rank through the net backend (transport check, host-heap tests, benchmarks)
};
const char* to_string(PeerNeed need);

// Where every rank of the job lives: node_of[r] in 0..nodes-1, local_of[r] its index among the
// ranks of that node (0..ranks on the node - 1, each once).
struct RankLayout {
  std::vector<int> node_of;
  std::vector<int> local_of;
};

// Block placement (srun's default): rank = node * per_node + local.
RankLayout block_layout(int nodes, int per_node);

// kOk when the layout is well formed (non-empty, lists of one length, nodes 0..N-1 each holding
// local indices 0..c-1 once); *why says what is wrong otherwise.
Status check_layout(const RankLayout& layout, std::string* why);

// A layout as a launcher reported it, made well formed: node ids made dense (0, 1, ... in ascending
// order of id; a PMIx server may number nodes sparsely), and on a node whose local indices are not
// 0..c-1 once each, the local index replaced by the rank's order on that node. Negative ids count
// as one node. Returns true when anything changed.
bool normalize_layout(RankLayout* layout);

struct PeerSet {
  int rank = -1, node = -1, local = -1;
  std::vector<int> net;     // ranks connected through the net backend, ascending
  std::vector<int> nvlink;  // node-mates (NVLink / CUDA IPC, not the net backend), ascending
};

// The peer set of `rank`. O(world) time, O(peers) output. Fails (with *why) on a malformed layout
// or a rank outside it.
Status peer_set(const RankLayout& layout, int rank, PeerNeed need, PeerSet* out, std::string* why);

// How signals reach a rank's heap over ibverbs, which sets what its wiring holds. Known only at run time
// (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING of the heap's GPU), so a report names the one it counts.
enum class SignalPath : int {
  kWrite = 0,  // the peer's NIC writes the flag: a host heap, or a GPU at "owner" RDMA write ordering or above
  kSend = 1,   // SENDs to receives this rank posts, applied by its proxy after a flush: a GPU below "owner"
};
const char* to_string(SignalPath path);  // "write" | "send"

// Where a rank's heap lives, which sets what the ofi backend holds for it (ofi_sizes.h): a host heap is
// registered and written directly; a device heap is staged through host rings, one registration per
// peer, and is itself not registered. Only the ofi figures depend on it.
enum class HeapPlace : int {
  kHost = 0,    // `weftrun check`, host-heap tests and benchmarks
  kDevice = 1,  // the fused ops: GPU memory
};
const char* to_string(HeapPlace place);  // "host" | "device"

// What the op asks of the transport, for the report below.
struct ResourceInputs {
  std::string backend = "ibverbs";          // ibverbs | ofi | socket | loopback | none
  int channels = 1;                         // NIC channels (proxies), WEFT_NET_CHANNELS
  uint64_t heap_bytes = 0;                  // the op's symmetric heap on every rank
  int chunks_per_peer = 1;                  // chunk messages in flight to one net peer (the op's pipeline)
  SignalPath signals = SignalPath::kWrite;  // ibverbs only: how signals reach every rank's heap
  HeapPlace heap = HeapPlace::kHost;        // ofi only: host heap (registered) or device heap (staged)
};

// Per rank, from peer_set(): what the wiring opens and holds. Counts are per rank, summed over channels.
struct RankResources {
  int rank = -1, node = -1, local = -1;
  int net_peers = 0;     // connections per channel
  int nvlink_peers = 0;  // node-mates mapped through CUDA IPC
  int channels = 0;
  int queue_pairs = 0;      // ibverbs: one RC QP per net peer per channel
  int endpoints = 0;        // ofi: one RDM endpoint per channel; socket: one TCP stream per peer per channel
  int address_entries = 0;  // ofi: address-vector entries asked (net peers + 1 per channel), all channels
  // Per channel. ibverbs: the heap and the signal staging records, and with SEND signals the receive
  // buffers. ofi: the control block (signal values, hello, receive buffers, credits) and, for a host
  // heap, the heap; for a device heap, a staging registration per peer instead of the heap.
  int memory_registrations = 0;
  uint64_t registered_bytes = 0;  // every registration above, receive buffers and staging rings included
  uint64_t heap_bytes = 0;
  uint64_t staging_bytes = 0;       // ofi, device heap: host staging rings (part of registered_bytes), all channels
  uint32_t fifo_depth = 0;          // GPU->proxy ring slots per channel: every in-flight chunk fits (power of two)
  uint64_t fifo_bytes = 0;          // all channels' rings
  int completion_queues = 0;        // per channel: ibverbs the send CQ and, with SEND signals, a receive CQ; ofi one
  uint64_t completion_entries = 0;  // ibverbs, ofi: entries of every CQ above, all channels
  // Receives posted, all channels: ibverbs with SEND signals kRecvDepth per QP; ofi kRecvSlots per channel.
  uint64_t receive_entries = 0;
  uint64_t receive_bytes = 0;   // their registered buffers (part of registered_bytes), all channels
  uint64_t exchange_bytes = 0;  // the endpoint blob this rank publishes, all channels
};

Status rank_resources(const RankLayout& layout, int rank, PeerNeed need, const ResourceInputs& in, RankResources* out,
                      std::string* why);

// Every rank's report, as JSON: {"need": ..., "backend": ..., "signals": "write"|"send", "heap":
// "host"|"device", "ranks": [{"first_rank", "last_rank", ...}, ...], "max": {...}}; consecutive ranks with
// equal reports share one entry (128 x 8 of one shape is one entry, not 1,024). "signals" names the path
// every ibverbs figure counts, "heap" the heap every ofi figure counts.
Status resources_json(const RankLayout& layout, PeerNeed need, const ResourceInputs& in, std::string* text,
                      std::string* why);

// The "resources" section of `weftrun plan --json`: a block layout of nodes x per_node running a
// fused op (rails), `backend` as the plan chose it ("none" on one node), WEFT_NET_CHANNELS channels,
// the op's heap, and in-flight chunks per peer from the bytes each rank sends over the NIC and the
// NIC chunk size. On ibverbs the GPU's RDMA write ordering is not known until run time, so "ranks" and
// "max" count the costlier SEND-signal wiring ("signals": "send") and "max_write_signals" gives the
// costliest rank where the NIC writes every flag. A fused op's heap is GPU memory ("heap": "device"):
// on ofi, the host staging rings. Malformed inputs give {"error": why}.
std::string plan_resources_json(int nodes, int per_node, const std::string& backend, uint64_t heap_bytes,
                                uint64_t nic_bytes_out, uint64_t nic_chunk_bytes);

}  // namespace weft::transport
