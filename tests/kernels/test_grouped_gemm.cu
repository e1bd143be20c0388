// GPU tests of the grouped GEMM over device-side expert counts (kernels/grouped_gemm.h) and of the
// SwiGLU expert FFN built from it (gate/up with the fused SiLU epilogue, then down): fresh random
// inputs, poisoned outputs, every expert's rows against the fp32 reference GEMM of
// gemm_testing.cuh, padding rows left untouched. Exits 77 (skipped) without a Hopper GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/grouped_gemm.h"
#include "kernels/moe_plan.h"
#include "kernels/moe_router.h"
#include "tests/kernels/gemm_testing.cuh"

using namespace weft::kernels;
using namespace weft::kernels::testing;
using weft::RoleCounts;
using weft::Status;

namespace {

// Device counts and offsets for host counts; returns the host offsets.
std::vector<int32_t> upload_counts(const std::vector<int32_t>& counts, DevBuf<int32_t>& d_counts,
                                   DevBuf<int32_t>& d_offsets) {
  const int32_t e = int32_t(counts.size());
  WEFT_CUDA_OK(cudaMemcpy(d_counts.p, counts.data(), size_t(e) * 4, cudaMemcpyHostToDevice));
  WEFT_CUDA_OK(cudaMemset(d_offsets.p, 0x5A, size_t(e + 1) * 4));
  REQUIRE(launch_moe_offsets(d_counts.p, e, d_offsets.p, nullptr) == Status::kOk);
  std::vector<int32_t> off(e + 1);
  moe_expert_offsets(counts.data(), e, kMoeTileRows, off.data());
  WEFT_CUDA_OK(cudaDeviceSynchronize());
  REQUIRE(to_host(d_offsets.p, e + 1) == off);  // the device's offsets are the plan's
  return off;
}

// Every padding row (past an expert's count, before the next expert) is still poison (NaN).
void require_padding_untouched(const __nv_bfloat16* y, int64_t ldy, const std::vector<int32_t>& counts,
                               const std::vector<int32_t>& off) {
  const std::vector<__nv_bfloat16> h = to_host(y, int64_t(off.back()) * ldy);
  for (size_t e = 0; e < counts.size(); ++e)
    for (int64_t r = off[e] + counts[e]; r < off[e + 1]; ++r)
      for (int64_t c = 0; c < ldy; c += 7) {
        uint16_t bits;
        std::memcpy(&bits, &h[size_t(r * ldy + c)], 2);
        CAPTURE(e);
        CAPTURE(r);
        REQUIRE(bits == 0xFFFF);
      }
}

struct Runner {
  FrameHost frame;
  FrameParams fp;
  int sms = 0;
  // blocks > 0: that many persistent blocks instead of one per SM (a block then runs many units in
  // a row: staging boxes reused across units, a producer waiting for its own consumers' counts).
  explicit Runner(int blocks = 0) {
    sms = require_hopper();
    REQUIRE(frame.create(0) == Status::kOk);
    RoleCounts roles;
    roles.compute = blocks > 0 ? std::min(blocks, sms) : sms;
    REQUIRE(frame.params(roles, &fp) == Status::kOk);
  }
  // store_tma 0: every tile stored from registers (the halves whose rows are all one expert's
  // otherwise leave through TMA).
  void run(const GroupedGemmArgs& a, const char* what, int32_t store_tma = 1) {
    GroupedGemmParams p;
    REQUIRE(make_grouped_gemm_params(a, &p) == Status::kOk);
    p.store_tma = store_tma;
    REQUIRE(launch_grouped_gemm(p, fp, nullptr) == Status::kOk);
    WEFT_CUDA_OK(cudaDeviceSynchronize());
    REQUIRE(frame.check(what) == Status::kOk);
  }
};

// Y_e = X_e W_e^T for the given counts, against the reference GEMM expert by expert.
void check_grouped(const std::vector<int32_t>& counts, int n, int k, int64_t extra_capacity_tiles = 0, int blocks = 0) {
  const int32_t experts = int32_t(counts.size());
  CAPTURE(experts);
  CAPTURE(n);
  CAPTURE(k);
  CAPTURE(blocks);
  Runner rn(blocks);
  DevBuf<int32_t> d_counts(experts), d_off(experts + 1), dropped(1);
  const std::vector<int32_t> off = upload_counts(counts, d_counts, d_off);
  const int64_t cap = off.back() + (extra_capacity_tiles + 1) * kMoeTileRows;  // never 0
  DevBuf<__nv_bfloat16> x(cap * k), w(int64_t(experts) * n * k), y(cap * n);
  DevBuf<float> ref(cap * n);
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  random_bf16(x.p, cap * k, seed);
  random_bf16(w.p, int64_t(experts) * n * k, seed + 1);
  poison_bf16(y.p, cap * n);
  WEFT_CUDA_OK(cudaMemset(dropped.p, 0, 4));
  GroupedGemmArgs a;
  a.experts = experts, a.capacity_rows = cap, a.n = n, a.k = k;
  a.x = x.p, a.w = w.p, a.counts = d_counts.p, a.offsets = d_off.p, a.y = y.p, a.dropped = dropped.p;
  rn.run(a, "grouped gemm test");
  REQUIRE(to_host(dropped.p, 1)[0] == 0);
  for (int32_t e = 0; e < experts; ++e) {
    if (counts[e] == 0) continue;
    CAPTURE(e);
    reference(x.p + int64_t(off[e]) * k, w.p + int64_t(e) * n * k, nullptr, ref.p, counts[e], n, k);
    const Compared cmp = compare(y.p + int64_t(off[e]) * n, ref.p, int64_t(counts[e]) * n);
    MESSAGE("expert " << e << " rows " << counts[e] << ": rel err " << cmp.rel_err);
    REQUIRE(cmp.bad == 0);
    REQUIRE(cmp.rel_err < 1e-2);
  }
  require_padding_untouched(y.p, n, counts, off);
  // Stored from registers only: the same bits (the TMA store rounds as the register store does).
  const std::vector<__nv_bfloat16> y_tma = to_host(y.p, int64_t(off.back()) * n);
  poison_bf16(y.p, cap * n);
  rn.run(a, "grouped gemm test, register stores", 0);
  const std::vector<__nv_bfloat16> y_reg = to_host(y.p, int64_t(off.back()) * n);
  for (int32_t e = 0; e < experts; ++e) {
    CAPTURE(e);
    const size_t yb = size_t(off[e]) * n;
    REQUIRE(std::memcmp(&y_reg[yb], &y_tma[yb], size_t(counts[e]) * n * 2) == 0);
  }
  require_padding_untouched(y.p, n, counts, off);
}

__global__ void swiglu_reference(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    out[i] = g / (1.f + expf(-g)) * up[i];
  }
}

// The expert FFN: H = SiLU(X Wg^T) * (X Wu^T) (fused epilogue over interleaved weights), Y = H W2^T.
void check_swiglu(const std::vector<int32_t>& counts, int hidden, int ffn, int blocks = 0) {
  const int32_t experts = int32_t(counts.size());
  CAPTURE(experts);
  CAPTURE(hidden);
  CAPTURE(ffn);
  CAPTURE(blocks);
  Runner rn(blocks);
  DevBuf<int32_t> d_counts(experts), d_off(experts + 1), dropped(1);
  const std::vector<int32_t> off = upload_counts(counts, d_counts, d_off);
  const int64_t cap = off.back() + kMoeTileRows;
  DevBuf<__nv_bfloat16> x(cap * hidden), wg(int64_t(experts) * ffn * hidden), wu(int64_t(experts) * ffn * hidden);
  DevBuf<__nv_bfloat16> w13(int64_t(experts) * 2 * ffn * hidden), w2(int64_t(experts) * hidden * ffn);
  DevBuf<__nv_bfloat16> h(cap * ffn), y(cap * hidden);
  DevBuf<float> rg(cap * ffn), ru(cap * ffn), rh(cap * ffn), ry(cap * hidden);
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  random_bf16(x.p, cap * hidden, seed);
  random_bf16(wg.p, int64_t(experts) * ffn * hidden, seed + 1, 0.1f);
  random_bf16(wu.p, int64_t(experts) * ffn * hidden, seed + 2, 0.1f);
  random_bf16(w2.p, int64_t(experts) * hidden * ffn, seed + 3, 0.1f);
  REQUIRE(launch_interleave_gate_up(wg.p, wu.p, experts, ffn, hidden, w13.p, nullptr) == Status::kOk);
  poison_bf16(h.p, cap * ffn);
  poison_bf16(y.p, cap * hidden);
  WEFT_CUDA_OK(cudaMemset(dropped.p, 0, 4));
  GroupedGemmArgs up;
  up.experts = experts, up.capacity_rows = cap, up.n = 2 * ffn, up.k = hidden;
  up.x = x.p, up.w = w13.p, up.counts = d_counts.p, up.offsets = d_off.p, up.y = h.p, up.dropped = dropped.p;
  up.epilogue = GroupedEpilogue::kSwiGlu;
  rn.run(up, "grouped gemm gate/up");
  GroupedGemmArgs down = up;
  down.n = hidden, down.k = ffn, down.x = h.p, down.w = w2.p, down.y = y.p, down.epilogue = GroupedEpilogue::kStore;
  rn.run(down, "grouped gemm down");
  REQUIRE(to_host(dropped.p, 1)[0] == 0);
  for (int32_t e = 0; e < experts; ++e) {
    if (counts[e] == 0) continue;
    CAPTURE(e);
    const __nv_bfloat16* xe = x.p + int64_t(off[e]) * hidden;
    reference(xe, wg.p + int64_t(e) * ffn * hidden, nullptr, rg.p, counts[e], ffn, hidden);
    reference(xe, wu.p + int64_t(e) * ffn * hidden, nullptr, ru.p, counts[e], ffn, hidden);
    swiglu_reference<<<256, 256>>>(rg.p, ru.p, int64_t(counts[e]) * ffn, rh.p);
    const Compared ch = compare(h.p + int64_t(off[e]) * ffn, rh.p, int64_t(counts[e]) * ffn);
    // Down against the reference on weft's own H (each GEMM checked on its own inputs).
    reference(h.p + int64_t(off[e]) * ffn, w2.p + int64_t(e) * hidden * ffn, nullptr, ry.p, counts[e], hidden, ffn);
    const Compared cy = compare(y.p + int64_t(off[e]) * hidden, ry.p, int64_t(counts[e]) * hidden);
    MESSAGE("expert " << e << " rows " << counts[e] << ": H rel err " << ch.rel_err << ", Y rel err " << cy.rel_err);
    REQUIRE(ch.bad == 0);
    REQUIRE(ch.rel_err < 1e-2);
    REQUIRE(cy.bad == 0);
    REQUIRE(cy.rel_err < 1e-2);
  }
  require_padding_untouched(h.p, ffn, counts, off);
  require_padding_untouched(y.p, hidden, counts, off);

  // The same FFN in one launch (a down tile waits for its H tile's gate/up units): the same bits,
  // the padding still unwritten; twice, so the tile counters start from zero on every call; a third
  // time with every tile stored from registers (each TMA-stored half counts its 4 warps at once).
  const std::vector<__nv_bfloat16> h2 = to_host(h.p, int64_t(off.back()) * ffn);
  const std::vector<__nv_bfloat16> y2 = to_host(y.p, int64_t(off.back()) * hidden);
  GroupedGemmParams pu, pd;
  REQUIRE(make_grouped_gemm_params(up, &pu) == Status::kOk);
  REQUIRE(make_grouped_gemm_params(down, &pd) == Status::kOk);
  DevBuf<uint64_t> tile_done(pu.capacity_tiles + 1);
  for (int call = 0; call < 3; ++call) {
    CAPTURE(call);
    poison_bf16(h.p, cap * ffn);
    poison_bf16(y.p, cap * hidden);
    GroupedGemmParams u = pu, d = pd;
    if (call == 2) u.store_tma = d.store_tma = 0;
    REQUIRE(launch_grouped_ffn(u, d, tile_done.p, rn.fp, nullptr) == Status::kOk);
    WEFT_CUDA_OK(cudaDeviceSynchronize());
    REQUIRE(rn.frame.check("grouped ffn in one launch") == Status::kOk);
    const std::vector<__nv_bfloat16> h1 = to_host(h.p, int64_t(off.back()) * ffn);
    const std::vector<__nv_bfloat16> y1 = to_host(y.p, int64_t(off.back()) * hidden);
    for (int32_t e = 0; e < experts; ++e) {
      CAPTURE(e);
      const size_t hb = size_t(off[e]) * ffn, yb = size_t(off[e]) * hidden;
      REQUIRE(std::memcmp(&h1[hb], &h2[hb], size_t(counts[e]) * ffn * 2) == 0);
      REQUIRE(std::memcmp(&y1[yb], &y2[yb], size_t(counts[e]) * hidden * 2) == 0);
    }
    require_padding_untouched(h.p, ffn, counts, off);
    require_padding_untouched(y.p, hidden, counts, off);
  }

  // Split over K (enable_grouped_split), which the kernel does where the rules say so for these
  // counts (kernels/grouped_ring.cuh, phases_of): gate/up's last wave where every row tile is in one
  // raster group (moe_up_tail_parts), down's pairs where they fit one wave (moe_split_parts), two
  // slots per block as the op gives them. The launch records the most parts it took (LaunchRecord::
  // parts), which must be the rules' as the host computes them; H and Y are checked against the
  // reference (Y on weft's H), keep the unsplit bits where no split feeds them (where one does, a
  // small split tile may round to the same bits), a second call repeats the first's bits (each launch
  // leaves the arrival words zero), and the padding stays unwritten. Then with gate/up's last wave kept
  // whole (split_tail = 0, benchmarks only): H keeps the unsplit bits.
  const int32_t m_tiles = off.back() / kMoeTileRows, nblk = rn.fp.roles.compute, slots = 2 * nblk;
  int64_t first_split = 0;
  const int64_t units0 = int64_t(m_tiles) * pu.n_blocks;
  const int32_t parts_up =
      moe_up_tail_parts(units0, m_tiles, pu.group_m, pu.k_iters, nblk, slots, kMoeMaxSplit, &first_split);
  const int64_t used = parts_up > 1 ? (units0 - first_split) * parts_up : 0;
  const int64_t tiles = int64_t(m_tiles) * pd.n_blocks;
  const int32_t parts = moe_split_parts(tiles, pd.k_iters, nblk, int32_t(slots - used));
  const int32_t parts_alone = moe_split_parts(tiles, pd.k_iters, nblk, slots);
  CAPTURE(parts_up);
  CAPTURE(parts);
  CAPTURE(parts_alone);
  DevBuf<uint8_t> split_mem(grouped_split_bytes(slots));
  GroupedGemmParams ds = pd;
  REQUIRE(enable_grouped_split(&ds, split_mem.p, slots) == Status::kOk);
  std::vector<__nv_bfloat16> first_h, first_y;
  DevBuf<LaunchRecord> rec(1);
  FrameParams fpr = rn.fp;
  fpr.launch = rec.p;
  for (int call = 0; call < 3; ++call) {
    CAPTURE(call);
    const bool whole_tail = call == 2;
    GroupedGemmParams d = ds;
    if (whole_tail) d.split_tail = 0;
    poison_bf16(h.p, cap * ffn);
    poison_bf16(y.p, cap * hidden);
    WEFT_CUDA_OK(cudaMemset(rec.p, 0, sizeof(LaunchRecord)));
    REQUIRE(launch_grouped_ffn(pu, d, tile_done.p, fpr, nullptr) == Status::kOk);
    WEFT_CUDA_OK(cudaDeviceSynchronize());
    REQUIRE(rn.frame.check("grouped ffn, split over K") == Status::kOk);
    CHECK(to_host(rec.p, 1)[0].parts == (whole_tail ? parts_alone : std::max(parts_up, parts)));
    const std::vector<__nv_bfloat16> h1 = to_host(h.p, int64_t(off.back()) * ffn);
    const std::vector<__nv_bfloat16> y1 = to_host(y.p, int64_t(off.back()) * hidden);
    bool h_differs = false, y_differs = false;
    for (int32_t e = 0; e < experts; ++e) {
      if (counts[e] == 0) continue;
      CAPTURE(e);
      const size_t hb = size_t(off[e]) * ffn, yb = size_t(off[e]) * hidden;
      h_differs = h_differs || std::memcmp(&h1[hb], &h2[hb], size_t(counts[e]) * ffn * 2) != 0;
      y_differs = y_differs || std::memcmp(&y1[yb], &y2[yb], size_t(counts[e]) * hidden * 2) != 0;
      const __nv_bfloat16* xe = x.p + int64_t(off[e]) * hidden;
      reference(xe, wg.p + int64_t(e) * ffn * hidden, nullptr, rg.p, counts[e], ffn, hidden);
      reference(xe, wu.p + int64_t(e) * ffn * hidden, nullptr, ru.p, counts[e], ffn, hidden);
      swiglu_reference<<<256, 256>>>(rg.p, ru.p, int64_t(counts[e]) * ffn, rh.p);
      const Compared ch = compare(h.p + int64_t(off[e]) * ffn, rh.p, int64_t(counts[e]) * ffn);
      REQUIRE(ch.bad == 0);
      REQUIRE(ch.rel_err < 1e-2);
      reference(h.p + int64_t(off[e]) * ffn, w2.p + int64_t(e) * hidden * ffn, nullptr, ry.p, counts[e], hidden, ffn);
      const Compared cy = compare(y.p + int64_t(off[e]) * hidden, ry.p, int64_t(counts[e]) * hidden);
      REQUIRE(cy.bad == 0);
      REQUIRE(cy.rel_err < 1e-2);
    }
    const bool up_split = !whole_tail && parts_up > 1;
    if (!up_split) CHECK(!h_differs);
    if (!up_split && (whole_tail ? parts_alone : parts) == 1) CHECK(!y_differs);
    if (call == 0) first_h = h1, first_y = y1;
    for (int32_t e = 0; call == 1 && e < experts; ++e) {  // expert rows only: the padding is NaN poison
      CAPTURE(e);
      const size_t hb = size_t(off[e]) * ffn, yb = size_t(off[e]) * hidden;
      REQUIRE(std::memcmp(&h1[hb], &first_h[hb], size_t(counts[e]) * ffn * 2) == 0);
      REQUIRE(std::memcmp(&y1[yb], &first_y[yb], size_t(counts[e]) * hidden * 2) == 0);
    }
    require_padding_untouched(h.p, ffn, counts, off);
    require_padding_untouched(y.p, hidden, counts, off);
  }
}

}  // namespace

TEST_CASE("grouped gemm: counts not multiples of 128, empty experts") {
  check_grouped({300, 0, 128, 1, 555, 0, 129, 77}, 512, 512);
  check_grouped({300, 0, 128, 1, 555, 0, 129, 77}, 776, 520);  // n, k not multiples of the tile
}

TEST_CASE("grouped gemm: few blocks, odd store boxes per unit, halves exactly full") {
  // n = 320: the last column block stores one 64-column box, so a block's units alternate odd and
  // even box counts; counts 64 and 192 end on a half's last row (stored by TMA), 65 just after it.
  for (int blocks : {1, 2}) check_grouped({64, 192, 65, 0, 300, 128}, 320, 64, 0, blocks);
  check_grouped({64, 192, 65, 0, 300, 128}, 448, 128, 0, 3);  // n % 256 = 192: three boxes
}

TEST_CASE("grouped gemm: all tokens to one expert, and no token at all") {
  check_grouped({0, 0, 4096 * 2 + 3, 0}, 1024, 256);
  check_grouped({0, 0, 0, 0, 0, 0, 0, 0}, 512, 256, 2);  // nothing to do: y stays poison
}

TEST_CASE("grouped gemm: random counts over many experts, fresh each run") {
  std::mt19937 rng(std::random_device{}());
  std::vector<int32_t> counts(64);
  for (auto& c : counts) c = rng() % 5 == 0 ? 0 : int32_t(rng() % 300);
  check_grouped(counts, 768, 1024);
}

TEST_CASE("grouped gemm: routed rows beyond the capacity are counted, not lost silently") {
  Runner rn;
  const std::vector<int32_t> counts = {200, 200};  // 512 padded rows
  DevBuf<int32_t> d_counts(2), d_off(3), dropped(1);
  upload_counts(counts, d_counts, d_off);
  DevBuf<__nv_bfloat16> x(256 * 64), w(2 * 256 * 64), y(256 * 256);
  random_bf16(x.p, 256 * 64, fresh_seed());
  random_bf16(w.p, 2 * 256 * 64, fresh_seed());
  WEFT_CUDA_OK(cudaMemset(dropped.p, 0, 4));
  GroupedGemmArgs a;
  a.experts = 2, a.capacity_rows = 256, a.n = 256, a.k = 64;
  a.x = x.p, a.w = w.p, a.counts = d_counts.p, a.offsets = d_off.p, a.y = y.p, a.dropped = dropped.p;
  rn.run(a, "grouped gemm overflow");
  CHECK(to_host(dropped.p, 1)[0] == 512 - 256);
}

TEST_CASE("grouped gemm: SwiGLU expert FFN (gate/up fused SiLU, then down; two launches and one)") {
  check_swiglu({300, 0, 128, 1, 555, 0, 129, 77}, 512, 384);
  check_swiglu({0, 1000, 0, 0}, 1024, 768);  // all tokens to one expert; Qwen3's ffn
  const uint64_t seed = fresh_seed();
  CAPTURE(seed);
  std::mt19937 rng{uint32_t(seed)};
  std::vector<int32_t> counts(32);  // many row tiles: down units of one tile run on other SMs than its gate/up
  for (auto& c : counts) c = rng() % 4 == 0 ? 0 : int32_t(rng() % 700);
  check_swiglu(counts, 768, 1024);
  // One and two blocks: a block's producer waits for its own consumers' gate/up counts (deferred
  // behind their next unit's first k-block, or settled when the stage it waits for is not full).
  for (int blocks : {1, 2}) check_swiglu({64, 192, 65, 0, 300}, 512, 384, blocks);
  // Split over K. Down (moe_split_parts): one pair on two blocks in 2 parts (on one block it does not
  // split: no fewer waves); the all-to-one case above splits its 32 pairs in 3 and its gate/up's 48
  // units (one wave, 8 row tiles) in 2. Gate/up's last wave (moe_up_tail_parts): 7 units on 2 blocks
  // leave 1 for a fourth wave, split in 2 (down's 2 pairs stay whole); a decode-like shape of 6 row
  // tiles, 48 gate/up units and 48 down pairs, each in 2 parts on every SM (the random case above has
  // more row tiles than a raster group: gate/up not split).
  for (int blocks : {1, 2}) check_swiglu({64, 0}, 256, 1024, blocks);
  check_swiglu({64, 0}, 512, 896, 2);
  check_swiglu({200, 56, 0, 300}, 2048, 1024);
}

TEST_CASE("grouped gemm: the one-launch FFN refuses mismatched halves") {
  Runner rn;
  DevBuf<int32_t> d_counts(2), d_off(3);
  upload_counts({100, 200}, d_counts, d_off);
  DevBuf<__nv_bfloat16> x(512 * 256), w13(2 * 512 * 256), w2(2 * 256 * 256), h(512 * 256), y(512 * 256);
  DevBuf<uint64_t> tile_done(5);
  GroupedGemmArgs up;
  up.experts = 2, up.capacity_rows = 512, up.n = 512, up.k = 256;
  up.x = x.p, up.w = w13.p, up.counts = d_counts.p, up.offsets = d_off.p, up.y = h.p;
  up.epilogue = GroupedEpilogue::kSwiGlu;
  GroupedGemmArgs down = up;
  down.n = 256, down.k = 256, down.x = h.p, down.w = w2.p, down.y = y.p, down.epilogue = GroupedEpilogue::kStore;
  GroupedGemmParams pu, pd;
  REQUIRE(make_grouped_gemm_params(up, &pu) == Status::kOk);
  REQUIRE(make_grouped_gemm_params(down, &pd) == Status::kOk);
  CHECK(launch_grouped_ffn(pu, pd, nullptr, rn.fp, nullptr) == Status::kInvalidArgument);      // no counters
  CHECK(launch_grouped_ffn(pd, pu, tile_done.p, rn.fp, nullptr) == Status::kInvalidArgument);  // halves swapped
  GroupedGemmParams other = pd;
  other.k = 128;  // not gate/up's output width
  CHECK(launch_grouped_ffn(pu, other, tile_done.p, rn.fp, nullptr) == Status::kInvalidArgument);
  FrameParams too_many = rn.fp;
  too_many.roles.compute = rn.sms + 1;  // more blocks than the GPU has SMs
  CHECK(launch_grouped_ffn(pu, pd, tile_done.p, too_many, nullptr) == Status::kInvalidArgument);
  // The K split is for down only, and needs its arrival words.
  DevBuf<uint8_t> split_mem(grouped_split_bytes(rn.sms));
  GroupedGemmParams up_split = pu, down_split = pd;
  CHECK(enable_grouped_split(&up_split, split_mem.p, rn.sms) == Status::kInvalidArgument);  // gate/up: SwiGLU
  up_split.split_ws = reinterpret_cast<float*>(split_mem.p);
  CHECK(launch_grouped_ffn(up_split, pd, tile_done.p, rn.fp, nullptr) == Status::kInvalidArgument);
  REQUIRE(enable_grouped_split(&down_split, split_mem.p, rn.sms) == Status::kOk);
  CHECK(launch_grouped_ffn(pu, down_split, tile_done.p, rn.fp, nullptr) == Status::kOk);
  WEFT_CUDA_OK(cudaDeviceSynchronize());
  down_split.split_cnt = nullptr;
  CHECK(launch_grouped_ffn(pu, down_split, tile_done.p, rn.fp, nullptr) == Status::kInvalidArgument);
}

TEST_CASE("grouped gemm: bad arguments are refused") {
  GroupedGemmArgs a;
  GroupedGemmParams p;
  CHECK(make_grouped_gemm_params(a, &p) == Status::kInvalidArgument);
  a.experts = 2, a.capacity_rows = 100, a.n = 256, a.k = 64;  // capacity not a multiple of 128
  CHECK(make_grouped_gemm_params(a, &p) == Status::kInvalidArgument);
}
