// share_plan(): "hash\nexecuted json" (or "error\nwhy") from rank 0 through the bootstrap.
#include "runtime/exec/plan_exchange.h"

#include <cstdio>

namespace weft::runtime {
namespace {

int next_exchange_ = 0;  // every rank shares plans in the same order

std::string hex64(uint64_t v) {
  char buf[20];
  snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

Status share_plan(bootstrap::Bootstrap& boot, const Plan* decided, const std::string& why_not, Plan* out,
                  std::string* error) {
  bootstrap::Blob mine;
  if (boot.info().rank == 0) {
    const std::string body =
        decided ? hex64(plan_hash(*decided)) + "\n" + executed_json(*decided) : "error\n" + why_not;
    mine.assign(body.begin(), body.end());
  }
  std::vector<bootstrap::Blob> all;
  WEFT_CHECK(boot.allgather("weft.plan." + std::to_string(next_exchange_), mine, &all));
  ++next_exchange_;
  if (all.empty()) return *error = "the bootstrap returned no plan", Status::kProtocolError;
  const std::string got(all[0].begin(), all[0].end());
  const size_t nl = got.find('\n');
  if (nl == std::string::npos) return *error = "rank 0 sent no plan", Status::kProtocolError;
  if (got.compare(0, nl, "error") == 0) return *error = got.substr(nl + 1), Status::kInvalidArgument;
  WEFT_CHECK(parse_executed_json(got.substr(nl + 1), out, error));
  if (hex64(plan_hash(*out)) != got.substr(0, nl)) {
    *error = "rank " + std::to_string(boot.info().rank) + ": the plan's hash is " + hex64(plan_hash(*out)) +
             ", rank 0 sent " + got.substr(0, nl);
    return Status::kProtocolError;
  }
  if (decided) {  // rank 0 keeps its own descriptive fields (name, predictions, notes)
    const Plan back = *out;
    *out = *decided;
    out->roles_explicit = back.roles_explicit;
  }
  return Status::kOk;
}

}  // namespace weft::runtime
