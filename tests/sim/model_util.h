// Small helpers the simulator's models share: numbers in messages and a seeded generator.
#pragma once

#include <cstdint>
#include <string>

namespace weft::sim {

inline std::string num(int64_t v) { return std::to_string(v); }

// splitmix64: the models' routings and orders, the same for a seed on every machine.
inline uint64_t next_random(uint64_t* s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace weft::sim
