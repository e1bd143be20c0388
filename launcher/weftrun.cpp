// weftrun: the one binary users run (topo, plan, check, run, bench); also each rank's entry point.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "launcher/commands.h"
#include "runtime/params.h"

int main(int argc, char** argv) {
  CLI::App app{"weftrun: persistent fused multi-GPU kernels (weft)", "weftrun"};
  app.require_subcommand(0, 1);
  bool print_params = false;
  app.add_flag("--print-params", print_params, "print every WEFT_* environment parameter and exit");

  int exit_code = 0;
  weft::launcher::add_topo_command(app, &exit_code);
  weft::launcher::add_plan_command(app, &exit_code);
  weft::launcher::add_check_command(app, &exit_code);
  weft::launcher::add_run_command(app, &exit_code);
  weft::launcher::add_bench_command(app, &exit_code);
  weft::launcher::add_exec_command(app, &exit_code);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (print_params) {
    weft::print_params(stdout);
    return 0;
  }
  if (app.get_subcommands().empty()) {
    fputs(app.help().c_str(), stdout);
    return 2;
  }
  return exit_code;
}
