// The tuner's model of the staged MoE op on one node (runtime/exec/moe.cpp): the time of each phase
// (route, dispatch, arrange, grouped FFN, combine), run one after another on every SM.
#pragma once

#include <cstdint>

#include "kernels/moe_plan.h"
#include "runtime/machine_model.h"
#include "runtime/workload.h"

namespace weft::runtime {

// The staged model's constants. The values are fitted on H100 80GB HBM3 (docs/tuner.md, "MoE", says
// which measured rows fitted which constant); moe_staged_constants() scales the rates to another
// MachineModel.
struct MoeStagedConstants {
  // The grouped GEMM (kernels/grouped_gemm.cu), fitted on bench_moe_single's one-GPU rows. A pass over
  // t tiles of 128 x 256 takes max(mma, hbm) + overlap_miss * min(mma, hbm), where
  // mma = ceil(t / SMs) waves of (tile FLOPs / (gemm_tflops / SMs) + gemm_tile_us) and hbm = the
  // experts' weights and the padded rows in and out at gemm_hbm_gbps, the rows read once per wave of
  // their raster group (moe_grouped_ffn_time).
  double gemm_tflops = 915;
  double gemm_tile_us = 6;
  double gemm_hbm_gbps = 3200;
  double gemm_overlap_miss = 0.51;
  // The other phases, fitted on the per-phase times of the 2 x H100 layer rows of Mixtral-8x7B and
  // Qwen3-30B-A3B (DeepSeek-V3's are held out).
  double route_us = 16;         // route: fixed cost beside the router GEMM (launches, memsets, top-k)
  double route_token_ns = 8.4;  // route: per local token (top-k over the logits)
  double dispatch_us = 12;      // dispatch: fixed cost (launch, flags)
  double exchange_gbps = 263;   // rows stored into the peers' heap by warps (dispatch and combine)
  double arrange_us = 22;       // arrange: fixed cost (launch, the bounded wait for every rank's flag)
  double copy_gbps = 2130;      // rows copied within HBM (arrange's scatter, combine's reads), read + write
  double combine_us = 53;       // combine: fixed cost (two launches, the home's wait)
};

// The constants for `m`: the fitted H100 values, with gemm_tflops scaled by m.tensor_tflops and the
// HBM rates by m.hbm_gbps against machine_model_h100()'s (no other GPU was measured).
MoeStagedConstants moe_staged_constants(const MachineModel& m);

// The predicted time of one call on one rank, per phase.
struct MoeStagedTime {
  double route_s = 0, dispatch_s = 0, arrange_s = 0, up_s = 0, down_s = 0, combine_s = 0;
  double ffn_s() const { return up_s + down_s; }
  double total_s() const { return route_s + dispatch_s + arrange_s + ffn_s() + combine_s; }
};

// Expected 128-row tiles per expert (rows padded to the tile, kernels/moe_plan.h) when `routed_tokens`
// tokens each pick `topk` distinct experts of `experts` uniformly: an expert's count is
// Binomial(routed_tokens, topk / experts), taken as normal; E[ceil(count / tile_m)].
double moe_expected_tiles(double routed_tokens, int64_t experts, int64_t topk, int tile_m = 128);

// The grouped expert FFN alone: gate/up with the SwiGLU epilogue ([rows, hidden] x [hidden, 2 ffn]),
// then down ([rows, ffn] x [ffn, hidden]), over `local_experts` experts of `tiles_per_expert` tiles.
// split_k: as the one-launch FFN runs it, split over K into at most split_k parts where the rules say
// so (kernels/moe_plan.h: down's pairs by moe_split_parts, gate/up's last wave by moe_up_tail_parts;
// decode counts whose parts fit one wave); 1 for the grouped GEMM launched pass by pass, as the
// one-GPU rows the constants were fitted to ran it.
void moe_grouped_ffn_time(int64_t hidden, int64_t ffn, double local_experts, double tiles_per_expert,
                          const MachineModel& m, const MoeStagedConstants& c, double* up_s, double* down_s,
                          int split_k = 1);

// One call of the staged op on `world` ranks of one node (shape.tokens is the global count). Uniform
// routing; the busiest rank is the average one. split_k: the plan's cap on the down projection's K
// parts (Execution::split_k).
MoeStagedTime moe_staged_time(const MoeShape& shape, int world, const MachineModel& m, const MoeStagedConstants& c,
                              int split_k = kernels::kMoeMaxSplit);

// One call of the hierarchical variant (kernels/moe_nodes.h) on `nodes` nodes of `per_node` ranks:
// the staged phases, with each rank's rows to another node crossing the network once per (token,
// node) at `net_gbps` each way (the tuner's per-GPU network rate: the NIC's, or the socket backend's
// for the plan's channels), packed into the block first; the node's rows over NVLink (the home's to
// its node-mates and, as the relay, its rail peers' forwards to them); the relay's sums. Uniform
// routing; one proxy hop per phase (m.latency_us). No constant is fitted to cross-node rows.
MoeStagedTime moe_hierarchical_time(const MoeShape& shape, int nodes, int per_node, double net_gbps,
                                    const MachineModel& m, const MoeStagedConstants& c,
                                    int split_k = kernels::kMoeMaxSplit);

}  // namespace weft::runtime
