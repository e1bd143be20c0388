// weftrun plan: read a workload, look at the machine (or an hwloc XML), print the tuner's plan.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "launcher/commands.h"
#if defined(WEFT_HAVE_EXEC)
#include "runtime/exec/machine.h"
#endif
#include "base/log.h"
#include "base/params.h"
#include "runtime/tuner.h"
#include "runtime/workload.h"
#include "topology/topology.h"

namespace weft::launcher {

namespace {
constexpr int kExitBadInput = 2;  // the workload or a flag is wrong; the message says where
constexpr int kExitFailed = 1;    // something else (an unreadable topology)
}  // namespace

void add_plan_command(CLI::App& app, int* exit_code) {
  auto* sub = app.add_subcommand("plan", "print the SM roles, tiles and predicted times for a workload");
  auto opts = std::make_shared<PlanOptions>();
  sub->add_option("workload", opts->workload, "workload YAML file (see configs/README.md)")->required();
  sub->add_option("--topology", opts->topology,
                  "hwloc XML of the node to plan for (default: WEFT_TOPO_FILE, else this machine)");
  sub->add_option("--nodes", opts->nodes, "plan for N such nodes instead of the workload's layout.nodes")
      ->check(CLI::Range(1, 65536));
  sub->add_flag("--json", opts->json, "print the plan as JSON");
  sub->add_flag("--oversubscribe", opts->share_gpus,
                "plan for ranks that share GPUs (as `weftrun run --oversubscribe` runs them on a smaller machine)");
  sub->callback([opts, exit_code] { *exit_code = run_plan(*opts); });
}

Status decide_plan(const PlanOptions& options, const runtime::Workload& w, runtime::Plan* plan, std::string* error,
                   int* exit_code) {
  runtime::DecideOptions d;
  d.topology = options.topology;
  d.nodes = options.nodes;
  d.share_gpus = options.share_gpus;
  // A heap the user sized (WEFT_HEAP_BYTES, checked by weftrun's preflight) is a budget the plan must fit.
  int64_t heap = 0;
  if (get_param("WEFT_HEAP_BYTES", &heap) == Status::kOk && heap > 0) d.heap_budget = uint64_t(heap);
#if defined(WEFT_HAVE_EXEC)
  // The tuning cache holds what this machine measured: planning for another (--topology) uses the model.
  runtime::TuneMachine machine;
  if (options.use_tune_cache && options.topology.empty() && runtime::this_machine(&machine)) d.machine = &machine;
#endif
  bool bad_input = true;
  const Status s = runtime::decide_plan(w, d, plan, error, &bad_input);
  *exit_code = s == Status::kOk ? 0 : bad_input ? kExitBadInput : kExitFailed;
  return s;
}

int run_plan(const PlanOptions& options) {
  try {
    runtime::Workload w;
    std::string error;
    if (runtime::load_workload(options.workload, &w, &error) != Status::kOk) {
      fprintf(stderr, "weftrun plan: %s\n", error.c_str());
      return kExitBadInput;
    }
    runtime::Plan plan;
    int code = 0;
    if (decide_plan(options, w, &plan, &error, &code) != Status::kOk) {
      fprintf(stderr, "weftrun plan: %s\n", error.c_str());
      return code;
    }
    const std::string text = options.json ? runtime::format_plan_json(plan) : runtime::format_plan_table(plan);
    fputs(text.c_str(), stdout);
    fputc('\n', stdout);
    return 0;
  } catch (const std::exception& e) {
    // Nothing below should throw; if it does, the user gets a message and an exit code, not abort().
    WEFT_WARN(kConfig, "weftrun plan: internal error: %s", e.what());
    fprintf(stderr, "weftrun plan: internal error: %s\n", e.what());
    return kExitFailed;
  }
}

}  // namespace weft::launcher
