// dlopen of weftrun bench's baseline libraries (bench_libs.h).
#include "runtime/ops/bench_libs.h"

#include <dlfcn.h>

#include <map>
#include <mutex>
#include <string>

#include "base/log.h"

namespace weft::runtime::ops {
namespace {

std::mutex g_mu;
std::map<std::string, void*> g_handles;  // soname -> handle (nullptr: tried, failed)

}  // namespace

void* bench_library(const char* soname, const char* what) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_handles.find(soname);
  if (it != g_handles.end()) return it->second;
  void* h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* why = dlerror();
    WEFT_WARN(kBench, "weftrun bench needs %s (%s) for its baselines and validation: %s", what, soname,
              why ? why : "not found");
  }
  g_handles[soname] = h;
  return h;
}

void* bench_symbol(void* library, const char* name, const char* what) {
  if (!library) return nullptr;
  void* f = dlsym(library, name);
  if (!f) WEFT_WARN(kBench, "%s has no %s: an older or a different library than weft was built against", what, name);
  return f;
}

}  // namespace weft::runtime::ops
