// weftrun: the one binary users run (topo, plan, check, run, bench); also each rank's entry point.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "base/params.h"
#include "launcher/commands.h"
#include "launcher/preflight.h"
#include "launcher/rank.h"

extern char** environ;

#ifndef WEFT_VERSION
#define WEFT_VERSION "unknown"
#endif
#ifndef WEFT_GIT_COMMIT
#define WEFT_GIT_COMMIT "unknown commit"
#endif

namespace {

using weft::launcher::kExitBadInput;

std::string version_text() {
  std::string v = "weftrun " WEFT_VERSION " (" WEFT_GIT_COMMIT;
#ifdef WEFT_CUDA_VERSION
  v += ", CUDA " WEFT_CUDA_VERSION;  // the toolkit weft was built with: nothing is loaded to say so
#else
  v += ", built without CUDA";
#endif
  return v + ")";
}

// The subcommand a message is about: the one the parser had reached ("weftrun run"), else "weftrun".
std::string who(const CLI::App& app) {
  const auto subs = app.get_subcommands();
  return subs.empty() ? "weftrun" : "weftrun " + subs[0]->get_name();
}

// A rank prints what every rank would print only once: ranks other than 0 stay silent (under srun or
// mpirun each rank checks its own environment, and all of them fail the same way).
bool first_rank_or_launcher() {
  const char* r = getenv("PMIX_RANK");
  return !r || !*r || !strcmp(r, "0");
}

// Once the command line parsed, before any subcommand runs: the environment, and for bench whether
// its ranks fit this machine's GPUs (run refuses that itself). Throws CLI::RuntimeError(2) to stop.
void preflight(CLI::App& app) {
  const auto subs = app.get_subcommands();
  if (subs.empty()) return;
  CLI::App* sub = subs[0];
  std::vector<std::string> problems;
  if (weft::launcher::check_environment(sub->get_name(), environ, &problems) != weft::Status::kOk) {
    if (first_rank_or_launcher())
      for (const auto& p : problems) fprintf(stderr, "%s\n", p.c_str());
    throw CLI::RuntimeError(kExitBadInput);
  }
  std::string why;
  if (sub->get_name() != "bench" || weft::launcher::detect_role(&why) != weft::launcher::Role::kLauncher) return;
  auto count = [&](const char* name) {
    CLI::Option* o = sub->get_option_no_throw(name);
    return o && o->count() ? o->as<int>() : 0;
  };
  std::string error;
  if (weft::launcher::check_bench_fits(sub->get_option("workload")->as<std::string>(), count("--ranks"),
                                       count("--emulate-nodes"), weft::launcher::visible_gpu_count(),
                                       &error) != weft::Status::kOk) {
    fprintf(stderr, "weftrun bench: %s\n", error.c_str());
    throw CLI::RuntimeError(kExitBadInput);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"weftrun: persistent fused multi-GPU kernels (weft)", "weftrun"};
  app.require_subcommand(0, 1);
  app.set_version_flag("--version", version_text(), "print weftrun's version, commit and CUDA version, and exit");
  std::string params;
  app.add_flag("--print-params{user}", params,
               "print the WEFT_* environment parameters a user sets and exit (--print-params=all: every one, with "
               "the experiment switches of weftrun bench, marked)")
      ->check(CLI::IsMember({"user", "all"}));

  int exit_code = 0;
  weft::launcher::add_topo_command(app, &exit_code);
  weft::launcher::add_plan_command(app, &exit_code);
  weft::launcher::add_check_command(app, &exit_code);
  weft::launcher::add_run_command(app, &exit_code);
  weft::launcher::add_bench_command(app, &exit_code);
  weft::launcher::add_exec_command(app, &exit_code);
  weft::launcher::add_tune_command(app, &exit_code);
  app.parse_complete_callback([&app, &params] {
    if (params.empty()) preflight(app);
  });

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help, --version: printed, exit 0
  } catch (const CLI::RuntimeError& e) {
    return e.get_exit_code();  // preflight refused, and said why
  } catch (const CLI::Error& e) {
    // Every command-line error is bad input: one line, exit 2 (not CLI11's own codes and banner).
    fprintf(stderr, "%s: %s (see %s --help)\n", who(app).c_str(), e.what(), who(app).c_str());
    return kExitBadInput;
  }
  if (!params.empty()) {
    weft::print_params(stdout, params == "all");
    return 0;
  }
  if (app.get_subcommands().empty()) {
    fputs(app.help().c_str(), stdout);
    return kExitBadInput;
  }
  return exit_code;
}
