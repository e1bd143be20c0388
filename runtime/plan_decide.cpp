// decide_plan(): the one place a workload becomes the Plan that `plan` prints and `run` executes.
#include <string>
#include <vector>

#include "runtime/tuner.h"
#include "topology/topology.h"

namespace weft::runtime {

Status decide_plan(const Workload& w, const DecideOptions& options, Plan* plan, std::string* error, bool* bad_input) {
  Layout layout = w.layout;
  *bad_input = true;
  if (options.nodes > 0) {
    layout.nodes = options.nodes;
    if (validate_layout(w, layout, error) != Status::kOk) {
      *error += " (with --nodes " + std::to_string(options.nodes) + ")";
      return Status::kInvalidArgument;
    }
  }
  topology::Topology topo;
  std::vector<std::string> notes;
  if (topology::load(options.topology, &topo) != Status::kOk) {
    if (!options.topology.empty()) {
      *error = "cannot read the topology " + options.topology + " (WEFT_DEBUG=INFO says why)";
      *bad_input = false;
      return Status::kNotFound;
    }
    // Planning needs no live machine: go on with the model's defaults, and say so.
    topo = topology::Topology{};
    notes.push_back("this machine's topology could not be read: planned without it");
  }
  // This machine may have fewer GPUs than the workload's node (a workstation planning for a
  // server): plan for the layout on GPUs of the kind found here, and say so. A topology named
  // explicitly must fit, so that is checked by the tuner instead.
  const std::vector<std::string> names = gpu_model_names(topo);
  const int found = static_cast<int>(topo.gpus.size());
  if (topo.source == "live" && found > 0 && found < layout.gpus_per_node) {
    notes.push_back("this machine has " + std::to_string(found) + " GPU" + (found == 1 ? "" : "s") + ", the layout " +
                    std::to_string(layout.gpus_per_node) +
                    " per node: planned for the layout, without this machine's topology");
    topo = topology::Topology{};
    topo.source = "live";
  }
  const topology::Mapping mapping = topology::map_gpus_to_nics(topo);
  WEFT_CHECK(make_plan(w, layout, topo, mapping, plan, error, &names));
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
  return Status::kOk;
}

}  // namespace weft::runtime
