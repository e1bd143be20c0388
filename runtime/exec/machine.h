// This machine as the tuning cache keys it.
#pragma once

#include "runtime/tune_cache.h"

namespace weft::runtime {

// GPU 0's name, the CUDA driver and runtime versions, the hash of kernels/ this build has, the live
// topology's fingerprint. False without a GPU: then plans come from the model.
bool this_machine(TuneMachine* out);

}  // namespace weft::runtime
