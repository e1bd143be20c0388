// weftrun exec [-n N] -- PROGRAM ARGS...: runs a program of yours as the ranks of a job on this machine,
// with weftrun's embedded PMIx server, so that it can create a weft::Context (runtime/weft.h).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "launcher/commands.h"
#include "launcher/launch.h"
#include "launcher/rank.h"

namespace weft::launcher {
namespace {

struct ExecOptions {
  int ranks = 0;
  int nodes = 1;
  bool oversubscribe = false;
  std::vector<std::string> program;
};

// Each rank is this weftrun, started with the job's PMIx variables; it becomes the program.
int exec_rank(const ExecOptions& o) {
  std::vector<char*> argv;
  for (const auto& a : o.program) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  fprintf(stderr, "weftrun exec: cannot run %s: %s\n", o.program[0].c_str(), strerror(errno));
  return 127;
}

int exec_launcher(const ExecOptions& o) {
  LaunchOptions lo;
  lo.gpus = visible_gpu_count();
  lo.nodes = o.nodes;
  lo.ranks = o.ranks > 0 ? o.ranks : default_rank_count(lo.gpus, o.nodes);
  std::string why;
  if (check_launch(lo, lo.gpus > 0 && !o.oversubscribe, &why) != Status::kOk) {
    fprintf(stderr, "weftrun exec: %s (--oversubscribe lets ranks share GPUs)\n", why.c_str());
    return 2;
  }
  lo.rank_args = own_args();
  return launch_ranks(lo);
}

}  // namespace

void add_exec_command(CLI::App& app, int* exit_code) {
  auto opts = std::make_shared<ExecOptions>();
  auto* sub = app.add_subcommand("exec", "run PROGRAM as the ranks of a job on this machine (weftrun serves PMIx)");
  sub->add_option("-n,--ranks", opts->ranks, "ranks to start (default: one per GPU)")->check(CLI::Range(1, kMaxRanks));
  sub->add_option("--emulate-nodes", opts->nodes, "emulated nodes (each gets its slice of the GPUs)")
      ->check(CLI::Range(1, kMaxRanks));
  sub->add_flag("--oversubscribe", opts->oversubscribe, "allow more ranks per node than GPUs (for testing)");
  sub->add_option("program", opts->program, "-- PROGRAM ARGS...: what each rank runs")->required()->expected(-1);
  sub->callback([opts, exit_code] {
    *exit_code = dispatch_role(
        "exec", [&] { return exec_rank(*opts); }, [&] { return exec_launcher(*opts); });
  });
}

}  // namespace weft::launcher
