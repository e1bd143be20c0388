// The one table of WEFT_* environment parameters, and typed accessors that validate them.
#include "base/params.h"

#include <strings.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "base/log.h"

namespace weft {
namespace {

// Keep sorted by scope, then subsystem; each entry is the only place the parameter's default, range
// and doc are written.
//
// The split (ParamScope): kUser parameters are what a cluster user sets and what `weftrun
// --print-params` lists. kBench parameters are experiment switches (kernel variants, sweeps,
// benchmark inputs): `weftrun bench` honours them and every other weftrun command refuses them at
// startup, because `run` executes the Plan (roles in the workload, or `weftrun run --plan FILE`);
// the library still reads them through get_param, so GPU tests and bench work as before. kTest
// parameters are read by tests only, kScript ones by scripts/weft and scripts/gpu: both are
// declared so that weftrun's check of the environment does not call them unknown.
constexpr ParamScope kU = ParamScope::kUser, kB = ParamScope::kBench, kT = ParamScope::kTest, kS = ParamScope::kScript;
constexpr ParamType kInt = ParamType::kInt, kDbl = ParamType::kDouble, kStr = ParamType::kString,
                    kBool = ParamType::kBool;
constexpr double kDay = 86400, kTiB = 1099511627776.0;

const std::vector<ParamInfo> kParams = {
    // --- user: logging, topology, GPU model
    {"WEFT_DEBUG", kStr, "WARN", "", "log level: NONE, WARN, INFO or TRACE", kU, 0, 0, "NONE|WARN|INFO|TRACE",
     ParamForm::kOne, true},
    {"WEFT_DEBUG_SUBSYS", kStr, "ALL", "",
     "comma list of subsystems to log (INIT,CONFIG,TOPO,TUNE,BOOT,LAUNCH,TRANSPORT,PROXY,NET,KERNEL,BENCH, ALL, "
     "^NAME)",
     kU, 0, 0, "ALL|INIT|CONFIG|TOPO|TUNE|BOOT|LAUNCH|TRANSPORT|PROXY|NET|KERNEL|BENCH", ParamForm::kMaskList, true},
    {"WEFT_TOPO_FILE", kStr, "", "", "hwloc XML file to use instead of discovering the live machine", kU},
    {"WEFT_GPU_ARCH", kStr, "auto", "", "GPU model the tuner assumes when no GPU is visible: auto, h100 or h200", kU, 0,
     0, "auto|h100|h200", ParamForm::kOne, true},
    // --- user: bounds on every wait
    {"WEFT_BOOTSTRAP_TIMEOUT", kDbl, "60", "s", "bound on every bootstrap call (fence, get, barrier)", kU, 0.1, kDay},
    {"WEFT_LAUNCH_KILL_GRACE", kDbl, "5", "s",
     "after one rank fails, how long the launcher waits before SIGKILL of the rest", kU, 0, 3600},
    {"WEFT_DEVICE_TIMEOUT", kDbl, "10", "s",
     "bound on every device-side wait (flag spins in kernels) and on an op call's kernel that does not finish", kU, 0.1,
     kDay},
    {"WEFT_EMULATE_NETNS", kStr, "off", "",
     "on: weftrun's emulated nodes (--emulate-nodes) run in network namespaces of their own, on a bridge "
     "(needs root and ip; says so and shares the host's network otherwise)",
     kU, 0, 0, "on|off"},
    {"WEFT_LIVENESS", kStr, "auto", "",
     "out-of-band heartbeats between ranks (a TCP ring) that name a dead or stalled rank: auto (on where the "
     "launcher reports no dead ranks, i.e. not weftrun's own or mpirun), on or off",
     kU, 0, 0, "auto|on|off"},
    {"WEFT_LIVENESS_TIMEOUT", kDbl, "15", "s",
     "a rank whose heartbeats stop for this long is reported stalled; its peers exit 5 s later", kU, 2, kDay},
    {"WEFT_PROXY_TIMEOUT", kDbl, "30", "s", "bound on every proxy wait (completions, FIFO space)", kU, 0.1, kDay},
    // --- user: memory, transport, results
    {"WEFT_HEAP_BYTES", kInt, "0", "bytes", "symmetric heap size per rank; 0 sizes it from the workload", kU, 0, kTiB},
    {"WEFT_TUNE_CACHE", kStr, "", "",
     "tuning cache file weftrun tune writes and plan/run read (default $XDG_CACHE_HOME/weft/tune.json, else "
     "~/.cache/weft/tune.json); point it at a shared file system to share one across a cluster",
     kU},
    {"WEFT_FIFO_DEPTH", kInt, "1024", "commands", "GPU->proxy FIFO depth per channel (power of two)", kU, 2, 16777216},
    {"WEFT_NET_BACKEND", kStr, "auto", "", "inter-node backend: auto, ibverbs, ofi or socket (loopback: tests)", kU, 0,
     0, "auto|ibverbs|ofi|socket|loopback"},
    {"WEFT_SIGNAL_MODE", kStr, "", "",
     "signal ordering on the proxy path: serial, fenced or batched (overrides transport.signal_mode)", kU, 0, 0,
     "serial|fenced|batched"},
    {"WEFT_NET_CHANNELS", kInt, "4", "channels",
     "proxy channels (a proxy thread and its connections each) a fused op spreads its inter-node pushes over", kU, 1,
     8},
    {"WEFT_OFI_PROVIDER", kStr, "", "",
     "libfabric provider for the ofi backend (e.g. \"tcp;ofi_rxm\", efa, verbs;ofi_rxm); empty = libfabric's choice",
     kU},
    {"WEFT_SOCKET_IFNAME", kStr, "", "", "network interface for the socket backend; empty = the route to the peer", kU},
    {"WEFT_IB_TC", kInt, "-1", "",
     "ibverbs: traffic class in each RoCE QP's global route header (0-255); -1 = the site's: the device's "
     "sysfs tc/<port>/traffic_class where the driver has one, else 0",
     kU, -1, 255},
    {"WEFT_IB_GID_INDEX", kInt, "-1", "",
     "ibverbs: GID table index for RoCE; -1 = the first RoCE v2 GID bound to a network device (IPv4-mapped first)", kU,
     -1, 4095},
    {"WEFT_DETERMINISTIC", kBool, "0", "",
     "weftrun run (and bench for GEMM+RS/AR) checks that a second call on the same inputs repeats bit for bit (weft "
     "always reduces in a fixed order)",
     kU},

    // --- bench: the GEMM core's variants
    {"WEFT_GEMM_TMA_STORE", kBool, "1", "",
     "weftrun bench: GEMM bf16 stores through shared memory and TMA (0: straight from registers, for comparisons; "
     "a plan's execution.gemm.tma_store)",
     kB},
    {"WEFT_GEMM_GROUP", kInt, "0", "tiles",
     "fused ops' GEMMs: raster group height in 128-row tiles (L2 reuse of B); 0 = the kernel's default", kB, 0, 1024},
    {"WEFT_GEMM_CLUSTER", kInt, "1", "CTAs",
     "ag_gemm copy-engine variants: CTAs per cluster sharing B through TMA multicast (1 or 2)", kB, 1, 2},
    {"WEFT_GEMM_SPLIT_TAIL", kBool, "1", "",
     "weftrun bench: GEMM splits the last wave's tiles along K so no SM idles (0: whole tiles, for comparisons; a "
     "plan's execution.gemm.split_tail)",
     kB},
    {"WEFT_GEMM_CHUNKED_TAIL", kBool, "1", "",
     "weftrun bench: the GEMM's split tail may cut the last wave's k-blocks into one chunk per SM (0: equal "
     "K-slices only; a plan's execution.gemm.chunked_tail)",
     kB},
    {"WEFT_GEMM_DYNAMIC", kBool, "1", "",
     "weftrun bench: GEMM blocks claim their next tile when ready (0: block b takes every B-th tile, for "
     "comparisons; a plan's execution.gemm.dynamic_tiles)",
     kB},
    // --- bench: AllGather+GEMM
    {"WEFT_AG_MOVER", kStr, "auto", "",
     "ag_gemm on one node, who moves A's shards (comma list): copy_engine, sm (every SM mover), pull_vec, "
     "push_vec, pull_bulk, push_bulk; auto measures all and keeps the fastest; split_k_tail adds the split-K tail "
     "variants (measured slower)",
     kB, 0, 0, "auto|copy_engine|sm|pull_vec|push_vec|pull_bulk|push_bulk|split_k_tail", ParamForm::kList},
    {"WEFT_AG_INTRA", kStr, "", "SMs",
     "ag_gemm SM movers: intra_comm SM counts to measure besides the tuner's (or the YAML's), comma list", kB, 1, 1024,
     nullptr, ParamForm::kIntList},
    {"WEFT_AG_CHUNKS", kInt, "8", "chunks",
     "ag_gemm across nodes: at most this many chunks (a put+signal each) per A shard crossing nodes", kB, 1, 1024},
    {"WEFT_SIGNAL_BATCH_BYTES", kInt, "1048576", "bytes",
     "batched signal mode: a batch is posted before a put that would leave more than this much data behind its "
     "first signal (0: no bound)",
     kB, 0, kTiB},
    {"WEFT_OPS_INPUT", kStr, "normal", "",
     "fused ops' random inputs: normal (like torch.randn in the PyTorch baselines) or uniform in [-1, 1)", kB, 0, 0,
     "normal|uniform"},
    {"WEFT_REPORT", kStr, "", "",
     "weftrun bench's --json FILE, as the ranks receive it: every timed row appended as a JSON line", kB},
    // --- bench: GEMM+ReduceScatter / GEMM+AllReduce
    {"WEFT_GEMM_REDUCE_PATH", kStr, "auto", "",
     "gemm_rs/gemm_ar: overlap (partials move during the GEMM, whose epilogue reduces; M/ranks a multiple of 128), "
     "peer (one kernel after the GEMM sums the peers' partials over NVLink) or auto",
     kB, 0, 0, "auto|overlap|peer"},
    {"WEFT_GEMM_REDUCE_PIECES", kInt, "0", "pieces",
     "gemm_rs/gemm_ar overlap path: each owner's row block moves in this many pieces; 0 = pieces of >= 2 MiB, <= 4", kB,
     0, 64},
    {"WEFT_GEMM_REDUCE_SYS_SIGNAL", kBool, "0", "",
     "gemm_rs/gemm_ar overlap path: release the GEMM's per-tile counts at system scope instead of GPU scope "
     "(comparison)",
     kB},
    {"WEFT_GEMM_AR_SERIAL_PUSH", kBool, "0", "",
     "gemm_ar overlap path: push the reduced pieces on the one comm stream instead of one stream per peer "
     "(comparison)",
     kB},
    {"WEFT_GEMM_AR_GATHER", kStr, "auto", "",
     "gemm_ar overlap path, how reduced rows reach the peers: push (owner's copy engines), pull (peers' copy "
     "engines), sm (the owner's epilogue stores into every peer's C), auto (validate and time all three, keep the "
     "fastest)",
     kB, 0, 0, "auto|push|pull|sm"},
    {"WEFT_GEMM_REDUCE_SEND", kStr, "auto", "",
     "gemm_rs/gemm_ar overlap path, how partial tiles reach their owners: copy (this GPU's copy engines, piece by "
     "piece), sm (the GEMM's epilogue stores each tile into the owner's slot over NVLink), auto (validate and time "
     "both, keep the fastest)",
     kB, 0, 0, "auto|copy|sm"},
    {"WEFT_GEMM_REDUCE_OWN_TMA", kBool, "1", "",
     "gemm_rs/gemm_ar overlap path: store reduced own tiles through shared memory and TMA (0: from registers)", kB},
    {"WEFT_GEMM_REDUCE_SLOT_TMA", kBool, "1", "",
     "gemm_rs/gemm_ar overlap path: bring own tiles' staged partials in through the GEMM's TMA ring after the tile's "
     "last k-block, gated there (0: the epilogue loads them from global memory, gated before the tile's operands)",
     kB},
    {"WEFT_GEMM_REDUCE_LOOP_SIGNAL", kBool, "1", "",
     "gemm_rs/gemm_ar overlap path, copy-engine sends: a partial tile's count moves from inside the block's next tile "
     "(each consumer warpgroup once its stores are complete, no block barrier); 0: each tile waits for its stores and "
     "counts at once",
     kB},
    {"WEFT_GEMM_REDUCE_PROBE", kBool, "0", "",
     "gemm_rs/gemm_ar overlap path: also time what the tile signals cost and print one run's timeline per rank", kB},
    {"WEFT_GEMM_REDUCE_ORDER", kStr, "piece", "piece|owner",
     "gemm_rs/gemm_ar overlap path: tile order; piece = round by round (every other owner's piece j), own pieces late "
     "(WEFT_GEMM_REDUCE_LAG); owner = other owners' rows one after the other, own rows last",
     kB, 0, 0, "piece|owner"},
    {"WEFT_GEMM_REDUCE_MOVERS", kInt, "4", "blocks",
     "gemm_rs/gemm_ar overlap path with copy-engine sends: SMs taken from the GEMM to push partial pieces beside "
     "the copy engines (WEFT_GEMM_REDUCE_MOVER_LAST, WEFT_GEMM_REDUCE_MOVER_ROWS)",
     kB, 0, 1024},
    {"WEFT_GEMM_REDUCE_MOVER_ROWS", kInt, "0", "rows",
     "gemm_rs/gemm_ar overlap path: rows of every partial piece that the mover SMs push (the last ones; the copy "
     "engines move the rest); 0 = copy engines only",
     kB, 0, 2147483647},
    {"WEFT_GEMM_REDUCE_MOVER_LAST", kBool, "1", "",
     "gemm_rs/gemm_ar overlap path with copy-engine sends and 3 or more ranks: the mover SMs push every piece of "
     "each round's last owner (the copy engines run only two of a round's copies at once)",
     kB},
    {"WEFT_GEMM_REDUCE_LAG", kInt, "0", "rounds",
     "gemm_rs/gemm_ar piece order: own piece j follows round j + lag (a lag of the piece count or more: all own "
     "pieces last); 0 = 1 for gemm_ar (reduced pieces leave early), all own pieces last for gemm_rs",
     kB, 0, 1024},
    {"WEFT_GEMM_REDUCE_PEER", kStr, "auto", "",
     "gemm_rs/gemm_ar peer path kernel: pull (one flag round, 16-byte pulls of all partials; AR pushes the sum: "
     "two-shot), pull_nopdl, oneshot (AR: every rank reduces all rows), previous (three flag rounds), pull_tiles "
     "(peer path only) or auto",
     kB, 0, 0, "auto|pull|pull_nopdl|oneshot|previous|pull_tiles"},
    {"WEFT_GEMM_REDUCE_PEER_BLOCKS", kInt, "16", "blocks",
     "gemm_rs/gemm_ar peer path: at most this many blocks of 512 threads reduce (0 = one per SM); on 4x H200 16 moved "
     "the NVLink bytes faster than 132",
     kB, 0, 1024},
    {"WEFT_GEMM_REDUCE_PEER_SWEEP", kStr, "auto", "auto|0|1",
     "gemm_rs/gemm_ar: validate and time every peer path variant and the reduction's phases; auto = when the peer path "
     "is chosen, 1 = also on the overlap path, 0 = never",
     kB, 0, 0, "auto|0|1"},

    // --- test only
    {"WEFT_TEST_FAULT", kStr, "", "",
     "tests only: 'RANK:MODE' makes that rank of weftrun check stall, exit, crash or abort (MODE) before its first "
     "fence",
     kT},
    {"WEFT_TUNER_FIT_TABLE", kStr, "", "", "tests only: test_tuner prints the model-vs-measured table of docs/tuner.md",
     kT},

    // --- scripts (read by scripts/weft and scripts/gpu/*.sh; weftrun ignores them)
    {"WEFT_BUILD_DIR", kStr, "build", "", "scripts/weft: the build folder", kS},
    {"WEFT_JOBS", kStr, "", "", "scripts/weft: parallel build jobs (default: nproc)", kS},
    {"WEFT_NO_INSTALL", kStr, "0", "", "scripts/weft: 1 = never apt-get missing packages", kS},
    {"WEFT_BUILD_TARGETS", kStr, "", "", "scripts/weft: build only these targets", kS},
    {"WEFT_CMAKE_ARGS", kStr, "", "", "scripts/weft: extra arguments for cmake's configure step", kS},
    {"WEFT_GPU_STEPS", kStr, "*", "", "scripts/weft gpu-check: glob of scripts/gpu/ steps to run", kS},
    {"WEFT_SUMMARY", kStr, "", "", "scripts/gpu steps: the summary file each step appends its rows to", kS},
    {"WEFT_OUT", kStr, "", "", "scripts/weft gpu-check: the output folder of the steps", kS},
    {"WEFT_NCU", kStr, "0", "", "scripts/gpu/22-gemm-ncu.sh: 1 = collect Nsight Compute counters (opt-in)", kS},
    {"WEFT_NCU_SHAPE", kStr, "0", "", "scripts/gpu/22-gemm-ncu.sh: bench_gemm's --shape index", kS},
    {"WEFT_OPS_CONFIGS", kStr, "", "", "scripts/gpu/40-ops.sh: example configs to bench on one node", kS},
    {"WEFT_OPS_NODES_CONFIGS", kStr, "", "", "scripts/gpu/40-ops.sh: example configs to bench on 2 emulated nodes", kS},
    {"WEFT_OPS_PEERS", kStr, "1", "", "scripts/gpu/40-ops.sh: 0 leaves out the peer-path rows", kS},
    {"WEFT_MOE_ROUNDS", kStr, "20", "", "scripts/gpu/27-moe.sh: bench_moe_single --rounds", kS},
};

bool parse_bool(const char* s, bool* out) {
  if (!strcmp(s, "1") || !strcasecmp(s, "true") || !strcasecmp(s, "yes") || !strcasecmp(s, "on"))
    return *out = true, true;
  if (!strcmp(s, "0") || !strcasecmp(s, "false") || !strcasecmp(s, "no") || !strcasecmp(s, "off"))
    return *out = false, true;
  return false;
}

bool parse_int(const char* v, int64_t* out) {
  errno = 0;
  char* end = nullptr;
  long long x = strtoll(v, &end, 0);
  if (errno || end == v || *end) return false;
  *out = x;
  return true;
}

bool parse_double(const char* v, double* out) {
  errno = 0;
  char* end = nullptr;
  double x = strtod(v, &end);
  if (errno || end == v || *end || !(x == x)) return false;
  *out = x;
  return true;
}

bool bounded(const ParamInfo& p) { return p.min < p.max; }

// "1 to 8", "0.1 to 86400": integers print without a fraction.
std::string range_text(const ParamInfo& p) {
  char buf[96];
  snprintf(buf, sizeof buf, "%.15g to %.15g", p.min, p.max);
  return buf;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (true) {
    size_t next = s.find(sep, pos);
    out.push_back(s.substr(pos, next == std::string::npos ? std::string::npos : next - pos));
    if (next == std::string::npos) return out;
    pos = next + 1;
  }
}

std::string choices_text(const ParamInfo& p) {
  std::string out;
  for (const auto& c : split(p.choices, '|')) out += (out.empty() ? "" : ", ") + c;
  return out;
}

bool is_choice(const ParamInfo& p, const std::string& v) {
  for (const auto& c : split(p.choices, '|'))
    if (p.ignore_case ? !strcasecmp(c.c_str(), v.c_str()) : c == v) return true;
  return false;
}

// Whether the doc already lists every choice (then printing them again is noise).
bool doc_names_choices(const ParamInfo& p) {
  for (const auto& c : split(p.choices, '|'))
    if (!strcasestr(p.doc, c.c_str())) return false;
  return true;
}

const ParamInfo* lookup(const char* name, ParamType want) {
  const ParamInfo* p = find_param(name);
  if (!p) {
    WEFT_WARN(kInit, "internal: parameter %s is not declared in runtime/params.cpp", name);
    return nullptr;
  }
  if (p->type != want) {
    WEFT_WARN(kInit, "internal: parameter %s is a %s, read as a %s", name, to_string(p->type), to_string(want));
    return nullptr;
  }
  return p;
}

const char* raw_value(const ParamInfo& p) {
  const char* v = getenv(p.name);
  return (v && *v) ? v : p.default_value;
}

// The value from the environment (or the default), checked against the table; one log line when bad.
const ParamInfo* checked(const char* name, ParamType want, const char** value, Status* status) {
  const ParamInfo* p = lookup(name, want);
  if (!p) return *status = Status::kInternal, nullptr;
  *value = raw_value(*p);
  std::string expected;
  if (!param_value_ok(*p, *value, &expected)) {
    WEFT_WARN(kInit, "%s='%s': expected %s (%s; default %s)", p->name, *value, expected.c_str(), p->doc,
              *p->default_value ? p->default_value : "\"\"");
    return *status = Status::kInvalidArgument, nullptr;
  }
  *status = Status::kOk;
  return p;
}

}  // namespace

const char* to_string(ParamType t) {
  switch (t) {
    case ParamType::kInt:
      return "int";
    case ParamType::kDouble:
      return "float";
    case ParamType::kString:
      return "string";
    case ParamType::kBool:
      return "bool";
  }
  return "?";
}

const char* to_string(ParamScope s) {
  switch (s) {
    case ParamScope::kUser:
      return "user";
    case ParamScope::kBench:
      return "bench";
    case ParamScope::kTest:
      return "test";
    case ParamScope::kScript:
      return "script";
  }
  return "?";
}

const std::vector<ParamInfo>& all_params() { return kParams; }

const ParamInfo* find_param(const std::string& name) {
  for (const auto& p : kParams)
    if (name == p.name) return &p;
  return nullptr;
}

bool param_value_ok(const ParamInfo& p, const std::string& value, std::string* expected) {
  const char* v = value.c_str();
  switch (p.type) {
    case ParamType::kBool: {
      bool b;
      *expected = "a boolean (0/1, true/false, yes/no, on/off)";
      return parse_bool(v, &b);
    }
    case ParamType::kInt: {
      int64_t x;
      *expected = bounded(p) ? "an integer from " + range_text(p) : "an integer";
      return parse_int(v, &x) && (!bounded(p) || (x >= p.min && x <= p.max));
    }
    case ParamType::kDouble: {
      double x;
      *expected = bounded(p) ? "a number from " + range_text(p) : "a number";
      return parse_double(v, &x) && (!bounded(p) || (x >= p.min && x <= p.max));
    }
    case ParamType::kString:
      break;
  }
  if (value.empty()) return true;  // an empty string is the same as unset
  switch (p.form) {
    case ParamForm::kOne:
      *expected = p.choices ? "one of " + choices_text(p) : "any text";
      return !p.choices || is_choice(p, value);
    case ParamForm::kList:
    case ParamForm::kMaskList: {
      const bool mask = p.form == ParamForm::kMaskList;
      *expected = "a comma list of " + choices_text(p) + (mask ? " (each may be negated with ^)" : "");
      for (std::string item : split(value, ',')) {
        if (mask && !item.empty() && item[0] == '^') item.erase(0, 1);
        if (!item.empty() && p.choices && !is_choice(p, item)) return false;
      }
      return true;
    }
    case ParamForm::kIntList: {
      *expected = "a comma list of integers from " + range_text(p);
      for (const std::string& item : split(value, ',')) {
        int64_t x;
        if (item.empty()) continue;
        if (!parse_int(item.c_str(), &x) || (bounded(p) && (x < p.min || x > p.max))) return false;
      }
      return true;
    }
  }
  return false;
}

Status get_param(const char* name, int64_t* out) {
  const char* v = nullptr;
  Status s;
  if (!checked(name, ParamType::kInt, &v, &s)) return s;
  parse_int(v, out);
  return Status::kOk;
}

Status get_param(const char* name, double* out) {
  const char* v = nullptr;
  Status s;
  if (!checked(name, ParamType::kDouble, &v, &s)) return s;
  parse_double(v, out);
  return Status::kOk;
}

Status get_param(const char* name, bool* out) {
  const char* v = nullptr;
  Status s;
  if (!checked(name, ParamType::kBool, &v, &s)) return s;
  parse_bool(v, out);
  return Status::kOk;
}

Status get_param(const char* name, std::string* out) {
  const char* v = nullptr;
  Status s;
  if (!checked(name, ParamType::kString, &v, &s)) return s;
  *out = v;
  return Status::kOk;
}

int64_t param_int_or_default(const char* name) {
  int64_t v = 0;
  if (get_param(name, &v) == Status::kOk) return v;
  const ParamInfo* p = find_param(name);
  return p ? strtoll(p->default_value, nullptr, 0) : 0;
}

double param_double_or_default(const char* name) {
  double v = 0;
  if (get_param(name, &v) == Status::kOk) return v;
  const ParamInfo* p = find_param(name);
  return p ? strtod(p->default_value, nullptr) : 0;
}

bool param_bool_or_default(const char* name) {
  bool v = false;
  if (get_param(name, &v) == Status::kOk) return v;
  const ParamInfo* p = find_param(name);
  return p && parse_bool(p->default_value, &v) && v;
}

void print_params(FILE* out, bool all) {
  if (all)
    fprintf(out, "%-28s %-6s %-7s %-8s %-8s %s\n", "NAME", "SCOPE", "TYPE", "DEFAULT", "UNIT", "DESCRIPTION");
  else
    fprintf(out, "%-28s %-7s %-8s %-8s %s\n", "NAME", "TYPE", "DEFAULT", "UNIT", "DESCRIPTION");
  for (const auto& p : kParams) {
    if (!all && p.scope != ParamScope::kUser) continue;
    const char* set = getenv(p.name);
    std::string expected, accepted;
    if (p.type == ParamType::kString && p.choices && !doc_names_choices(p))
      accepted = " (one of " + choices_text(p) + ")";
    else if (bounded(p))
      accepted = " (" + range_text(p) + ")";
    std::string note;
    if (set) {
      note = std::string(" [set: ") + set;
      if (!param_value_ok(p, set, &expected)) note += "; refused: expected " + expected;
      note += "]";
    }
    const char* def = *p.default_value ? p.default_value : "\"\"";
    if (all)
      fprintf(out, "%-28s %-6s %-7s %-8s %-8s %s%s%s\n", p.name, to_string(p.scope), to_string(p.type), def, p.unit,
              p.doc, accepted.c_str(), note.c_str());
    else
      fprintf(out, "%-28s %-7s %-8s %-8s %s%s%s\n", p.name, to_string(p.type), def, p.unit, p.doc, accepted.c_str(),
              note.c_str());
  }
  if (all)
    fprintf(out,
            "\nscope: user = set by cluster users; bench = experiment switches, honoured by weftrun bench and refused "
            "by every other weftrun command; test = read by tests only; script = read by scripts/weft and "
            "scripts/gpu only\n");
  else
    fprintf(out, "\n(weftrun --print-params=all also lists the experiment switches of weftrun bench)\n");
}

}  // namespace weft
