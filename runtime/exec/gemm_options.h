// The Plan's GEMM launch choices (execution.gemm) as the kernels take them.
#pragma once

#include "kernels/gemm_types.h"
#include "runtime/plan.h"

namespace weft::runtime {

inline kernels::GemmOptions gemm_options(const GemmChoices& c) {
  kernels::GemmOptions o;
  o.split_tail = c.split_tail;
  o.chunked_tail = c.chunked_tail;
  o.dynamic_tiles = c.dynamic_tiles;
  o.tma_store = c.tma_store;
  return o;
}

}  // namespace weft::runtime
