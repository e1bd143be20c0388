// Two-phase wiring: publish this rank's endpoint info, one collective exchange, read every peer's.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "bootstrap/bootstrap.h"

namespace weft::bootstrap {

// Usage (transport setup):
//   Wiring w(boot, "transport.socket", /*version=*/1);
//   w.publish("addr", my_addr_blob);          // phase 1: local resources already created
//   w.publish("heap_key", my_key_blob);
//   WEFT_CHECK(w.exchange());                  // phase 2: one allgather (one fence) for all entries
//   const Blob* a; WEFT_CHECK(w.peer(3, "addr", &a));   // phase 3: connect to each peer
// Every rank must publish the same entry names; a peer built with another `version` of the entries
// is rejected by name instead of being misread.
class Wiring {
 public:
  Wiring(Bootstrap& boot, std::string name, uint16_t version);
  void publish(const std::string& entry, Blob value);
  Status exchange();
  Status peer(int rank, const std::string& entry, const Blob** out) const;
  int size() const { return static_cast<int>(peers_.size()); }

 private:
  Bootstrap& boot_;
  std::string name_;
  uint16_t version_;
  std::map<std::string, Blob> mine_;
  std::vector<std::map<std::string, Blob>> peers_;
};

}  // namespace weft::bootstrap
