// Host tests of the fused ops' environment knobs that need no GPU (runtime/ops/op_harness.h).
#include <doctest/doctest.h>

#include <cstdlib>

#include "kernels/gemm.h"
#include "runtime/ops/op_harness.h"

using weft::Status;
using weft::runtime::ops::gemm_group;

TEST_CASE("WEFT_GEMM_GROUP: unset or 0 keeps the kernel's default, a height is taken, bad values are refused") {
  const int32_t kernel_default = weft::kernels::GemmArgs{}.group_m;
  int32_t g = kernel_default;
  unsetenv("WEFT_GEMM_GROUP");
  CHECK(gemm_group(&g) == Status::kOk);
  CHECK(g == kernel_default);
  setenv("WEFT_GEMM_GROUP", "0", 1);
  CHECK(gemm_group(&g) == Status::kOk);
  CHECK(g == kernel_default);
  setenv("WEFT_GEMM_GROUP", "12", 1);
  CHECK(gemm_group(&g) == Status::kOk);
  CHECK(g == 12);
  for (const char* bad : {"-1", "1025", "8x", "many"}) {
    CAPTURE(bad);
    int32_t kept = 5;
    setenv("WEFT_GEMM_GROUP", bad, 1);
    CHECK(gemm_group(&kept) == Status::kInvalidArgument);
    CHECK(kept == 5);
  }
  unsetenv("WEFT_GEMM_GROUP");
}
