// The ofi backend's fixed sizes, and what one channel asks libfabric for from them: one place for the
// backend (ofi_backend.cpp) and the resource report (peer_set.cpp), so the report counts what the wiring
// holds. libfabric-free.
//
//   per channel, facing `peers` ranks of a `world`-rank job:
//   endpoint   1 RDM endpoint, bound to the CQ and the AV below
//   CQ         cq_entries(peers)   = min(256 x (peers + 1) + 4 x 32, 65536)
//   AV         av_entries(peers)   = peers + 1 (fi_av_attr.count; `peers` addresses inserted)
//   receives   kRecvSlots control receives kept posted, kMsgBytes each (inside the control block)
//   MRs        host heap:   the heap, the control block
//              device heap: the control block, one staging registration per peer (host staging,
//                           ofi_stage.h: the ring the peer writes here, then the ring this rank sends from)
#pragma once

#include <algorithm>
#include <cstdint>

namespace weft::transport::ofi {

constexpr uint64_t kOpsPerPeer = 256;   // writes posted to libfabric, not completed, per peer
constexpr uint64_t kRecvSlots = 32;     // control-message receives kept posted (hellos, staging credits)
constexpr uint64_t kMsgBytes = 64;      // one control message: each receive buffer, the hello, each credit
constexpr uint64_t kValueBytes = 8;     // control block: a signal value slot per operation context
constexpr uint64_t kCqCeiling = 65536;  // the CQ never asks for more entries
constexpr uint32_t kStageSlots = 8;     // device heaps: slots per peer and direction
constexpr uint32_t kStageSlotBytes = 128u << 10;
// Keys weft requests where the provider does not choose them (no FI_MR_PROV_KEY): the heap, the control
// block, and a staging ring per peer (kStageKey + peer). Unlike the 1, 2, 3... a provider hands out.
constexpr uint64_t kHeapKey = 0x11, kCtrlKey = 0x12, kStageKey = 0x13;

// What a channel faces: its peers and one entry of slack (the full mesh's sizes as they always were).
constexpr uint64_t faced(uint64_t peers) { return peers + 1; }
// CQ entries: every peer's posted writes and four rounds of the posted receives, capped.
constexpr uint64_t cq_entries(uint64_t peers) {
  return std::min<uint64_t>(kOpsPerPeer * faced(peers) + 4 * kRecvSlots, kCqCeiling);
}
constexpr uint64_t av_entries(uint64_t peers) { return faced(peers); }
// Operation contexts: the writes, a credit per peer, the posted receives, the hello.
constexpr uint64_t contexts(uint64_t peers) { return kOpsPerPeer * faced(peers) + faced(peers) + kRecvSlots + 1; }
// The control block (one registration per channel): a value slot per context, then the hello, the
// receive buffers and a credit message per rank of the job (indexed by rank, so it grows with the world).
constexpr uint64_t control_bytes(uint64_t peers, uint64_t world) {
  return contexts(peers) * kValueBytes + kMsgBytes * (1 + kRecvSlots + world);
}
constexpr uint64_t receive_bytes() { return kRecvSlots * kMsgBytes; }  // part of the control block
// Device heaps: host memory registered per connected peer (its receive ring and this rank's send ring).
constexpr uint64_t stage_bytes_per_peer() { return 2ull * kStageSlots * kStageSlotBytes; }

}  // namespace weft::transport::ofi
