// weftrun's startup checks: the WEFT_* environment against the parameter table, and a benchmark's
// ranks against the machine's GPUs. They run in the launcher before anything starts, once.
#include "launcher/preflight.h"

#include <cstring>

#include "base/params.h"
#include "launcher/launch.h"
#include "runtime/workload.h"

namespace weft::launcher {
namespace {

// What each command does instead of reading an experiment switch (the second half of the message).
std::string instead(const std::string& command) {
  if (command == "run") return "run executes the plan (set roles in the workload or pass --plan)";
  if (command == "plan") return "plan prints the plan that run executes (set roles in the workload)";
  return command + " does not read it";
}

}  // namespace

std::string nearest_param(const std::string& name) {
  std::string best;
  int best_d = 0;
  for (const auto& p : all_params()) {
    const int d = runtime::edit_distance(name, p.name);
    if (best.empty() || d < best_d) best = p.name, best_d = d;
  }
  // A suggestion only for a slip (a letter or two, a dropped S), not for an unrelated name.
  return best_d <= 3 && best_d * 4 <= static_cast<int>(name.size()) ? best : "";
}

Status check_environment(const std::string& command, char** env, std::vector<std::string>* problems) {
  problems->clear();
  for (char** e = env; e && *e; ++e) {
    if (strncmp(*e, "WEFT_", 5) != 0) continue;
    const char* eq = strchr(*e, '=');
    const std::string name(*e, eq ? eq - *e : strlen(*e)), value(eq ? eq + 1 : "");
    const ParamInfo* p = find_param(name);
    if (!p) {
      const std::string near = nearest_param(name);
      problems->push_back("weftrun: " + name + " is not a weft parameter" +
                          (near.empty() ? "" : "; did you mean " + near + "?") +
                          " (weftrun --print-params=all lists them)");
      continue;
    }
    std::string expected;
    if (!param_value_ok(*p, value, &expected)) {
      problems->push_back("weftrun: " + name + "=" + value + ": expected " + expected);
      continue;
    }
    if (p->scope == ParamScope::kBench && command != "bench")
      problems->push_back("weftrun " + command + ": " + name + " is an experiment switch of weftrun bench; " +
                          instead(command));
  }
  return problems->empty() ? Status::kOk : Status::kInvalidArgument;
}

Status check_bench_fits(const std::string& workload, int ranks, int nodes, int gpus, std::string* error) {
  runtime::Workload wl;
  std::string ignored;
  if (runtime::load_workload(workload, &wl, &ignored) != Status::kOk) return Status::kOk;
  LaunchOptions lo;
  lo.ranks = ranks > 0 ? ranks : wl.world_size();
  lo.nodes = nodes > 0 ? nodes : wl.layout.nodes;
  lo.gpus = gpus;
  std::string why;
  if (check_launch(lo, /*rank_per_gpu=*/true, &why) == Status::kOk) return Status::kOk;
  *error = workload + ": " + why;
  return Status::kInvalidArgument;
}

}  // namespace weft::launcher
