// The socket backend's wire format and the validation every incoming header passes before anything is written.
#pragma once

#include <cstdint>
#include <string>

namespace weft::transport {

// Every message on a proxy-to-proxy TCP stream starts with this 48-byte header (host byte order;
// weft ranks of one job share an architecture). A stream carries one direction only: the
// connecting rank sends, the accepting rank receives and writes into its registered region.
//
//   byte  0 u32 magic     'WFTS'
//   byte  4 u16 version   kWireVersion
//   byte  6 u16 kind      WireKind
//   byte  8 u32 src_rank  sender; must match the stream's hello
//   byte 12 u32 channel   must match the receiving backend's channel
//   byte 16 u64 secret    job secret from the bootstrap
//   byte 24 u64 offset    put: destination offset; signal: flag offset (8-aligned)
//   byte 32 u64 length    put/abort: payload bytes that follow; signal: the flag value
//   byte 40 u64 reserved  zero
struct WireHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t kind;
  uint32_t src_rank;
  uint32_t channel;
  uint64_t secret;
  uint64_t offset;
  uint64_t length;
  uint64_t reserved;
};
static_assert(sizeof(WireHeader) == 48, "wire header is 48 bytes");

constexpr uint32_t kWireMagic = 0x53544657u;  // "WFTS"
constexpr uint16_t kWireVersion = 1;
// kAbort: the sender failed and is leaving; `length` bytes of text (its error) follow, so the
// receiver names the first cause instead of blaming the messenger.
enum class WireKind : uint16_t { kHello = 1, kPut = 2, kSignal = 3, kBye = 4, kAbort = 5 };
constexpr uint64_t kMaxAbortText = 4096;

struct WireExpect {
  uint64_t secret = 0;
  uint64_t region_bytes = 0;
  int self_rank = 0;
  int world_size = 1;
  int channel = 0;
  int stream_src = -1;  // -1: no hello yet, so only a hello is acceptable
};

// True when `h` may be acted on; otherwise *why says what was wrong. Bounds are checked without
// overflow, so no header can name bytes outside [0, region_bytes).
bool validate_wire_header(const WireHeader& h, const WireExpect& e, std::string* why);

WireHeader make_wire_header(WireKind kind, int src_rank, int channel, uint64_t secret, uint64_t offset,
                            uint64_t length);

}  // namespace weft::transport
