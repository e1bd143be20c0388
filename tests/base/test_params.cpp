// Environment parameters: declared once, typed, ranged, scoped, and a bad value is an error naming the variable.
#include <doctest/doctest.h>

#include <cstdlib>
#include <set>
#include <string>

#include "base/log.h"
#include "base/params.h"

using weft::Status;

TEST_CASE("every parameter is declared once, named WEFT_*, with a doc and a parseable default") {
  std::set<std::string> names;
  for (const auto& p : weft::all_params()) {
    CHECK(std::string(p.name).rfind("WEFT_", 0) == 0);
    CHECK(names.insert(p.name).second);
    CHECK(std::string(p.doc).size() > 10);
    unsetenv(p.name);
    switch (p.type) {
      case weft::ParamType::kInt: {
        int64_t v;
        CHECK(weft::get_param(p.name, &v) == Status::kOk);
        break;
      }
      case weft::ParamType::kDouble: {
        double v;
        CHECK(weft::get_param(p.name, &v) == Status::kOk);
        break;
      }
      case weft::ParamType::kBool: {
        bool v;
        CHECK(weft::get_param(p.name, &v) == Status::kOk);
        break;
      }
      case weft::ParamType::kString: {
        std::string v;
        CHECK(weft::get_param(p.name, &v) == Status::kOk);
        break;
      }
    }
  }
}

TEST_CASE("values from the environment are parsed; bad ones are rejected, not ignored") {
  double t = 0;
  setenv("WEFT_BOOTSTRAP_TIMEOUT", "2.5", 1);
  CHECK(weft::get_param("WEFT_BOOTSTRAP_TIMEOUT", &t) == Status::kOk);
  CHECK(t == doctest::Approx(2.5));
  setenv("WEFT_BOOTSTRAP_TIMEOUT", "soon", 1);
  CHECK(weft::get_param("WEFT_BOOTSTRAP_TIMEOUT", &t) == Status::kInvalidArgument);
  CHECK(weft::param_double_or_default("WEFT_BOOTSTRAP_TIMEOUT") == doctest::Approx(60.0));
  unsetenv("WEFT_BOOTSTRAP_TIMEOUT");

  int64_t depth = 0;
  setenv("WEFT_FIFO_DEPTH", "12x", 1);
  CHECK(weft::get_param("WEFT_FIFO_DEPTH", &depth) == Status::kInvalidArgument);
  setenv("WEFT_FIFO_DEPTH", "0x100", 1);
  CHECK(weft::get_param("WEFT_FIFO_DEPTH", &depth) == Status::kOk);
  CHECK(depth == 256);
  unsetenv("WEFT_FIFO_DEPTH");

  // The GEMM's on/off switches: a value is taken, a bad one falls back to the table's default.
  setenv("WEFT_GEMM_DYNAMIC", "0", 1);
  CHECK_FALSE(weft::param_bool_or_default("WEFT_GEMM_DYNAMIC"));
  setenv("WEFT_GEMM_DYNAMIC", "maybe", 1);
  CHECK(weft::param_bool_or_default("WEFT_GEMM_DYNAMIC"));
  setenv("WEFT_GEMM_SPLIT_TAIL", "false", 1);
  CHECK_FALSE(weft::param_bool_or_default("WEFT_GEMM_SPLIT_TAIL"));
  unsetenv("WEFT_GEMM_DYNAMIC");
  unsetenv("WEFT_GEMM_SPLIT_TAIL");
  CHECK(weft::param_bool_or_default("WEFT_GEMM_DYNAMIC"));

  bool det = true;
  setenv("WEFT_DETERMINISTIC", "maybe", 1);
  CHECK(weft::get_param("WEFT_DETERMINISTIC", &det) == Status::kInvalidArgument);
  setenv("WEFT_DETERMINISTIC", "true", 1);
  CHECK(weft::get_param("WEFT_DETERMINISTIC", &det) == Status::kOk);
  CHECK(det);
  unsetenv("WEFT_DETERMINISTIC");
}

TEST_CASE("reading an undeclared parameter or with the wrong type is an internal error") {
  int64_t v = 0;
  CHECK(weft::get_param("WEFT_NO_SUCH_THING", &v) == Status::kInternal);
  CHECK(weft::get_param("WEFT_BOOTSTRAP_TIMEOUT", &v) == Status::kInternal);  // declared as float
}

TEST_CASE("log level and subsystem mask follow the environment") {
  setenv("WEFT_DEBUG", "INFO", 1);
  setenv("WEFT_DEBUG_SUBSYS", "BOOT,PROXY", 1);
  weft::log::reload_from_env();
  CHECK(weft::log::enabled(weft::log::Level::kInfo, weft::log::kBoot));
  CHECK(weft::log::enabled(weft::log::Level::kWarn, weft::log::kProxy));
  CHECK_FALSE(weft::log::enabled(weft::log::Level::kInfo, weft::log::kTopo));
  CHECK_FALSE(weft::log::enabled(weft::log::Level::kTrace, weft::log::kBoot));
  setenv("WEFT_DEBUG_SUBSYS", "ALL,^TOPO", 1);
  weft::log::reload_from_env();
  CHECK(weft::log::enabled(weft::log::Level::kInfo, weft::log::kConfig));
  CHECK_FALSE(weft::log::enabled(weft::log::Level::kInfo, weft::log::kTopo));
  unsetenv("WEFT_DEBUG");
  unsetenv("WEFT_DEBUG_SUBSYS");
  weft::log::reload_from_env();
  CHECK(weft::log::enabled(weft::log::Level::kWarn, weft::log::kTopo));
  CHECK_FALSE(weft::log::enabled(weft::log::Level::kInfo, weft::log::kTopo));
}

namespace {

bool ok(const char* name, const char* value) {
  const weft::ParamInfo* p = weft::find_param(name);
  REQUIRE(p != nullptr);
  std::string expected;
  return weft::param_value_ok(*p, value, &expected);
}

std::string expected_for(const char* name, const char* value) {
  std::string expected;
  weft::param_value_ok(*weft::find_param(name), value, &expected);
  return expected;
}

}  // namespace

TEST_CASE("every default passes its own rule; every number has a range, every scope is set deliberately") {
  for (const auto& p : weft::all_params()) {
    INFO(p.name);
    std::string expected;
    CHECK(weft::param_value_ok(p, p.default_value, &expected));
    if (p.type == weft::ParamType::kInt || p.type == weft::ParamType::kDouble) CHECK(p.min < p.max);
  }
  // The product surface: what a cluster user sets. Everything else is bench, test or script.
  const std::set<std::string> user = {"WEFT_DEBUG",          "WEFT_DEBUG_SUBSYS",      "WEFT_TOPO_FILE",
                                      "WEFT_GPU_ARCH",       "WEFT_BOOTSTRAP_TIMEOUT", "WEFT_LAUNCH_KILL_GRACE",
                                      "WEFT_DEVICE_TIMEOUT", "WEFT_PROXY_TIMEOUT",     "WEFT_HEAP_BYTES",
                                      "WEFT_FIFO_DEPTH",     "WEFT_NET_BACKEND",       "WEFT_SIGNAL_MODE",
                                      "WEFT_NET_CHANNELS",   "WEFT_SOCKET_IFNAME",     "WEFT_DETERMINISTIC",
                                      "WEFT_OFI_PROVIDER",   "WEFT_TUNE_CACHE",        "WEFT_IB_TC",
                                      "WEFT_IB_GID_INDEX",   "WEFT_LIVENESS",          "WEFT_LIVENESS_TIMEOUT",
                                      "WEFT_EMULATE_NETNS"};
  for (const auto& p : weft::all_params()) {
    INFO(p.name);
    CHECK((p.scope == weft::ParamScope::kUser) == (user.count(p.name) == 1));
    const std::string n = p.name;
    if (n.rfind("WEFT_AG_", 0) == 0 || n.rfind("WEFT_GEMM_", 0) == 0) CHECK(p.scope == weft::ParamScope::kBench);
  }
  CHECK(weft::find_param("WEFT_OPS_INPUT")->scope == weft::ParamScope::kBench);
  CHECK(weft::find_param("WEFT_REPORT")->scope == weft::ParamScope::kBench);
  CHECK(weft::find_param("WEFT_TEST_FAULT")->scope == weft::ParamScope::kTest);
  CHECK(weft::find_param("WEFT_BUILD_DIR")->scope == weft::ParamScope::kScript);
}

TEST_CASE("declared ranges and choices are enforced, by the check and by get_param") {
  CHECK(ok("WEFT_NET_CHANNELS", "8"));
  CHECK_FALSE(ok("WEFT_NET_CHANNELS", "99"));
  CHECK_FALSE(ok("WEFT_NET_CHANNELS", "0"));
  CHECK(expected_for("WEFT_NET_CHANNELS", "99") == "an integer from 1 to 8");
  CHECK_FALSE(ok("WEFT_BOOTSTRAP_TIMEOUT", "0"));
  CHECK_FALSE(ok("WEFT_BOOTSTRAP_TIMEOUT", "nan"));
  CHECK(expected_for("WEFT_BOOTSTRAP_TIMEOUT", "0") == "a number from 0.1 to 86400");
  CHECK(ok("WEFT_GPU_ARCH", "H100"));  // its reader compares without case
  CHECK_FALSE(ok("WEFT_GPU_ARCH", "a100"));
  CHECK(expected_for("WEFT_GPU_ARCH", "a100") == "one of auto, h100, h200");
  CHECK_FALSE(ok("WEFT_SIGNAL_MODE", "Batched"));  // its reader compares exactly
  CHECK(ok("WEFT_SIGNAL_MODE", ""));               // empty is unset
  CHECK(ok("WEFT_NET_BACKEND", "socket"));
  CHECK(ok("WEFT_NET_BACKEND", "ofi"));
  CHECK_FALSE(ok("WEFT_NET_BACKEND", "verbs"));
  CHECK(ok("WEFT_DEBUG", "info"));
  CHECK_FALSE(ok("WEFT_DEBUG", "verbose"));
  CHECK(ok("WEFT_DEBUG_SUBSYS", "BOOT,^topo"));
  CHECK_FALSE(ok("WEFT_DEBUG_SUBSYS", "BOOT,TOPOLOGY"));
  CHECK(ok("WEFT_AG_MOVER", "copy_engine,pull_vec"));
  CHECK_FALSE(ok("WEFT_AG_MOVER", "sm,warp"));
  CHECK_FALSE(ok("WEFT_AG_MOVER", "^sm"));  // negation is only for subsystem masks
  CHECK(ok("WEFT_AG_INTRA", "4,8"));
  CHECK_FALSE(ok("WEFT_AG_INTRA", "4,0"));
  CHECK_FALSE(ok("WEFT_AG_INTRA", "4,x"));
  CHECK(ok("WEFT_TOPO_FILE", "/any/path.xml"));

  // get_param applies the same rule, naming the variable; the *_or_default readers fall back.
  int64_t ch = 0;
  setenv("WEFT_NET_CHANNELS", "99", 1);
  CHECK(weft::get_param("WEFT_NET_CHANNELS", &ch) == Status::kInvalidArgument);
  CHECK(weft::param_int_or_default("WEFT_NET_CHANNELS") == 4);
  setenv("WEFT_NET_CHANNELS", "2", 1);
  CHECK(weft::get_param("WEFT_NET_CHANNELS", &ch) == Status::kOk);
  CHECK(ch == 2);
  unsetenv("WEFT_NET_CHANNELS");
  std::string arch;
  setenv("WEFT_GPU_ARCH", "a100", 1);
  CHECK(weft::get_param("WEFT_GPU_ARCH", &arch) == Status::kInvalidArgument);
  unsetenv("WEFT_GPU_ARCH");
  // Every scope stays readable by the library: bench and the GPU tests read the switches.
  setenv("WEFT_AG_MOVER", "sm", 1);
  CHECK(weft::get_param("WEFT_AG_MOVER", &arch) == Status::kOk);
  CHECK(arch == "sm");
  unsetenv("WEFT_AG_MOVER");
}

TEST_CASE("--print-params lists the user parameters; all lists every one with its scope") {
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  setenv("WEFT_NET_CHANNELS", "99", 1);
  weft::print_params(f, false);
  fclose(f);
  std::string user(buf, len);
  free(buf);
  CHECK(user.find("WEFT_BOOTSTRAP_TIMEOUT") != std::string::npos);
  CHECK(user.find("WEFT_AG_MOVER") == std::string::npos);
  CHECK(user.find("WEFT_TEST_FAULT") == std::string::npos);
  CHECK(user.find("(1 to 8) [set: 99; refused: expected an integer from 1 to 8]") != std::string::npos);
  unsetenv("WEFT_NET_CHANNELS");

  f = open_memstream(&buf, &len);
  weft::print_params(f, true);
  fclose(f);
  std::string all(buf, len);
  free(buf);
  for (const auto& p : weft::all_params()) CHECK(all.find(p.name) != std::string::npos);
  CHECK(all.find("WEFT_AG_MOVER                bench ") != std::string::npos);
  CHECK(all.find("WEFT_DEBUG                   user ") != std::string::npos);
}
