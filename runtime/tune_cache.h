// The tuning cache: `weftrun tune`'s measured winners, keyed by machine and problem, that `plan` and
// `run` use instead of the model's choice where the key matches.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "runtime/plan.h"
#include "topology/topology.h"

namespace weft::runtime {

// What a measurement depends on, besides the problem: the GPU model, the CUDA driver and runtime
// versions, weft's kernel code (a hash of kernels/ at build time) and the node's topology.
struct TuneMachine {
  std::string gpu;       // "NVIDIA H100 80GB HBM3" (the CUDA device name)
  std::string cuda;      // "driver 13000, runtime 13000"
  std::string kernels;   // WEFT_KERNELS_HASH
  std::string topology;  // topology_fingerprint()
};

// GPUs (PCI ids, bus ids, NUMA nodes) and NICs of a topology, hashed: equal on identical nodes.
std::string topology_fingerprint(const topology::Topology& topo);

// The key of an entry: the machine, then op, dtype, layout and shape (canonical text, one line).
std::string tune_key(const TuneMachine& machine, const Plan& plan);

struct TuneEntry {
  std::string key;
  std::string plan_json;   // executed_json of the winner
  double measured_ms = 0;  // the winner, median, max over ranks
  double model_ms = 0;     // the model's plan, measured in the same call
  int candidates = 0;
  std::string tuned_at;  // UTC, ISO 8601
};

// The cache file: WEFT_TUNE_CACHE, else $XDG_CACHE_HOME/weft/tune.json, else ~/.cache/weft/tune.json.
std::string tune_cache_path();

// Reads the cache (at most 4 MiB, a regular file). A missing file is an empty cache; a corrupt or
// oversized one is ignored: *warning says why and `entries` is empty (kOk either way).
Status load_tune_cache(const std::string& path, std::vector<TuneEntry>* entries, std::string* warning);
// Adds or replaces the entry of `entry.key` (read, modify, write a temporary file, rename; under an
// flock of the cache file's folder so that ranks of different jobs do not lose each other's entries).
Status store_tune_entry(const std::string& path, const TuneEntry& entry, std::string* error);

// The cache's plan for `model` on `machine` into *out (kOk), kNotFound without an entry, or
// kInvalidArgument (with *warning) for an entry whose plan does not parse or does not fit the
// problem (another op, shape or layout): then the model's plan stands.
Status cached_plan(const std::vector<TuneEntry>& entries, const TuneMachine& machine, const Plan& model, Plan* out,
                   const TuneEntry** used, std::string* warning);

}  // namespace weft::runtime
