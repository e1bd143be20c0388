// GPU tests of the persistent sm_90a GEMM: results against an fp32 reference on fresh random
// data, every output written, every epilogue, the tile order on the device, the flag gate and
// the timeout record. Exits 77 (skipped) where no Hopper GPU is visible.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

#include "base/params.h"
#include "kernels/gemm.h"
#include "tests/kernels/gemm_testing.cuh"

using namespace weft::kernels;
using namespace weft::kernels::testing;
using weft::RoleCounts;
using weft::Status;

namespace {

struct Problem {
  int m, n, k;
  DevBuf<__nv_bfloat16> a, b;
  DevBuf<float> ref;
  Problem(int m_, int n_, int k_)
      : m(m_), n(n_), k(k_), a(int64_t(m_) * k_), b(int64_t(n_) * k_), ref(int64_t(m_) * n_) {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    random_bf16(a.p, int64_t(m) * k, seed);
    random_bf16(b.p, int64_t(n) * k, seed + 1);
  }
  GemmParams params(int group_m = 8, int shards = 1, int first = 0, int cluster_m = 2) const {
    GemmArgs args;
    args.m = m, args.n = n, args.k = k;
    args.a = a.p, args.b = b.p;
    args.group_m = group_m, args.num_shards = shards, args.first_shard = first;
    args.cluster_m = cluster_m;
    GemmParams g;
    REQUIRE(make_gemm_params(args, &g) == Status::kOk);
    return g;
  }
};

RoleCounts compute_only(int blocks) {
  RoleCounts r;
  r.compute = blocks;
  return r;
}

// launch_gemm's choices for these cases: the defaults, with WEFT_GEMM_DYNAMIC=0 turning the tile
// claims off (scripts/gpu/20-gemm.sh runs racecheck on the static walk that way).
GemmOptions store_options() {
  GemmOptions o;
  o.dynamic_tiles = weft::param_bool_or_default("WEFT_GEMM_DYNAMIC");
  return o;
}

// Runs C = A * B^T into a poisoned bf16 C and checks it against the fp32 reference.
void check_store_cluster(int m, int n, int k, int compute_blocks, int idle_blocks, int group_m, int cluster_m) {
  CAPTURE(cluster_m);
  CAPTURE(m);
  CAPTURE(n);
  CAPTURE(k);
  CAPTURE(compute_blocks);
  Problem pb(m, n, k);
  DevBuf<__nv_bfloat16> c(int64_t(m) * n);
  poison_bf16(c.p, int64_t(m) * n);
  FrameHost frame;
  REQUIRE(frame.create(0) == Status::kOk);
  RoleCounts roles = compute_only(compute_blocks);
  roles.intra_comm = idle_blocks;
  FrameParams fp;
  REQUIRE(frame.params(roles, &fp) == Status::kOk);
  EpiStoreBf16 epi;
  epi.c = c.p, epi.ldc = n, epi.paired = (n % 2 == 0);
  REQUIRE(launch_gemm(pb.params(group_m, 1, 0, cluster_m), fp, epi, FlagGate{}, TileSignal{}, nullptr,
                      store_options()) == Status::kOk);
  WEFT_CUDA_OK(cudaDeviceSynchronize());
  REQUIRE(frame.check("gemm test") == Status::kOk);
  reference(pb.a.p, pb.b.p, nullptr, pb.ref.p, m, n, k);
  Compared r = compare(c.p, pb.ref.p, int64_t(m) * n);
  MESSAGE("gemm " << m << "x" << n << "x" << k << " blocks " << compute_blocks << " cluster " << cluster_m
                  << ": rel err " << r.rel_err);
  CHECK(r.bad == 0);
  // bf16 output rounding alone gives ~1.7e-3; a wrong tile or k-slice gives O(1).
  CHECK(r.rel_err < 4e-3);
}

// Both the 2-CTA cluster (B multicast, the default) and the single-CTA variant. Block counts
// are rounded down to whole clusters.
void check_store(int m, int n, int k, int compute_blocks, int idle_blocks = 0, int group_m = 8) {
  check_store_cluster(m, n, k, compute_blocks & ~1, idle_blocks & ~1, group_m, 2);
  check_store_cluster(m, n, k, compute_blocks, idle_blocks, group_m, 1);
}

}  // namespace

TEST_CASE("gemm small: one tile and a partial tile (also the compute-sanitizer case)") {
  const int sms = require_hopper();
  (void)sms;
  check_store(128, 256, 64, 2);
  check_store(200, 300, 136, 3);  // ldc % 8 != 0: stores from registers
  check_store(200, 296, 136, 3);  // ldc % 8 == 0: TMA stores, boxes cut at M and N
}

TEST_CASE("gemm tile multiples on all SMs and on few SMs (ring phases across many tiles)") {
  const int sms = require_hopper();
  check_store(1024, 1024, 1024, sms);
  check_store(2048, 2048, 2048, sms);
  check_store(1024, 2048, 4096, 5);
  check_store(384, 512, 256, 2);             // odd number of 128-row tiles: the cluster's second tile is empty
  check_store(512, 768, 512, sms - 16, 16);  // SMs lent to another role do nothing here
  // K of 1-2 k-blocks with several tiles per block: a tile's stores are issued while the next
  // tile runs its first k-blocks; here the next tile ends before all slices could be issued.
  check_store(1024, 1024, 128, 5);
  check_store(1000, 777, 72, 3);
}

TEST_CASE("gemm M, N, K that are not tile multiples are handled (K a multiple of 8)") {
  const int sms = require_hopper();
  check_store(1000, 777, 520, sms);  // odd N: unpaired stores
  check_store(333, 1999, 1672, sms);
  check_store(64, 64, 8, sms);  // smaller than one tile in every dimension
  check_store(3000, 2944, 4104, 17, 0, 3);
  check_store(129, 257, 72, sms);
  check_store(333, 1000, 1672, sms);  // TMA stores of partial boxes on both edges
}

TEST_CASE("gemm split tail: K-sliced and chunked last waves are correct, fully written and repeat bit for bit") {
  const int sms = require_hopper();
  // (shape, compute blocks) whose last wave is ragged enough for the planner to cut it; `chunks`:
  // with chunks allowed the planner picks them (single CTAs).
  struct Case {
    int m, n, k, blocks;
    bool chunks;
  };
  for (const Case cs :
       {Case{2048, 7168, 2048, sms, false}, Case{1024, 1024, 1024, sms, false}, Case{1000, 1000, 1672, 5, false},
        Case{640, 512, 4096, 7, false}, Case{2048, 7168, 8192, sms, true}, Case{1000, 1000, 8192, 5, true}})
    for (int cluster : {1, 2})
      for (bool chunked : {true, false}) {
        if (chunked && !cs.chunks) continue;  // the same plan as K-slices only
        const int blocks = cluster == 2 ? cs.blocks & ~1 : cs.blocks;
        CAPTURE(cs.m);
        CAPTURE(cs.n);
        CAPTURE(cs.k);
        CAPTURE(blocks);
        CAPTURE(cluster);
        CAPTURE(chunked);
        Problem pb(cs.m, cs.n, cs.k);
        GemmParams g = pb.params(8, 1, 0, cluster);
        GemmParams planned = g;
        REQUIRE(enable_tail_split(blocks, nullptr, &planned, chunked) == Status::kOk);
        // The cases exercise the split with single CTAs; with 2-CTA clusters the planner may keep
        // the few-block cases whole, which is checked just the same. launch_gemm runs the plan
        // it is given.
        if (cluster == 1) CHECK(planned.sched.split > 1);
        if (cluster == 1) CHECK((planned.sched.chunks > 0) == chunked);
        const int64_t elems = int64_t(cs.m) * cs.n;
        DevBuf<__nv_bfloat16> c1(elems), c2(elems);
        FrameHost frame;
        REQUIRE(frame.create(0) == Status::kOk);
        FrameParams fp;
        REQUIRE(frame.params(compute_only(blocks), &fp) == Status::kOk);
        for (__nv_bfloat16* c : {c1.p, c2.p}) {
          poison_bf16(c, elems);
          EpiStoreBf16 epi;
          epi.c = c, epi.ldc = cs.n;
          REQUIRE(launch_gemm(planned, fp, epi, FlagGate{}, TileSignal{}, nullptr) == Status::kOk);
        }
        WEFT_CUDA_OK(cudaDeviceSynchronize());
        REQUIRE(frame.check("gemm split test") == Status::kOk);
        reference(pb.a.p, pb.b.p, nullptr, pb.ref.p, cs.m, cs.n, cs.k);
        Compared r = compare(c1.p, pb.ref.p, elems);
        MESSAGE("split tail " << cs.m << "x" << cs.n << "x" << cs.k << " blocks " << blocks << " cluster " << cluster
                              << " split " << planned.sched.split << " chunks " << planned.sched.chunks << ": rel err "
                              << r.rel_err);
        CHECK(r.bad == 0);
        CHECK(r.rel_err < 4e-3);
        std::vector<uint16_t> h1(static_cast<size_t>(elems)), h2(static_cast<size_t>(elems));
        WEFT_CUDA_OK(cudaMemcpy(h1.data(), c1.p, size_t(elems) * 2, cudaMemcpyDeviceToHost));
        WEFT_CUDA_OK(cudaMemcpy(h2.data(), c2.p, size_t(elems) * 2, cudaMemcpyDeviceToHost));
        CHECK(h1 == h2);  // partials are added in slice order: the same bits every launch
      }
}

TEST_CASE("gemm rejects K that is not a multiple of 8, saying why") {
  require_hopper();
  Problem pb(128, 128, 128);
  GemmArgs args;
  args.m = 128, args.n = 128, args.k = 100;
  args.a = pb.a.p, args.b = pb.b.p;
  GemmParams g;
  CHECK(make_gemm_params(args, &g) == Status::kInvalidArgument);
  args.k = 128;
  args.lda = 130;
  CHECK(make_gemm_params(args, &g) == Status::kInvalidArgument);
}

TEST_CASE("gemm add epilogues: fp32 and bf16 atomic adds into existing C") {
  const int sms = require_hopper();
  const int m = 1536, n = 1280, k = 1024;
  Problem pb(m, n, k);
  FrameHost frame;
  REQUIRE(frame.create(0) == Status::kOk);
  FrameParams fp;
  REQUIRE(frame.params(compute_only(sms), &fp) == Status::kOk);
  const uint64_t seed = fresh_seed();
  DevBuf<float> init(int64_t(m) * n);
  random_f32(init.p, int64_t(m) * n, seed, 4.0f);
  reference(pb.a.p, pb.b.p, init.p, pb.ref.p, m, n, k);

  SUBCASE("fp32") {
    DevBuf<float> c(int64_t(m) * n);
    WEFT_CUDA_OK(cudaMemcpy(c.p, init.p, size_t(m) * n * 4, cudaMemcpyDeviceToDevice));
    EpiAddF32 epi;
    epi.c = c.p, epi.ldc = n;
    REQUIRE(launch_gemm(pb.params(), fp, epi, FlagGate{}, TileSignal{}, nullptr) == Status::kOk);
    WEFT_CUDA_OK(cudaDeviceSynchronize());
    REQUIRE(frame.check("gemm add f32") == Status::kOk);
    Compared r = compare(c.p, pb.ref.p, int64_t(m) * n);
    MESSAGE("add f32 rel err " << r.rel_err);
    CHECK(r.bad == 0);
    CHECK(r.rel_err < 1e-5);  // fp32 all the way: only the summation order differs
  }
  SUBCASE("bf16") {
    DevBuf<__nv_bfloat16> c(int64_t(m) * n);
    std::vector<float> h(size_t(m) * n);
    WEFT_CUDA_OK(cudaMemcpy(h.data(), init.p, h.size() * 4, cudaMemcpyDeviceToHost));
    std::vector<__nv_bfloat16> hb(h.size());
    for (size_t i = 0; i < h.size(); ++i) hb[i] = __float2bfloat16_rn(h[i]);
    WEFT_CUDA_OK(cudaMemcpy(c.p, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice));
    EpiAddBf16 epi;
    epi.c = c.p, epi.ldc = n;
    REQUIRE(launch_gemm(pb.params(), fp, epi, FlagGate{}, TileSignal{}, nullptr) == Status::kOk);
    WEFT_CUDA_OK(cudaDeviceSynchronize());
    REQUIRE(frame.check("gemm add bf16") == Status::kOk);
    Compared r = compare(c.p, pb.ref.p, int64_t(m) * n);
    MESSAGE("add bf16 rel err " << r.rel_err);
    CHECK(r.bad == 0);
    CHECK(r.rel_err < 8e-3);  // init rounded to bf16, then the sum rounded again
  }
}

TEST_CASE("gemm scatter epilogue: rows go to their owner's slot, with and without a tile signal") {
  const int sms = require_hopper();
  for (int n : {1280, 777}) {  // 777: odd N, unpaired stores
    const int m = 1024, k = 320, owners = 4, rpo = m / owners;
    const int perm[owners] = {2, 0, 3, 1};  // owner o's slot is block perm[o] of the buffer
    CAPTURE(n);
    Problem pb(m, n, k);
    reference(pb.a.p, pb.b.p, nullptr, pb.ref.p, m, n, k);
    DevBuf<__nv_bfloat16> buf(int64_t(m) * n);
    const int64_t tiles = int64_t(m / 128) * ((n + 255) / 256);
    DevBuf<uint64_t> tile_flags(tiles);
    FrameHost frame;
    REQUIRE(frame.create(0) == Status::kOk);
    FrameParams fp;
    REQUIRE(frame.params(compute_only(sms), &fp) == Status::kOk);
    for (int cluster : {2, 1})
      for (bool with_signal : {false, true}) {
        CAPTURE(cluster);
        CAPTURE(with_signal);
        poison_bf16(buf.p, int64_t(m) * n);
        WEFT_CUDA_OK(cudaMemset(tile_flags.p, 0, size_t(tiles) * 8));
        EpiScatterBf16 epi;
        for (int o = 0; o < owners; ++o) epi.dst[o] = buf.p + int64_t(perm[o]) * rpo * n;
        epi.rows_per_owner = rpo, epi.ldc = n, epi.paired = (n % 2 == 0);
        TileSignal sig;
        if (with_signal) sig = TileSignal{tile_flags.p, kFlagPerTile, 1};
        REQUIRE(launch_gemm(pb.params(8, 1, 0, cluster), fp, epi, FlagGate{}, sig, nullptr) == Status::kOk);
        WEFT_CUDA_OK(cudaDeviceSynchronize());
        REQUIRE(frame.check("gemm scatter") == Status::kOk);
        for (int o = 0; o < owners; ++o) {
          Compared r = compare(buf.p + int64_t(perm[o]) * rpo * n, pb.ref.p + int64_t(o) * rpo * n, int64_t(rpo) * n);
          CHECK(r.bad == 0);
          CHECK(r.rel_err < 4e-3);
        }
        std::vector<uint64_t> h(static_cast<size_t>(tiles));
        WEFT_CUDA_OK(cudaMemcpy(h.data(), tile_flags.p, h.size() * 8, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < h.size(); ++i) REQUIRE_MESSAGE(h[i] == (with_signal ? 1u : 0u), "flag " << i);
      }
  }
}

TEST_CASE("gemm gate + signal: rank-rotated shards, every tile signalled exactly once") {
  const int sms = require_hopper();
  const int m = 2048, n = 1792, k = 512, shards = 4;
  Problem pb(m, n, k);
  const int64_t tiles = int64_t(m / 128) * ((n + 255) / 256);  // flags are per 128 x 256 CTA tile
  DevBuf<uint64_t> ready(shards), tile_flags(tiles), shard_flags(shards);
  std::vector<uint64_t> h_ready(shards, 7);
  WEFT_CUDA_OK(cudaMemcpy(ready.p, h_ready.data(), shards * 8, cudaMemcpyHostToDevice));
  FrameHost frame;
  REQUIRE(frame.create(1) == Status::kOk);
  FrameParams fp;
  REQUIRE(frame.params(compute_only(sms), &fp) == Status::kOk);
  DevBuf<__nv_bfloat16> c(int64_t(m) * n);

  for (int cluster : {2, 1})
    for (int gran : {kFlagPerTile, kFlagPerShard}) {
      CAPTURE(cluster);
      CAPTURE(gran);
      const GemmParams g = pb.params(8, shards, 2, cluster);
      REQUIRE(int64_t(g.cta_m_blocks) * g.n_blocks == tiles);
      poison_bf16(c.p, int64_t(m) * n);
      uint64_t* flags = gran == kFlagPerTile ? tile_flags.p : shard_flags.p;
      const int64_t nflags = gran == kFlagPerTile ? tiles : shards;
      WEFT_CUDA_OK(cudaMemset(flags, 0, size_t(nflags) * 8));
      EpiStoreBf16 epi;
      epi.c = c.p, epi.ldc = n;
      FlagGate gate{ready.p, kFlagPerShard, 7};
      TileSignal sig{flags, gran, 3};
      REQUIRE(launch_gemm(g, fp, epi, gate, sig, nullptr) == Status::kOk);
      WEFT_CUDA_OK(cudaDeviceSynchronize());
      REQUIRE(frame.check("gemm gated") == Status::kOk);
      std::vector<uint64_t> h(static_cast<size_t>(nflags));
      WEFT_CUDA_OK(cudaMemcpy(h.data(), flags, h.size() * 8, cudaMemcpyDeviceToHost));
      const uint64_t want = gran == kFlagPerTile ? 3 : 3 * uint64_t(m / shards / 128) * g.n_blocks;
      for (size_t i = 0; i < h.size(); ++i) REQUIRE_MESSAGE(h[i] == want, "flag " << i);
      reference(pb.a.p, pb.b.p, nullptr, pb.ref.p, m, n, k);
      Compared r = compare(c.p, pb.ref.p, int64_t(m) * n);
      CHECK(r.bad == 0);
      CHECK(r.rel_err < 4e-3);
    }
}

TEST_CASE("gemm flag timeout: a shard flag that is never set ends the kernel with a record") {
  const int sms = require_hopper();
  const int m = 2048, n = 1024, k = 256, shards = 4;
  Problem pb(m, n, k);
  DevBuf<uint64_t> ready(shards);
  // Shard 1 stays one short of the awaited value.
  std::vector<uint64_t> h_ready = {5, 4, 5, 5};
  WEFT_CUDA_OK(cudaMemcpy(ready.p, h_ready.data(), shards * 8, cudaMemcpyHostToDevice));
  FrameHost frame;
  REQUIRE(frame.create(3) == Status::kOk);
  frame.set_timeout(0.2);
  RoleCounts roles = compute_only(sms - 8);
  roles.intra_comm = 8;
  FrameParams fp;
  REQUIRE(frame.params(roles, &fp) == Status::kOk);
  DevBuf<__nv_bfloat16> c(int64_t(m) * n);
  EpiStoreBf16 epi;
  epi.c = c.p, epi.ldc = n;
  FlagGate gate{ready.p, kFlagPerShard, 5};
  cudaEvent_t t0, t1;
  WEFT_CUDA_OK(cudaEventCreate(&t0));
  WEFT_CUDA_OK(cudaEventCreate(&t1));
  WEFT_CUDA_OK(cudaEventRecord(t0));
  REQUIRE(launch_gemm(pb.params(8, shards, 0), fp, epi, gate, TileSignal{}, nullptr) == Status::kOk);
  WEFT_CUDA_OK(cudaEventRecord(t1));
  // The kernel must come back by itself (bounded waits), not hang.
  WEFT_CUDA_OK(cudaDeviceSynchronize());
  float ms = 0;
  WEFT_CUDA_OK(cudaEventElapsedTime(&ms, t0, t1));
  MESSAGE("timed-out launch returned after " << ms << " ms");
  CHECK(ms < 5000.f);
  CHECK(frame.check("gemm timeout test") == Status::kTimeout);
  const DeviceError& e = frame.record();
  CHECK(e.status != 0);
  CHECK(e.committed == 1);
  CHECK(e.kind == int32_t(DeviceErrorKind::kFlagTimeout));
  CHECK(e.rank == 3);
  CHECK(e.role == int32_t(weft::Role::kCompute));
  CHECK(e.block >= 0);
  CHECK(e.block < sms - 8);
  CHECK(e.flag_index == 1);
  CHECK(e.flag_addr == reinterpret_cast<uint64_t>(ready.p + 1));
  CHECK(e.expected == 5);
  CHECK(e.seen == 4);
  CHECK(e.waited_ns >= 200000000ull);
  CHECK(e.tile_m / (m / 128 / shards) == 1);  // a tile of shard 1

  // The device is still usable afterwards, and the record clears for the next launch.
  check_store(256, 512, 128, sms);
}

namespace {
std::vector<uint32_t> claim_words_now(const GemmParams& g) {
  std::vector<uint32_t> h(2, 0xdeadbeefu);
  WEFT_CUDA_OK(cudaMemcpy(h.data(), g.claims, 8, cudaMemcpyDeviceToHost));
  return h;
}
}  // namespace

TEST_CASE("gemm dynamic claims: correct, repeatable, the claim words reset after every launch") {
  const int sms = require_hopper();
  struct Case {
    int m, n, k, blocks, shards, first;
  };
  // Split tail (2048 x 7168 on all SMs), rotated shards, edge tiles, many short tiles per block.
  for (const Case cs : {Case{2048, 7168, 2048, sms, 4, 1}, Case{1000, 777, 520, sms, 1, 0},
                        Case{1024, 1024, 128, 5, 1, 0}, Case{640, 512, 4096, 7, 1, 0}}) {
    CAPTURE(cs.m);
    CAPTURE(cs.n);
    CAPTURE(cs.k);
    CAPTURE(cs.blocks);
    Problem pb(cs.m, cs.n, cs.k);
    GemmParams g = pb.params(8, cs.shards, cs.first, 1);
    REQUIRE(enable_dynamic_tiles(nullptr, &g) == Status::kOk);
    REQUIRE(g.claims != nullptr);
    const int64_t elems = int64_t(cs.m) * cs.n;
    DevBuf<__nv_bfloat16> c1(elems), c2(elems);
    FrameHost frame;
    REQUIRE(frame.create(0) == Status::kOk);
    FrameParams fp;
    REQUIRE(frame.params(compute_only(cs.blocks), &fp) == Status::kOk);
    for (__nv_bfloat16* c : {c1.p, c2.p}) {
      poison_bf16(c, elems);
      WEFT_CUDA_OK(cudaDeviceSynchronize());
      EpiStoreBf16 epi;
      epi.c = c, epi.ldc = cs.n, epi.paired = cs.n % 2 == 0;
      REQUIRE(launch_gemm(g, fp, epi, FlagGate{}, TileSignal{}, nullptr) == Status::kOk);
    }
    WEFT_CUDA_OK(cudaDeviceSynchronize());
    REQUIRE(frame.check("gemm dynamic claims") == Status::kOk);
    CHECK(claim_words_now(g) == std::vector<uint32_t>{0, 0});
    reference(pb.a.p, pb.b.p, nullptr, pb.ref.p, cs.m, cs.n, cs.k);
    Compared r = compare(c1.p, pb.ref.p, elems);
    MESSAGE("dynamic claims " << cs.m << "x" << cs.n << "x" << cs.k << " blocks " << cs.blocks << ": rel err "
                              << r.rel_err);
    CHECK(r.bad == 0);
    CHECK(r.rel_err < 4e-3);
    // Whichever block computes a tile, its bits are the same (split-tail slices add in order).
    CHECK(to_host(c1.p, elems) == to_host(c2.p, elems));
  }
}

TEST_CASE("gemm dynamic claims: a gate that opens late, every tile signalled once; reset after a timeout") {
  const int sms = require_hopper();
  const int m = 2048, n = 1792, k = 512, shards = 4;
  Problem pb(m, n, k);
  const int64_t tiles = int64_t(m / 128) * ((n + 255) / 256);
  DevBuf<uint64_t> ready(shards), tile_flags(tiles);
  DevBuf<__nv_bfloat16> c(int64_t(m) * n);
  GemmParams g = pb.params(8, shards, 1, 1);
  cudaStream_t run = nullptr, late = nullptr;
  WEFT_CUDA_OK(cudaStreamCreateWithFlags(&run, cudaStreamNonBlocking));
  WEFT_CUDA_OK(cudaStreamCreateWithFlags(&late, cudaStreamNonBlocking));
  REQUIRE(enable_dynamic_tiles(run, &g) == Status::kOk);  // the words of the stream it runs on
  REQUIRE(g.claims != nullptr);
  FrameHost frame;
  REQUIRE(frame.create(2) == Status::kOk);
  EpiStoreBf16 epi;
  epi.c = c.p, epi.ldc = n;

  SUBCASE("late gate") {
    FrameParams fp;
    REQUIRE(frame.params(compute_only(sms), &fp) == Status::kOk);
    // Shard 3 (the third visited, order 1, 2, 3, 0) arrives 50 ms after the launch, long after the
    // tiles before it are done: blocks wait on it while others claim past it. Its rows are poison
    // until then, so a tile that read them before its gate opened (or skipped its gate because the
    // block had seen other shards open) fails the comparison.
    const int64_t shard_elems = int64_t(m / shards) * k;
    __nv_bfloat16* shard3 = pb.a.p + 3 * shard_elems;
    DevBuf<__nv_bfloat16> saved(shard_elems);
    WEFT_CUDA_OK(cudaMemcpy(saved.p, shard3, size_t(shard_elems) * 2, cudaMemcpyDeviceToDevice));
    poison_bf16(shard3, shard_elems);
    const std::vector<uint64_t> h_ready = {9, 9, 9, 0};
    WEFT_CUDA_OK(cudaMemcpy(ready.p, h_ready.data(), shards * 8, cudaMemcpyHostToDevice));
    WEFT_CUDA_OK(cudaMemset(tile_flags.p, 0, size_t(tiles) * 8));
    poison_bf16(c.p, int64_t(m) * n);
    WEFT_CUDA_OK(cudaDeviceSynchronize());
    REQUIRE(launch_gemm(g, fp, epi, FlagGate{ready.p, kFlagPerShard, 9}, TileSignal{tile_flags.p, kFlagPerTile, 1},
                        run) == Status::kOk);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const uint64_t nine = 9;
    WEFT_CUDA_OK(cudaMemcpyAsync(shard3, saved.p, size_t(shard_elems) * 2, cudaMemcpyDeviceToDevice, late));
    WEFT_CUDA_OK(cudaMemcpyAsync(ready.p + 3, &nine, 8, cudaMemcpyHostToDevice, late));
    WEFT_CUDA_OK(cudaStreamSynchronize(late));
    WEFT_CUDA_OK(cudaStreamSynchronize(run));
    REQUIRE(frame.check("gemm dynamic late gate") == Status::kOk);
    CHECK(claim_words_now(g) == std::vector<uint32_t>{0, 0});
    for (uint64_t v : to_host(tile_flags.p, tiles)) REQUIRE(v == 1);
    reference(pb.a.p, pb.b.p, nullptr, pb.ref.p, m, n, k);
    Compared r = compare(c.p, pb.ref.p, int64_t(m) * n);
    CHECK(r.bad == 0);
    CHECK(r.rel_err < 4e-3);
  }
  SUBCASE("timeout") {
    frame.set_timeout(0.2);
    FrameParams fp;
    REQUIRE(frame.params(compute_only(sms), &fp) == Status::kOk);
    const std::vector<uint64_t> h_ready = {5, 5, 4, 5};  // shard 2 stays one short
    WEFT_CUDA_OK(cudaMemcpy(ready.p, h_ready.data(), shards * 8, cudaMemcpyHostToDevice));
    REQUIRE(launch_gemm(g, fp, epi, FlagGate{ready.p, kFlagPerShard, 5}, TileSignal{}, run) == Status::kOk);
    WEFT_CUDA_OK(cudaStreamSynchronize(run));
    CHECK(frame.check("gemm dynamic timeout") == Status::kTimeout);
    CHECK(frame.record().kind == int32_t(DeviceErrorKind::kFlagTimeout));
    CHECK(frame.record().flag_index == 2);
    // Every producer left through finish_claims: the next launch starts from unit 0.
    CHECK(claim_words_now(g) == std::vector<uint32_t>{0, 0});
    WEFT_CUDA_OK(cudaMemcpy(ready.p + 2, &h_ready[0], 8, cudaMemcpyHostToDevice));
    REQUIRE(frame.params(compute_only(sms), &fp) == Status::kOk);
    poison_bf16(c.p, int64_t(m) * n);
    WEFT_CUDA_OK(cudaDeviceSynchronize());
    REQUIRE(launch_gemm(g, fp, epi, FlagGate{ready.p, kFlagPerShard, 5}, TileSignal{}, run) == Status::kOk);
    WEFT_CUDA_OK(cudaStreamSynchronize(run));
    REQUIRE(frame.check("gemm dynamic after timeout") == Status::kOk);
    reference(pb.a.p, pb.b.p, nullptr, pb.ref.p, m, n, k);
    Compared r = compare(c.p, pb.ref.p, int64_t(m) * n);
    CHECK(r.bad == 0);
    CHECK(r.rel_err < 4e-3);
  }
  WEFT_CUDA_OK(cudaStreamDestroy(run));
  WEFT_CUDA_OK(cudaStreamDestroy(late));
}
