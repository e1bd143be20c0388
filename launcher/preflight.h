// Checks weftrun makes once, before any subcommand runs or any rank starts: the WEFT_* environment
// and whether a benchmark's ranks fit this machine's GPUs. Each failure is one line and exit 2.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace weft::launcher {

constexpr int kExitBadInput = 2;  // usage, workload, WEFT_* value, or a job that does not fit: nothing started

// Every WEFT_* variable in `env` (a NULL-terminated environ-style array) against the parameter
// table: unknown names (with the nearest declared name), values that do not parse or lie outside
// the declared range or choices, and experiment switches of `weftrun bench` set for another
// command. `command` is the subcommand ("run", "plan", ...). Fills *problems with one line each,
// ready to print, and returns kInvalidArgument when there is any.
Status check_environment(const std::string& command, char** env, std::vector<std::string>* problems);

// The declared parameter nearest to an unknown name (edit distance), or "" when none is close.
std::string nearest_param(const std::string& name);

// `weftrun bench WORKLOAD [-n R] [--emulate-nodes K]` on a machine with `gpus` GPUs: every rank
// needs a GPU of its own (bench times the real NVLink path). A workload that does not load is left
// to the command, which reports it with its position; no GPU at all is fine (bench prints the plan).
Status check_bench_fits(const std::string& workload, int ranks, int nodes, int gpus, std::string* error);

}  // namespace weft::launcher
