// decide_plan(): the one place a workload becomes the Plan that `plan` prints and `run` executes.
#include <string>
#include <vector>

#include "base/log.h"
#include "runtime/tune_cache.h"
#include "runtime/tuner.h"
#include "topology/topology.h"

namespace weft::runtime {

Status decide_plan(const Workload& w, const DecideOptions& options, Plan* plan, std::string* error, bool* bad_input) {
  Layout job = w.layout;
  *bad_input = true;
  if (options.nodes > 0) {
    job.nodes = options.nodes;
    if (validate_layout(w, job, error) != Status::kOk) {
      *error += " (with --nodes " + std::to_string(options.nodes) + ")";
      return Status::kInvalidArgument;
    }
  }
  // The op is planned for the ranks it runs on: one group (the whole job without `group:`).
  const Layout layout = w.group ? *w.group : job;
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
  // GEMM+RS/AR's overlap variant, where the model chose it, cannot run with ranks that share a GPU
  // (below), nor in a heap too small for its staging slots: the model plans the peer variant then.
  const bool overlap_over_budget = options.heap_budget > 0 && plan->heap_bytes > options.heap_budget;
  if (plan->exec.variant == "overlap" && !w.plan.variant && (options.share_gpus || overlap_over_budget)) {
    const uint64_t overlap_bytes = plan->heap_bytes;
    Workload peer = w;
    peer.plan.variant = "peer";
    Plan overlap = *plan;
    WEFT_CHECK(make_plan(peer, layout, topo, mapping, plan, error, &names));
    plan->chosen_by = w.plan.empty() ? "model" : "workload";
    const std::string need =
        std::to_string(options.heap_budget) + " are free (raise WEFT_HEAP_BYTES or Context::Options::heap_bytes)";
    if (options.share_gpus)
      notes.push_back(
          "ranks share GPUs (--oversubscribe): the peer variant, since the overlap variant's GEMMs wait for each "
          "other's pieces");
    else if (plan->heap_bytes <= options.heap_budget)
      notes.push_back("the peer variant: the overlap variant needs " + std::to_string(overlap_bytes) +
                      " bytes of symmetric heap per rank, " + need);
    else {  // the peer variant keeps two copies of the partials: no smaller. Neither runs in this heap.
      const uint64_t peer_bytes = plan->heap_bytes;
      *plan = std::move(overlap);
      plan->exec.executable = false;
      plan->exec.not_executable = "the symmetric heap is too small: the overlap variant needs " +
                                  std::to_string(overlap_bytes) + " bytes per rank and the peer variant " +
                                  std::to_string(peer_bytes) + ", " + need;
      notes.push_back(plan->exec.not_executable);
    }
  }
  if (w.group) {
    plan->job_nodes = job.nodes;
    plan->job_gpus_per_node = job.gpus_per_node;
  }
  // Ranks that share a GPU copy between each other on that GPU, where a copy may need SMs: a
  // persistent GEMM on every SM would wait for it forever.
  constexpr int kSharedCopySms = 8;
  if (options.share_gpus && plan->exec.variant == "copy_engine" && !plan->roles_explicit &&
      plan->roles.compute >= plan->sm_count) {
    plan->roles.compute = plan->sm_count - kSharedCopySms;
    notes.push_back("ranks share GPUs (--oversubscribe): " + std::to_string(kSharedCopySms) +
                    " SMs left for the copies between them; predictions are for all SMs");
  }
  // Explicit choices are used as written: a cache entry (measured for the problem, whatever the file
  // says) replaces neither the workload's roles nor its plan: map.
  if (options.machine && !w.plan.empty()) {
    notes.push_back("the workload's plan: map sets the execution; the tuning cache was not consulted");
  } else if (options.machine && !w.roles.automatic) {
    notes.push_back("the workload's roles are used as written; the tuning cache was not consulted");
  } else if (options.machine) {
    const std::string path = options.tune_cache.empty() ? tune_cache_path() : options.tune_cache;
    std::vector<TuneEntry> entries;
    std::string warning;
    load_tune_cache(path, &entries, &warning);
    Plan cached;
    const TuneEntry* used = nullptr;
    const Status found = cached_plan(entries, *options.machine, *plan, &cached, &used, &warning);
    if (!warning.empty()) {
      WEFT_WARN(kTune, "%s", warning.c_str());
      notes.push_back(warning);
    }
    const bool cached_unfit =
        found == Status::kOk &&
        ((cached.exec.variant == "overlap" &&
          (options.share_gpus || (options.heap_budget > 0 && cached.heap_bytes > options.heap_budget))) ||
         (cached.exec.variant == "ffn_combine" && options.share_gpus));
    if (cached_unfit)
      notes.push_back("the tuning cache's " + cached.exec.variant + " plan (" + path +
                      ") was not used: it cannot run with ranks sharing a GPU or in the heap that is free");
    if (found == Status::kOk && !cached_unfit) {
      // What runs comes from the measurement; the predictions stay the model's, for its own choice.
      plan->roles = cached.roles;
      plan->roles_explicit = true;
      plan->tile_m = cached.tile_m, plan->tile_n = cached.tile_n, plan->tile_k = cached.tile_k;
      plan->exec = cached.exec;
      plan->heap = cached.heap;
      plan->heap_bytes = cached.heap_bytes;
      if (plan->op == Op::kMoe) {
        // MoE's heap follows this run's WEFT_HEAP_BYTES (counts first below the worst case), which the
        // cache's key does not hold: the cached variant is planned again here, not its layout copied.
        Workload v = w;
        v.plan.variant = cached.exec.variant;
        plan_execution(v, IntraMover::kSm, plan);
      }
      plan->chosen_by = "tuning cache";
      char line[256];
      snprintf(line, sizeof line, "from the tuning cache (%s, tuned %s): %.3f ms measured, the model's plan %.3f ms",
               path.c_str(), used->tuned_at.c_str(), used->measured_ms, used->model_ms);
      notes.push_back(line);
    } else if (!cached_unfit) {
      notes.push_back("the model's plan: no tuning cache entry for this machine and problem in " + path +
                      " (weftrun tune measures one)");
    }
  }
  // Whatever chose it (the workload, the tuning cache): variants whose launches wait for the peers'
  // while they hold the SMs cannot run with ranks that share a GPU, as not all can be resident at once.
  const std::string& v = plan->exec.variant;
  const char* shared_why =
      v == "overlap" ? "overlap: with ranks sharing a GPU (--oversubscribe) their GEMMs, which wait for each other's "
                       "pieces, cannot all run at once; expected peer"
      : v == "ffn_combine" ? "ffn_combine: with ranks sharing a GPU (--oversubscribe) one rank's launch, waiting for "
                             "a peer's combine, can hold the SMs that peer needs; expected staged"
                           : nullptr;
  if (options.share_gpus && shared_why && plan->exec.executable) {
    plan->exec.executable = false;
    plan->exec.not_executable = w.error_at("plan.variant", shared_why);
  }
  plan->notes.insert(plan->notes.end(), notes.begin(), notes.end());
  return Status::kOk;
}

}  // namespace weft::runtime
