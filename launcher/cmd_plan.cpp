// weftrun plan: placeholder registration until its implementation lands.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "launcher/commands.h"

namespace weft::launcher {

void add_plan_command(CLI::App& app, int* exit_code) {
  auto* sub = app.add_subcommand("plan", "(not available in this build yet)");
  sub->allow_extras();
  sub->callback([exit_code] {
    fprintf(stderr, "weftrun plan: not available in this build yet\n");
    *exit_code = 3;
  });
}

}  // namespace weft::launcher

namespace weft::launcher {
int run_plan(const PlanOptions&) {
  fprintf(stderr, "weftrun plan: not available in this build yet\n");
  return 3;
}
}  // namespace weft::launcher
