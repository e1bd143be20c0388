// Logging implementation: one line per message to stderr, prefixed with host, pid and rank.
#include "base/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "base/status.h"

namespace weft {

const char* to_string(Status s) {
  switch (s) {
    case Status::kOk:
      return "ok";
    case Status::kInvalidArgument:
      return "invalid argument";
    case Status::kNotFound:
      return "not found";
    case Status::kSystemError:
      return "system error";
    case Status::kTimeout:
      return "timeout";
    case Status::kPeerFailed:
      return "peer failed";
    case Status::kProtocolError:
      return "protocol error";
    case Status::kUnsupported:
      return "unsupported";
    case Status::kCudaError:
      return "CUDA error";
    case Status::kInternal:
      return "internal error";
  }
  return "unknown status";
}

namespace log {
namespace {

struct SubsysName {
  uint32_t bit;
  const char* name;
};
constexpr SubsysName kNames[] = {
    {kInit, "INIT"}, {kConfig, "CONFIG"}, {kTopo, "TOPO"},           {kTune, "TUNE"},
    {kBoot, "BOOT"}, {kLaunch, "LAUNCH"}, {kTransport, "TRANSPORT"}, {kProxy, "PROXY"},
    {kNet, "NET"},   {kKernel, "KERNEL"}, {kBench, "BENCH"},
};

std::atomic<int> g_level{-1};
std::atomic<uint32_t> g_mask{kAll};
std::atomic<int> g_rank{-1};
std::mutex g_mutex;

Level parse_level(const char* s) {
  if (!s || !*s) return Level::kWarn;
  if (!strcasecmp(s, "NONE")) return Level::kNone;
  if (!strcasecmp(s, "WARN")) return Level::kWarn;
  if (!strcasecmp(s, "INFO")) return Level::kInfo;
  if (!strcasecmp(s, "TRACE")) return Level::kTrace;
  fprintf(stderr, "weft: WEFT_DEBUG='%s' is not one of NONE, WARN, INFO, TRACE; using WARN\n", s);
  return Level::kWarn;
}

uint32_t parse_mask(const char* s) {
  if (!s || !*s) return kAll;
  std::string list(s);
  bool negate_all = list[0] == '^';
  uint32_t mask = negate_all ? uint32_t(kAll) : 0u;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t comma = list.find(',', pos);
    std::string tok = list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? list.size() + 1 : comma + 1;
    bool neg = !tok.empty() && tok[0] == '^';
    if (neg) tok.erase(0, 1);
    if (tok.empty()) continue;
    uint32_t bit = 0;
    if (!strcasecmp(tok.c_str(), "ALL")) bit = kAll;
    for (const auto& n : kNames)
      if (!strcasecmp(tok.c_str(), n.name)) bit = n.bit;
    if (!bit) {
      fprintf(stderr, "weft: WEFT_DEBUG_SUBSYS: unknown subsystem '%s' (ignored)\n", tok.c_str());
      continue;
    }
    mask = neg ? (mask & ~bit) : (mask | bit);
  }
  return mask;
}

void ensure_loaded() {
  if (g_level.load(std::memory_order_relaxed) < 0) reload_from_env();
}

}  // namespace

void reload_from_env() {
  g_mask.store(parse_mask(getenv("WEFT_DEBUG_SUBSYS")));
  g_level.store(static_cast<int>(parse_level(getenv("WEFT_DEBUG"))));
}

bool enabled(Level level, uint32_t subsys) {
  ensure_loaded();
  return static_cast<int>(level) <= g_level.load(std::memory_order_relaxed) &&
         (subsys & g_mask.load(std::memory_order_relaxed));
}

void set_rank(int rank) { g_rank.store(rank); }

const char* subsys_name(uint32_t bit) {
  for (const auto& n : kNames)
    if (n.bit == bit) return n.name;
  return "?";
}

void emit(Level level, uint32_t subsys, const char* file, int line, const char* fmt, ...) {
  static const char* kLevel[] = {"NONE", "WARN", "INFO", "TRACE"};
  char host[64] = "?";
  gethostname(host, sizeof host);
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  const char* base = strrchr(file, '/');
  base = base ? base + 1 : file;
  std::lock_guard<std::mutex> lock(g_mutex);
  int rank = g_rank.load();
  if (rank >= 0)
    fprintf(stderr, "weft %s:%d rank %d [%s %s] %s", host, getpid(), rank, kLevel[static_cast<int>(level)],
            subsys_name(subsys), msg);
  else
    fprintf(stderr, "weft %s:%d [%s %s] %s", host, getpid(), kLevel[static_cast<int>(level)], subsys_name(subsys), msg);
  if (level >= Level::kTrace) fprintf(stderr, " (%s:%d)", base, line);
  fputc('\n', stderr);
}

void breadcrumb(const char* file, int line, Status s) {
  if (enabled(Level::kInfo, kAll)) emit(Level::kInfo, kInit, file, line, "-> %s:%d (%s)", file, line, to_string(s));
}

}  // namespace log
}  // namespace weft
