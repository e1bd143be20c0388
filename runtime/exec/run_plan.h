// `weftrun run` on one rank: a Plan executed as an op object on generated inputs, validated against
// weft's own reference, and the plan as executed read back from the launch.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"
#include "bootstrap/bootstrap.h"
#include "runtime/plan.h"
#include "runtime/workload.h"

namespace weft::runtime {

struct RunReport {
  double ms_median = 0;          // this rank's median time per call (events around each call)
  bool validated = false;        // compared with the reference (RunSpec::validate)
  double rel_err = 0;            // C against the reference GEMM
  int64_t unwritten = 0;         // C elements left NaN (poisoned) or not finite
  int64_t gather_mismatch = 0;   // gathered A elements that differ from the regenerated shards
  int64_t repeat_mismatch = -1;  // WEFT_DETERMINISTIC=1: outputs whose bits differ in a second call on the
                                 // same inputs (-1: not checked)
  Plan executed;                 // read back from the launch record and the op's allocation
};

// Collective over the job. `heap_bytes` 0: the plan's. Each call's inputs are fresh random data
// (seeded by rank 0 and the source rank, so a misrouted shard is caught); outputs are poisoned first.
Status run_plan(bootstrap::Bootstrap& boot, const Plan& plan, const RunSpec& run, uint64_t heap_bytes, RunReport* out);

}  // namespace weft::runtime
