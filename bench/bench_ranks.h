// Across the ranks of a benchmark job: the largest of every rank's figure (a step ends when its
// slowest rank does). Exits the benchmark when the exchange fails.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bootstrap/bootstrap.h"

namespace weft::bench {

inline double allgather_max(bootstrap::Bootstrap& boot, const std::string& key, double v) {
  bootstrap::Blob mine(8);
  std::memcpy(mine.data(), &v, 8);
  std::vector<bootstrap::Blob> all;
  if (boot.allgather(key, mine, &all) != Status::kOk) std::exit(1);
  double m = 0;
  for (const auto& b : all) {
    double x = 0;
    if (b.size() == 8) std::memcpy(&x, b.data(), 8);
    m = std::max(m, x);
  }
  return m;
}

}  // namespace weft::bench
