// GPU tests of the SM-driven AllGather+GEMM kernel: W ranks in one process (one GPU each where there
// are enough, else several on one GPU), every mover gathers A bit for bit and the gated GEMM matches
// an fp32 reference, twice (flags reused across epochs); the movers alone; a push whose peer never
// starts times out naming the clear-to-send flag; the split-K pair and its fp32 -> bf16 pass.
// Exits 77 (skipped) where no Hopper GPU is visible.
#include <doctest/doctest.h>

#include <cstdlib>
#include <random>
#include <vector>

#include "kernels/ag_gemm_fused.h"
#include "kernels/gemm.h"
#include "tests/kernels/gemm_testing.cuh"

using namespace weft::kernels;
using namespace weft::kernels::testing;
using weft::RoleCounts;
using weft::Status;
using bf16 = __nv_bfloat16;

namespace {

__global__ void count_mismatches(const uint16_t* a, const uint16_t* b, int64_t n, unsigned long long* out) {
  unsigned long long bad = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    bad += a[i] != b[i];
  atomicAdd(out, bad);
}

unsigned long long mismatches(const bf16* a, const bf16* b, int64_t n) {
  unsigned long long* d = nullptr;
  WEFT_CUDA_OK(cudaMalloc(&d, sizeof(*d)));
  WEFT_CUDA_OK(cudaMemset(d, 0, sizeof(*d)));
  count_mismatches<<<256, 256>>>(reinterpret_cast<const uint16_t*>(a), reinterpret_cast<const uint16_t*>(b), n, d);
  unsigned long long h = 0;
  WEFT_CUDA_OK(cudaMemcpy(&h, d, sizeof(h), cudaMemcpyDeviceToHost));
  WEFT_CUDA_OK(cudaFree(d));
  return h;
}

// W ranks, rank r on GPU r % devices; every buffer of every rank reachable from every rank.
struct Ranks {
  int world, m, n, k, shard_rows, devices = 1;
  struct Rank {
    int dev = 0;
    cudaStream_t s = nullptr;
    bf16 *a = nullptr, *b = nullptr, *c = nullptr, *expect = nullptr;
    float* ref = nullptr;
    uint64_t* flags = nullptr;
    GemmParams g;
    FrameHost frame;
  };
  std::vector<Rank> r;
  int64_t flag_words = 0, n_blocks = 0;

  Ranks(int world_, int shard_rows_, int n_, int k_)
      : world(world_), m(world_ * shard_rows_), n(n_), k(k_), shard_rows(shard_rows_), r(world_) {
    int count = 0;
    WEFT_CUDA_OK(cudaGetDeviceCount(&count));
    devices = count >= world ? world : 1;
    for (int d = 0; d < devices; ++d)
      for (int e = 0; e < devices; ++e)
        if (d != e) {
          WEFT_CUDA_OK(cudaSetDevice(d));
          cudaError_t err = cudaDeviceEnablePeerAccess(e, 0);
          if (err == cudaErrorPeerAccessAlreadyEnabled)
            cudaGetLastError();
          else
            WEFT_CUDA_OK(err);
        }
    n_blocks = (n + 255) / 256;
    flag_words = int64_t(m / 128) * n_blocks + world;
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    for (int q = 0; q < world; ++q) {
      Rank& x = r[q];
      x.dev = q % devices;
      WEFT_CUDA_OK(cudaSetDevice(x.dev));
      WEFT_CUDA_OK(cudaStreamCreateWithFlags(&x.s, cudaStreamNonBlocking));
      WEFT_CUDA_OK(cudaMalloc(&x.a, size_t(m) * k * 2));
      WEFT_CUDA_OK(cudaMalloc(&x.expect, size_t(m) * k * 2));
      WEFT_CUDA_OK(cudaMalloc(&x.b, size_t(n) * k * 2));
      WEFT_CUDA_OK(cudaMalloc(&x.c, size_t(m) * n * 2));
      WEFT_CUDA_OK(cudaMalloc(&x.ref, size_t(m) * n * 4));
      WEFT_CUDA_OK(cudaMalloc(&x.flags, size_t(flag_words) * 8));
      random_bf16(own(q), int64_t(shard_rows) * k, seed + 17 * q);
      random_bf16(x.b, int64_t(n) * k, seed + 17 * q + 1);
      REQUIRE(x.frame.create(q) == Status::kOk);
      GemmArgs args;
      args.m = m, args.n = n, args.k = k, args.a = x.a, args.b = x.b;
      args.num_shards = world, args.first_shard = q;
      REQUIRE(make_gemm_params(args, &x.g) == Status::kOk);
      REQUIRE(x.g.n_blocks == n_blocks);
    }
    for (int q = 0; q < world; ++q) {
      WEFT_CUDA_OK(cudaSetDevice(r[q].dev));
      WEFT_CUDA_OK(cudaDeviceSynchronize());
    }
    // What every rank must end up with: all shards, and its C in fp32.
    for (int q = 0; q < world; ++q) {
      for (int s = 0; s < world; ++s)
        WEFT_CUDA_OK(cudaMemcpyPeer(r[q].expect + int64_t(s) * shard_rows * k, r[q].dev, own(s), r[s].dev,
                                    size_t(shard_rows) * k * 2));
      WEFT_CUDA_OK(cudaSetDevice(r[q].dev));
      reference(r[q].expect, r[q].b, nullptr, r[q].ref, m, n, k);
      reset_flags(q);
    }
  }
  ~Ranks() {
    for (auto& x : r) {
      cudaSetDevice(x.dev);
      cudaDeviceSynchronize();
      for (void* p : {(void*)x.a, (void*)x.b, (void*)x.c, (void*)x.expect, (void*)x.ref, (void*)x.flags}) cudaFree(p);
      cudaStreamDestroy(x.s);
    }
    cudaSetDevice(0);
  }
  bf16* own(int q) const { return r[q].a + int64_t(q) * shard_rows * k; }
  void reset_flags(int q) {
    WEFT_CUDA_OK(cudaSetDevice(r[q].dev));
    WEFT_CUDA_OK(cudaMemset(r[q].flags, 0, size_t(flag_words) * 8));
    const int64_t own_blocks = shard_rows / 128;
    WEFT_CUDA_OK(cudaMemset(r[q].flags + q * own_blocks * n_blocks, 0xFF, size_t(own_blocks * n_blocks) * 8));
    // cudaMemset runs on the legacy stream, which does not order the non-blocking launch stream: without
    // this, a kernel may read the words a freed buffer left at the same address (a stale clear-to-send).
    WEFT_CUDA_OK(cudaDeviceSynchronize());
  }
  void poison(int q) {
    WEFT_CUDA_OK(cudaSetDevice(r[q].dev));
    for (int s = 0; s < world; ++s)
      if (s != q) poison_bf16(r[q].a + int64_t(s) * shard_rows * k, int64_t(shard_rows) * k);
    poison_bf16(r[q].c, int64_t(m) * n);
    WEFT_CUDA_OK(cudaDeviceSynchronize());
  }
  AgMoveParams move(int q, AgMover mover, uint64_t epoch) const {
    AgMoveParams p;
    for (int s = 0; s < world; ++s) p.a[s] = r[s].a, p.flags[s] = r[s].flags;
    p.rank = q, p.world = world, p.shard_rows = shard_rows, p.k = k, p.m_blocks = m / 128;
    p.flag_cols = int32_t(n_blocks), p.epoch = epoch, p.mover = mover;
    return p;
  }
  Status launch(int q, AgMover mover, const RoleCounts& roles, uint64_t epoch) {
    WEFT_CUDA_OK(cudaSetDevice(r[q].dev));
    FrameParams fp;
    REQUIRE(r[q].frame.params(roles, &fp) == Status::kOk);
    EpiStoreBf16 epi{r[q].c, n, n % 2 == 0};
    FlagGate gate{r[q].flags, kFlagPerTile, epoch * uint64_t(roles.intra_comm)};
    return launch_ag_gemm_fused(r[q].g, fp, epi, gate, move(q, mover, epoch), r[q].s);
  }
  void sync_all() {
    for (auto& x : r) {
      WEFT_CUDA_OK(cudaSetDevice(x.dev));
      WEFT_CUDA_OK(cudaStreamSynchronize(x.s));
    }
  }
  // Gathered A bit for bit, C against the reference (when computed), and every flag's final value.
  void check(int q, AgMover mover, int intra, uint64_t epoch, bool computed) {
    CAPTURE(q);
    WEFT_CUDA_OK(cudaSetDevice(r[q].dev));
    REQUIRE(r[q].frame.check("ag_gemm test") == Status::kOk);
    CHECK(mismatches(r[q].a, r[q].expect, int64_t(m) * k) == 0);
    if (computed) {
      Compared cmp = compare(r[q].c, r[q].ref, int64_t(m) * n);
      CHECK(cmp.bad == 0);
      CHECK(cmp.rel_err < 4e-3);
    }
    std::vector<uint64_t> h(static_cast<size_t>(flag_words));
    WEFT_CUDA_OK(cudaMemcpy(h.data(), r[q].flags, h.size() * 8, cudaMemcpyDeviceToHost));
    const int64_t own_blocks = shard_rows / 128, tiles = int64_t(m / 128) * n_blocks;
    for (int64_t i = 0; i < tiles; ++i) {
      const bool mine = i / n_blocks / own_blocks == q;
      REQUIRE_MESSAGE(h[i] == (mine ? ~0ull : epoch * uint64_t(intra)), "flag " << i);
    }
    const bool push = mover == AgMover::kPushVec || mover == AgMover::kPushBulk;
    for (int s = 0; s < world; ++s) CHECK(h[tiles + s] == (push && s != q ? epoch : 0));
  }
};

RoleCounts roles_of(int compute, int intra) {
  RoleCounts r;
  r.compute = compute;
  r.intra_comm = intra;
  return r;
}

}  // namespace

TEST_CASE("ag_gemm fused: every mover gathers A bit for bit and the gated GEMM matches, over two epochs") {
  require_hopper();
  // 3 chunks per shard, K with a partial k-block, N with a partial tile, a 3-way uneven slice split.
  Ranks w(4, 384, 640, 520);
  MESSAGE("ranks on " << w.devices << " GPU(s)");
  for (AgMover mover : {AgMover::kPullVec, AgMover::kPushVec, AgMover::kPullBulk, AgMover::kPushBulk}) {
    CAPTURE(to_string(mover));
    for (int q = 0; q < w.world; ++q) w.reset_flags(q);
    for (uint64_t epoch = 1; epoch <= 2; ++epoch) {
      CAPTURE(epoch);
      for (int q = 0; q < w.world; ++q) w.poison(q);
      for (int q = 0; q < w.world; ++q) REQUIRE(w.launch(q, mover, roles_of(8, 3), epoch) == Status::kOk);
      w.sync_all();
      for (int q = 0; q < w.world; ++q) w.check(q, mover, 3, epoch, true);
    }
  }
}

TEST_CASE("ag_gemm fused: the movers alone (no compute block), one and many per chunk") {
  require_hopper();
  Ranks w(4, 256, 256, 1024);
  for (AgMover mover : {AgMover::kPullVec, AgMover::kPushBulk}) {
    for (int intra : {1, 7}) {
      CAPTURE(to_string(mover));
      CAPTURE(intra);
      for (int q = 0; q < w.world; ++q) w.reset_flags(q), w.poison(q);
      for (int q = 0; q < w.world; ++q) REQUIRE(w.launch(q, mover, roles_of(0, intra), 1) == Status::kOk);
      w.sync_all();
      for (int q = 0; q < w.world; ++q) w.check(q, mover, intra, 1, false);
    }
  }
  // Refused: no mover block, a gate that does not match the movers' count.
  FrameParams fp;
  REQUIRE(w.r[0].frame.params(roles_of(8, 0), &fp) == Status::kOk);
  CHECK(launch_ag_gemm_fused(w.r[0].g, fp, EpiStoreBf16{w.r[0].c, w.n, true}, FlagGate{w.r[0].flags, kFlagPerTile, 0},
                             w.move(0, AgMover::kPullVec, 1), nullptr) == Status::kInvalidArgument);
  REQUIRE(w.r[0].frame.params(roles_of(8, 2), &fp) == Status::kOk);
  CHECK(launch_ag_gemm_fused(w.r[0].g, fp, EpiStoreBf16{w.r[0].c, w.n, true}, FlagGate{w.r[0].flags, kFlagPerTile, 1},
                             w.move(0, AgMover::kPullVec, 1), nullptr) == Status::kInvalidArgument);
}

TEST_CASE("ag_gemm fused: a push to a peer that never starts times out naming the clear-to-send flag") {
  require_hopper();
  Ranks w(4, 256, 256, 256);
  WEFT_CUDA_OK(cudaSetDevice(w.r[0].dev));
  w.r[0].frame.set_timeout(0.2);
  cudaEvent_t t0, t1;
  WEFT_CUDA_OK(cudaEventCreate(&t0));
  WEFT_CUDA_OK(cudaEventCreate(&t1));
  WEFT_CUDA_OK(cudaEventRecord(t0, w.r[0].s));
  REQUIRE(w.launch(0, AgMover::kPushVec, roles_of(0, 2), 1) == Status::kOk);
  WEFT_CUDA_OK(cudaEventRecord(t1, w.r[0].s));
  WEFT_CUDA_OK(cudaStreamSynchronize(w.r[0].s));
  float ms = 0;
  WEFT_CUDA_OK(cudaEventElapsedTime(&ms, t0, t1));
  CHECK(ms >= 150);
  CHECK(ms < 5000);
  CHECK(w.r[0].frame.check("ag_gemm push timeout test") == Status::kTimeout);
  const DeviceError& e = w.r[0].frame.record();
  CHECK(e.kind == int32_t(DeviceErrorKind::kFlagTimeout));
  CHECK(e.rank == 0);
  CHECK(e.role == int32_t(weft::Role::kIntraComm));
  // Rank 0 pushes to rank 3 first (the rank that computes on shard 0 next) and waits for its word.
  CHECK(e.flag_index == int32_t(w.move(0, AgMover::kPushVec, 1).cts_offset() + 3));
  CHECK(e.expected == 1);
  CHECK(e.seen == 0);
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
}

TEST_CASE("split-k pair: two K halves on two halves of the grid, then fp32 -> bf16 into a column block") {
  const int sms = require_hopper();
  WEFT_CUDA_OK(cudaSetDevice(0));
  const int m = 512, n = 640, k = 1040, ldc = 1024, col0 = 256;  // C's columns [256, 896) of 1024
  bf16 *a, *b, *c;
  float *acc, *ref;
  WEFT_CUDA_OK(cudaMalloc(&a, size_t(m) * k * 2));
  WEFT_CUDA_OK(cudaMalloc(&b, size_t(n) * k * 2));
  WEFT_CUDA_OK(cudaMalloc(&c, size_t(m) * ldc * 2));
  WEFT_CUDA_OK(cudaMalloc(&acc, size_t(m) * n * 4));
  WEFT_CUDA_OK(cudaMalloc(&ref, size_t(m) * n * 4));
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  random_bf16(a, int64_t(m) * k, seed);
  random_bf16(b, int64_t(n) * k, seed + 1);
  poison_bf16(c, int64_t(m) * ldc);
  WEFT_CUDA_OK(cudaMemset(acc, 0, size_t(m) * n * 4));
  GemmParams half[2];
  for (int h = 0; h < 2; ++h) {
    GemmArgs args;
    args.m = m, args.n = n, args.k = k / 2, args.lda = k, args.ldb = k;
    args.a = a + h * k / 2, args.b = b + h * k / 2;
    REQUIRE(make_gemm_params(args, &half[h]) == Status::kOk);
  }
  FrameHost frame;
  REQUIRE(frame.create(0) == Status::kOk);
  FrameParams fp;
  REQUIRE(frame.params(roles_of(sms - sms % 2, 0), &fp) == Status::kOk);
  for (int rep = 0; rep < 2; ++rep) {  // the pass leaves acc zeroed for the next launch
    REQUIRE(launch_split_k_pair(half[0], half[1], fp, acc, nullptr) == Status::kOk);
    REQUIRE(launch_acc_to_bf16(acc, m, n, c + col0, ldc, nullptr) == Status::kOk);
    WEFT_CUDA_OK(cudaDeviceSynchronize());
    REQUIRE(frame.check("split-k test") == Status::kOk);
  }
  // Compare row by row through a packed copy of the column block.
  bf16* packed;
  WEFT_CUDA_OK(cudaMalloc(&packed, size_t(m) * n * 2));
  WEFT_CUDA_OK(
      cudaMemcpy2D(packed, size_t(n) * 2, c + col0, size_t(ldc) * 2, size_t(n) * 2, m, cudaMemcpyDeviceToDevice));
  reference(a, b, nullptr, ref, m, n, k);
  Compared cmp = compare(packed, ref, int64_t(m) * n);
  CHECK(cmp.bad == 0);
  CHECK(cmp.rel_err < 4e-3);
  std::vector<float> h(size_t(m) * n);
  WEFT_CUDA_OK(cudaMemcpy(h.data(), acc, h.size() * 4, cudaMemcpyDeviceToHost));
  size_t nonzero = 0;
  for (float x : h) nonzero += x != 0.f;
  CHECK(nonzero == 0);
  // Columns outside the block stay untouched (poison).
  std::vector<uint16_t> row(ldc);
  WEFT_CUDA_OK(cudaMemcpy(row.data(), c, size_t(ldc) * 2, cudaMemcpyDeviceToHost));
  CHECK(row[col0 - 1] == 0xFFFF);
  CHECK(row[col0 + n] == 0xFFFF);
  for (void* p : {(void*)a, (void*)b, (void*)c, (void*)acc, (void*)ref, (void*)packed}) cudaFree(p);
}
