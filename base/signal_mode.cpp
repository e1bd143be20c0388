#include "base/signal_mode.h"

namespace weft::runtime {

const char* to_string(SignalMode m) {
  switch (m) {
    case SignalMode::kSerial:
      return "serial";
    case SignalMode::kFenced:
      return "fenced";
    case SignalMode::kBatched:
      return "batched";
  }
  return "?";
}

}  // namespace weft::runtime
