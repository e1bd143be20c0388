// parse_workload: YAML text -> Workload, with one "file:line:col: key: what was expected" per error.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "base/log.h"
#include "runtime/machine_model.h"
#include "runtime/workload.h"

namespace weft::runtime {
namespace {

// Sizes beyond int32 would overflow the kernels' tile index math.
constexpr int64_t kMaxDim = std::numeric_limits<int32_t>::max();
constexpr int kMaxNodes = 65536;
constexpr int kMaxGpusPerNode = 64;

using Keys = std::vector<const char*>;

std::string join(const Keys& keys) {
  std::string s;
  for (size_t i = 0; i < keys.size(); ++i) s += (i ? ", " : "") + std::string(keys[i]);
  return s;
}

std::string nearest(const std::string& word, const Keys& keys) {
  std::string best;
  int best_d = 1 << 30;
  for (const char* k : keys) {
    int d = edit_distance(word, k);
    if (d < best_d) best_d = d, best = k;
  }
  // A suggestion is only useful when the word is plausibly a typo of it.
  int limit = std::max<int>(2, static_cast<int>(best.size()) / 3);
  return best_d <= limit ? best : std::string();
}

const char* kind_of(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Null:
      return "nothing";
    case YAML::NodeType::Scalar:
      return n.Tag() == "!" ? "a quoted string" : "a scalar";
    default:
      return "nothing";
  }
}

// The key written on 1-based `line`, for messages about lines yaml-cpp rejects.
std::string key_on_line(const std::string& text, int line) {
  std::istringstream in(text);
  std::string l;
  for (int i = 1; std::getline(in, l); ++i) {
    if (i != line) continue;
    size_t b = l.find_first_not_of(" \t-");
    size_t c = l.find(':', b == std::string::npos ? 0 : b);
    if (b == std::string::npos || c == std::string::npos || c == b) return "(syntax)";
    std::string k = l.substr(b, c - b);
    if (k.size() > 64) return "(syntax)";  // not a workload key; never echo a long line back
    for (char ch : k)
      if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_')) return "(syntax)";
    return k;
  }
  return "(syntax)";
}

// Messages are one line, whatever the file holds: a value echoed back (a folded scalar, a quoted key)
// may carry newlines or control bytes, which are written as escapes.
std::string one_line(const std::string& s) {
  std::string out;
  for (char c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (c == '\n') {
      out += "\\n";
    } else if (u < 0x20 || u == 0x7f) {
      char esc[8];
      snprintf(esc, sizeof esc, "\\x%02x", u);
      out += esc;
    } else {
      out += c;
    }
  }
  return out;
}

// A value as messages echo it: escaped, and cut after 64 characters (the place is in file:line:col).
std::string quote(const std::string& v) {
  std::string out = one_line(v.size() > 64 ? v.substr(0, 64) : v);
  return v.size() > 64 ? out + "..." : out;
}

class Reader {
 public:
  Reader(const std::string& text, const std::string& file, Workload* w, std::string* error)
      : text_(text), file_(file), w_(w), error_(error) {}

  bool run();

 private:
  // Every failure funnels through here: one message, then the caller returns false.
  bool fail_at(int line0, int col0, const std::string& key, const std::string& what) {
    std::ostringstream os;
    os << file_ << ":" << line0 + 1 << ":" << col0 + 1 << ": " << key << ": " << what;
    *error_ = one_line(os.str());
    return false;
  }
  bool fail(const YAML::Node& at, const std::string& key, const std::string& what) {
    YAML::Mark m = at.Mark();
    return fail_at(m.line < 0 ? 0 : m.line, m.column < 0 ? 0 : m.column, key, what);
  }
  void remember(const std::string& key, const YAML::Node& n) {
    YAML::Mark m = n.Mark();
    w_->locations[key] = SourceLoc{m.line + 1, m.column + 1};
  }

  bool check_bytes();
  void unclosed_bracket(size_t end, int* line, int* col) const;
  bool first_content(int* line, int* col) const;
  bool check_single_document();
  bool check_tabs();
  bool check_duplicates(const YAML::Node& n, const std::string& path);
  bool check_keys(const YAML::Node& map, const std::string& path, const Keys& allowed, const std::string& what);
  bool want_map(const YAML::Node& n, const std::string& key, const std::string& what);

  bool get_int(const YAML::Node& map, const std::string& path, const char* key, int64_t lo, int64_t hi, int64_t* out,
               bool required);
  bool get_bool(const YAML::Node& map, const std::string& path, const char* key, bool* out);
  bool get_string(const YAML::Node& n, const std::string& key, std::string* out);
  bool get_enum(const YAML::Node& n, const std::string& key, const Keys& names, int* out);

  bool read_shape(const YAML::Node& top);
  bool read_layout(const YAML::Node& top);
  bool read_group(const YAML::Node& top);
  bool read_machine(const YAML::Node& top, int* sm_count);
  bool read_roles(const YAML::Node& top, int sm_count);
  bool read_transport(const YAML::Node& top);
  bool read_run(const YAML::Node& top);
  bool read_plan(const YAML::Node& top);
  bool opt_int(const YAML::Node& map, const std::string& path, const char* key, int64_t lo, int64_t hi,
               std::optional<int>* out);
  bool opt_bool(const YAML::Node& map, const std::string& path, const char* key, std::optional<bool>* out);

  const std::string& text_;
  const std::string& file_;
  Workload* w_;
  std::string* error_;
};

void Reader::unclosed_bracket(size_t end, int* line, int* col) const {
  // Brackets inside quotes or comments are not counted; good enough to point at the right line.
  std::vector<size_t> open;
  bool comment = false;
  char quote = 0;
  for (size_t i = 0; i < end && i < text_.size(); ++i) {
    char c = text_[i];
    if (c == '\n') comment = false;
    if (comment) continue;
    if (quote) {
      if (c == quote) quote = 0;
      continue;
    }
    if (c == '#')
      comment = true;
    else if (c == '"' || c == '\'')
      quote = c;
    else if (c == '{' || c == '[')
      open.push_back(i);
    else if ((c == '}' || c == ']') && !open.empty())
      open.pop_back();
  }
  if (open.empty()) return;
  const size_t at = open.back();
  const size_t bol = text_.rfind('\n', at);  // text_[at] is the bracket, so this is the line before
  *line = static_cast<int>(std::count(text_.begin(), text_.begin() + static_cast<std::ptrdiff_t>(at), '\n'));
  *col = static_cast<int>(bol == std::string::npos ? at : at - bol - 1);
}

bool Reader::first_content(int* line, int* col) const {
  // The first character that is not blank, not in a comment and not a document marker.
  std::istringstream in(text_);
  std::string l;
  for (int i = 0; std::getline(in, l); ++i) {
    size_t b = l.find_first_not_of(" \t\r");
    if (b == std::string::npos || l[b] == '#' || l.rfind("---", 0) == 0 || l.rfind("...", 0) == 0) continue;
    *line = i;
    *col = static_cast<int>(b);
    return true;
  }
  return false;
}

bool Reader::check_single_document() {
  // Document markers start a line: "---" (start) and "..." (end). Content after a second start,
  // or after an end, is a second document.
  std::istringstream in(text_);
  std::string l;
  bool content = false, ended = false;
  for (int i = 0; std::getline(in, l); ++i) {
    if (!l.empty() && l.back() == '\r') l.pop_back();
    const bool start = l.rfind("---", 0) == 0 && (l.size() == 3 || l[3] == ' ' || l[3] == '\t');
    const bool end = l.rfind("...", 0) == 0 && (l.size() == 3 || l[3] == ' ' || l[3] == '\t');
    if (start && (content || ended))
      return fail_at(i, 0, "(file)", "a second YAML document; expected one workload per file");
    if (end) {
      ended = true;
      continue;
    }
    size_t b = l.find_first_not_of(" \t");
    if (start || b == std::string::npos || l[b] == '#') continue;
    if (ended)
      return fail_at(i, static_cast<int>(b), "(file)",
                     "content after the document end '...'; expected one workload per file");
    content = true;
  }
  return true;
}

bool Reader::check_bytes() {
  int line = 0, col = 0;
  for (size_t i = 0; i < text_.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(text_[i]);
    size_t extra = 0;
    bool bad = false;
    if (c == '\n') {
      ++line, col = 0;
      continue;
    }
    if (c < 0x20 && c != '\t' && c != '\r')
      bad = true;
    else if (c == 0x7f)
      bad = true;
    else if (c >= 0x80) {
      // Valid UTF-8 only: a lead byte and its continuation bytes.
      if ((c & 0xe0) == 0xc0 && c >= 0xc2)
        extra = 1;
      else if ((c & 0xf0) == 0xe0)
        extra = 2;
      else if ((c & 0xf8) == 0xf0 && c <= 0xf4)
        extra = 3;
      else
        bad = true;
      for (size_t j = 1; !bad && j <= extra; ++j)
        if (i + j >= text_.size() || (static_cast<unsigned char>(text_[i + j]) & 0xc0) != 0x80) bad = true;
    }
    if (bad) {
      char what[160];
      snprintf(what, sizeof(what), "binary data (byte 0x%02x at offset %zu); expected a UTF-8 YAML text file", c, i);
      return fail_at(line, col, "(file)", what);
    }
    i += extra;
    ++col;
  }
  return true;
}

bool Reader::check_tabs() {
  // YAML forbids tabs in indentation; yaml-cpp reports them as unrelated syntax errors, if at all.
  int line = 0;
  size_t start = 0;
  while (start <= text_.size()) {
    size_t end = text_.find('\n', start);
    if (end == std::string::npos) end = text_.size();
    for (size_t i = start; i < end; ++i) {
      char c = text_[i];
      if (c == ' ' || c == '-') continue;
      if (c == '\t') {
        size_t k = text_.find_first_not_of(" \t", i);
        std::string key = "(indentation)";
        if (k != std::string::npos && k < end) {
          size_t colon = text_.find(':', k);
          if (colon != std::string::npos && colon < end && colon > k && colon - k <= 64)
            key = text_.substr(k, colon - k);
        }
        return fail_at(line, static_cast<int>(i - start), key,
                       "tab character in indentation; expected spaces (YAML does not allow tabs there)");
      }
      break;
    }
    ++line;
    start = end + 1;
  }
  return true;
}

bool Reader::check_duplicates(const YAML::Node& n, const std::string& path) {
  if (n.IsSequence()) {
    for (size_t i = 0; i < n.size(); ++i)
      if (!check_duplicates(n[i], path + "[" + std::to_string(i) + "]")) return false;
  }
  if (!n.IsMap()) return true;
  std::vector<std::pair<std::string, YAML::Mark>> seen;
  for (auto it = n.begin(); it != n.end(); ++it) {
    const YAML::Node k = it->first;
    std::string name = k.IsScalar() ? k.Scalar() : std::string("?");
    std::string full = path.empty() ? name : path + "." + name;
    if (!k.IsScalar()) return fail(k, full, "a map key must be a plain word, got " + std::string(kind_of(k)));
    for (const auto& s : seen)
      if (s.first == name)
        return fail(
            k, full,
            "duplicate key (first set at line " + std::to_string(s.second.line + 1) + "); expected each key once");
    seen.emplace_back(name, k.Mark());
    if (!check_duplicates(it->second, full)) return false;
  }
  return true;
}

bool Reader::check_keys(const YAML::Node& map, const std::string& path, const Keys& allowed, const std::string& what) {
  for (auto it = map.begin(); it != map.end(); ++it) {
    std::string name = it->first.Scalar();
    bool ok = false;
    for (const char* a : allowed) ok = ok || name == a;
    if (ok) continue;
    std::string full = path.empty() ? name : path + "." + name;
    std::string hint = nearest(name, allowed);
    std::string msg = "unknown key" + (what.empty() ? std::string() : " " + what) + ";";
    if (!hint.empty()) msg += " did you mean '" + hint + "'?";
    msg += " expected one of: " + join(allowed);
    return fail(it->first, full, msg);
  }
  return true;
}

bool Reader::want_map(const YAML::Node& n, const std::string& key, const std::string& what) {
  if (n.IsMap()) return true;
  return fail(n, key,
              "expected " + what + ", got " + kind_of(n) + (n.IsScalar() ? " '" + quote(n.Scalar()) + "'" : ""));
}

bool Reader::get_int(const YAML::Node& map, const std::string& path, const char* key, int64_t lo, int64_t hi,
                     int64_t* out, bool required) {
  std::string full = path.empty() ? key : path + "." + key;
  YAML::Node n = map[key];
  std::string range = "an integer between " + std::to_string(lo) + " and " + std::to_string(hi);
  if (!n) {
    if (!required) return true;
    return fail(map, full, "missing; expected " + range);
  }
  remember(full, n);
  if (!n.IsScalar() || n.Tag() == "!")
    return fail(n, full,
                "expected " + range + ", got " + kind_of(n) + (n.IsScalar() ? " \"" + quote(n.Scalar()) + "\"" : ""));
  const std::string& s = n.Scalar();
  size_t i = (s[0] == '-' || s[0] == '+') ? 1 : 0;
  bool digits = i < s.size();
  for (size_t j = i; j < s.size(); ++j) digits = digits && std::isdigit(static_cast<unsigned char>(s[j]));
  if (!digits) return fail(n, full, "expected " + range + ", got '" + quote(s) + "'");
  errno = 0;
  long long v = strtoll(s.c_str(), nullptr, 10);
  if (errno == ERANGE || v < lo || v > hi) return fail(n, full, "expected " + range + ", got " + quote(s));
  *out = v;
  return true;
}

bool Reader::get_bool(const YAML::Node& map, const std::string& path, const char* key, bool* out) {
  std::string full = path + "." + key;
  YAML::Node n = map[key];
  if (!n) return true;
  remember(full, n);
  if (n.IsScalar() && n.Tag() != "!") {
    const std::string& s = n.Scalar();
    if (s == "true" || s == "True" || s == "TRUE") return *out = true, true;
    if (s == "false" || s == "False" || s == "FALSE") return *out = false, true;
  }
  return fail(
      n, full,
      std::string("expected true or false, got ") + kind_of(n) + (n.IsScalar() ? " '" + quote(n.Scalar()) + "'" : ""));
}

bool Reader::get_string(const YAML::Node& n, const std::string& key, std::string* out) {
  remember(key, n);
  if (!n.IsScalar() || n.Scalar().empty())
    return fail(n, key, std::string("expected a non-empty string, got ") + kind_of(n));
  *out = n.Scalar();
  return true;
}

bool Reader::get_enum(const YAML::Node& n, const std::string& key, const Keys& names, int* out) {
  remember(key, n);
  if (!n.IsScalar()) return fail(n, key, "expected one of " + join(names) + ", got " + kind_of(n));
  const std::string& s = n.Scalar();
  for (size_t i = 0; i < names.size(); ++i)
    if (s == names[i]) return *out = static_cast<int>(i), true;
  std::string hint = nearest(s, names);
  return fail(n, key,
              "unknown value '" + quote(s) + "';" + (hint.empty() ? "" : " did you mean '" + hint + "'?") +
                  " expected one of " + join(names));
}

bool Reader::read_shape(const YAML::Node& top) {
  static const Keys kGemm = {"m", "n", "k"};
  static const Keys kMoe = {"tokens", "hidden", "ffn", "experts", "topk"};
  static const Keys kAttn = {"seq", "heads", "head_dim", "causal"};
  const Op op = w_->op;
  const Keys& keys = is_gemm_op(op) ? kGemm : op == Op::kMoe ? kMoe : kAttn;
  YAML::Node s = top["shape"];
  if (!s)
    return fail(top, "shape", std::string("missing; expected a map {") + join(keys) + "} for op " + to_string(op));
  remember("shape", s);
  if (!want_map(s, "shape", std::string("a map {") + join(keys) + "} for op " + to_string(op))) return false;
  if (!check_keys(s, "shape", keys, std::string("for op ") + to_string(op))) return false;
  if (is_gemm_op(op)) {
    if (!get_int(s, "shape", "m", 1, kMaxDim, &w_->gemm.m, true) ||
        !get_int(s, "shape", "n", 1, kMaxDim, &w_->gemm.n, true) ||
        !get_int(s, "shape", "k", 1, kMaxDim, &w_->gemm.k, true))
      return false;
    // Each operand must be addressable in bytes without overflow (int32 dims alone allow 2^62 elements).
    const double e = dtype_bytes(w_->dtype);
    const double mk = double(w_->gemm.m) * w_->gemm.k * e, kn = double(w_->gemm.k) * w_->gemm.n * e,
                 mn = double(w_->gemm.m) * w_->gemm.n * 4;
    if (std::max({mk, kn, mn}) > double(int64_t(1) << 50))
      return fail(s, "shape",
                  "a matrix of this shape would exceed 1 PiB; expected sizes whose A, B and C fit in memory");
  } else if (op == Op::kMoe) {
    auto& m = w_->moe;
    if (!get_int(s, "shape", "tokens", 1, kMaxDim, &m.tokens, true) ||
        !get_int(s, "shape", "hidden", 1, kMaxDim, &m.hidden, true) ||
        !get_int(s, "shape", "ffn", 1, kMaxDim, &m.ffn, true) ||
        !get_int(s, "shape", "experts", 1, 1 << 20, &m.experts, true) ||
        !get_int(s, "shape", "topk", 1, 1 << 20, &m.topk, true))
      return false;
    if (m.topk > m.experts)
      return fail(s["topk"], "shape.topk",
                  std::to_string(m.topk) + " > experts (" + std::to_string(m.experts) +
                      "); expected topk between 1 and experts");
    if (double(m.experts) * m.hidden * m.ffn * 3 * dtype_bytes(w_->dtype) > double(int64_t(1) << 50))
      return fail(s, "shape", "the experts' weights would exceed 1 PiB; expected smaller hidden, ffn or experts");
  } else {
    auto& a = w_->attention;
    if (!get_int(s, "shape", "seq", 1, kMaxDim, &a.seq, true) ||
        !get_int(s, "shape", "heads", 1, 1 << 16, &a.heads, true) ||
        !get_int(s, "shape", "head_dim", 1, 1024, &a.head_dim, true) || !get_bool(s, "shape", "causal", &a.causal))
      return false;
    if (double(a.seq) * a.heads * a.head_dim * dtype_bytes(w_->dtype) > double(int64_t(1) << 50))
      return fail(s, "shape", "Q, K or V of this shape would exceed 1 PiB; expected a smaller seq, heads or head_dim");
  }
  return true;
}

bool Reader::read_layout(const YAML::Node& top) {
  YAML::Node l = top["layout"];
  if (!l) return true;
  remember("layout", l);
  if (!want_map(l, "layout", "a map {nodes, gpus_per_node}")) return false;
  if (!check_keys(l, "layout", {"nodes", "gpus_per_node"}, "")) return false;
  int64_t nodes = w_->layout.nodes, gpn = w_->layout.gpus_per_node;
  if (!get_int(l, "layout", "nodes", 1, kMaxNodes, &nodes, false) ||
      !get_int(l, "layout", "gpus_per_node", 1, kMaxGpusPerNode, &gpn, false))
    return false;
  w_->layout.nodes = static_cast<int>(nodes);
  w_->layout.gpus_per_node = static_cast<int>(gpn);
  return true;
}

bool Reader::read_group(const YAML::Node& top) {
  YAML::Node g = top["group"];
  if (!g) return true;
  remember("group", g);
  if (!want_map(g, "group", "a map {nodes, gpus_per_node}")) return false;
  if (!check_keys(g, "group", {"nodes", "gpus_per_node"}, "")) return false;
  // Unset sides default to one node and the layout's GPUs per node (a group per node).
  int64_t nodes = 1, gpn = w_->layout.gpus_per_node;
  if (!get_int(g, "group", "nodes", 1, kMaxNodes, &nodes, false) ||
      !get_int(g, "group", "gpus_per_node", 1, kMaxGpusPerNode, &gpn, false))
    return false;
  w_->group = Layout{static_cast<int>(nodes), static_cast<int>(gpn)};
  return true;  // bounds and tiling: validate_layout, with the layout it is run with
}

bool Reader::read_machine(const YAML::Node& top, int* sm_count) {
  YAML::Node m = top["machine"];
  MachineModel model;
  std::string why;
  if (m) {
    remember("machine", m);
    if (!want_map(m, "machine", "a map {gpu, sm_count, tensor_tflops, ...}")) return false;
    Keys keys = {"gpu"};
    for (const auto& k : machine_model_keys()) keys.push_back(k.c_str());
    if (!check_keys(m, "machine", keys, "")) return false;
    if (m["gpu"]) {
      int idx = 0;
      if (!get_enum(m["gpu"], "machine.gpu", {"h100", "h200"}, &idx)) return false;
      w_->gpu = idx == 0 ? "h100" : "h200";
    }
    for (auto it = m.begin(); it != m.end(); ++it) {
      std::string key = it->first.Scalar();
      if (key == "gpu") continue;
      std::string full = "machine." + key;
      const YAML::Node v = it->second;
      remember(full, v);
      char* end = nullptr;
      double x = v.IsScalar() && v.Tag() != "!" ? strtod(v.Scalar().c_str(), &end) : 0;
      if (!v.IsScalar() || v.Tag() == "!" || end == v.Scalar().c_str() || *end)
        return fail(v, full, std::string("expected a number, got ") + kind_of(v));
      std::string err;
      if (set_machine_model_value(&model, key, x, &err) != Status::kOk) return fail(v, full, err);
      w_->machine_overrides.emplace_back(key, x);
    }
  }
  // The SM count explicit roles are checked against: the model this workload will most likely
  // be planned with (the tuner re-checks against the one it actually uses).
  if (choose_machine_model(w_->gpu, {}, &model, &why) != Status::kOk) model = machine_model_h200();
  std::string err;
  for (const auto& o : w_->machine_overrides) set_machine_model_value(&model, o.first, o.second, &err);
  *sm_count = model.sm_count;
  return true;
}

bool Reader::read_roles(const YAML::Node& top, int sm_count) {
  YAML::Node r = top["roles"];
  if (!r) return true;
  remember("roles", r);
  if (r.IsScalar() && r.Tag() != "!" && r.Scalar() == "auto") return true;
  if (!r.IsMap())
    return fail(r, "roles",
                std::string("expected auto or a map {compute, intra_comm, inter_send, inter_reduce}, got ") +
                    kind_of(r) + (r.IsScalar() ? " '" + quote(r.Scalar()) + "'" : ""));
  if (!check_keys(r, "roles", {"compute", "intra_comm", "inter_send", "inter_reduce"}, "")) return false;
  int64_t c = -1, ic = 0, is = 0, ir = 0;
  if (!get_int(r, "roles", "intra_comm", 0, sm_count, &ic, false) ||
      !get_int(r, "roles", "inter_send", 0, sm_count, &is, false) ||
      !get_int(r, "roles", "inter_reduce", 0, sm_count, &ir, false) ||
      !get_int(r, "roles", "compute", 0, sm_count, &c, false))
    return false;
  const int64_t others = ic + is + ir;
  if (c < 0) c = sm_count - others;  // compute defaults to the SMs the others leave
  if (c == 0 || c + others > sm_count) {
    std::ostringstream os;
    os << "compute " << c << " + intra_comm " << ic << " + inter_send " << is << " + inter_reduce " << ir << " = "
       << c + others << "; expected at most " << sm_count << " SMs in all with at least 1 compute SM";
    return fail(r["compute"] ? r["compute"] : r, r["compute"] ? "roles.compute" : "roles", os.str());
  }
  w_->roles.automatic = false;
  w_->roles.counts =
      RoleCounts{static_cast<int32_t>(c), static_cast<int32_t>(ic), static_cast<int32_t>(is), static_cast<int32_t>(ir)};
  return true;
}

bool Reader::read_transport(const YAML::Node& top) {
  YAML::Node t = top["transport"];
  if (!t) return true;
  remember("transport", t);
  if (!want_map(t, "transport", "a map {inter_node, signal_mode}")) return false;
  if (!check_keys(t, "transport", {"inter_node", "signal_mode"}, "")) return false;
  int v = 0;
  if (t["inter_node"]) {
    if (!get_enum(t["inter_node"], "transport.inter_node", {"auto", "ibverbs", "socket", "ofi"}, &v)) return false;
    w_->transport.inter_node = static_cast<InterNode>(v);
  }
  if (t["signal_mode"]) {
    if (!get_enum(t["signal_mode"], "transport.signal_mode", {"serial", "fenced", "batched"}, &v)) return false;
    w_->transport.signal_mode = static_cast<SignalMode>(v);
  }
  return true;
}

bool Reader::read_run(const YAML::Node& top) {
  YAML::Node r = top["run"];
  if (!r) return true;
  remember("run", r);
  if (!want_map(r, "run", "a map {warmup, iters, validate}")) return false;
  if (!check_keys(r, "run", {"warmup", "iters", "validate"}, "")) return false;
  int64_t warmup = w_->run.warmup, iters = w_->run.iters;
  if (!get_int(r, "run", "warmup", 0, 1000000, &warmup, false) ||
      !get_int(r, "run", "iters", 1, 10000000, &iters, false) || !get_bool(r, "run", "validate", &w_->run.validate))
    return false;
  w_->run.warmup = static_cast<int>(warmup);
  w_->run.iters = static_cast<int>(iters);
  return true;
}

bool Reader::opt_int(const YAML::Node& map, const std::string& path, const char* key, int64_t lo, int64_t hi,
                     std::optional<int>* out) {
  if (!map[key]) return true;
  int64_t v = 0;
  if (!get_int(map, path, key, lo, hi, &v, true)) return false;
  *out = static_cast<int>(v);
  return true;
}

bool Reader::opt_bool(const YAML::Node& map, const std::string& path, const char* key, std::optional<bool>* out) {
  if (!map[key]) return true;
  bool v = false;
  if (!get_bool(map, path, key, &v)) return false;
  *out = v;
  return true;
}

// Types and ranges only: whether a choice fits the op, the layout and the roles is the tuner's check
// (tuner.cpp, check_plan_spec), and whether this build runs it plan_execution's; both name the line.
bool Reader::read_plan(const YAML::Node& top) {
  YAML::Node p = top["plan"];
  if (!p) return true;
  remember("plan", p);
  if (!want_map(p, "plan",
                "a map {variant, sm_mover, copy_chunks, cluster, group_m, reduce_blocks, pieces, lag, send, gather, "
                "split_k, gemm}"))
    return false;
  if (!check_keys(p, "plan",
                  {"variant", "sm_mover", "copy_chunks", "cluster", "group_m", "reduce_blocks", "pieces", "lag", "send",
                   "gather", "split_k", "gemm"},
                  ""))
    return false;
  PlanSpec& s = w_->plan;
  static const Keys kVariants = {"copy_engine", "sm_movers",   "peer",        "overlap",
                                 "staged",      "ffn_combine", "hierarchical"};
  static const Keys kMovers = {"pull_vec", "push_vec", "pull_bulk", "push_bulk"};
  static const Keys kBy = {"copy", "sm"};
  static const Keys kGather = {"push", "sm"};
  int v = 0;
  if (p["send"]) {
    if (!get_enum(p["send"], "plan.send", kBy, &v)) return false;
    s.send = kBy[size_t(v)];
  }
  if (p["gather"]) {
    if (!get_enum(p["gather"], "plan.gather", kGather, &v)) return false;
    s.gather = kGather[size_t(v)];
  }
  if (p["variant"]) {
    if (!get_enum(p["variant"], "plan.variant", kVariants, &v)) return false;
    s.variant = kVariants[size_t(v)];
  }
  if (p["sm_mover"]) {
    if (!get_enum(p["sm_mover"], "plan.sm_mover", kMovers, &v)) return false;
    s.sm_mover = kMovers[size_t(v)];
  }
  if (!opt_int(p, "plan", "copy_chunks", 1, 1024, &s.copy_chunks) || !opt_int(p, "plan", "cluster", 1, 2, &s.cluster) ||
      !opt_int(p, "plan", "group_m", 1, 1024, &s.group_m) ||
      !opt_int(p, "plan", "reduce_blocks", 1, 4096, &s.reduce_blocks) ||
      !opt_int(p, "plan", "pieces", 1, 64, &s.pieces) || !opt_int(p, "plan", "lag", 1, 64, &s.lag) ||
      !opt_int(p, "plan", "split_k", 1, 4, &s.split_k))
    return false;
  YAML::Node g = p["gemm"];
  if (!g) return true;
  remember("plan.gemm", g);
  if (!want_map(g, "plan.gemm", "a map {split_tail, chunked_tail, dynamic_tiles, tma_store}")) return false;
  if (!check_keys(g, "plan.gemm", {"split_tail", "chunked_tail", "dynamic_tiles", "tma_store"}, "")) return false;
  return opt_bool(g, "plan.gemm", "split_tail", &s.split_tail) &&
         opt_bool(g, "plan.gemm", "chunked_tail", &s.chunked_tail) &&
         opt_bool(g, "plan.gemm", "dynamic_tiles", &s.dynamic_tiles) &&
         opt_bool(g, "plan.gemm", "tma_store", &s.tma_store);
}

bool Reader::run() {
  if (text_.size() > kMaxWorkloadBytes)
    return fail_at(0, 0, "(file)",
                   std::to_string(text_.size()) + " bytes; expected a YAML file of at most " +
                       std::to_string(kMaxWorkloadBytes) + " bytes (a workload is a few hundred)");
  if (!check_bytes() || !check_tabs()) return false;
  // One document only. (YAML::LoadAll is not used: yaml-cpp 0.7 loops forever on some inputs,
  // such as a line starting with ',', that YAML::Load handles.)
  if (!check_single_document()) return false;
  // Before YAML::Load: anchors, aliases, node count, depth and value length (workload.h).
  if (check_workload_structure(text_, file_, error_) != Status::kOk) return false;
  YAML::Node top;
  try {
    top = YAML::Load(text_);
  } catch (const YAML::Exception& e) {
    int line = e.mark.line < 0 ? 0 : e.mark.line, col = e.mark.column < 0 ? 0 : e.mark.column;
    // yaml-cpp finds an unclosed { or [ only at the end of the file: point at the bracket instead.
    if (e.msg.find("flow") != std::string::npos && e.msg.find("not found") != std::string::npos)
      unclosed_bracket(e.mark.pos < 0 ? text_.size() : static_cast<size_t>(e.mark.pos), &line, &col);
    std::string key = key_on_line(text_, line + 1);
    for (int l = line; key == "(syntax)" && l > 0; --l) key = key_on_line(text_, l);  // the key above
    return fail_at(line, col, key, "YAML syntax error (" + e.msg + ")");
  }
  if (top.IsNull()) {
    int line = 0, col = 0;
    if (!first_content(&line, &col))
      return fail_at(0, 0, "(file)", "empty; expected a YAML map with at least 'op' and 'shape'");
    return fail_at(line, col, "(top level)",
                   "no YAML value could be read here; expected a map of keys (name, op, shape, ...)");
  }
  if (!top.IsMap())
    return fail(top, "(top level)",
                std::string("expected a map of keys (name, op, shape, ...), got ") + kind_of(top) +
                    (top.IsScalar() ? " '" + quote(top.Scalar()) + "'" : ""));
  if (!check_duplicates(top, "")) return false;
  if (!check_keys(top, "",
                  {"name", "op", "dtype", "shape", "layout", "group", "roles", "transport", "run", "machine", "plan"},
                  ""))
    return false;

  if (top["name"] && !get_string(top["name"], "name", &w_->name)) return false;
  YAML::Node op = top["op"];
  if (!op) return fail(top, "op", "missing; expected one of ag_gemm, gemm_rs, gemm_ar, moe, ring_attention");
  int v = 0;
  if (!get_enum(op, "op", {"ag_gemm", "gemm_rs", "gemm_ar", "moe", "ring_attention"}, &v)) return false;
  w_->op = static_cast<Op>(v);
  if (top["dtype"]) {
    if (!get_enum(top["dtype"], "dtype", {"bf16", "fp16", "fp8"}, &v)) return false;
    w_->dtype = static_cast<DType>(v);
  }
  int sm_count = 0;
  if (!read_shape(top) || !read_layout(top) || !read_group(top) || !read_machine(top, &sm_count) ||
      !read_roles(top, sm_count) || !read_transport(top) || !read_run(top) || !read_plan(top))
    return false;
  return true;
}

std::string stem(const std::string& path) {
  size_t slash = path.find_last_of('/');
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  size_t dot = base.rfind('.');
  return dot == std::string::npos || dot == 0 ? base : base.substr(0, dot);
}

}  // namespace

Status parse_workload(const std::string& yaml_text, const std::string& filename, Workload* out, std::string* error) {
  Workload w;
  w.source = filename;
  w.name = stem(filename);
  std::string err;
  bool ok = false;
  try {
    ok = Reader(yaml_text, filename, &w, &err).run();
    if (ok && validate_layout(w, w.layout, &err) != Status::kOk) ok = false;
  } catch (const std::exception& e) {
    // yaml-cpp may throw from places the reader did not expect; never let it escape.
    err = one_line(filename + ":1:1: (file): could not be read as YAML (" + e.what() + ")");
    ok = false;
  }
  if (!ok) {
    WEFT_INFO(kConfig, "%s", err.c_str());
    if (error) *error = err;
    return Status::kInvalidArgument;
  }
  *out = std::move(w);
  return Status::kOk;
}

}  // namespace weft::runtime
