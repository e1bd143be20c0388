// Wiring: all published entries travel in one versioned blob per rank.
#include "bootstrap/wiring.h"

#include "base/log.h"
#include "bootstrap/blob.h"

namespace weft::bootstrap {
namespace {
constexpr uint16_t kWiringKind = 2;
}

Wiring::Wiring(Bootstrap& boot, std::string name, uint16_t version)
    : boot_(boot), name_(std::move(name)), version_(version) {}

void Wiring::publish(const std::string& entry, Blob value) { mine_[entry] = std::move(value); }

Status Wiring::exchange() {
  BlobWriter w;
  w.u32(static_cast<uint32_t>(mine_.size()));
  for (const auto& [entry, value] : mine_) {
    w.str(entry);
    w.bytes(value);
  }
  std::vector<Blob> all;
  WEFT_CHECK(boot_.allgather("wire." + name_, seal_blob(kWiringKind, version_, w.blob()), &all));
  peers_.assign(all.size(), {});
  for (size_t r = 0; r < all.size(); ++r) {
    Blob payload;
    WEFT_CHECK(open_blob(all[r], kWiringKind, version_, static_cast<int>(r), name_.c_str(), &payload));
    BlobReader rd(payload);
    uint32_t n = 0;
    bool ok = rd.u32(&n);
    for (uint32_t i = 0; ok && i < n; ++i) {
      std::string entry;
      Blob value;
      ok = rd.str(&entry) && rd.bytes(&value);
      if (ok) peers_[r][entry] = std::move(value);
    }
    if (!ok || !rd.done()) {
      WEFT_WARN(kBoot, "rank %d: wiring '%s': malformed endpoint info from rank %zu", boot_.info().rank, name_.c_str(),
                r);
      return Status::kProtocolError;
    }
  }
  return Status::kOk;
}

Status Wiring::peer(int rank, const std::string& entry, const Blob** out) const {
  if (rank < 0 || rank >= static_cast<int>(peers_.size())) {
    WEFT_WARN(kBoot, "rank %d: wiring '%s': no rank %d (exchange() not called, or world size %zu)", boot_.info().rank,
              name_.c_str(), rank, peers_.size());
    return Status::kInvalidArgument;
  }
  auto it = peers_[rank].find(entry);
  if (it == peers_[rank].end()) {
    WEFT_WARN(kBoot, "rank %d: wiring '%s': rank %d published no '%s'", boot_.info().rank, name_.c_str(), rank,
              entry.c_str());
    return Status::kNotFound;
  }
  *out = &it->second;
  return Status::kOk;
}

}  // namespace weft::bootstrap
