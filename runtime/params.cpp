// The one table of WEFT_* environment parameters, and typed accessors that validate them.
#include "runtime/params.h"

#include <strings.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "runtime/log.h"

namespace weft {
namespace {

// Keep sorted by subsystem; each entry is the only place the parameter's default is written.
const std::vector<ParamInfo> kParams = {
    {"WEFT_DEBUG", ParamType::kString, "WARN", "", "log level: NONE, WARN, INFO or TRACE"},
    {"WEFT_DEBUG_SUBSYS", ParamType::kString, "ALL", "",
     "comma list of subsystems to log (INIT,CONFIG,TOPO,TUNE,BOOT,LAUNCH,TRANSPORT,PROXY,NET,KERNEL,BENCH, ALL, "
     "^NAME)"},
    {"WEFT_TOPO_FILE", ParamType::kString, "", "", "hwloc XML file to use instead of discovering the live machine"},
    {"WEFT_GPU_ARCH", ParamType::kString, "auto", "",
     "GPU model the tuner assumes when no GPU is visible: auto, h100 or h200"},
    {"WEFT_BOOTSTRAP_TIMEOUT", ParamType::kDouble, "60", "s", "bound on every bootstrap call (fence, get, barrier)"},
    {"WEFT_LAUNCH_KILL_GRACE", ParamType::kDouble, "5", "s",
     "after one rank fails, how long the launcher waits before SIGKILL of the rest"},
    {"WEFT_TEST_FAULT", ParamType::kString, "", "",
     "tests only: 'RANK:MODE' makes that rank of weftrun check stall, exit, crash or abort (MODE) before its first "
     "fence"},
    {"WEFT_DEVICE_TIMEOUT", ParamType::kDouble, "10", "s", "bound on every device-side wait (flag spins in kernels)"},
    {"WEFT_GEMM_TMA_STORE", ParamType::kBool, "1", "",
     "GEMM bf16 stores through shared memory and TMA (0: straight from registers, for comparisons)"},
    {"WEFT_GEMM_GROUP", ParamType::kInt, "0", "tiles",
     "fused ops' GEMMs: raster group height in 128-row tiles (L2 reuse of B); 0 = the kernel's default"},
    {"WEFT_GEMM_CLUSTER", ParamType::kInt, "1", "CTAs",
     "ag_gemm copy-engine variants: CTAs per cluster sharing B through TMA multicast (1 or 2)"},
    {"WEFT_GEMM_SPLIT_TAIL", ParamType::kBool, "1", "",
     "GEMM: split the last wave's tiles along K so no SM idles (0: whole tiles, for comparisons)"},
    {"WEFT_GEMM_CHUNKED_TAIL", ParamType::kBool, "1", "",
     "GEMM: the split tail may cut the last wave's k-blocks into one chunk per SM (0: equal K-slices only)"},
    {"WEFT_GEMM_DYNAMIC", ParamType::kBool, "1", "",
     "GEMM: blocks claim their next tile when ready (0: block b takes every B-th tile, for comparisons)"},
    {"WEFT_AG_MOVER", ParamType::kString, "auto", "",
     "ag_gemm on one node, who moves A's shards (comma list): copy_engine, sm (every SM mover), pull_vec, "
     "push_vec, pull_bulk, push_bulk; auto measures all and keeps the fastest; split_k_tail adds the split-K tail "
     "variants (measured slower)"},
    {"WEFT_AG_INTRA", ParamType::kString, "", "SMs",
     "ag_gemm SM movers: intra_comm SM counts to measure besides the tuner's (or the YAML's), comma list"},
    {"WEFT_PROXY_TIMEOUT", ParamType::kDouble, "30", "s", "bound on every proxy wait (completions, FIFO space)"},
    {"WEFT_HEAP_BYTES", ParamType::kInt, "0", "bytes", "symmetric heap size per rank; 0 sizes it from the workload"},
    {"WEFT_FIFO_DEPTH", ParamType::kInt, "1024", "commands", "GPU->proxy FIFO depth per channel (power of two)"},
    {"WEFT_NET_BACKEND", ParamType::kString, "auto", "", "inter-node backend: auto, ibverbs or socket"},
    {"WEFT_SIGNAL_MODE", ParamType::kString, "", "",
     "signal ordering on the proxy path: serial, fenced or batched (overrides transport.signal_mode)"},
    {"WEFT_NET_CHANNELS", ParamType::kInt, "4", "channels",
     "proxy channels (a proxy thread and its connections each) a fused op spreads its inter-node pushes over (1..8)"},
    {"WEFT_AG_CHUNKS", ParamType::kInt, "8", "chunks",
     "ag_gemm across nodes: at most this many chunks (a put+signal each) per A shard crossing nodes"},
    {"WEFT_SIGNAL_BATCH_BYTES", ParamType::kInt, "1048576", "bytes",
     "batched signal mode: a batch is posted before a put that would leave more than this much data behind its "
     "first signal (0: no bound)"},
    {"WEFT_SOCKET_IFNAME", ParamType::kString, "", "",
     "network interface for the socket backend; empty = the route to the peer"},
    {"WEFT_OPS_INPUT", ParamType::kString, "normal", "",
     "fused ops' random inputs: normal (like torch.randn in the PyTorch baselines) or uniform in [-1, 1)"},
    {"WEFT_DETERMINISTIC", ParamType::kBool, "0", "", "fixed reduction order, so results repeat bit for bit"},
    {"WEFT_GEMM_REDUCE_PATH", ParamType::kString, "auto", "",
     "gemm_rs/gemm_ar: overlap (partials move during the GEMM, whose epilogue reduces; M/ranks a multiple of 128), "
     "peer (one kernel after the GEMM sums the peers' partials over NVLink) or auto"},
    {"WEFT_GEMM_REDUCE_PIECES", ParamType::kInt, "0", "pieces",
     "gemm_rs/gemm_ar overlap path: each owner's row block moves in this many pieces; 0 = pieces of >= 2 MiB, <= 4"},
    {"WEFT_GEMM_REDUCE_SYS_SIGNAL", ParamType::kBool, "0", "",
     "gemm_rs/gemm_ar overlap path: release the GEMM's per-tile counts at system scope instead of GPU scope "
     "(comparison)"},
    {"WEFT_GEMM_AR_SERIAL_PUSH", ParamType::kBool, "0", "",
     "gemm_ar overlap path: push the reduced pieces on the one comm stream instead of one stream per peer "
     "(comparison)"},
    {"WEFT_GEMM_AR_GATHER", ParamType::kString, "auto", "",
     "gemm_ar overlap path, how reduced rows reach the peers: push (owner's copy engines), pull (peers' copy "
     "engines), sm (the owner's epilogue stores into every peer's C), auto (validate and time all three, keep the "
     "fastest)"},
    {"WEFT_GEMM_REDUCE_SEND", ParamType::kString, "auto", "",
     "gemm_rs/gemm_ar overlap path, how partial tiles reach their owners: copy (this GPU's copy engines, piece by "
     "piece), sm (the GEMM's epilogue stores each tile into the owner's slot over NVLink), auto (validate and time "
     "both, "
     "keep the fastest)"},
    {"WEFT_GEMM_REDUCE_OWN_TMA", ParamType::kBool, "1", "",
     "gemm_rs/gemm_ar overlap path: store reduced own tiles through shared memory and TMA (0: from registers)"},
    {"WEFT_GEMM_REDUCE_SLOT_TMA", ParamType::kBool, "1", "",
     "gemm_rs/gemm_ar overlap path: bring own tiles' staged partials in through the GEMM's TMA ring after the tile's "
     "last k-block, gated there (0: the epilogue loads them from global memory, gated before the tile's operands)"},
    {"WEFT_GEMM_REDUCE_LOOP_SIGNAL", ParamType::kBool, "1", "",
     "gemm_rs/gemm_ar overlap path, copy-engine sends: a partial tile's count moves from inside the block's next tile "
     "(each consumer warpgroup once its stores are complete, no block barrier); 0: each tile waits for its stores and "
     "counts at once"},
    {"WEFT_GEMM_REDUCE_PROBE", ParamType::kBool, "0", "",
     "gemm_rs/gemm_ar overlap path: also time what the tile signals cost and print one run's timeline per rank"},
    {"WEFT_GEMM_REDUCE_ORDER", ParamType::kString, "piece", "piece|owner",
     "gemm_rs/gemm_ar overlap path: tile order; piece = round by round (every other owner's piece j), own pieces late "
     "(WEFT_GEMM_REDUCE_LAG); owner = other owners' rows one after the other, own rows last"},
    {"WEFT_GEMM_REDUCE_MOVERS", ParamType::kInt, "4", "blocks",
     "gemm_rs/gemm_ar overlap path with copy-engine sends: SMs taken from the GEMM to push partial pieces beside "
     "the copy engines (WEFT_GEMM_REDUCE_MOVER_LAST, WEFT_GEMM_REDUCE_MOVER_ROWS)"},
    {"WEFT_GEMM_REDUCE_MOVER_ROWS", ParamType::kInt, "0", "rows",
     "gemm_rs/gemm_ar overlap path: rows of every partial piece that the mover SMs push (the last ones; the copy "
     "engines move the rest); 0 = copy engines only"},
    {"WEFT_GEMM_REDUCE_MOVER_LAST", ParamType::kBool, "1", "",
     "gemm_rs/gemm_ar overlap path with copy-engine sends and 3 or more ranks: the mover SMs push every piece of "
     "each round's last owner (the copy engines run only two of a round's copies at once)"},
    {"WEFT_GEMM_REDUCE_LAG", ParamType::kInt, "0", "rounds",
     "gemm_rs/gemm_ar piece order: own piece j follows round j + lag (a lag of the piece count or more: all own "
     "pieces last); 0 = 1 for gemm_ar (reduced pieces leave early), all own pieces last for gemm_rs"},
    {"WEFT_GEMM_REDUCE_PEER", ParamType::kString, "auto", "",
     "gemm_rs/gemm_ar peer path kernel: pull (one flag round, 16-byte pulls of all partials; AR pushes the sum: "
     "two-shot), "
     "pull_nopdl, oneshot (AR: every rank reduces all rows), previous (three flag rounds) or auto"},
    {"WEFT_GEMM_REDUCE_PEER_BLOCKS", ParamType::kInt, "16", "blocks",
     "gemm_rs/gemm_ar peer path: at most this many blocks of 512 threads reduce (0 = one per SM); on 4x H200 16 moved "
     "the NVLink bytes faster than 132"},
    {"WEFT_GEMM_REDUCE_PEER_SWEEP", ParamType::kString, "auto", "auto|0|1",
     "gemm_rs/gemm_ar: validate and time every peer path variant and the reduction's phases; auto = when the peer path "
     "is chosen, 1 = also on the overlap path, 0 = never"},
};

bool parse_bool(const char* s, bool* out) {
  if (!strcmp(s, "1") || !strcasecmp(s, "true") || !strcasecmp(s, "yes") || !strcasecmp(s, "on"))
    return *out = true, true;
  if (!strcmp(s, "0") || !strcasecmp(s, "false") || !strcasecmp(s, "no") || !strcasecmp(s, "off"))
    return *out = false, true;
  return false;
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

Status bad_value(const ParamInfo& p, const char* v, const char* expected) {
  WEFT_WARN(kInit, "%s='%s' is not %s (%s; default %s)", p.name, v, expected, p.doc, p.default_value);
  return Status::kInvalidArgument;
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

const std::vector<ParamInfo>& all_params() { return kParams; }

const ParamInfo* find_param(const std::string& name) {
  for (const auto& p : kParams)
    if (name == p.name) return &p;
  return nullptr;
}

Status get_param(const char* name, int64_t* out) {
  const ParamInfo* p = lookup(name, ParamType::kInt);
  if (!p) return Status::kInternal;
  const char* v = raw_value(*p);
  errno = 0;
  char* end = nullptr;
  long long x = strtoll(v, &end, 0);
  if (errno || end == v || *end) return bad_value(*p, v, "an integer");
  *out = x;
  return Status::kOk;
}

Status get_param(const char* name, double* out) {
  const ParamInfo* p = lookup(name, ParamType::kDouble);
  if (!p) return Status::kInternal;
  const char* v = raw_value(*p);
  errno = 0;
  char* end = nullptr;
  double x = strtod(v, &end);
  if (errno || end == v || *end || !(x == x)) return bad_value(*p, v, "a number");
  *out = x;
  return Status::kOk;
}

Status get_param(const char* name, bool* out) {
  const ParamInfo* p = lookup(name, ParamType::kBool);
  if (!p) return Status::kInternal;
  const char* v = raw_value(*p);
  if (!parse_bool(v, out)) return bad_value(*p, v, "a boolean (0/1, true/false)");
  return Status::kOk;
}

Status get_param(const char* name, std::string* out) {
  const ParamInfo* p = lookup(name, ParamType::kString);
  if (!p) return Status::kInternal;
  *out = raw_value(*p);
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

void print_params(FILE* out) {
  fprintf(out, "%-26s %-7s %-8s %-6s %s\n", "NAME", "TYPE", "DEFAULT", "UNIT", "DESCRIPTION");
  for (const auto& p : kParams) {
    const char* set = getenv(p.name);
    fprintf(out, "%-26s %-7s %-8s %-6s %s%s%s%s\n", p.name, to_string(p.type),
            *p.default_value ? p.default_value : "\"\"", p.unit, p.doc, set ? " [set: " : "", set ? set : "",
            set ? "]" : "");
  }
}

}  // namespace weft
