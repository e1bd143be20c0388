// Host tests of the small-shape reduction plan (kernels/small_reduce_plan.h): vector coverage,
// block counts, flag words and the partial copies by epoch parity.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/small_reduce_plan.h"

using weft::kernels::SmallReduceMode;
using weft::kernels::SmallReducePlan;

namespace {

SmallReducePlan make(SmallReduceMode mode, int ranks, int rank, int64_t elems, int max_blocks) {
  SmallReducePlan p;
  const char* why = nullptr;
  REQUIRE_MESSAGE(SmallReducePlan::make(mode, ranks, rank, elems, max_blocks, &p, &why), (why ? why : ""));
  return p;
}

// Walks the kernel's loop exactly as it does and counts the visits of every vector.
std::vector<int> visits(const SmallReducePlan& p) {
  std::vector<int> seen(static_cast<size_t>(p.vecs), 0);
  for (int64_t pass = 0; pass < p.passes(); ++pass)
    for (int u = 0; u < SmallReducePlan::kUnroll; ++u)
      for (int b = 0; b < p.blocks; ++b)
        for (int t = 0; t < SmallReducePlan::kThreads; ++t) {
          const int64_t v = p.vec_at(pass, u, b, t);
          if (v < p.vecs) ++seen[static_cast<size_t>(v)];
        }
  return seen;
}

}  // namespace

TEST_CASE("small reduce plan: every vector of the region is reduced exactly once") {
  struct Shape {
    int64_t rows_per_rank, n;
  };
  for (const Shape s : {Shape{64, 8192}, Shape{512, 8192}, Shape{1, 8}, Shape{3, 1000}, Shape{64, 7168}})
    for (int ranks : {1, 2, 4, 8})
      for (SmallReduceMode mode :
           {SmallReduceMode::kReduceScatter, SmallReduceMode::kAllReduceTwoShot, SmallReduceMode::kAllReduceOneShot})
        for (int max_blocks : {1, 7, 132}) {
          CAPTURE(s.rows_per_rank);
          CAPTURE(s.n);
          CAPTURE(ranks);
          CAPTURE(int(mode));
          CAPTURE(max_blocks);
          const int rank = ranks - 1;
          const SmallReducePlan p = make(mode, ranks, rank, s.rows_per_rank * s.n, max_blocks);
          const bool all_rows = mode == SmallReduceMode::kAllReduceOneShot;
          CHECK(p.region == (all_rows ? 0 : rank * s.rows_per_rank * s.n));
          CHECK(p.vecs * 8 == (all_rows ? ranks : 1) * s.rows_per_rank * s.n);
          CHECK(p.blocks >= 1);
          CHECK(p.blocks <= max_blocks);
          // No block without work: fewer blocks when a vector per thread covers the region.
          CHECK(int64_t(p.blocks - 1) * SmallReducePlan::kThreads < p.vecs);
          const std::vector<int> seen = visits(p);
          int64_t wrong = 0;
          for (int c : seen) wrong += c != 1;
          CHECK(wrong == 0);
          CHECK(p.pushes() == (mode == SmallReduceMode::kAllReduceTwoShot));
        }
}

TEST_CASE("small reduce plan: the decode AllReduce fills the GPU in one pass, the 2048-row ReduceScatter in a few") {
  // 256 x 8192 over 4 ranks: 64 own rows = 65536 vectors, one per thread on 128 blocks.
  const SmallReducePlan ar = make(SmallReduceMode::kAllReduceTwoShot, 4, 1, 64 * 8192, 132);
  CHECK(ar.blocks == 128);
  CHECK(ar.passes() == 1);
  const SmallReducePlan one = make(SmallReduceMode::kAllReduceOneShot, 4, 1, 64 * 8192, 132);
  CHECK(one.blocks == 132);
  CHECK(one.passes() == 2);
  const SmallReducePlan rs = make(SmallReduceMode::kReduceScatter, 4, 3, 512 * 8192, 132);
  CHECK(rs.blocks == 132);
  CHECK(rs.passes() == 4);
}

TEST_CASE("small reduce plan: flag words, gathered counts and partial copies") {
  const SmallReducePlan p = make(SmallReduceMode::kAllReduceTwoShot, 4, 2, 4096, 132);
  CHECK(SmallReducePlan::words(4) == 9);
  CHECK(p.tiles_word() == 8);
  for (int q = 0; q < 4; ++q) {
    CHECK(p.ready_word(q) == q);
    CHECK(p.gathered_word(q) == 4 + q);
  }
  CHECK(p.gathered_after(10) == 10 + uint64_t(p.blocks));
  const SmallReducePlan one = make(SmallReduceMode::kAllReduceOneShot, 4, 2, 4096, 132);
  CHECK(one.gathered_after(10) == 10);  // one-shot launches count nothing
  CHECK(SmallReducePlan::parity(1) != SmallReducePlan::parity(2));
  CHECK(SmallReducePlan::parity(1) == SmallReducePlan::parity(3));
}

TEST_CASE("small reduce plan: shapes it cannot take are refused with a reason") {
  SmallReducePlan p;
  const char* why = nullptr;
  CHECK_FALSE(SmallReducePlan::make(SmallReduceMode::kReduceScatter, 4, 0, 12, 132, &p, &why));  // not 16-byte vectors
  CHECK(why != nullptr);
  why = nullptr;
  CHECK_FALSE(SmallReducePlan::make(SmallReduceMode::kReduceScatter, 9, 0, 64, 132, &p, &why));
  CHECK(why != nullptr);
  why = nullptr;
  CHECK_FALSE(SmallReducePlan::make(SmallReduceMode::kReduceScatter, 4, 4, 64, 132, &p, &why));
  CHECK(why != nullptr);
  why = nullptr;
  CHECK_FALSE(SmallReducePlan::make(SmallReduceMode::kReduceScatter, 4, 0, 64, 0, &p, &why));
  CHECK(why != nullptr);
}
