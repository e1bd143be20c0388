// The signal ordering mode of the proxy path (Perseus), shared by the workload schema and the
// transport: one enum, one spelling.
#pragma once

namespace weft::runtime {

// How a signal is ordered after the puts it covers:
//   serial   the proxy waits for the puts' completions, then posts the signal (the slow baseline)
//   fenced   every signal carries a fence flag: the NIC orders it, the proxy never waits
//   batched  signals are coalesced per destination; one fenced signal opens each batch
enum class SignalMode : int { kSerial = 0, kFenced = 1, kBatched = 2 };

// "serial", "fenced", "batched": the spelling of the YAML key and of WEFT_SIGNAL_MODE.
const char* to_string(SignalMode m);

}  // namespace weft::runtime
