// Workload enums, shards, layout checks, bounded file reading and structural limits (reader: workload_yaml.cpp).
#include "runtime/workload.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <vector>

#include "base/log.h"

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
    case InterNode::kOfi:
      return "ofi";
  }
  return "?";
}

int dtype_bytes(DType t) { return t == DType::kFp8 ? 1 : 2; }

bool is_gemm_op(Op op) { return op == Op::kAgGemm || op == Op::kGemmRs || op == Op::kGemmAr; }

GemmShard Workload::gemm_shard() const {
  GemmShard s;
  const int64_t w = group_size();
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

namespace {

std::string plural(int64_t n, const char* what) { return std::to_string(n) + " " + what + (n == 1 ? "" : "s"); }

// The group against the op's bounds and the layout it must tile.
Status validate_group(const Workload& w, const Layout& layout, std::string* error) {
  if (!w.group) return Status::kOk;
  const Layout& g = *w.group;
  auto refuse = [&](const char* key, const std::string& what) {
    *error = w.error_at(key, what);
    return Status::kInvalidArgument;
  };
  if (w.op == Op::kMoe) {
    if (g.nodes < 1 || g.nodes > kMaxExpertGroupNodes)
      return refuse("group.nodes", "expected 1 to " + std::to_string(kMaxExpertGroupNodes) +
                                       " nodes for moe's expert-parallel group, got " + std::to_string(g.nodes));
    if (g.gpus_per_node != kExpertGroupGpus && g.gpus_per_node != layout.gpus_per_node)
      return refuse("group.gpus_per_node", "expected " + std::to_string(kExpertGroupGpus) + " or the node's " +
                                               std::to_string(layout.gpus_per_node) +
                                               " (moe's expert-parallel group takes whole nodes), got " +
                                               std::to_string(g.gpus_per_node));
  } else {
    if (g.nodes < 1 || g.nodes > kMaxTensorGroupNodes)
      return refuse("group.nodes", "expected 1 to " + std::to_string(kMaxTensorGroupNodes) + " nodes for " +
                                       to_string(w.op) + "'s tensor-parallel group, got " + std::to_string(g.nodes));
    if (g.gpus_per_node < 1 || g.gpus_per_node > kMaxTensorGroupGpus)
      return refuse("group.gpus_per_node", "expected 1 to " + std::to_string(kMaxTensorGroupGpus) + " GPUs for " +
                                               to_string(w.op) + "'s tensor-parallel group, got " +
                                               std::to_string(g.gpus_per_node));
  }
  const std::string job = "the layout's " + plural(layout.nodes, "node") + " x " + plural(layout.gpus_per_node, "GPU");
  if (g.nodes > layout.nodes || layout.nodes % g.nodes != 0)
    return refuse("group.nodes", plural(g.nodes, "node") + " per group do not tile " + job +
                                     "; expected a divisor of " + std::to_string(layout.nodes));
  if (g.gpus_per_node > layout.gpus_per_node || layout.gpus_per_node % g.gpus_per_node != 0)
    return refuse("group.gpus_per_node", plural(g.gpus_per_node, "GPU") + " per node per group do not tile " + job +
                                             "; expected a divisor of " + std::to_string(layout.gpus_per_node));
  return Status::kOk;
}

}  // namespace

Status validate_layout(const Workload& w, const Layout& layout, std::string* error) {
  if (layout.nodes < 1 || layout.gpus_per_node < 1) {
    *error = w.error_at("layout", "expected at least 1 node and 1 GPU per node");
    return Status::kInvalidArgument;
  }
  if (validate_group(w, layout, error) != Status::kOk) return Status::kInvalidArgument;
  // The op's problem is split over one group's ranks (the whole layout without `group:`).
  const Layout ranks = w.group ? *w.group : layout;
  const int64_t world = static_cast<int64_t>(ranks.nodes) * ranks.gpus_per_node;
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
      os << n.value << " is not divisible by the " << world << " ranks (" << ranks.nodes << " node"
         << (ranks.nodes == 1 ? "" : "s") << " x " << ranks.gpus_per_node << " GPU"
         << (ranks.gpus_per_node == 1 ? "" : "s") << (w.group ? " per group" : "") << "); expected a multiple of "
         << world << " (" << n.why << ")";
      *error = w.error_at(n.key, os.str());
      return Status::kInvalidArgument;
    }
  }
  return Status::kOk;
}

namespace {

// Stops the event stream at the first thing over a bound; carries the located message out.
struct LimitHit {
  YAML::Mark mark;
  std::string key, what;
};

class LimitChecker final : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& m, YAML::anchor_t) override { node(m); }
  void OnAlias(const YAML::Mark& m, YAML::anchor_t) override {
    throw LimitHit{m, "(alias)",
                   "a YAML alias (*name); expected plain values (workload files use no anchors or aliases)"};
  }
  void OnAnchor(const YAML::Mark& m, const std::string& name) override {
    throw LimitHit{m, "(anchor)",
                   "a YAML anchor (&" + name.substr(0, 32) +
                       "); expected plain values (workload files use no anchors or aliases)"};
  }
  void OnScalar(const YAML::Mark& m, const std::string&, YAML::anchor_t, const std::string& value) override {
    node(m);
    if (value.size() > kMaxWorkloadScalarBytes)
      throw LimitHit{m, "(value)",
                     "a value of " + std::to_string(value.size()) + " bytes; expected at most " +
                         std::to_string(kMaxWorkloadScalarBytes) + " (names and numbers are short)"};
  }
  void OnSequenceStart(const YAML::Mark& m, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    open(m);
  }
  void OnSequenceEnd() override { --depth_; }
  void OnMapStart(const YAML::Mark& m, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    open(m);
  }
  void OnMapEnd() override { --depth_; }

 private:
  void node(const YAML::Mark& m) {
    if (++nodes_ > kMaxWorkloadNodes)
      throw LimitHit{
          m, "(file)",
          "more than " + std::to_string(kMaxWorkloadNodes) + " YAML values; expected a workload of a few dozen keys"};
  }
  void open(const YAML::Mark& m) {
    node(m);
    if (++depth_ > kMaxWorkloadDepth)
      throw LimitHit{m, "(file)",
                     "maps and lists nested more than " + std::to_string(kMaxWorkloadDepth) +
                         " deep; expected a workload's few levels"};
  }
  int nodes_ = 0;
  int depth_ = 0;
};

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

Status check_workload_structure(const std::string& yaml_text, const std::string& filename, std::string* error) {
  std::istringstream in(yaml_text);
  try {
    YAML::Parser parser(in);
    LimitChecker checker;
    parser.HandleNextDocument(checker);
  } catch (const LimitHit& hit) {
    std::ostringstream os;
    os << filename << ":" << std::max(0, hit.mark.line) + 1 << ":" << std::max(0, hit.mark.column) + 1 << ": "
       << hit.key << ": " << hit.what;
    *error = os.str();
    return Status::kInvalidArgument;
  } catch (const YAML::Exception&) {
    // Syntax errors are the full parse's to report, with the key on that line.
  }
  return Status::kOk;
}

Status load_workload(const std::string& path, Workload* out, std::string* error) {
  auto refuse = [&](Status s, const std::string& what) {
    *error = path + ":1:1: (file): " + what;
    WEFT_INFO(kConfig, "%s", error->c_str());
    return s;
  };
  // O_NONBLOCK: opening a FIFO must not wait for a writer (the type check refuses it next).
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0)
    return refuse(Status::kNotFound,
                  std::string("cannot be read (") + strerror(errno) + "); expected a readable YAML file");
  struct stat st {};
  const int stat_rc = fstat(fd, &st);
  if (stat_rc != 0 || !S_ISREG(st.st_mode)) {
    const std::string kind = stat_rc == 0 ? file_kind(st.st_mode) : std::string("unreadable: ") + strerror(errno);
    close(fd);
    return refuse(Status::kInvalidArgument, "is " + kind + "; expected a regular YAML file");
  }
  const std::string too_big = " bytes; expected a YAML file of at most " + std::to_string(kMaxWorkloadBytes) +
                              " bytes (a workload is a few hundred)";
  if (static_cast<uint64_t>(st.st_size) > kMaxWorkloadBytes) {
    // A program or data file given by mistake says so: its first bytes tell, the rest is not read.
    char head[512];
    ssize_t n = read(fd, head, sizeof head);
    close(fd);
    for (ssize_t i = 0; i < n; ++i) {
      const unsigned char c = static_cast<unsigned char>(head[i]);
      if ((c < 0x20 && c != '\t' && c != '\r' && c != '\n') || c == 0x7f) {
        char what[96];
        snprintf(what, sizeof what, "binary data (byte 0x%02x at offset %zd) and ", c, i);
        return refuse(Status::kInvalidArgument, what + std::to_string(st.st_size) + too_big);
      }
    }
    return refuse(Status::kInvalidArgument, std::to_string(st.st_size) + too_big);
  }
  // At most one byte past the cap, whatever the size said (the file may be growing).
  std::string text(kMaxWorkloadBytes + 1, '\0');
  size_t got = 0;
  while (got < text.size()) {
    ssize_t n = read(fd, &text[got], text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      close(fd);
      return refuse(Status::kNotFound,
                    std::string("read error (") + strerror(err) + "); expected a readable YAML file");
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  close(fd);
  if (got > kMaxWorkloadBytes)
    return refuse(Status::kInvalidArgument, "more than " + std::to_string(got - 1) + too_big);
  text.resize(got);
  return parse_workload(text, path, out, error);
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
