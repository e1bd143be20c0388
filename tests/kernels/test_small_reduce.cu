// GPU test of the small-shape reduction kernel (launch_small_reduce) with several ranks simulated by
// concurrent launches on one GPU that share their flag words: ReduceScatter, two-shot and one-shot
// AllReduce sum every rank's partial in rank order (bit-exact against the host), write every element
// they own and nothing else, alternate the partial copies by epoch, count their flag rounds, and a
// missing peer ends in a bounded wait that names it. Exits 77 (skipped) where no Hopper GPU is visible.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/reduce_slots.h"
#include "tests/kernels/gemm_testing.cuh"

using namespace weft::kernels;
using namespace weft::kernels::testing;
using weft::RoleCounts;
using weft::Status;

namespace {

// Rank q's partial carries its rank in the integer part (q + 1) and noise below: a sum that takes
// a rank twice or misses one is off by whole units.
__global__ void rank_payload(__nv_bfloat16* p, int64_t n, uint64_t seed, int rank) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float u = float(hash32(seed * 0x9E3779B97F4A7C15ull + uint64_t(i)) >> 8) * (1.0f / 8388608.0f);
    p[i] = __float2bfloat16_rn(float(rank + 1) * ((i & 1) ? 1.0f : -1.0f) + u * 0.5f);
  }
}

struct Ranks {
  int ranks = 0;
  int64_t elems = 0;  // one rank's row block
  DevBuf<__nv_bfloat16> partials, c, out;
  DevBuf<uint64_t> words;
  std::vector<FrameHost> frames;
  std::vector<FrameParams> fps;
  std::vector<cudaStream_t> streams;
  Ranks(int w, int64_t e, double timeout_s)
      : ranks(w),
        elems(e),
        partials(int64_t(w) * 2 * w * e),
        c(int64_t(w) * w * e),
        out(int64_t(w) * e),
        words(int64_t(w) * SmallReducePlan::words(w)),
        frames(size_t(w)),
        fps(size_t(w)),
        streams(size_t(w)) {
    WEFT_CUDA_OK(cudaMemset(words.p, 0, size_t(w) * SmallReducePlan::words(w) * 8));
    WEFT_CUDA_OK(cudaDeviceSynchronize());  // the legacy stream's memset before the non-blocking launches
    RoleCounts roles;
    roles.intra_comm = 1;
    for (int r = 0; r < w; ++r) {
      REQUIRE(frames[size_t(r)].create(r) == Status::kOk);
      frames[size_t(r)].set_timeout(timeout_s);
      REQUIRE(frames[size_t(r)].params(roles, &fps[size_t(r)]) == Status::kOk);
      WEFT_CUDA_OK(cudaStreamCreateWithFlags(&streams[size_t(r)], cudaStreamNonBlocking));
    }
  }
  ~Ranks() {
    for (cudaStream_t s : streams) cudaStreamDestroy(s);
  }
  // Rank q's copy `parity` of its partial (all W row blocks), its C, its RS output, its words.
  __nv_bfloat16* partial(int q, int parity) { return partials.p + (int64_t(q) * 2 + parity) * ranks * elems; }
  __nv_bfloat16* c_of(int q) { return c.p + int64_t(q) * ranks * elems; }
  uint64_t* words_of(int q) { return words.p + int64_t(q) * SmallReducePlan::words(ranks); }

  SmallReduceArgs args(SmallReduceMode mode, int r, uint64_t epoch, int max_blocks, uint64_t gathered_before = 0) {
    SmallReduceArgs a;
    const char* why = nullptr;
    REQUIRE_MESSAGE(SmallReducePlan::make(mode, ranks, r, elems, max_blocks, &a.plan, &why), (why ? why : ""));
    a.epoch = epoch;
    a.gathered = a.plan.gathered_after(gathered_before);
    for (int q = 0; q < ranks; ++q) {
      a.src[q] = partial(q, SmallReducePlan::parity(epoch));
      a.words_out[q] = words_of(q);
      a.push[q] = c_of(q) + a.plan.region;
    }
    a.words_in = words_of(r);
    a.out = mode == SmallReduceMode::kReduceScatter ? out.p + int64_t(r) * elems : c_of(r) + a.plan.region;
    return a;
  }
};

}  // namespace

TEST_CASE("small reduce: simulated ranks sum every partial in rank order, each epoch on its own partial copy") {
  require_hopper();
  const int ranks = 4, max_blocks = 3;
  for (SmallReduceMode mode :
       {SmallReduceMode::kReduceScatter, SmallReduceMode::kAllReduceTwoShot, SmallReduceMode::kAllReduceOneShot})
    for (int64_t elems : {int64_t(8) * 700, int64_t(8) * 3 * 512 * 2 + 64})  // < 1 pass; several passes + a tail
      for (bool pdl : {false, true}) {
        CAPTURE(int(mode));
        CAPTURE(elems);
        CAPTURE(pdl);
        const uint64_t seed = fresh_seed();
        INFO("seed " << seed);
        Ranks w(ranks, elems, 5.0);
        const bool rs = mode == SmallReduceMode::kReduceScatter;
        int blocks = 0;
        uint64_t gathered = 0;  // what every rank's gathered[q] holds after the launches so far
        for (uint64_t epoch = 1; epoch <= 3; ++epoch) {
          CAPTURE(epoch);
          const int par = SmallReducePlan::parity(epoch);
          for (int q = 0; q < ranks; ++q) {
            rank_payload<<<256, 256>>>(w.partial(q, par), int64_t(ranks) * elems, seed + 7 * epoch + q, q);
            // The other copy is last epoch's: poison it, so a read of the wrong copy shows.
            poison_bf16(w.partial(q, 1 - par), int64_t(ranks) * elems);
          }
          WEFT_CUDA_OK(cudaGetLastError());
          poison_bf16(w.c.p, int64_t(ranks) * ranks * elems);
          poison_bf16(w.out.p, int64_t(ranks) * elems);
          WEFT_CUDA_OK(cudaDeviceSynchronize());
          for (int r = 0; r < ranks; ++r) {  // side by side: each waits for the others' flags
            const SmallReduceArgs a = w.args(mode, r, epoch, max_blocks, gathered);
            blocks = a.plan.blocks;
            if (r == ranks - 1) gathered = a.gathered;
            REQUIRE(launch_small_reduce(a, w.fps[size_t(r)], pdl, w.streams[size_t(r)]) == Status::kOk);
          }
          WEFT_CUDA_OK(cudaDeviceSynchronize());
          for (int r = 0; r < ranks; ++r) REQUIRE(w.frames[size_t(r)].check("small reduce test") == Status::kOk);
          std::vector<std::vector<__nv_bfloat16>> p(ranks);
          for (int q = 0; q < ranks; ++q) p[size_t(q)] = to_host(w.partial(q, par), int64_t(ranks) * elems);
          auto want = [&](int64_t i) {  // fp32 in rank order, rounded once: the kernel's exact arithmetic
            float sum = 0;
            for (int q = 0; q < ranks; ++q) sum += __bfloat162float(p[size_t(q)][size_t(i)]);
            return __float2bfloat16_rn(sum);
          };
          int64_t wrong = 0, stray = 0;
          const std::vector<__nv_bfloat16> c = to_host(w.c.p, int64_t(ranks) * ranks * elems);
          const std::vector<__nv_bfloat16> out = to_host(w.out.p, int64_t(ranks) * elems);
          for (int r = 0; r < ranks; ++r)
            for (int b = 0; b < ranks; ++b)
              for (int64_t x = 0; x < elems; ++x) {
                const int64_t i = int64_t(b) * elems + x;
                const __nv_bfloat16 have = c[size_t(int64_t(r) * ranks * elems + i)];
                if (rs) {  // C untouched; the output holds the own block
                  if (!std::isnan(__bfloat162float(have))) ++stray;
                  if (b != r) continue;
                  const __nv_bfloat16 o = out[size_t(int64_t(r) * elems + x)], e = want(i);
                  if (memcmp(&o, &e, sizeof o) != 0) ++wrong;
                  continue;
                }
                const __nv_bfloat16 e = want(i);
                if (memcmp(&have, &e, sizeof e) != 0) ++wrong;
              }
          if (!rs)
            for (const __nv_bfloat16& o : out)
              if (!std::isnan(__bfloat162float(o))) ++stray;
          CHECK(wrong == 0);
          CHECK(stray == 0);
          const int nw = SmallReducePlan::words(ranks);
          const std::vector<uint64_t> words = to_host(w.words.p, int64_t(ranks) * nw);
          for (int r = 0; r < ranks; ++r)
            for (int q = 0; q < ranks; ++q) {
              CHECK_MESSAGE(words[size_t(r * nw + q)] == epoch, "rank " << r << " ready[" << q << "]");
              const bool counted = mode == SmallReduceMode::kAllReduceTwoShot && q != r;
              CHECK_MESSAGE(words[size_t(r * nw + ranks + q)] == (counted ? epoch * uint64_t(blocks) : 0),
                            "rank " << r << " gathered[" << q << "]");
            }
        }
      }
}

TEST_CASE("small reduce: one-shot launches and other block counts between two-shot launches keep the counts right") {
  require_hopper();
  const int ranks = 3;
  const int64_t elems = 8 * 512 * 3;
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  Ranks w(ranks, elems, 5.0);
  struct Launch {
    SmallReduceMode mode;
    int max_blocks;
  };
  const Launch seq[] = {{SmallReduceMode::kAllReduceTwoShot, 3},
                        {SmallReduceMode::kAllReduceOneShot, 4},
                        {SmallReduceMode::kAllReduceTwoShot, 1},
                        {SmallReduceMode::kAllReduceTwoShot, 2}};
  uint64_t gathered = 0, epoch = 0;
  for (const Launch& l : seq) {
    ++epoch;
    CAPTURE(epoch);
    const int par = SmallReducePlan::parity(epoch);
    for (int q = 0; q < ranks; ++q)
      rank_payload<<<256, 256>>>(w.partial(q, par), int64_t(ranks) * elems, seed + epoch * 11 + q, q);
    poison_bf16(w.c.p, int64_t(ranks) * ranks * elems);
    WEFT_CUDA_OK(cudaDeviceSynchronize());
    uint64_t after = gathered;
    for (int r = 0; r < ranks; ++r) {
      const SmallReduceArgs a = w.args(l.mode, r, epoch, l.max_blocks, gathered);
      after = a.plan.pushes() ? a.gathered : gathered;
      REQUIRE(launch_small_reduce(a, w.fps[size_t(r)], true, w.streams[size_t(r)]) == Status::kOk);
    }
    gathered = after;
    WEFT_CUDA_OK(cudaDeviceSynchronize());
    for (int r = 0; r < ranks; ++r) REQUIRE(w.frames[size_t(r)].check("small reduce test") == Status::kOk);
    std::vector<std::vector<__nv_bfloat16>> p(ranks);
    for (int q = 0; q < ranks; ++q) p[size_t(q)] = to_host(w.partial(q, par), int64_t(ranks) * elems);
    const std::vector<__nv_bfloat16> c = to_host(w.c.p, int64_t(ranks) * ranks * elems);
    int64_t wrong = 0;
    for (int r = 0; r < ranks; ++r)
      for (int64_t i = 0; i < int64_t(ranks) * elems; ++i) {
        float sum = 0;
        for (int q = 0; q < ranks; ++q) sum += __bfloat162float(p[size_t(q)][size_t(i)]);
        const __nv_bfloat16 e = __float2bfloat16_rn(sum), have = c[size_t(int64_t(r) * ranks * elems + i)];
        if (memcmp(&e, &have, sizeof e) != 0) ++wrong;
      }
    CHECK(wrong == 0);
    const int nw = SmallReducePlan::words(ranks);
    const std::vector<uint64_t> words = to_host(w.words.p, int64_t(ranks) * nw);
    for (int r = 0; r < ranks; ++r)
      for (int q = 0; q < ranks; ++q)
        CHECK_MESSAGE(words[size_t(r * nw + ranks + q)] == (q == r ? 0 : gathered),
                      "rank " << r << " gathered[" << q << "]");
  }
}

TEST_CASE("small reduce: flag rounds only (diagnostic) move the flags and write nothing") {
  require_hopper();
  const int ranks = 2;
  const int64_t elems = 8 * 1024;
  Ranks w(ranks, elems, 5.0);
  poison_bf16(w.c.p, int64_t(ranks) * ranks * elems);
  int blocks = 0;
  for (int r = 0; r < ranks; ++r) {
    SmallReduceArgs a = w.args(SmallReduceMode::kAllReduceTwoShot, r, 1, 4);
    blocks = a.plan.blocks;
    a.skip = kSmallReduceSkipData;
    REQUIRE(launch_small_reduce(a, w.fps[size_t(r)], false, w.streams[size_t(r)]) == Status::kOk);
  }
  WEFT_CUDA_OK(cudaDeviceSynchronize());
  for (int r = 0; r < ranks; ++r) REQUIRE(w.frames[size_t(r)].check("small reduce test") == Status::kOk);
  int64_t written = 0;
  for (const __nv_bfloat16& v : to_host(w.c.p, int64_t(ranks) * ranks * elems))
    if (!std::isnan(__bfloat162float(v))) ++written;
  CHECK(written == 0);
  const std::vector<uint64_t> words = to_host(w.words.p, int64_t(ranks) * SmallReducePlan::words(ranks));
  // Rank 0's words: ready[0], ready[1], gathered[0] (its own: never counted), gathered[1].
  CHECK(words[0] == 1);
  CHECK(words[1] == 1);
  CHECK(words[2] == 0);
  CHECK(words[3] == uint64_t(blocks));  // every block of rank 1 counted once
}

TEST_CASE("small reduce: a peer that never runs ends in a bounded wait that names it") {
  require_hopper();
  Ranks w(2, 8 * 256, 0.2);
  const SmallReduceArgs a = w.args(SmallReduceMode::kReduceScatter, 0, 1, 2);
  REQUIRE(launch_small_reduce(a, w.fps[0], false, w.streams[0]) == Status::kOk);  // rank 1 never launches
  WEFT_CUDA_OK(cudaDeviceSynchronize());
  CHECK(w.frames[0].check("small reduce test (expected timeout)") == Status::kTimeout);
  const DeviceError& e = w.frames[0].record();
  CHECK(e.rank == 0);
  CHECK(e.role == int32_t(weft::Role::kIntraComm));
  CHECK(e.tile_n == 1);                         // the peer
  CHECK(e.flag_index == a.plan.ready_word(1));  // its ready flag
  CHECK(e.expected == 1);
  describe_small_reduce_error(e, a.plan, "small reduce test (expected timeout)");
}

TEST_CASE("small reduce: ready from the GEMMs' tile counts (read over the peers' words), and a short count times out") {
  require_hopper();
  const int ranks = 3;
  const int64_t elems = 8 * 1024;
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  Ranks w(ranks, elems, 0.3);
  const int nw = SmallReducePlan::words(ranks);
  for (int q = 0; q < ranks; ++q) rank_payload<<<256, 256>>>(w.partial(q, 1), int64_t(ranks) * elems, seed + q, q);
  poison_bf16(w.c.p, int64_t(ranks) * ranks * elems);
  // The tile counts as three GEMMs of 64 tiles would leave them; rank 2's short by one in the second run.
  std::vector<uint64_t> words(size_t(ranks) * nw, 0);
  for (int q = 0; q < ranks; ++q) words[size_t(q * nw + 2 * ranks)] = 64;
  WEFT_CUDA_OK(cudaMemcpy(w.words.p, words.data(), words.size() * 8, cudaMemcpyHostToDevice));
  WEFT_CUDA_OK(cudaDeviceSynchronize());
  uint64_t gathered = 0;
  for (int r = 0; r < ranks; ++r) {
    SmallReduceArgs a = w.args(SmallReduceMode::kAllReduceTwoShot, r, 1, 2, 0);
    gathered = a.gathered;
    for (int q = 0; q < ranks; ++q) a.tiles[q] = w.words_of(q) + a.plan.tiles_word();
    a.tiles_target = 64;
    REQUIRE(launch_small_reduce(a, w.fps[size_t(r)], true, w.streams[size_t(r)]) == Status::kOk);
  }
  WEFT_CUDA_OK(cudaDeviceSynchronize());
  for (int r = 0; r < ranks; ++r) REQUIRE(w.frames[size_t(r)].check("small reduce test") == Status::kOk);
  std::vector<std::vector<__nv_bfloat16>> p(ranks);
  for (int q = 0; q < ranks; ++q) p[size_t(q)] = to_host(w.partial(q, 1), int64_t(ranks) * elems);
  const std::vector<__nv_bfloat16> c = to_host(w.c.p, int64_t(ranks) * ranks * elems);
  int64_t wrong = 0;
  for (int r = 0; r < ranks; ++r)
    for (int64_t i = 0; i < int64_t(ranks) * elems; ++i) {
      float sum = 0;
      for (int q = 0; q < ranks; ++q) sum += __bfloat162float(p[size_t(q)][size_t(i)]);
      const __nv_bfloat16 e = __float2bfloat16_rn(sum), have = c[size_t(int64_t(r) * ranks * elems + i)];
      if (memcmp(&e, &have, sizeof e) != 0) ++wrong;
    }
  CHECK(wrong == 0);
  const std::vector<uint64_t> after = to_host(w.words.p, int64_t(ranks) * nw);
  for (int r = 0; r < ranks; ++r) CHECK(after[size_t(r * nw)] == 0);  // no ready round was run
  // Second run: rank 0 alone, rank 2's count stays one short of 128.
  uint64_t short_count = 127, full = 128;
  for (int q = 0; q < ranks; ++q)
    WEFT_CUDA_OK(cudaMemcpy(w.words_of(q) + 2 * ranks, q == 2 ? &short_count : &full, 8, cudaMemcpyHostToDevice));
  SmallReduceArgs a = w.args(SmallReduceMode::kReduceScatter, 0, 2, 2, gathered);
  for (int q = 0; q < ranks; ++q) a.tiles[q] = w.words_of(q) + a.plan.tiles_word();
  a.tiles_target = 128;
  REQUIRE(launch_small_reduce(a, w.fps[0], false, w.streams[0]) == Status::kOk);
  WEFT_CUDA_OK(cudaDeviceSynchronize());
  CHECK(w.frames[0].check("small reduce test (expected timeout)") == Status::kTimeout);
  const DeviceError& e = w.frames[0].record();
  CHECK(e.tile_n == 2);
  CHECK(e.flag_index == a.plan.tiles_word());
  CHECK(e.seen == 127);
  describe_small_reduce_error(e, a.plan, "small reduce test (expected timeout)");
}
