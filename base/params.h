// Every WEFT_* environment parameter, declared once in params.cpp's table with type, default, range and doc.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "base/status.h"

namespace weft {

enum class ParamType { kInt, kDouble, kString, kBool };

// Who sets a parameter. Only kUser parameters are the product's surface (what `weftrun
// --print-params` lists); kBench ones are experiment switches of `weftrun bench`, refused by every
// other weftrun command (the library still reads them, so GPU tests and bench work unchanged).
enum class ParamScope {
  kUser,    // a cluster user sets it: logging, timeouts, topology, GPU model, transport, heap size
  kBench,   // an experiment switch of weftrun bench: kernel variants, sweeps, benchmark inputs
  kTest,    // read only by tests (fault injection, tables for docs)
  kScript,  // read by scripts/weft and scripts/gpu, never by weftrun: declared so that it is not unknown
};

// How a string parameter's value is read against its choices.
enum class ParamForm {
  kOne,       // one of the choices (or any text where there are none)
  kList,      // a comma list, each item one of the choices
  kMaskList,  // as kList, each item optionally negated with a leading '^'
  kIntList,   // a comma list of integers in [min, max]
};

struct ParamInfo {
  const char* name;  // "WEFT_BOOTSTRAP_TIMEOUT"
  ParamType type;
  const char* default_value;  // as text; "" for an unset string
  const char* unit;           // "s", "bytes", "" ...
  const char* doc;
  ParamScope scope = ParamScope::kUser;
  double min = 0, max = 0;        // numbers and kIntList items: the accepted range (when min < max)
  const char* choices = nullptr;  // strings: accepted values as "a|b|c" (nullptr: any text)
  ParamForm form = ParamForm::kOne;
  bool ignore_case = false;  // choices match regardless of case (as their reader compares them)
};

const std::vector<ParamInfo>& all_params();
const ParamInfo* find_param(const std::string& name);

// Read a parameter from the environment, falling back to its default. A value that does not parse
// as the declared type, lies outside the declared range or is not one of the declared choices (or a
// name missing from the table) is an error that names the variable; nothing is silently ignored.
// Every scope is readable here: which command may set which parameter is weftrun's rule, not the
// library's.
Status get_param(const char* name, int64_t* out);
Status get_param(const char* name, double* out);
Status get_param(const char* name, bool* out);
Status get_param(const char* name, std::string* out);

// Whether `value` is acceptable for p (type, range, choices); if not, *expected says what is
// ("an integer from 1 to 8", "one of auto, h100, h200"). Logs nothing: the caller decides.
bool param_value_ok(const ParamInfo& p, const std::string& value, std::string* expected);

// For code paths that cannot propagate a Status: the default when the value is bad (logged once).
int64_t param_int_or_default(const char* name);
double param_double_or_default(const char* name);
bool param_bool_or_default(const char* name);

// The table `weftrun --print-params` prints: the kUser parameters, or every one (marked by scope).
void print_params(FILE* out, bool all = false);
const char* to_string(ParamType t);
const char* to_string(ParamScope s);

}  // namespace weft
