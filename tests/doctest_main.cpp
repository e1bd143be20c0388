// doctest's main for every weft test executable: exits 77 (CTest: skipped) where a test called
// skip_executable() and nothing failed (tests/skip_report.h).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <mutex>
#include <set>
#include <string>

#include "tests/skip_report.h"

namespace {
std::mutex g_mu;
std::set<std::string> g_skipped;
}  // namespace

namespace weft::testing {
void skip_executable(const std::string& why) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_skipped.insert(why);
}
}  // namespace weft::testing

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int rc = context.run();
  if (context.shouldExit() || rc != 0) return rc;
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_skipped.empty()) return 0;
  for (const std::string& why : g_skipped) printf("SKIPPED: %s\n", why.c_str());
  return 77;
}
