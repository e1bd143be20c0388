// The weftrun subcommands: each registers itself on the CLI11 app from its own file.
#pragma once

#include <string>

#include "base/status.h"
#include "runtime/plan.h"

namespace CLI {
class App;
}

namespace weft::launcher {

// Each adds one subcommand; its callback stores the exit code in *exit_code.
void add_topo_command(CLI::App& app, int* exit_code);   // cmd_topo.cpp
void add_plan_command(CLI::App& app, int* exit_code);   // cmd_plan.cpp
void add_check_command(CLI::App& app, int* exit_code);  // cmd_check.cpp
void add_run_command(CLI::App& app, int* exit_code);    // cmd_run.cpp
void add_bench_command(CLI::App& app, int* exit_code);  // cmd_bench.cpp
void add_exec_command(CLI::App& app, int* exit_code);   // cmd_exec.cpp
void add_tune_command(CLI::App& app, int* exit_code);   // cmd_tune.cpp

// The options run and bench share: the workload file (positional, required), -n/--ranks,
// --emulate-nodes and --topo (job_options.cpp).
void add_job_options(CLI::App* sub, std::string* workload, int* ranks, int* nodes, std::string* topology);

// `weftrun plan` as a function, so that `weftrun run` can print the plan where no GPU is found.
struct PlanOptions {
  std::string workload;  // YAML path
  std::string topology;  // hwloc XML path; empty: WEFT_TOPO_FILE or the live machine
  int nodes = 0;         // 0: the workload's layout.nodes
  bool json = false;
  bool share_gpus = false;     // ranks of a node share GPUs (--oversubscribe): leave SMs for the copies between them
  bool use_tune_cache = true;  // false: the model's plan even where the tuning cache has an entry (tune)
};
int run_plan(const PlanOptions& options);

// The plan `plan` prints and `run` executes: the workload under options' layout and topology. On
// error *error says why and *exit_code is 2 (bad input) or 1.
Status decide_plan(const PlanOptions& options, const runtime::Workload& w, runtime::Plan* plan, std::string* error,
                   int* exit_code);

}  // namespace weft::launcher
