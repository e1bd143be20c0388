// What every fuzz target shares: quiet logging, and an invariant check that crashes (libFuzzer reports it).
#pragma once

#include <cstdio>
#include <cstdlib>

// A broken invariant is a finding: print it and abort, so libFuzzer saves the input.
#define FUZZ_ASSERT(cond)                                                                 \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      fprintf(stderr, "fuzz invariant failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      abort();                                                                            \
    }                                                                                     \
  } while (0)

// Rejections are logged at WARN; thousands per second would only slow the search.
inline void fuzz_quiet_logs() { setenv("WEFT_DEBUG", "NONE", 1); }
