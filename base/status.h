// Status codes returned by every fallible host function, and the one macro that propagates them.
#pragma once

namespace weft {

enum class Status : int {
  kOk = 0,
  kInvalidArgument,  // bad input from a user: config, CLI flag, environment variable
  kNotFound,         // a file, device, peer or key that should exist does not
  kSystemError,      // an OS call failed (errno is in the log line)
  kTimeout,          // a bounded wait expired (the log line names what was awaited)
  kPeerFailed,       // a peer rank died or reported an error
  kProtocolError,    // a peer sent something malformed
  kUnsupported,      // valid, but not on this machine or build
  kCudaError,        // a CUDA call failed
  kInternal,         // a weft bug
};

const char* to_string(Status s);

namespace log {
void breadcrumb(const char* file, int line, Status s);
}

}  // namespace weft

// Propagates a non-OK Status, leaving a "-> file:line" breadcrumb at INFO level. The place where
// the error is decided logs the full message (rank, role, peer, what was awaited) once.
#define WEFT_CHECK(call)                                          \
  do {                                                            \
    ::weft::Status weft_check_s_ = (call);                        \
    if (weft_check_s_ != ::weft::Status::kOk) {                   \
      ::weft::log::breadcrumb(__FILE__, __LINE__, weft_check_s_); \
      return weft_check_s_;                                       \
    }                                                             \
  } while (0)
