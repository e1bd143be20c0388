// GPU test of the mover SMs of GEMM+RS/AR (launch_piece_push) with the owners simulated by buffers
// on one GPU. A stand-in for the GEMM holds every SM but the movers' (one block per SM), writes each
// piece's rows and then raises its tile count, one piece at a time, and waits (bounded) until the
// movers report every piece landed: the movers must run beside it, copy only after a piece's count,
// copy exactly their rows into the right owner's slot, and count one per block. A count that never
// completes, or an owner that never frees its slots, ends in a bounded wait that names owner and
// piece. Exits 77 (skipped) where no Hopper GPU is visible.
#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#include "kernels/piece_push.h"
#include "tests/kernels/gemm_testing.cuh"

using namespace weft::kernels;
using namespace weft::kernels::testing;
using weft::RoleCounts;
using weft::Status;

namespace {

constexpr int kOwners = 3;  // simulated ranks: this one (0) sends to owners 1 and 2
constexpr int kPieces = 2;
constexpr int64_t kRows = 64;  // rows of a piece
constexpr int64_t kCols = 1000;
constexpr int64_t kPieceElems = kRows * kCols;

__device__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Piece (o, j) of this rank's partial: its integer part says which piece it is, noise below, so a
// piece copied into another's place or before it was written shows.
__device__ __nv_bfloat16 payload(int o, int j, int64_t i, uint64_t seed) {
  const float u = float(hash32(seed * 0x9E3779B97F4A7C15ull + uint64_t(i)) >> 8) * (1.0f / 8388608.0f);
  return __float2bfloat16_rn(float(o * kPieces + j + 1) * ((i & 1) ? 1.0f : -1.0f) + u * 0.5f);
}

// The GEMM's stand-in: `grid` blocks of one SM each (the shared memory sees to that). Block 0 writes
// each piece (in step order, 30 us apart) and then releases its count; then every block waits for
// every piece's landed word to reach `blocks_expected`; ok[block] = 1 when they all did.
__global__ void producer(__nv_bfloat16* partial, uint64_t* tiles, const uint64_t* landed, int steps,
                         const int* step_owner, const int* step_piece, uint64_t tiles_at, uint64_t blocks_expected,
                         uint64_t seed, int* ok) {
  extern __shared__ char hold[];
  if (blockIdx.x == 0) {
    for (int s = 0; s < steps; ++s) {
      const int o = step_owner[s], j = step_piece[s];
      __nv_bfloat16* p = partial + (int64_t(o) * kPieces + j) * kPieceElems;
      for (int64_t i = threadIdx.x; i < kPieceElems; i += blockDim.x) p[i] = payload(o, j, i, seed);
      __syncthreads();
      if (threadIdx.x == 0) {
        const uint64_t t0 = now_ns();
        while (now_ns() - t0 < 30000) {
        }
        __threadfence();
        atomicExch(reinterpret_cast<unsigned long long*>(tiles + o * kPieces + j), tiles_at);
      }
      __syncthreads();
    }
  }
  if (threadIdx.x == 0) {
    hold[0] = 1;
    bool all = true;
    const uint64_t t0 = now_ns();
    for (int s = 0; s < steps && all; ++s) {
      const volatile uint64_t* w = landed + step_owner[s] * kPieces + step_piece[s];
      while (*w < blocks_expected && now_ns() - t0 < 2000000000ull) {
      }
      all = *w >= blocks_expected;
    }
    ok[blockIdx.x] = all ? 1 : 0;
  }
}

struct Setup {
  int sms = require_hopper();  // first: exits 77 before any allocation where no Hopper GPU is visible
  DevBuf<__nv_bfloat16> partial{int64_t(kOwners) * kPieces * kPieceElems};
  DevBuf<__nv_bfloat16> slots{int64_t(kOwners) * kPieces * kPieceElems};  // owner o's slot of this rank
  DevBuf<uint64_t> tiles{kOwners * kPieces};
  DevBuf<uint64_t> landed{kOwners * kPieces};  // [o * S + j]: stands for owner o's word of this rank's piece j
  DevBuf<uint64_t> freed{kOwners};
  FrameHost frame;
  FrameParams fp;
  explicit Setup(double timeout_s) {
    for (auto* w : {tiles.p, landed.p}) WEFT_CUDA_OK(cudaMemset(w, 0, sizeof(uint64_t) * kOwners * kPieces));
    WEFT_CUDA_OK(cudaMemset(freed.p, 0, sizeof(uint64_t) * kOwners));
    poison_bf16(partial.p, int64_t(kOwners) * kPieces * kPieceElems);
    poison_bf16(slots.p, int64_t(kOwners) * kPieces * kPieceElems);
    WEFT_CUDA_OK(cudaDeviceSynchronize());
    REQUIRE(frame.create(0) == Status::kOk);
    frame.set_timeout(timeout_s);
    RoleCounts roles;
    roles.intra_comm = 1;
    REQUIRE(frame.params(roles, &fp) == Status::kOk);
  }
  __nv_bfloat16* piece(__nv_bfloat16* base, int o, int j) { return base + (int64_t(o) * kPieces + j) * kPieceElems; }
  // Steps for owners 1 and 2, piece by piece; the movers take the last `rows` rows of each.
  PiecePushParams params(int64_t rows, uint64_t tiles_at, uint64_t clear_at) {
    PiecePushParams p;
    for (int j = 0; j < kPieces; ++j)
      for (int o = 1; o < kOwners; ++o) {
        PiecePushStep& s = p.step[p.steps++];
        const int64_t skip = (kRows - rows) * kCols;
        s.src = piece(partial.p, o, j) + skip;
        s.dst = piece(slots.p, o, j) + skip;
        s.elems = rows * kCols;
        s.ready = tiles.p + o * kPieces + j;
        s.ready_at = tiles_at;
        s.clear = freed.p + o;
        s.clear_at = clear_at;
        s.landed = landed.p + o * kPieces + j;
        s.owner = o;
        s.piece = j;
        s.ready_index = o * kPieces + j;
        s.clear_index = o;
      }
    return p;
  }
};

}  // namespace

TEST_CASE("piece push: beside a kernel holding the other SMs, each owner gets exactly its rows, after their count") {
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  Setup t(2.0);
  const int movers = 4;
  const int64_t rows = 24;  // of 64: the copy engines' 40 rows stay untouched here
  const PiecePushParams p = t.params(rows, 7, 0);
  std::vector<int> owner(size_t(p.steps)), pc(size_t(p.steps));
  for (int s = 0; s < p.steps; ++s) owner[size_t(s)] = p.step[s].owner, pc[size_t(s)] = p.step[s].piece;
  DevBuf<int> d_owner(p.steps), d_piece(p.steps), ok(t.sms);
  WEFT_CUDA_OK(cudaMemcpy(d_owner.p, owner.data(), owner.size() * sizeof(int), cudaMemcpyHostToDevice));
  WEFT_CUDA_OK(cudaMemcpy(d_piece.p, pc.data(), pc.size() * sizeof(int), cudaMemcpyHostToDevice));
  WEFT_CUDA_OK(cudaMemset(ok.p, 0, sizeof(int) * t.sms));
  const int hold = 200 * 1024;  // one producer block per SM
  WEFT_CUDA_OK(cudaFuncSetAttribute(producer, cudaFuncAttributeMaxDynamicSharedMemorySize, hold));
  REQUIRE(prepare_piece_push() == Status::kOk);  // never loaded while the producer runs
  cudaStream_t gemm = nullptr, move = nullptr;
  WEFT_CUDA_OK(cudaStreamCreateWithFlags(&gemm, cudaStreamNonBlocking));
  WEFT_CUDA_OK(cudaStreamCreateWithFlags(&move, cudaStreamNonBlocking));
  const int producers = t.sms - movers;
  producer<<<producers, 256, hold, gemm>>>(t.partial.p, t.tiles.p, t.landed.p, p.steps, d_owner.p, d_piece.p, 7, movers,
                                           seed, ok.p);
  REQUIRE(launch_piece_push(p, t.fp, movers, move) == Status::kOk);
  WEFT_CUDA_OK(cudaDeviceSynchronize());
  CHECK(t.frame.check("piece push test") == Status::kOk);
  const std::vector<int> oks = to_host(ok.p, producers);
  int seen = 0;
  for (int v : oks) seen += v;
  CHECK(seen == producers);  // the movers ran beside the producer and every landed word reached 4

  const std::vector<__nv_bfloat16> src = to_host(t.partial.p, int64_t(kOwners) * kPieces * kPieceElems);
  const std::vector<__nv_bfloat16> dst = to_host(t.slots.p, int64_t(kOwners) * kPieces * kPieceElems);
  int64_t wrong = 0, touched = 0, checked = 0;
  for (int o = 0; o < kOwners; ++o)
    for (int j = 0; j < kPieces; ++j)
      for (int64_t i = 0; i < kPieceElems; ++i) {
        const size_t at = size_t((int64_t(o) * kPieces + j) * kPieceElems + i);
        const bool mover_row = o != 0 && i >= (kRows - rows) * kCols;
        uint16_t have, want, poison = 0xFFFF;
        memcpy(&have, &dst[at], 2);
        memcpy(&want, &src[at], 2);
        if (mover_row) {
          ++checked;
          if (have != want) ++wrong;
        } else if (have != poison) {
          ++touched;
        }
      }
  CHECK(checked == int64_t(kPieces) * (kOwners - 1) * rows * kCols);
  CHECK(wrong == 0);    // every mover row equals the piece's payload, written before its count
  CHECK(touched == 0);  // the copy engines' rows and this rank's own slot stay as they were
  const std::vector<uint64_t> landed = to_host(t.landed.p, kOwners * kPieces);
  for (int o = 0; o < kOwners; ++o)
    for (int j = 0; j < kPieces; ++j) CHECK(landed[size_t(o * kPieces + j)] == (o == 0 ? 0u : uint64_t(movers)));
  cudaStreamDestroy(gemm);
  cudaStreamDestroy(move);
}

TEST_CASE("piece push: a count that never completes, or slots never freed, end in a bounded wait naming the piece") {
  Setup t(0.2);
  const uint64_t counts[kOwners * kPieces] = {0, 0, 5, 5, 5, 4};  // owner 2's piece 1 one tile short
  WEFT_CUDA_OK(cudaMemcpy(t.tiles.p, counts, sizeof counts, cudaMemcpyHostToDevice));
  REQUIRE(launch_piece_push(t.params(8, 5, 0), t.fp, 2, nullptr) == Status::kOk);
  WEFT_CUDA_OK(cudaDeviceSynchronize());
  CHECK(t.frame.check("piece push test (expected timeout)") == Status::kTimeout);
  const DeviceError& e = t.frame.record();
  CHECK(e.role == int32_t(weft::Role::kIntraComm));
  CHECK(e.tile_m == 1);  // piece
  CHECK(e.tile_n == 2);  // owner
  CHECK(e.flag_index == 2 * kPieces + 1);
  CHECK(e.expected == 5);
  CHECK(e.seen == 4);
  const std::vector<uint64_t> landed = to_host(t.landed.p, kOwners * kPieces);
  CHECK(landed[size_t(1 * kPieces + 1)] == 2);  // the pieces before it landed
  CHECK(landed[size_t(2 * kPieces + 1)] == 0);

  // Epoch 2 needs owner 1 to have read its slots of epoch 1 (freed[1] >= 1); it never does.
  FrameParams fp;
  RoleCounts roles;
  roles.intra_comm = 1;
  REQUIRE(t.frame.params(roles, &fp) == Status::kOk);
  REQUIRE(launch_piece_push(t.params(8, 5, 1), fp, 2, nullptr) == Status::kOk);
  WEFT_CUDA_OK(cudaDeviceSynchronize());
  CHECK(t.frame.check("piece push test (expected timeout)") == Status::kTimeout);
  CHECK(t.frame.record().tile_n == 1);
  CHECK(t.frame.record().flag_index == 1);  // freed[owner]
  CHECK(t.frame.record().expected == 1);
}

TEST_CASE("piece push: misaligned rows or too many steps are refused before anything runs") {
  Setup t(0.2);
  PiecePushParams p = t.params(8, 1, 0);
  p.step[1].dst = p.step[1].dst + 1;  // 2 bytes off the 16-byte grid
  CHECK(launch_piece_push(p, t.fp, 2, nullptr) == Status::kInvalidArgument);
  p = t.params(8, 1, 0);
  p.steps = PiecePushParams::kMaxSteps + 1;
  CHECK(launch_piece_push(p, t.fp, 2, nullptr) == Status::kInvalidArgument);
  CHECK(launch_piece_push(t.params(8, 1, 0), t.fp, 0, nullptr) == Status::kInvalidArgument);
  WEFT_CUDA_OK(cudaDeviceSynchronize());
  CHECK(t.frame.check("piece push test") == Status::kOk);
}
