// The tuning cache file: JSON {"version": 1, "entries": [...]}, bounded, replaced atomically.
#include "runtime/tune_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <nlohmann/json.hpp>

namespace weft::runtime {
namespace {

constexpr size_t kMaxCacheBytes = 4u << 20;
constexpr size_t kMaxEntries = 4096;

std::string fnv_hex(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  char buf[20];
  snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string shape_text(const Plan& p) {
  char buf[160];
  if (is_gemm_op(p.op))
    snprintf(buf, sizeof buf, "m=%lld n=%lld k=%lld", (long long)p.gemm.m, (long long)p.gemm.n, (long long)p.gemm.k);
  else if (p.op == Op::kMoe)
    snprintf(buf, sizeof buf, "tokens=%lld hidden=%lld ffn=%lld experts=%lld topk=%lld", (long long)p.moe.tokens,
             (long long)p.moe.hidden, (long long)p.moe.ffn, (long long)p.moe.experts, (long long)p.moe.topk);
  else
    snprintf(buf, sizeof buf, "seq=%lld heads=%lld head_dim=%lld causal=%d", (long long)p.attention.seq,
             (long long)p.attention.heads, (long long)p.attention.head_dim, p.attention.causal ? 1 : 0);
  return buf;
}

Status read_bounded(const std::string& path, std::string* text, std::string* why) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    if (errno == ENOENT) return Status::kNotFound;
    *why = path + ": " + strerror(errno);
    return Status::kSystemError;
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || size_t(st.st_size) > kMaxCacheBytes) {
    *why = path + ": not a regular file of at most 4 MiB";
    close(fd);
    return Status::kInvalidArgument;
  }
  text->resize(size_t(st.st_size));
  size_t got = 0;
  while (got < text->size()) {
    ssize_t n = read(fd, &(*text)[got], text->size() - got);
    if (n <= 0) break;
    got += size_t(n);
  }
  close(fd);
  text->resize(got);
  return Status::kOk;
}

}  // namespace

std::string topology_fingerprint(const topology::Topology& topo) {
  std::string text = "gpus";
  for (const auto& g : topo.gpus) text += " " + g.pci_id + "@" + g.pci_bus_id + "/numa" + std::to_string(g.numa_node);
  text += " nics";
  for (const auto& n : topo.nics) text += " " + n.name;
  text += " numa " + std::to_string(topo.numa_nodes.size());
  return fnv_hex(text);
}

std::string tune_key(const TuneMachine& m, const Plan& p) {
  return "gpu=" + m.gpu + "; cuda=" + m.cuda + "; kernels=" + m.kernels + "; topology=" + m.topology +
         "; op=" + to_string(p.op) + "; dtype=" + to_string(p.dtype) + "; layout=" + std::to_string(p.nodes) + "x" +
         std::to_string(p.gpus_per_node) + "; " + shape_text(p);
}

std::string tune_cache_path() {
  if (const char* v = getenv("WEFT_TUNE_CACHE"); v && *v) return v;
  if (const char* x = getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/weft/tune.json";
  if (const char* h = getenv("HOME"); h && *h) return std::string(h) + "/.cache/weft/tune.json";
  return "/tmp/weft-tune-" + std::to_string(getuid()) + ".json";
}

Status load_tune_cache(const std::string& path, std::vector<TuneEntry>* entries, std::string* warning) {
  entries->clear();
  std::string text, why;
  const Status s = read_bounded(path, &text, &why);
  if (s == Status::kNotFound) return Status::kOk;
  if (s != Status::kOk) {
    *warning = "tuning cache ignored: " + why;
    return Status::kOk;
  }
  try {
    const auto j = nlohmann::json::parse(text);
    if (j.at("version").get<int>() != 1) throw std::invalid_argument("version is not 1");
    const auto& list = j.at("entries");
    if (!list.is_array() || list.size() > kMaxEntries) throw std::invalid_argument("entries: at most 4096");
    for (const auto& e : list) {
      TuneEntry t;
      t.key = e.at("key").get<std::string>();
      t.plan_json = e.at("plan").dump();
      t.measured_ms = e.at("measured_ms").get<double>();
      t.model_ms = e.at("model_ms").get<double>();
      t.candidates = e.at("candidates").get<int>();
      t.tuned_at = e.at("tuned_at").get<std::string>();
      entries->push_back(std::move(t));
    }
  } catch (const std::exception& ex) {
    entries->clear();
    *warning = "tuning cache ignored: " + path + ": " + ex.what();
  }
  return Status::kOk;
}

Status store_tune_entry(const std::string& path, const TuneEntry& entry, std::string* error) {
  const std::string dir = path.substr(0, path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/'));
  if (!dir.empty()) {
    // Create the folder chain (mode 0700 for ones we make).
    for (size_t at = 1; at <= dir.size(); ++at)
      if (at == dir.size() || dir[at] == '/') mkdir(dir.substr(0, at).c_str(), 0700);
  }
  const std::string lock_path = path + ".lock";
  int lock = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (lock < 0 || flock(lock, LOCK_EX) != 0) {
    *error = lock_path + ": " + strerror(errno);
    if (lock >= 0) close(lock);
    return Status::kSystemError;
  }
  std::vector<TuneEntry> entries;
  std::string warning;
  load_tune_cache(path, &entries, &warning);  // a corrupt cache is replaced
  bool replaced = false;
  for (auto& e : entries)
    if (e.key == entry.key) e = entry, replaced = true;
  if (!replaced) entries.push_back(entry);
  nlohmann::json list = nlohmann::json::array();
  for (const auto& e : entries)
    list.push_back({{"key", e.key},
                    {"plan", nlohmann::json::parse(e.plan_json)},
                    {"measured_ms", e.measured_ms},
                    {"model_ms", e.model_ms},
                    {"candidates", e.candidates},
                    {"tuned_at", e.tuned_at}});
  const std::string text = nlohmann::json{{"version", 1}, {"entries", list}}.dump(1) + "\n";
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  Status st = Status::kOk;
  FILE* f = fopen(tmp.c_str(), "w");
  if (!f || fwrite(text.data(), 1, text.size(), f) != text.size() || fclose(f) != 0 ||
      rename(tmp.c_str(), path.c_str()) != 0) {
    *error = tmp + ": " + strerror(errno);
    unlink(tmp.c_str());
    st = Status::kSystemError;
  }
  flock(lock, LOCK_UN);
  close(lock);
  return st;
}

Status cached_plan(const std::vector<TuneEntry>& entries, const TuneMachine& machine, const Plan& model, Plan* out,
                   const TuneEntry** used, std::string* warning) {
  const std::string key = tune_key(machine, model);
  for (const auto& e : entries) {
    if (e.key != key) continue;
    Plan p;
    std::string why;
    if (parse_executed_json(e.plan_json, &p, &why) != Status::kOk) {
      *warning = "tuning cache entry ignored: " + why;
      return Status::kInvalidArgument;
    }
    if (p.op != model.op || p.dtype != model.dtype || p.nodes != model.nodes ||
        p.gpus_per_node != model.gpus_per_node || shape_text(p) != shape_text(model) || !p.exec.executable) {
      *warning = "tuning cache entry ignored: its plan is for another problem or cannot run";
      return Status::kInvalidArgument;
    }
    *used = &e;
    *out = std::move(p);
    return Status::kOk;
  }
  return Status::kNotFound;
}

}  // namespace weft::runtime
