// Workload enums, per-rank shards, layout checks and file loading (the YAML reader is workload_yaml.cpp).
#include "runtime/workload.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "runtime/log.h"

namespace weft::runtime {

const char* to_string(Op op) {
  switch (op) {
    case Op::kAgGemm:
      return "ag_gemm";
    case Op::kGemmRs:
      return "gemm_rs";
    case Op::kGemmAr:
      return "gemm_ar";
    case Op::kMoe:
      return "moe";
    case Op::kRingAttention:
      return "ring_attention";
  }
  return "?";
}

const char* to_string(DType t) {
  switch (t) {
    case DType::kBf16:
      return "bf16";
    case DType::kFp16:
      return "fp16";
    case DType::kFp8:
      return "fp8";
  }
  return "?";
}

const char* to_string(InterNode t) {
  switch (t) {
    case InterNode::kAuto:
      return "auto";
    case InterNode::kIbverbs:
      return "ibverbs";
    case InterNode::kSocket:
      return "socket";
  }
  return "?";
}

int dtype_bytes(DType t) { return t == DType::kFp8 ? 1 : 2; }

bool is_gemm_op(Op op) { return op == Op::kAgGemm || op == Op::kGemmRs || op == Op::kGemmAr; }

GemmShard Workload::gemm_shard() const {
  GemmShard s;
  const int64_t w = world_size();
  if (w <= 0) return s;
  switch (op) {
    case Op::kAgGemm:
      s = {gemm.m, gemm.n / w, gemm.k, gemm.m / w, gemm.m, gemm.n / w};
      break;
    case Op::kGemmRs:
      s = {gemm.m, gemm.n, gemm.k / w, gemm.m, gemm.m / w, gemm.n};
      break;
    case Op::kGemmAr:
      s = {gemm.m, gemm.n, gemm.k / w, gemm.m, gemm.m, gemm.n};
      break;
    default:
      break;
  }
  return s;
}

SourceLoc Workload::loc_of(const std::string& key) const {
  auto it = locations.find(key);
  if (it != locations.end()) return it->second;
  // Fall back to the enclosing key ("roles" for "roles.compute").
  auto dot = key.rfind('.');
  if (dot != std::string::npos) return loc_of(key.substr(0, dot));
  return SourceLoc{1, 1};
}

std::string Workload::error_at(const std::string& key, const std::string& what) const {
  SourceLoc l = loc_of(key);
  std::ostringstream os;
  os << (source.empty() ? "<workload>" : source) << ":" << l.line << ":" << l.column << ": " << key << ": " << what;
  return os.str();
}

Status validate_layout(const Workload& w, const Layout& layout, std::string* error) {
  const int64_t world = static_cast<int64_t>(layout.nodes) * layout.gpus_per_node;
  if (layout.nodes < 1 || layout.gpus_per_node < 1) {
    *error = w.error_at("layout", "expected at least 1 node and 1 GPU per node");
    return Status::kInvalidArgument;
  }
  struct Need {
    const char* key;
    int64_t value;
    const char* why;
  };
  // At most two sizes per op must split evenly over the ranks.
  Need needs[2] = {};
  switch (w.op) {
    case Op::kAgGemm:
      needs[0] = {"shape.m", w.gemm.m, "ag_gemm gathers A by rows"};
      needs[1] = {"shape.n", w.gemm.n, "ag_gemm gives each rank an n/world column block"};
      break;
    case Op::kGemmRs:
      needs[0] = {"shape.k", w.gemm.k, "gemm_rs splits k across ranks"};
      needs[1] = {"shape.m", w.gemm.m, "gemm_rs scatters rows of C"};
      break;
    case Op::kGemmAr:
      needs[0] = {"shape.k", w.gemm.k, "gemm_ar splits k across ranks"};
      break;
    case Op::kMoe:
      needs[0] = {"shape.tokens", w.moe.tokens, "moe gives each rank tokens/world tokens"};
      needs[1] = {"shape.experts", w.moe.experts, "moe places experts/world experts on each rank"};
      break;
    case Op::kRingAttention:
      needs[0] = {"shape.seq", w.attention.seq, "ring_attention gives each rank seq/world positions"};
      break;
  }
  for (const auto& n : needs) {
    if (n.key && n.value % world != 0) {
      std::ostringstream os;
      os << n.value << " is not divisible by the " << world << " ranks (" << layout.nodes << " node"
         << (layout.nodes == 1 ? "" : "s") << " x " << layout.gpus_per_node << " GPU"
         << (layout.gpus_per_node == 1 ? "" : "s") << "); expected a multiple of " << world << " (" << n.why << ")";
      *error = w.error_at(n.key, os.str());
      return Status::kInvalidArgument;
    }
  }
  return Status::kOk;
}

Status load_workload(const std::string& path, Workload* out, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = path + ":1:1: (file): cannot be read (" + strerror(errno) + "); expected a readable YAML file";
    WEFT_INFO(kConfig, "%s", error->c_str());
    return Status::kNotFound;
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    *error = path + ":1:1: (file): read error; expected a readable YAML file";
    return Status::kNotFound;
  }
  return parse_workload(text.str(), path, out, error);
}

int edit_distance(const std::string& a, const std::string& b) {
  std::vector<int> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = static_cast<int>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = static_cast<int>(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      int sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace weft::runtime
