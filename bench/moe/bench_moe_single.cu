// One GPU: weft's grouped GEMM (SwiGLU expert FFN: gate/up with the fused SiLU epilogue, then down)
// against per-expert cuBLAS (cublasGemmEx per expert, gate and up as one GEMM, a SiLU*up kernel,
// then down) on the per-expert counts one rank of a 4-GPU job would receive: 4 x T random tokens
// routed by weft's router over all experts, the counts of rank 0's experts/4 kept. Shapes from the
// issue (Mixtral-8x7B, Qwen3-30B-A3B, DeepSeek-V3 sizes) at T = 4096 (prefill) and 256 (decode).
// Every candidate timed with CUDA events, interleaved round by round, median after warm-up; fresh
// random inputs every run; weft's outputs checked against cuBLAS's. weft's FFN twice: as two
// launches (gate/up, then down) and in one launch (launch_grouped_ffn: a down tile starts when its
// H rows are complete), the second checked to give the first's bits. And the same three with the
// epilogue storing from registers only (GroupedGemmParams::store_tma = 0, how every tile was stored
// before the TMA store epilogue), checked to give the same bits. And the one-launch FFN split over K
// where its tiles leave SMs idle (enable_grouped_split: down's pairs, and gate/up's last wave), and with
// down's split alone (GroupedGemmParams::split_tail = 0), each checked against cuBLAS.
// --split-sweep adds the one-launch FFN with down's parts forced to 1..4 (GroupedGemmParams::split_fixed;
// gate/up's last wave whole).
// --tokens T runs that count per rank only; --profile P launches only the one-launch FFN (down in P parts,
// 0 unsplit) six times, for a profiler; --seed S draws the tokens, routing and weights from S instead of
// fresh ones (the same counts in two builds' processes).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench/gemm/bench_timing.h"
#include "kernels/grouped_gemm.h"
#include "kernels/moe_plan.h"
#include "kernels/moe_router.h"
#include "tests/kernels/gemm_testing.cuh"

using namespace weft::kernels;
using namespace weft::kernels::testing;
using weft::Status;

#define CUBLAS_OK(call)                                                              \
  do {                                                                               \
    cublasStatus_t s_ = (call);                                                      \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                               \
      fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #call, int(s_)); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)
#define WEFT_OK(call)                                                                 \
  do {                                                                                \
    if ((call) != Status::kOk) {                                                      \
      fprintf(stderr, "%s:%d: %s failed (see the log)\n", __FILE__, __LINE__, #call); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

namespace {

struct Shape {
  const char* name;
  int hidden, ffn, experts, topk;
};
int g_world = 4;     // --world: the ranks the counts are taken from (rank 0 keeps experts / world)
int g_group_m = 16;  // --group: row tiles per raster group of weft's grouped GEMM
// --split-sweep: the one-launch FFN with down's parts forced to 1..kMoeMaxSplit (four slots per SM),
// each timed beside the rest and checked against cuBLAS.
bool g_split_sweep = false;
// --profile P: only the one-launch FFN with down in P parts (0: unsplit), 6 times, for a profiler.
int g_profile = -1;
// --seed S: inputs from S (every shape's), else fresh.
int64_t g_seed = -1;

__global__ void silu_mul(const __nv_bfloat16* gu, int64_t rows, int ffn, __nv_bfloat16* h) {
  const int64_t n = rows * ffn;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / ffn, c = i % ffn;
    const float g = __bfloat162float(gu[r * 2 * ffn + c]), u = __bfloat162float(gu[r * 2 * ffn + ffn + c]);
    h[i] = __float2bfloat16_rn(g / (1.f + __expf(-g)) * u);
  }
}

struct Row {
  std::string shape;
  int tokens;
  int64_t rows, padded;
  int min_count, max_count;
  double router_ms, up_w, up_c, silu_c, down_w, down_c, ffn_one;
  double up_r, down_r, ffn_one_r;  // register stores only
  double ffn_split;                // one launch, split over K where it leaves SMs idle
  double ffn_split_down;           // the same, gate/up's last wave whole (down's split alone)
  int parts_up, parts_down;        // the parts the split launch takes for these counts (host-side rule)
  double sweep[kMoeMaxSplit + 1];  // --split-sweep: one launch, down in p parts (sweep[p], p >= 1)
  double err_sweep;
  double err_h, err_y, err_split, err_split_down;
};

Row run_shape(const Shape& s, int tokens, int rounds, FrameParams fp, cublasHandle_t blas) {
  const int L = s.experts / g_world, H = s.hidden, F = s.ffn;
  const int64_t R = int64_t(g_world) * tokens;  // the tokens of all four ranks
  const uint64_t seed = g_seed >= 0 ? uint64_t(g_seed) : fresh_seed();
  Row row{};
  row.shape = s.name;
  row.tokens = tokens;
  // 1. Routing of the job's tokens; rank 0 receives its experts' (token, expert) pairs.
  DevBuf<int32_t> counts(s.experts), dropped(1), offsets(L + 1), ids(R * s.topk);
  DevBuf<float> logits(R * s.experts), wts(R * s.topk);
  {
    DevBuf<__nv_bfloat16> tok(R * H), rw(int64_t(H) * s.experts);
    random_bf16(tok.p, R * H, seed);
    random_bf16(rw.p, int64_t(H) * s.experts, seed + 1, 0.05f);
    MoeRouterArgs a;
    a.tokens = tok.p, a.weight = rw.p, a.tokens_n = int32_t(R), a.hidden = H, a.experts = s.experts, a.topk = s.topk;
    MoeRouterOut o;
    o.logits = logits.p, o.topk_ids = ids.p, o.topk_weights = wts.p, o.counts = counts.p, o.dropped = dropped.p;
    WEFT_OK(launch_moe_router(a, o, nullptr));
    WEFT_OK(launch_moe_offsets(counts.p, L, offsets.p, nullptr));
    WEFT_CUDA_OK(cudaDeviceSynchronize());
    if (to_host(dropped.p, 1)[0] != 0) {
      fprintf(stderr, "router dropped tokens\n");
      std::exit(1);
    }
    // The router alone on one rank's T tokens.
    MoeRouterArgs one = a;
    one.tokens_n = tokens;
    row.router_ms = weft::bench::time_ms(rounds, 1, [&](int) { WEFT_OK(launch_moe_router(one, o, nullptr)); });
    WEFT_OK(launch_moe_router(a, o, nullptr));  // the job's counts again
    WEFT_OK(launch_moe_offsets(counts.p, L, offsets.p, nullptr));
    WEFT_CUDA_OK(cudaDeviceSynchronize());
  }
  const std::vector<int32_t> cnt = to_host(counts.p, L), off = to_host(offsets.p, L + 1);
  row.rows = 0;
  row.min_count = 1 << 30;
  for (int c : cnt) {
    row.rows += c;
    row.min_count = std::min(row.min_count, c);
    row.max_count = std::max(row.max_count, c);
  }
  row.padded = off[L];
  const int64_t cap = std::max<int64_t>(off[L], kMoeTileRows);
  // 2. Expert weights (fresh), weft's interleaved gate/up and cuBLAS's concatenated one.
  DevBuf<__nv_bfloat16> x(cap * H), w13i(int64_t(L) * 2 * F * H), w13c(int64_t(L) * 2 * F * H), w2(int64_t(L) * H * F);
  DevBuf<__nv_bfloat16> h(cap * F), y(cap * H), gu(cap * 2 * F), hc(cap * F), yc(cap * H);
  random_bf16(x.p, cap * H, seed + 2);
  random_bf16(w13c.p, int64_t(L) * 2 * F * H, seed + 3, 0.05f);
  random_bf16(w2.p, int64_t(L) * H * F, seed + 4, 0.05f);
  {
    DevBuf<__nv_bfloat16> wg(int64_t(L) * F * H), wu(int64_t(L) * F * H);
    for (int e = 0; e < L; ++e) {
      WEFT_CUDA_OK(cudaMemcpy(wg.p + int64_t(e) * F * H, w13c.p + int64_t(e) * 2 * F * H, size_t(F) * H * 2,
                              cudaMemcpyDeviceToDevice));
      WEFT_CUDA_OK(cudaMemcpy(wu.p + int64_t(e) * F * H, w13c.p + (int64_t(e) * 2 + 1) * F * H, size_t(F) * H * 2,
                              cudaMemcpyDeviceToDevice));
    }
    WEFT_OK(launch_interleave_gate_up(wg.p, wu.p, L, F, H, w13i.p, nullptr));
    WEFT_CUDA_OK(cudaDeviceSynchronize());
  }
  poison_bf16(h.p, cap * F);
  poison_bf16(y.p, cap * H);
  GroupedGemmArgs up;
  up.experts = L, up.capacity_rows = cap, up.n = 2 * F, up.k = H;
  up.x = x.p, up.w = w13i.p, up.counts = counts.p, up.offsets = offsets.p, up.y = h.p, up.dropped = dropped.p;
  up.epilogue = GroupedEpilogue::kSwiGlu;
  up.group_m = g_group_m;
  GroupedGemmArgs down = up;
  down.n = H, down.k = F, down.x = h.p, down.w = w2.p, down.y = y.p, down.epilogue = GroupedEpilogue::kStore;
  GroupedGemmParams pu, pd;
  WEFT_OK(make_grouped_gemm_params(up, &pu));
  WEFT_OK(make_grouped_gemm_params(down, &pd));
  GroupedGemmParams pu_r = pu, pd_r = pd;
  pu_r.store_tma = pd_r.store_tma = 0;
  DevBuf<uint64_t> tile_done(pu.capacity_tiles + 1);
  // The one-launch FFN with down split over K (enable_grouped_split: where moe_split_parts splits for
  // these counts; otherwise it runs as the unsplit launch).
  GroupedGemmParams pd_s = pd;
  DevBuf<uint8_t> split_mem(grouped_split_bytes(2 * fp.roles.compute));  // two slots per SM
  WEFT_OK(enable_grouped_split(&pd_s, split_mem.p, 2 * fp.roles.compute));
  GroupedGemmParams pd_sd = pd_s;  // down's split alone
  pd_sd.split_tail = 0;
  {  // The parts the kernel takes (kernels/grouped_ring.cuh, phases_of), for the printout.
    const int32_t m_tiles = off[L] / kMoeTileRows, slots = 2 * fp.roles.compute;
    int64_t first = 0;
    const int64_t units0 = int64_t(m_tiles) * pu.n_blocks;
    row.parts_up =
        moe_up_tail_parts(units0, m_tiles, pu.group_m, pu.k_iters, fp.roles.compute, slots, kMoeMaxSplit, &first);
    const int64_t used = row.parts_up > 1 ? (units0 - first) * row.parts_up : 0;
    row.parts_down =
        moe_split_parts(int64_t(m_tiles) * pd.n_blocks, pd.k_iters, fp.roles.compute, int32_t(slots - used));
  }
  std::vector<GroupedGemmParams> pd_f;  // --split-sweep: parts forced, four slots per SM
  DevBuf<uint8_t> sweep_mem(g_split_sweep ? grouped_split_bytes(4 * fp.roles.compute) : 16);
  for (int q = 1; g_split_sweep && q <= kMoeMaxSplit; ++q) {
    pd_f.push_back(pd);
    WEFT_OK(enable_grouped_split(&pd_f.back(), sweep_mem.p, 4 * fp.roles.compute));
    pd_f.back().split_fixed = q;
    pd_f.back().split_tail = 0;
  }
  const float one = 1.f, zero = 0.f;
  auto blas_up = [&](cudaEvent_t) {
    for (int e = 0; e < L; ++e) {
      if (cnt[e] == 0) continue;
      CUBLAS_OK(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, 2 * F, cnt[e], H, &one, w13c.p + int64_t(e) * 2 * F * H,
                             CUDA_R_16BF, H, x.p + int64_t(off[e]) * H, CUDA_R_16BF, H, &zero,
                             gu.p + int64_t(off[e]) * 2 * F, CUDA_R_16BF, 2 * F, CUBLAS_COMPUTE_32F,
                             CUBLAS_GEMM_DEFAULT));
    }
  };
  auto blas_down = [&](cudaEvent_t) {
    for (int e = 0; e < L; ++e) {
      if (cnt[e] == 0) continue;
      CUBLAS_OK(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, H, cnt[e], F, &one, w2.p + int64_t(e) * H * F, CUDA_R_16BF,
                             F, hc.p + int64_t(off[e]) * F, CUDA_R_16BF, F, &zero, yc.p + int64_t(off[e]) * H,
                             CUDA_R_16BF, H, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
  };
  // Rows of the padding of gu are never written by cuBLAS: SiLU runs on every row (its cost is
  // the baseline's), the padding rows' values are never compared.
  WEFT_CUDA_OK(cudaMemset(gu.p, 0, size_t(cap) * 2 * F * 2));
  std::vector<std::function<void(cudaEvent_t)>> cands = {
      [&](cudaEvent_t) { WEFT_OK(launch_grouped_gemm(pu, fp, nullptr)); },
      [&](cudaEvent_t) { WEFT_OK(launch_grouped_gemm(pd, fp, nullptr)); },
      blas_up,
      [&](cudaEvent_t) {
        silu_mul<<<1024, 256>>>(gu.p, off[L], F, hc.p);
        WEFT_CUDA_OK(cudaGetLastError());
      },
      blas_down,
      [&](cudaEvent_t) { WEFT_OK(launch_grouped_ffn(pu, pd, tile_done.p, fp, nullptr)); },
      [&](cudaEvent_t) { WEFT_OK(launch_grouped_gemm(pu_r, fp, nullptr)); },
      [&](cudaEvent_t) { WEFT_OK(launch_grouped_gemm(pd_r, fp, nullptr)); },
      [&](cudaEvent_t) { WEFT_OK(launch_grouped_ffn(pu_r, pd_r, tile_done.p, fp, nullptr)); },
      [&](cudaEvent_t) { WEFT_OK(launch_grouped_ffn(pu, pd_s, tile_done.p, fp, nullptr)); },
      [&](cudaEvent_t) { WEFT_OK(launch_grouped_ffn(pu, pd_sd, tile_done.p, fp, nullptr)); },
  };
  for (const GroupedGemmParams& q : pd_f)
    cands.push_back([&](cudaEvent_t) { WEFT_OK(launch_grouped_ffn(pu, q, tile_done.p, fp, nullptr)); });
  WEFT_CUDA_OK(cudaMemset(dropped.p, 0, 4));
  if (g_profile >= 0) {
    GroupedGemmParams d = pd;
    DevBuf<uint8_t> mem(grouped_split_bytes(4 * fp.roles.compute));
    if (g_profile > 0) {
      WEFT_OK(enable_grouped_split(&d, mem.p, 4 * fp.roles.compute));
      d.split_fixed = g_profile;
    }
    for (int i = 0; i < 6; ++i) WEFT_OK(launch_grouped_ffn(pu, d, tile_done.p, fp, nullptr));
    WEFT_CUDA_OK(cudaDeviceSynchronize());
    std::exit(0);
  }
  const std::vector<double> ms = weft::bench::time_interleaved(rounds, nullptr, cands);
  row.up_w = ms[0], row.down_w = ms[1], row.up_c = ms[2], row.silu_c = ms[3], row.down_c = ms[4];
  row.ffn_one = ms[5];
  row.up_r = ms[6], row.down_r = ms[7], row.ffn_one_r = ms[8];
  row.ffn_split = ms[9];
  row.ffn_split_down = ms[10];
  for (size_t q = 0; q < pd_f.size(); ++q) row.sweep[q + 1] = ms[11 + q];
  // The one-launch FFN gives the two launches' bits (valid rows; the padding stays unwritten).
  {
    WEFT_OK(launch_grouped_gemm(pu, fp, nullptr));
    WEFT_OK(launch_grouped_gemm(pd, fp, nullptr));
    WEFT_CUDA_OK(cudaDeviceSynchronize());
    const std::vector<__nv_bfloat16> h2 = to_host(h.p, int64_t(off[L]) * F), y2 = to_host(y.p, int64_t(off[L]) * H);
    poison_bf16(h.p, cap * F);
    poison_bf16(y.p, cap * H);
    WEFT_OK(launch_grouped_ffn(pu, pd, tile_done.p, fp, nullptr));
    WEFT_CUDA_OK(cudaDeviceSynchronize());
    const std::vector<__nv_bfloat16> h1 = to_host(h.p, int64_t(off[L]) * F), y1 = to_host(y.p, int64_t(off[L]) * H);
    poison_bf16(h.p, cap * F);
    poison_bf16(y.p, cap * H);
    WEFT_OK(launch_grouped_ffn(pu_r, pd_r, tile_done.p, fp, nullptr));
    WEFT_CUDA_OK(cudaDeviceSynchronize());
    const std::vector<__nv_bfloat16> h3 = to_host(h.p, int64_t(off[L]) * F), y3 = to_host(y.p, int64_t(off[L]) * H);
    for (int e = 0; e < L; ++e) {
      const size_t hb = size_t(off[e]) * F, hn = size_t(cnt[e]) * F, yb = size_t(off[e]) * H, yn = size_t(cnt[e]) * H;
      if (std::memcmp(&h1[hb], &h2[hb], hn * 2) != 0 || std::memcmp(&y1[yb], &y2[yb], yn * 2) != 0) {
        fprintf(stderr, "%s T=%d expert %d: the one-launch FFN differs from the two launches\n", s.name, tokens, e);
        std::exit(1);
      }
      if (std::memcmp(&h3[hb], &h2[hb], hn * 2) != 0 || std::memcmp(&y3[yb], &y2[yb], yn * 2) != 0) {
        fprintf(stderr, "%s T=%d expert %d: the register-store FFN differs from the TMA-store one\n", s.name, tokens,
                e);
        std::exit(1);
      }
    }
  }
  if (to_host(dropped.p, 1)[0] != 0) {
    fprintf(stderr, "grouped gemm dropped rows\n");
    std::exit(1);
  }
  // The split launch against cuBLAS's Y (its K sums run in another order: not the same bits).
  {
    DevBuf<__nv_bfloat16> ys(cap * H);
    WEFT_CUDA_OK(cudaMemcpy(ys.p, y.p, size_t(cap) * H * 2, cudaMemcpyDeviceToDevice));
    auto check_split = [&](const GroupedGemmParams& d) {
      poison_bf16(y.p, cap * H);
      WEFT_OK(launch_grouped_ffn(pu, d, tile_done.p, fp, nullptr));
      WEFT_CUDA_OK(cudaDeviceSynchronize());
      double es = 0;
      for (int e = 0; e < L; ++e) {
        if (cnt[e] == 0) continue;
        const Compared cy = compare(y.p + int64_t(off[e]) * H, yc.p + int64_t(off[e]) * H, int64_t(cnt[e]) * H);
        if (cy.bad) {
          fprintf(stderr, "%s T=%d expert %d: the split launch (forced parts %d) left outputs unwritten\n", s.name,
                  tokens, e, d.split_fixed);
          std::exit(1);
        }
        es = std::max(es, cy.rel_err);
      }
      return es;
    };
    row.err_split = check_split(pd_s);
    row.err_split_down = check_split(pd_sd);
    for (const GroupedGemmParams& q : pd_f) row.err_sweep = std::max(row.err_sweep, check_split(q));
    WEFT_CUDA_OK(cudaMemcpy(y.p, ys.p, size_t(cap) * H * 2, cudaMemcpyDeviceToDevice));
  }
  // 3. weft against cuBLAS, expert by expert (valid rows only).
  double eh = 0, ey = 0;
  for (int e = 0; e < L; ++e) {
    if (cnt[e] == 0) continue;
    const Compared ch = compare(h.p + int64_t(off[e]) * F, hc.p + int64_t(off[e]) * F, int64_t(cnt[e]) * F);
    const Compared cy = compare(y.p + int64_t(off[e]) * H, yc.p + int64_t(off[e]) * H, int64_t(cnt[e]) * H);
    if (ch.bad || cy.bad) {
      fprintf(stderr, "%s T=%d expert %d: unwritten outputs\n", s.name, tokens, e);
      std::exit(1);
    }
    eh = std::max(eh, ch.rel_err);
    ey = std::max(ey, cy.rel_err);
  }
  row.err_h = eh, row.err_y = ey;
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 20;
  const char* markdown = nullptr;
  const char* only = nullptr;
  int only_tokens = 0;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--markdown") && i + 1 < argc) markdown = argv[++i];
    if (!std::strcmp(argv[i], "--world") && i + 1 < argc) g_world = std::max(1, std::min(64, std::atoi(argv[++i])));
    if (!std::strcmp(argv[i], "--group") && i + 1 < argc) g_group_m = std::max(1, std::min(4096, std::atoi(argv[++i])));
    if (!std::strcmp(argv[i], "--shape") && i + 1 < argc) only = argv[++i];
    if (!std::strcmp(argv[i], "--tokens") && i + 1 < argc) only_tokens = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--split-sweep")) g_split_sweep = true;
    if (!std::strcmp(argv[i], "--profile") && i + 1 < argc) g_profile = std::max(0, std::min(4, std::atoi(argv[++i])));
    if (!std::strcmp(argv[i], "--seed") && i + 1 < argc) g_seed = std::max(0ll, std::atoll(argv[++i]));
  }
  const int sms = hopper_sm_count_or_explain();
  if (sms == 0) return 77;
  cudaDeviceProp prop{};
  WEFT_CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  FrameHost frame;
  FrameParams fp;
  weft::RoleCounts roles;
  roles.compute = sms;
  WEFT_OK(frame.create(0));
  WEFT_OK(frame.params(roles, &fp));
  cublasHandle_t blas;
  CUBLAS_OK(cublasCreate(&blas));
  const Shape shapes[] = {
      {"Mixtral-8x7B", 4096, 14336, 8, 2}, {"Qwen3-30B-A3B", 2048, 768, 128, 8}, {"DeepSeek-V3", 7168, 2048, 256, 8}};
  std::vector<Row> rows;
  bool ok = true;
  // --tokens T: that count per rank only (any T from 1 to 65536), else prefill and decode.
  const std::vector<int> token_counts =
      only_tokens > 0 ? std::vector<int>{std::min(only_tokens, 65536)} : std::vector<int>{4096, 256};
  for (int tokens : token_counts)
    for (const Shape& s : shapes) {
      if (only && std::strcmp(only, s.name) != 0) continue;
      Row r = run_shape(s, tokens, rounds, fp, blas);
      if (frame.check("bench moe") != Status::kOk) return 1;
      ok =
          ok && r.err_h < 1e-2 && r.err_y < 1e-2 && r.err_split < 1e-2 && r.err_split_down < 1e-2 && r.err_sweep < 1e-2;
      rows.push_back(r);
      const double wf = r.up_w + r.down_w, cf = r.up_c + r.silu_c + r.down_c;
      const double flop = 2.0 * r.rows * (3.0 * s.hidden * s.ffn);
      printf(
          "%-14s T=%4d rank 0 of %d, raster group %d: %lld rows (%lld padded) over %d experts (%d..%d)  router %.3f "
          "ms\n"
          "   weft  gate/up+SiLU %.3f ms  down %.3f ms  FFN %.3f ms (%.0f TFLOP/s)  FFN in one launch %.3f ms (%.2fx)\n"
          "   cuBLAS gate/up %.3f ms  SiLU %.3f ms  down %.3f ms  FFN %.3f ms (%.0f TFLOP/s)\n"
          "   cuBLAS/weft: gate/up %.2fx down %.2fx FFN %.2fx   rel err H %.1e Y %.1e\n"
          "   register stores: gate/up+SiLU %.3f ms  down %.3f ms  FFN in one launch %.3f ms (register / TMA-store "
          "time "
          "%.3f)\n"
          "   split over K (gate/up's last wave in %d parts, down in %d): FFN in one launch %.3f ms (%.2fx the "
          "unsplit launch, cuBLAS/split %.2fx); down's split alone %.3f ms; rel err Y %.1e, %.1e\n",
          s.name, tokens, g_world, g_group_m, (long long)r.rows, (long long)r.padded, s.experts / g_world, r.min_count,
          r.max_count, r.router_ms, r.up_w, r.down_w, wf, flop / wf * 1e-9, r.ffn_one, wf / r.ffn_one, r.up_c, r.silu_c,
          r.down_c, cf, flop / cf * 1e-9, r.up_c / r.up_w, r.down_c / r.down_w, cf / wf, r.err_h, r.err_y, r.up_r,
          r.down_r, r.ffn_one_r, r.ffn_one_r / r.ffn_one, r.parts_up, r.parts_down, r.ffn_split,
          r.ffn_one / r.ffn_split, cf / r.ffn_split, r.ffn_split_down, r.err_split, r.err_split_down);
      if (g_split_sweep) {
        printf("   down in p parts (forced, 4 slots per SM): ");
        for (int q = 1; q <= kMoeMaxSplit; ++q) printf("p=%d %.3f ms  ", q, r.sweep[q]);
        printf("(unsplit %.3f), rel err Y %.1e\n", r.ffn_one, r.err_sweep);
      }
      fflush(stdout);
    }
  if (markdown) {
    FILE* f = fopen(markdown, "w");
    if (f) {
      fprintf(f, "| shape (%s, 1 of %d ranks) | T/rank | rows (padded) | router ms | weft up+SiLU | cuBLAS up+SiLU | ",
              prop.name, g_world);
      fprintf(f,
              "weft down | cuBLAS down | weft FFN | weft FFN one launch | one launch, register stores | cuBLAS FFN | "
              "cuBLAS/weft |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
      for (const Row& r : rows)
        fprintf(f, "| %s | %d | %lld (%lld) | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.2fx |\n",
                r.shape.c_str(), r.tokens, (long long)r.rows, (long long)r.padded, r.router_ms, r.up_w,
                r.up_c + r.silu_c, r.down_w, r.down_c, r.up_w + r.down_w, r.ffn_one, r.ffn_one_r,
                r.up_c + r.silu_c + r.down_c, (r.up_c + r.silu_c + r.down_c) / (r.up_w + r.down_w));
      fclose(f);
    }
  }
  cublasDestroy(blas);
  if (!ok) {
    fprintf(stderr, "weft's expert FFN differs from cuBLAS's by more than 1e-2\n");
    return 1;
  }
  return 0;
}
