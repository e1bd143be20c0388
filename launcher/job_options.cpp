// The command-line options `weftrun run` and `weftrun bench` share (commands.h).
#include <CLI/CLI.hpp>

#include "launcher/commands.h"
#include "launcher/launch.h"

namespace weft::launcher {

void add_job_options(CLI::App* sub, std::string* workload, int* ranks, int* nodes, std::string* topology) {
  sub->add_option("workload", *workload, "workload YAML file")->required();
  sub->add_option("-n,--ranks", *ranks, "ranks to start (default: the workload's layout)")
      ->check(CLI::Range(1, kMaxRanks));
  sub->add_option("--emulate-nodes", *nodes, "emulated nodes (default: the workload's layout.nodes)")
      ->check(CLI::Range(1, kMaxRanks));
  sub->add_option("--topo", *topology, "hwloc XML for the plan (default: WEFT_TOPO_FILE or this machine)");
}

}  // namespace weft::launcher
