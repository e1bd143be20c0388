// Fuzz target: what a peer publishes through the bootstrap: the blob frame (open_blob, BlobReader)
// and the transport's endpoint blob (decode_peer_info); a decode either fails or round-trips.
#include <cstdint>
#include <string>
#include <variant>

#include "bootstrap/blob.h"
#include "fuzz_common.h"
#include "transport/net_backend.h"

using namespace weft;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz_quiet_logs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const bootstrap::Blob blob(data, data + size);
  // The endpoint blob, as a peer's rank 1 would publish it.
  int node = -1;
  transport::PeerInfo info;
  if (transport::decode_peer_info(blob, 1, &node, &info) == Status::kOk) {
    // A decoded endpoint re-encodes to the very same bytes (nothing was ignored or invented).
    FUZZ_ASSERT(transport::encode_peer_info(1, node, info) == blob);
    if (const auto* s = std::get_if<transport::SocketPeerInfo>(&info)) FUZZ_ASSERT(!s->ipv4.empty());
    if (const auto* v = std::get_if<transport::IbvPeerInfo>(&info)) {  // bounded, ascending, never facing itself
      FUZZ_ASSERT(v->qps.size() <= transport::IbvPeerInfo::kMaxPeers);
      for (size_t i = 0; i < v->qps.size(); ++i)
        FUZZ_ASSERT(v->qps[i].peer >= 0 && v->qps[i].peer != 1 && (i == 0 || v->qps[i].peer > v->qps[i - 1].peer));
    }
  }
  // The bootstrap frame, with the kind/version this input's header names, then a field walk.
  if (size >= bootstrap::kBlobHeaderBytes) {
    const uint16_t kind = static_cast<uint16_t>(data[4] | data[5] << 8);
    const uint16_t version = static_cast<uint16_t>(data[6] | data[7] << 8);
    bootstrap::Blob payload;
    if (bootstrap::open_blob(blob, kind, version, 0, "fuzz", &payload) == Status::kOk) {
      FUZZ_ASSERT(payload.size() == size - bootstrap::kBlobHeaderBytes);
      FUZZ_ASSERT(bootstrap::seal_blob(kind, version, payload) == blob);
      bootstrap::BlobReader r(payload);
      uint32_t u = 0;
      std::string s;
      bootstrap::Blob b;
      // The walk the bootstrap's put entries and reports take: a rank, then strings and byte runs.
      for (int i = 0; i < 64 && !r.done(); ++i) {
        const bool ok = (i % 3 == 0) ? r.u32(&u) : (i % 3 == 1) ? r.str(&s) : r.bytes(&b);
        if (!ok) break;
        FUZZ_ASSERT(s.size() <= payload.size() && b.size() <= payload.size());
      }
    }
  }
  return 0;
}
