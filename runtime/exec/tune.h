// `weftrun tune` on one rank: candidate plans executed as op objects, validated, then timed
// interleaved (one call of each per round), the median of each, max over ranks.
#pragma once

#include <functional>
#include <vector>

#include "base/status.h"
#include "bootstrap/bootstrap.h"
#include "runtime/plan.h"
#include "runtime/workload.h"

namespace weft::runtime {

struct TuneResult {
  std::vector<bool> valid;  // validated against weft's reference on every rank
  std::vector<double> ms;   // median per call, max over ranks (0 where not valid)
  int best = -1;            // the fastest valid candidate
};

// Collective: every rank passes the same candidates (share_plan them first). `progress(round, of)` is
// called on rank 0 as the rounds go.
Status tune_plans(bootstrap::Bootstrap& boot, const std::vector<Plan>& candidates, const RunSpec& run,
                  const std::function<void(int, int)>& progress, TuneResult* out);

}  // namespace weft::runtime
