// Blob framing: header check on decode, bounds-checked field reads.
#include "bootstrap/blob.h"

#include <cstring>

#include "base/log.h"

namespace weft::bootstrap {
namespace {

void put_le(Blob* out, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out->push_back(static_cast<uint8_t>(v >> (8 * i)));
}
uint64_t get_le(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

}  // namespace

Blob seal_blob(uint16_t kind, uint16_t version, const Blob& payload) {
  Blob out;
  out.reserve(kBlobHeaderBytes + payload.size());
  put_le(&out, kBlobMagic, 4);
  put_le(&out, kind, 2);
  put_le(&out, version, 2);
  put_le(&out, payload.size(), 4);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

Status open_blob(const Blob& sealed, uint16_t kind, uint16_t version, int peer, const char* what, Blob* payload) {
  if (sealed.size() < kBlobHeaderBytes) {
    WEFT_WARN(kBoot, "blob '%s' from rank %d: %zu bytes, shorter than its %zu-byte header", what, peer, sealed.size(),
              kBlobHeaderBytes);
    return Status::kProtocolError;
  }
  const uint8_t* p = sealed.data();
  uint32_t magic = static_cast<uint32_t>(get_le(p, 4));
  uint16_t got_kind = static_cast<uint16_t>(get_le(p + 4, 2));
  uint16_t got_version = static_cast<uint16_t>(get_le(p + 6, 2));
  uint64_t len = get_le(p + 8, 4);
  if (magic != kBlobMagic || got_kind != kind) {
    WEFT_WARN(kBoot, "blob '%s' from rank %d: not a weft blob of kind %u (magic 0x%08x, kind %u)", what, peer, kind,
              magic, got_kind);
    return Status::kProtocolError;
  }
  if (got_version != version) {
    WEFT_WARN(kBoot, "blob '%s' from rank %d: version %u, this build reads version %u (mixed weft builds in one job?)",
              what, peer, got_version, version);
    return Status::kProtocolError;
  }
  if (len > kMaxBlobBytes) {
    WEFT_WARN(kBoot, "blob '%s' from rank %d: header says %llu payload bytes; at most %zu are accepted", what, peer,
              static_cast<unsigned long long>(len), kMaxBlobBytes);
    return Status::kProtocolError;
  }
  if (len != sealed.size() - kBlobHeaderBytes) {
    WEFT_WARN(kBoot, "blob '%s' from rank %d: header says %llu payload bytes, %zu arrived", what, peer,
              static_cast<unsigned long long>(len), sealed.size() - kBlobHeaderBytes);
    return Status::kProtocolError;
  }
  payload->assign(sealed.begin() + kBlobHeaderBytes, sealed.end());
  return Status::kOk;
}

void BlobWriter::raw(const void* p, size_t n) {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  out_.insert(out_.end(), b, b + n);
}
void BlobWriter::u32(uint32_t v) { put_le(&out_, v, 4); }
void BlobWriter::u64(uint64_t v) { put_le(&out_, v, 8); }
void BlobWriter::f64(double v) {
  uint64_t bits;
  memcpy(&bits, &v, sizeof bits);
  u64(bits);
}
void BlobWriter::str(const std::string& s) {
  u32(static_cast<uint32_t>(s.size()));
  raw(s.data(), s.size());
}
void BlobWriter::bytes(const Blob& b) {
  u32(static_cast<uint32_t>(b.size()));
  raw(b.data(), b.size());
}

bool BlobReader::raw(void* p, size_t n) {
  if (n > in_.size() - pos_) return false;
  memcpy(p, in_.data() + pos_, n);
  pos_ += n;
  return true;
}
bool BlobReader::u32(uint32_t* v) {
  uint8_t b[4];
  if (!raw(b, 4)) return false;
  *v = static_cast<uint32_t>(get_le(b, 4));
  return true;
}
bool BlobReader::u64(uint64_t* v) {
  uint8_t b[8];
  if (!raw(b, 8)) return false;
  *v = get_le(b, 8);
  return true;
}
bool BlobReader::f64(double* v) {
  uint64_t bits;
  if (!u64(&bits)) return false;
  memcpy(v, &bits, sizeof *v);
  return true;
}
bool BlobReader::str(std::string* s) {
  uint32_t n;
  if (!u32(&n) || n > in_.size() - pos_) return false;
  s->assign(reinterpret_cast<const char*>(in_.data() + pos_), n);
  pos_ += n;
  return true;
}
bool BlobReader::bytes(Blob* b) {
  uint32_t n;
  if (!u32(&n) || n > in_.size() - pos_) return false;
  b->assign(in_.begin() + pos_, in_.begin() + pos_ + n);
  pos_ += n;
  return true;
}

}  // namespace weft::bootstrap
