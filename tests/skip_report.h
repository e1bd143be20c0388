// A test executable that could not run what it is for: skip_executable(why) makes it exit 77 (CTest:
// skipped, the reason printed last) once every case that did run has passed; a failure still fails.
#pragma once

#include <string>

namespace weft::testing {

void skip_executable(const std::string& why);

}  // namespace weft::testing
