// Fuzz target: the workload reader (parse_workload) on any bytes: a Workload or one located error line.
#include <cstdint>
#include <string>

#include "fuzz_common.h"
#include "runtime/workload.h"

using namespace weft;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz_quiet_logs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  runtime::Workload w;
  std::string err;
  const Status s = runtime::parse_workload(text, "f.yaml", &w, &err);
  if (s == Status::kOk) {
    FUZZ_ASSERT(w.world_size() >= 1);
    FUZZ_ASSERT(w.name.size() <= runtime::kMaxWorkloadScalarBytes);
    std::string again;
    FUZZ_ASSERT(runtime::validate_layout(w, w.layout, &again) == Status::kOk);
  } else {
    if (getenv("FUZZ_PRINT")) fprintf(stderr, "error (%zu bytes): %s\n", err.size(), err.c_str());
    FUZZ_ASSERT(s == Status::kInvalidArgument);
    FUZZ_ASSERT(err.rfind("f.yaml:", 0) == 0);         // file:line:col: key: what
    FUZZ_ASSERT(err.find('\n') == std::string::npos);  // one line
    // Bounded: at most a key (256 bytes, each escaped to at most 4) and a value cut at 64, never the input.
    FUZZ_ASSERT(err.size() < 8 * runtime::kMaxWorkloadScalarBytes + 400);
  }
  return 0;
}
