// The caller's buffers an op is handed, checked before anything is enqueued: device memory this rank's
// GPU can use (its own, or managed), at least the bytes the op will touch inside one allocation.
// Checked on every call (address lookups in the driver, no synchronisation): a framework's
// allocator may hand the same address out again with another size, so nothing is remembered.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"

namespace weft::runtime {

// kOk, or kInvalidArgument with *error saying what `p` is and why an op on `device` cannot use it
// (`what`: the argument, e.g. "AgGemm::run's a").
// `pieces`: the range may span several pieces of a virtual-memory mapping (then the first and the last
// byte are checked, not the allocation's length): for buffers the caller registered.
Status check_device_buffer(const void* p, uint64_t bytes, int device, const std::string& what, std::string* error,
                           bool pieces = false);

}  // namespace weft::runtime
