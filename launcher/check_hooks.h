// Extension point of `weftrun check --transport NAME`: transport code registers a function that moves
// buffers between the ranks of a check and reports what it measured.
#pragma once

#include <string>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "launcher/rank.h"

namespace weft::launcher {

struct CheckTransportReport {
  std::string summary;  // appended to the rank's check line, e.g. "socket: 3 peers ok, 1.2 GB/s"
  std::string json;     // a JSON object for this rank; the launcher gathers them under "transport"
};

// Called on every rank after the bootstrap part of the check passed, with the same `iters`.
// Collective: every rank calls it. Returns non-OK (after logging why, naming rank and peer) when a
// buffer did not arrive intact.
using CheckTransportFn = Status (*)(const RankContext& ctx, bootstrap::Bootstrap& boot, int iters,
                                    CheckTransportReport* report);

// Registers `fn` under `name` (the --transport value); a later registration of the name replaces it.
void register_check_transport(const std::string& name, CheckTransportFn fn);
CheckTransportFn find_check_transport(const std::string& name);  // nullptr if none
std::vector<std::string> check_transport_names();

// Registers every transport check linked into weftrun (launcher/registrations.cpp: add one line there).
void register_builtin_check_transports();

}  // namespace weft::launcher
