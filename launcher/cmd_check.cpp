// weftrun check: placeholder registration until its implementation lands.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "launcher/commands.h"

namespace weft::launcher {

void add_check_command(CLI::App& app, int* exit_code) {
  auto* sub = app.add_subcommand("check", "(not available in this build yet)");
  sub->allow_extras();
  sub->callback([exit_code] {
    fprintf(stderr, "weftrun check: not available in this build yet\n");
    *exit_code = 3;
  });
}

}  // namespace weft::launcher
