// Rank 0's plan to every rank, checked by hash before anything runs.
#pragma once

#include <string>

#include "base/status.h"
#include "bootstrap/bootstrap.h"
#include "runtime/plan.h"

namespace weft::runtime {

// Collective. On rank 0 `decided` is the plan (or nullptr with `why_not` saying why there is none);
// other ranks pass nullptr. Every rank gets rank 0's plan in *out, read back from its executed form
// and checked against rank 0's hash; kInvalidArgument with rank 0's reason when it had none,
// kProtocolError when the plan did not survive the exchange.
Status share_plan(bootstrap::Bootstrap& boot, const Plan* decided, const std::string& why_not, Plan* out,
                  std::string* error);

}  // namespace weft::runtime
