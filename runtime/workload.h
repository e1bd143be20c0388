// A YAML workload file as a validated struct: op, shape, layout, roles, transport, run settings.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/roles.h"
#include "base/signal_mode.h"
#include "base/status.h"

namespace weft::runtime {

enum class Op : int { kAgGemm = 0, kGemmRs, kGemmAr, kMoe, kRingAttention };
enum class DType : int { kBf16 = 0, kFp16, kFp8 };  // kFp8 is e4m3
enum class InterNode : int { kAuto = 0, kIbverbs, kSocket, kOfi };

const char* to_string(Op op);  // "ag_gemm", the spelling used in YAML
const char* to_string(DType t);
const char* to_string(InterNode t);
int dtype_bytes(DType t);
bool is_gemm_op(Op op);  // ag_gemm, gemm_rs, gemm_ar

// Where a value came from in the YAML file (1-based; 0 = not from the file).
struct SourceLoc {
  int line = 0;
  int column = 0;
};

// Global problem sizes. GEMM: C[m,n] = A[m,k] * B[k,n].
struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
};
struct MoeShape {
  int64_t tokens = 0;   // global tokens in the batch (each rank holds tokens / world)
  int64_t hidden = 0;   // model dimension
  int64_t ffn = 0;      // expert intermediate dimension (gated: gate and up are each hidden x ffn)
  int64_t experts = 0;  // global experts (each rank holds experts / world)
  int64_t topk = 0;     // experts per token
};
struct AttentionShape {
  int64_t seq = 0;  // global sequence length (each rank holds seq / world queries, keys, values)
  int64_t heads = 0;
  int64_t head_dim = 0;
  bool causal = true;
};

struct Layout {
  int nodes = 1;
  int gpus_per_node = 1;
};

// Bounds on a `group:` (docs/runtime.md, "Rank groups"): tensor-parallel ops (ag_gemm, gemm_rs,
// gemm_ar) and ring_attention run on groups of 1..4 nodes x 1..8 GPUs; moe on expert-parallel groups
// of 1..128 nodes x 8 GPUs (or x the node's GPUs when a node has fewer).
constexpr int kMaxTensorGroupNodes = 4;
constexpr int kMaxTensorGroupGpus = 8;
constexpr int kMaxExpertGroupNodes = 128;
constexpr int kExpertGroupGpus = 8;

struct RoleSpec {
  bool automatic = true;  // `roles: auto`: the tuner decides
  RoleCounts counts;      // explicit counts when !automatic
};

struct TransportSpec {
  InterNode inter_node = InterNode::kAuto;
  SignalMode signal_mode = SignalMode::kBatched;
};

// `plan:` -- the Plan's execution choices written in the workload (configs/README.md). An unset choice
// is the tuner's; a set one is used as written, or the workload is refused naming its line.
struct PlanSpec {
  std::optional<std::string> variant;   // "copy_engine", "sm_movers" (ag_gemm), "peer" or "overlap" (gemm_rs, gemm_ar)
  std::optional<std::string> sm_mover;  // sm_movers: "pull_vec", "push_vec", "pull_bulk" or "push_bulk"
  std::optional<int> copy_chunks;       // copy_engine: copies per shard
  std::optional<int> cluster;           // GEMM CTAs per cluster, 1 or 2
  std::optional<int> group_m;           // raster group height in 128-row tiles
  std::optional<int> reduce_blocks;     // peer: blocks of the reduction kernel
  std::optional<int> pieces, lag;       // overlap: pieces per rank's rows; own piece j after round j + lag
  std::optional<std::string> send;      // overlap: "copy" or "sm"
  std::optional<std::string> gather;    // overlap, gemm_ar: "push" or "sm"
  std::optional<int> split_k;           // moe: the FFN's projections in at most this many K parts (1: never)
  // plan.gemm: the GEMM core's launch choices (kernels::GemmOptions).
  std::optional<bool> split_tail, chunked_tail, dynamic_tiles, tma_store;

  bool empty() const {
    return !variant && !sm_mover && !copy_chunks && !cluster && !group_m && !reduce_blocks && !pieces && !lag &&
           !send && !gather && !split_k && !split_tail && !chunked_tail && !dynamic_tiles && !tma_store;
  }
};

struct RunSpec {
  int warmup = 5;
  int iters = 50;
  bool validate = true;
};

// The GEMM one rank runs, and what it holds before and after communication.
struct GemmShard {
  int64_t m = 0, n = 0, k = 0;  // the local GEMM
  int64_t a_rows = 0;           // rows of A this rank holds before communication
  int64_t c_rows = 0;           // rows of C this rank holds after communication
  int64_t c_cols = 0;           // columns of C this rank holds after communication
};

struct Workload {
  std::string name;    // default: the file name without extension
  std::string source;  // the file it came from
  Op op = Op::kAgGemm;
  DType dtype = DType::kBf16;
  GemmShape gemm;            // ag_gemm, gemm_rs, gemm_ar
  MoeShape moe;              // moe
  AttentionShape attention;  // ring_attention
  Layout layout;
  // `group:` -- the op runs on groups of group->nodes x group->gpus_per_node ranks that tile the
  // layout, all groups at once, each on its own data (bootstrap/rank_group.h numbers them). Unset:
  // one group, the whole job.
  std::optional<Layout> group;
  RoleSpec roles;
  TransportSpec transport;
  RunSpec run;
  PlanSpec plan;
  std::string gpu;  // `machine.gpu`: "", "h100" or "h200"
  // `machine:` overrides of MachineModel constants, by key (see machine_model.h), in file order.
  std::vector<std::pair<std::string, double>> machine_overrides;
  // Where each key's value is in the file ("shape.m", "roles", "roles.compute"), so that errors found
  // later (a different --nodes, the tuner's SM count) still point at the line.
  std::map<std::string, SourceLoc> locations;

  SourceLoc loc_of(const std::string& key) const;
  // "file:line:col: key: what" (file:1:1 when the key is not in the file).
  std::string error_at(const std::string& key, const std::string& what) const;

  // The ranks the job starts (every group's).
  int world_size() const { return layout.nodes * layout.gpus_per_node; }
  // The ranks one op runs on: the group's shape (the layout without `group:`), and how many groups.
  Layout group_layout() const { return group ? *group : layout; }
  int group_size() const { return group_layout().nodes * group_layout().gpus_per_node; }
  int num_groups() const { return group_size() > 0 ? world_size() / group_size() : 0; }
  // Per-rank shards of one group's problem (the shape is what each group computes; "world" below is
  // the group's size) (GEMM ops only; zeros otherwise):
  //  ag_gemm: A[m,k] gathered along rows (m/world rows each); each rank computes the m x n/world block.
  //  gemm_rs: k split (k/world each); C[m,n] partial sums reduce-scattered by rows (m/world each).
  //  gemm_ar: k split (k/world each); C[m,n] all-reduced (every rank holds all of it).
  GemmShard gemm_shard() const;
  int64_t moe_tokens_per_rank() const { return moe.tokens / group_size(); }
  int64_t moe_experts_per_rank() const { return moe.experts / group_size(); }
  int64_t attention_seq_per_rank() const { return attention.seq / group_size(); }
};

// Bounds on a workload file, checked before yaml-cpp builds anything: a workload is a few hundred
// bytes, so these only ever stop a wrong file (/dev/zero, a data set) or a hostile one (an alias
// bomb), which would otherwise take the machine's memory or minutes of CPU.
constexpr size_t kMaxWorkloadBytes = size_t{1} << 20;  // the file; at most this + 1 bytes are read
constexpr int kMaxWorkloadNodes = 4096;                // YAML scalars, maps and lists in all
constexpr int kMaxWorkloadDepth = 16;                  // maps and lists nested in each other
constexpr size_t kMaxWorkloadScalarBytes = 256;        // one key or value (a `name`, a number)

// Reads and validates a workload file. On error returns kInvalidArgument (kNotFound when the file
// cannot be read) and sets *error to one line "file:line:col: key: what was expected". Only regular
// files are read (a directory, device or FIFO is refused by its type), and only when they are at
// most kMaxWorkloadBytes.
Status load_workload(const std::string& path, Workload* out, std::string* error);
// The same from text already in memory; `filename` is used in messages.
Status parse_workload(const std::string& yaml_text, const std::string& filename, Workload* out, std::string* error);

// The structural bounds above, on text already checked to be UTF-8: anchors and aliases (workload
// files need none, and an alias expands to its whole target each time it is walked), node count,
// nesting depth and scalar length. Streams yaml-cpp's parser events, so nothing is built or
// expanded; a YAML syntax error is left to the full parse, which reports it. Sets *error as
// parse_workload does.
Status check_workload_structure(const std::string& yaml_text, const std::string& filename, std::string* error);

// Re-checks the workload against a layout (its own, or `weftrun plan --nodes N`): the group (if any)
// within its bounds for the op and tiling the layout, and the sizes divisible by the group's ranks
// where the op needs it. Sets *error as parse_workload does.
Status validate_layout(const Workload& w, const Layout& layout, std::string* error);

// Levenshtein distance, for "did you mean" suggestions.
int edit_distance(const std::string& a, const std::string& b);

}  // namespace weft::runtime
