// Logging by level and subsystem, switched by WEFT_DEBUG and WEFT_DEBUG_SUBSYS.
#pragma once

#include <cstdint>

namespace weft::log {

enum class Level : int { kNone = 0, kWarn = 1, kInfo = 2, kTrace = 3 };

// Subsystem bits; WEFT_DEBUG_SUBSYS takes a comma list of these names (or ALL, or ^NAME to drop one).
enum Subsys : uint32_t {
  kInit = 1u << 0,       // INIT
  kConfig = 1u << 1,     // CONFIG
  kTopo = 1u << 2,       // TOPO
  kTune = 1u << 3,       // TUNE
  kBoot = 1u << 4,       // BOOT
  kLaunch = 1u << 5,     // LAUNCH
  kTransport = 1u << 6,  // TRANSPORT
  kProxy = 1u << 7,      // PROXY
  kNet = 1u << 8,        // NET
  kKernel = 1u << 9,     // KERNEL
  kBench = 1u << 10,     // BENCH
  kAll = 0xffffffffu,
};

bool enabled(Level level, uint32_t subsys);
void emit(Level level, uint32_t subsys, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));

// Identity printed in every line once known ("rank 3"); before that the pid alone.
void set_rank(int rank);
// Re-reads WEFT_DEBUG / WEFT_DEBUG_SUBSYS (tests change them).
void reload_from_env();
const char* subsys_name(uint32_t bit);

}  // namespace weft::log

#define WEFT_LOG_AT(level, subsys, ...)                                                                         \
  do {                                                                                                          \
    if (::weft::log::enabled(level, subsys)) ::weft::log::emit(level, subsys, __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)
#define WEFT_WARN(subsys, ...) WEFT_LOG_AT(::weft::log::Level::kWarn, ::weft::log::subsys, __VA_ARGS__)
#define WEFT_INFO(subsys, ...) WEFT_LOG_AT(::weft::log::Level::kInfo, ::weft::log::subsys, __VA_ARGS__)
#define WEFT_TRACE(subsys, ...) WEFT_LOG_AT(::weft::log::Level::kTrace, ::weft::log::subsys, __VA_ARGS__)
