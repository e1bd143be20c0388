// Versioned, size-checked framing for the small blobs ranks exchange through the bootstrap.
#pragma once

#include <cstdint>
#include <string>

#include "bootstrap/bootstrap.h"

namespace weft::bootstrap {

// Frame layout (little endian): u32 magic 'WEFT', u16 kind, u16 version, u32 payload bytes, payload.
// A decoder rejects a wrong magic, kind, version or length with a message naming the peer, so a blob
// from a different weft build or a truncated store entry never reads as garbage.
constexpr uint32_t kBlobMagic = 0x54464557u;  // "WEFT"
constexpr size_t kBlobHeaderBytes = 12;
// The largest payload a peer may send (endpoint lists, IPC handles: kilobytes in practice). Checked
// on both sides, and before anything is copied from a store entry or a file.
constexpr size_t kMaxBlobBytes = size_t{16} << 20;

Blob seal_blob(uint16_t kind, uint16_t version, const Blob& payload);
// `peer` and `what` only name the blob in the error message.
Status open_blob(const Blob& sealed, uint16_t kind, uint16_t version, int peer, const char* what, Blob* payload);

// Append-only writer and bounds-checked reader for blob payloads.
class BlobWriter {
 public:
  void u32(uint32_t v);
  void u64(uint64_t v);
  void f64(double v);
  void str(const std::string& s);
  void bytes(const Blob& b);
  const Blob& blob() const { return out_; }

 private:
  void raw(const void* p, size_t n);
  Blob out_;
};

class BlobReader {
 public:
  explicit BlobReader(const Blob& in) : in_(in) {}
  bool u32(uint32_t* v);
  bool u64(uint64_t* v);
  bool f64(double* v);
  bool str(std::string* s);
  bool bytes(Blob* b);
  bool done() const { return pos_ == in_.size(); }

 private:
  bool raw(void* p, size_t n);
  const Blob& in_;
  size_t pos_ = 0;
};

}  // namespace weft::bootstrap
