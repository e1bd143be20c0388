// The staged MoE op's time per phase: expected padded tiles, the grouped GEMM's passes, the exchange.
#include "runtime/tuner_moe.h"

#include <algorithm>
#include <cmath>

#include "kernels/moe_plan.h"

namespace weft::runtime {
namespace {

constexpr double kGB = 1e9;
constexpr double kTileM = 128, kTileN = 256;  // the GEMM core's tile (kernels/grouped_gemm.cu)
constexpr double kHeaderBytes = 80;           // dispatch header per (token, rank) (kernels/moe_plan.h)
constexpr double kGroupM = 16;                // row tiles per raster group (kernels/grouped_gemm.h, group_m)

// Probability that `g` of the `experts` hold at least one of a token's `k` distinct experts.
double group_hit(int64_t experts, int64_t k, int64_t g) {
  if (g >= experts) return 1;
  double miss = 1;
  for (int64_t i = 0; i < k; ++i) miss *= double(experts - g - i) / double(experts - i);
  return 1 - std::max(0.0, miss);
}

// One grouped GEMM pass: `tiles` output tiles of k deep on every SM, `bytes` through HBM.
double grouped_pass(double tiles, double k, double bytes, const MachineModel& m, const MoeStagedConstants& c) {
  const double per_sm = c.gemm_tflops * 1e12 / m.sm_count;
  const double waves = std::ceil(tiles / m.sm_count - 1e-9);
  const double mma = waves * (2 * kTileM * kTileN * k / per_sm + c.gemm_tile_us * 1e-6);
  const double hbm = bytes / (c.gemm_hbm_gbps * kGB);
  return std::max(mma, hbm) + c.gemm_overlap_miss * std::min(mma, hbm);
}

}  // namespace

MoeStagedConstants moe_staged_constants(const MachineModel& m) {
  MoeStagedConstants c;
  const MachineModel h100 = machine_model_h100();
  c.gemm_tflops *= m.tensor_tflops / h100.tensor_tflops;
  c.gemm_hbm_gbps *= m.hbm_gbps / h100.hbm_gbps;
  c.copy_gbps *= m.hbm_gbps / h100.hbm_gbps;
  return c;
}

double moe_expected_tiles(double routed_tokens, int64_t experts, int64_t topk, int tile_m) {
  if (routed_tokens <= 0 || experts <= 0 || topk <= 0) return 0;
  const double p = std::min(1.0, double(topk) / double(experts));
  const double mean = routed_tokens * p, sd = std::sqrt(routed_tokens * p * (1 - p));
  if (sd <= 0) return std::ceil(mean / tile_m);
  // E[ceil(X / m)] = sum over j >= 0 of P(X > j m), X integer: P(X >= j m + 1), continuity-corrected.
  double tiles = 0;
  for (int64_t j = 0;; ++j) {
    const double edge = double(j) * tile_m + 0.5;
    const double above = 0.5 * std::erfc((edge - mean) / (sd * std::sqrt(2.0)));
    if (edge > mean && above < 1e-9) break;
    tiles += above;
  }
  return tiles;
}

void moe_grouped_ffn_time(int64_t hidden, int64_t ffn, double local_experts, double tiles_per_expert,
                          const MachineModel& m, const MoeStagedConstants& c, double* up_s, double* down_s,
                          int split_k) {
  const double h = double(hidden), f = double(ffn), rows = local_experts * tiles_per_expert * kTileM;
  const double row_tiles = local_experts * tiles_per_expert;
  const double up_blocks = std::ceil(2 * f / kTileN), down_blocks = std::ceil(h / kTileN);
  // The rows are read once per wave of their raster group, not once: a group of kGroupM row tiles runs
  // every n block, row tiles fastest (kernels/moe_plan.h, moe_grouped_tile_at), so a wave holds a few
  // n blocks of the group, and the blocks running together share its row tiles through L2; the next
  // wave needs them again after the weight slices of every expert in the group have streamed through
  // L2 (DeepSeek-V3 gate/up at 2.5 tiles an expert: about 190 MB of weights a wave, L2 holds 50 MB).
  const double group_tiles = std::min(kGroupM, row_tiles);
  const double up_row_reads = std::max(1.0, group_tiles * up_blocks / m.sm_count);
  const double down_row_reads = std::max(1.0, group_tiles * down_blocks / m.sm_count);
  // Gate/up: 2 ffn wide, the SwiGLU epilogue writes ffn columns; bf16 weights, rows in and out. As
  // MoeOp: the launch's blocks are the SMs, two workspace slots per SM.
  const double up_units = row_tiles * up_blocks;
  const double up_bytes = (local_experts * 2 * f * h + rows * (h * up_row_reads + f)) * 2;
  const int32_t slots = 2 * m.sm_count;
  int64_t first = 0;
  const int32_t up_parts =
      kernels::moe_up_tail_parts(std::llround(up_units), int32_t(std::ceil(row_tiles - 1e-9)), int32_t(kGroupM),
                                 int32_t(std::ceil(h / 64)), m.sm_count, slots, std::max(1, split_k), &first);
  int64_t used = 0;  // slots gate/up's split takes
  if (up_parts > 1 && up_units > 0) {
    // The last wave's units in up_parts parts of K each, their fp32 sums through L2 as down's below.
    const double rest = up_units - double(first);
    used = std::llround(rest) * up_parts;
    *up_s = grouped_pass(double(first), h, up_bytes * double(first) / up_units, m, c) +
            grouped_pass(rest * up_parts, h / up_parts,
                         up_bytes * rest / up_units + rest * up_parts * 2 * kTileM * kTileN * 4, m, c);
  } else {
    *up_s = grouped_pass(up_units, h, up_bytes, m, c);
  }
  const double down_tiles = row_tiles * down_blocks;
  const double down_bytes = (local_experts * f * h + rows * (f * down_row_reads + h)) * 2;
  const int32_t parts = kernels::moe_split_parts(std::llround(down_tiles), int32_t(std::ceil(f / 64)), m.sm_count,
                                                 int32_t(slots - used), std::max(1, split_k));
  // Split: parts times the units over a part of K each; every part's fp32 sums (kTileM x kTileN x 4
  // bytes) written once and read once at L2, counted here at HBM's rate.
  *down_s = parts > 1 ? grouped_pass(down_tiles * parts, f / parts,
                                     down_bytes + down_tiles * parts * 2 * kTileM * kTileN * 4, m, c)
                      : grouped_pass(down_tiles, f, down_bytes, m, c);
}

MoeStagedTime moe_staged_time(const MoeShape& s, int world, const MachineModel& m, const MoeStagedConstants& c,
                              int split_k) {
  MoeStagedTime t;
  const double W = std::max(1, world), T = double(s.tokens) / W, h = double(s.hidden);
  const double local = double(s.experts) / W;
  const double hit = group_hit(s.experts, s.topk, s.experts / int64_t(W));
  const double row = h * 2 + kHeaderBytes;
  const double remote = T * (W - 1) * hit * row;  // rows to the other ranks, once per (token, rank)
  const double pairs = T * double(s.topk);        // (token, local expert) rows a rank receives on average
  // Route: the router GEMM (T x experts x hidden, one add per logit: no split tail) on every SM.
  const double router_tiles = std::ceil(T / kTileM) * std::ceil(double(s.experts) / kTileN);
  const double router = std::ceil(router_tiles / m.sm_count) *
                        (2 * kTileM * kTileN * h / (m.tensor_tflops * 1e12 / m.sm_count) + m.tile_overhead_us * 1e-6);
  t.route_s = c.route_us * 1e-6 + router + T * c.route_token_ns * 1e-9;
  // Dispatch: each (token, destination rank) row once; the own rank's rows stay in HBM.
  t.dispatch_s = c.dispatch_us * 1e-6 + remote / (c.exchange_gbps * kGB);
  // Arrange: every (token, local expert) row copied into its expert's rows (read and write).
  t.arrange_s = c.arrange_us * 1e-6 + pairs * h * 2 * 2 / (c.copy_gbps * kGB);
  moe_grouped_ffn_time(s.hidden, s.ffn, local, moe_expected_tiles(W * T, s.experts, s.topk), m, c, &t.up_s, &t.down_s,
                       split_k);
  // Combine: the owner reads its experts' rows and sends one row per (token, rank); the home reads W rows a token.
  t.combine_s = c.combine_us * 1e-6 + (pairs + W * T) * h * 2 / (c.copy_gbps * kGB) + remote / (c.exchange_gbps * kGB);
  return t;
}

MoeStagedTime moe_hierarchical_time(const MoeShape& s, int nodes, int per_node, double net_gbps, const MachineModel& m,
                                    const MoeStagedConstants& c, int split_k) {
  const int N = std::max(1, nodes), G = std::max(1, per_node), W = N * G;
  MoeStagedTime t = moe_staged_time(s, W, m, c, split_k);  // route, arrange and the FFN as on one node
  const double T = double(s.tokens) / W, h = double(s.hidden);
  const double hit_rank = group_hit(s.experts, s.topk, s.experts / int64_t(W));
  const double hit_node = group_hit(s.experts, s.topk, s.experts / int64_t(W) * G);
  const double row = h * 2 + kHeaderBytes;
  // NVLink: the home's rows to its G - 1 node-mates, and the relay's forwards of its N - 1 rail
  // peers' tokens to them; the relay's own slot is a copy within HBM.
  const double nvlink = T * (G - 1) * hit_rank * row * N;
  const double net = T * (N - 1) * hit_node * row;  // each way
  const double net_s = net_gbps > 0 ? net / (net_gbps * kGB) : 0;
  const double pairs = T * double(s.topk);
  t.dispatch_s = c.dispatch_us * 1e-6 + nvlink / (c.exchange_gbps * kGB) +
                 (net + T * (N - 1) * hit_rank * row) * 2 / (c.copy_gbps * kGB) + net_s + m.latency_us * 1e-6;
  // Combine: the owner's pre-sums (read its experts' rows), the node's rows over NVLink, the relay's
  // sums (G rows a remote token at most), the network, the home's sum (G + N - 1 rows a token at most).
  t.combine_s = c.combine_us * 1e-6 +
                (pairs + T * (N - 1) * G * hit_rank + T * (G + N - 1)) * h * 2 / (c.copy_gbps * kGB) +
                nvlink / (c.exchange_gbps * kGB) + net_s + m.latency_us * 1e-6;
  return t;
}

}  // namespace weft::runtime
