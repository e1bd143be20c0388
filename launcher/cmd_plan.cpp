// weftrun plan: read a workload, look at the machine (or an hwloc XML), print the tuner's plan.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "launcher/commands.h"
#include "runtime/log.h"
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
  runtime::Layout layout = w.layout;
  *exit_code = kExitBadInput;
  if (options.nodes > 0) {
    layout.nodes = options.nodes;
    if (runtime::validate_layout(w, layout, error) != Status::kOk) {
      *error += " (with --nodes " + std::to_string(options.nodes) + ")";
      return Status::kInvalidArgument;
    }
  }
  topology::Topology topo;
  std::vector<std::string> notes;
  if (topology::load(options.topology, &topo) != Status::kOk) {
    if (!options.topology.empty()) {
      *error = "cannot read the topology " + options.topology + " (WEFT_DEBUG=INFO says why)";
      *exit_code = kExitFailed;
      return Status::kNotFound;
    }
    // Planning needs no live machine: go on with the model's defaults, and say so.
    topo = topology::Topology{};
    notes.push_back("this machine's topology could not be read: planned without it");
  }
  // This machine may have fewer GPUs than the workload's node (a workstation planning for a
  // server): plan for the layout on GPUs of the kind found here, and say so. A topology named
  // explicitly must fit, so that is checked by the tuner instead.
  const std::vector<std::string> names = runtime::gpu_model_names(topo);
  const int found = static_cast<int>(topo.gpus.size());
  if (topo.source == "live" && found > 0 && found < layout.gpus_per_node) {
    notes.push_back("this machine has " + std::to_string(found) + " GPU" + (found == 1 ? "" : "s") + ", the layout " +
                    std::to_string(layout.gpus_per_node) +
                    " per node: planned for the layout, without this machine's topology");
    topo = topology::Topology{};
    topo.source = "live";
  }
  const topology::Mapping mapping = topology::map_gpus_to_nics(topo);
  WEFT_CHECK(runtime::make_plan(w, layout, topo, mapping, plan, error, &names));
  // Ranks that share a GPU copy between each other on that GPU, where a copy may need SMs: a
  // persistent GEMM on every SM would wait for it forever.
  constexpr int kSharedCopySms = 8;
  if (options.share_gpus && plan->exec.variant == "copy_engine" && !plan->roles_explicit &&
      plan->roles.compute >= plan->sm_count) {
    plan->roles.compute = plan->sm_count - kSharedCopySms;
    notes.push_back("ranks share GPUs (--oversubscribe): " + std::to_string(kSharedCopySms) +
                    " SMs left for the copies between them; predictions are for all SMs");
  }
  plan->notes.insert(plan->notes.end(), notes.begin(), notes.end());
  *exit_code = 0;
  return Status::kOk;
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
