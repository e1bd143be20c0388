// Every WEFT_* environment parameter, declared once in params.cpp's table with type, default and doc.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "runtime/status.h"

namespace weft {

enum class ParamType { kInt, kDouble, kString, kBool };

struct ParamInfo {
  const char* name;  // "WEFT_BOOTSTRAP_TIMEOUT"
  ParamType type;
  const char* default_value;  // as text; "" for an unset string
  const char* unit;           // "s", "bytes", "" ...
  const char* doc;
};

const std::vector<ParamInfo>& all_params();
const ParamInfo* find_param(const std::string& name);

// Read a parameter from the environment, falling back to its default. A value that does not parse
// as the declared type (or a name missing from the table) is an error that names the variable;
// nothing is silently ignored.
Status get_param(const char* name, int64_t* out);
Status get_param(const char* name, double* out);
Status get_param(const char* name, bool* out);
Status get_param(const char* name, std::string* out);

// For code paths that cannot propagate a Status: the default when the value is bad (logged once).
int64_t param_int_or_default(const char* name);
double param_double_or_default(const char* name);
bool param_bool_or_default(const char* name);

// The table `weftrun --print-params` prints.
void print_params(FILE* out);
const char* to_string(ParamType t);

}  // namespace weft
