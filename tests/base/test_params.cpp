// Environment parameters: declared once, typed, and a bad value is an error naming the variable.
#include <doctest/doctest.h>

#include <cstdlib>
#include <set>
#include <string>

#include "runtime/log.h"
#include "runtime/params.h"

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
