// The measured MoE rows of docs/moe.md (weft's staged MoE op and its grouped GEMM on H100), copied as
// the page reports them, for the tuner's MoE model (test_tuner_moe.cpp, docs/tuner.md "MoE").
#pragma once

#include <cstdint>
#include <vector>

namespace weft::testing {

// A figure docs/moe.md does not give is -1.
struct MoeMeasured {
  const char* id;
  const char* machine;
  int gpus;            // GPUs the run used
  const char* commit;  // the code it ran
  const char* shape;
  int64_t hidden, ffn, experts, topk;
  int64_t tokens;    // tokens per rank
  int world;         // the ranks: "layer" rows ran on them; "ffn" rows time the counts one rank of them receives
  const char* part;  // "layer": the whole op (median of 20 calls, slowest rank); "ffn": the grouped GEMM alone
  int raster_group;  // the grouped GEMM's raster group in 128-row tiles (16 is the op's)
  double ms;         // layer: run B (the one with phases); ffn: gate/up + SiLU and down
  double ms_a;       // layer: run A of the same call
  // Layer, run B: per-phase medians of 20 more calls with events between the phases (arrange and
  // combine include their waits for the other rank).
  double route_ms, dispatch_ms, arrange_ms, ffn_ms, combine_ms;
  // ffn rows: the two passes, and the rows (real, padded to 128) rank 0 received.
  double up_ms, down_ms;
  int64_t rows, padded_rows;
};

inline const std::vector<MoeMeasured>& moe_measured_rows() {
  // docs/moe.md, "The layer on 2 H100s": NVIDIA H100 80GB HBM3 x 2 (NVLink), driver 580.159.04,
  // 2026-11-25, bench_moe_layer under weftrun exec -n 2.
  static const char* kTwo = "2 x NVIDIA H100 80GB HBM3 (NVLink), driver 580.159.04";
  // docs/moe.md, "Measured": bench_moe_single on one of the same cards, counts rank 0 of W receives.
  static const char* kOne = "NVIDIA H100 80GB HBM3 (one GPU)";
  static const std::vector<MoeMeasured> rows = {
      {"L01", kTwo,  2,     "04c0c8e", "Mixtral-8x7B", 4096,  14336, 8,     2,  4096, 2,  "layer",
       16,    4.737, 4.865, 0.088,     0.102,          0.094, 4.508, 0.276, -1, -1,   -1, -1},
      {"L02", kTwo,  2,     "04c0c8e", "Qwen3-30B-A3B", 2048,  768,   128,   8,  4096, 2,  "layer",
       16,    1.142, 1.138, 0.088,     0.069,           0.126, 0.687, 0.176, -1, -1,   -1, -1},
      {"L03", kTwo,   2,      "04c0c8e", "DeepSeek-V3", 7168,  2048,  256,   8,  4096, 2,  "layer",
       16,    10.168, 11.661, 0.160,     0.193,         0.464, 9.189, 1.262, -1, -1,   -1, -1},
      {"L04", kTwo,  2,     "04c0c8e", "Mixtral-8x7B", 4096,  14336, 8,     2,  256, 2,  "layer",
       16,    0.690, 0.694, 0.056,     0.018,          0.027, 0.561, 0.065, -1, -1,  -1, -1},
      // Run A's 1.697 ms is the one outlier of the two repeats (docs/moe.md).
      {"L05", kTwo,  2,     "04c0c8e", "Qwen3-30B-A3B", 2048,  768,   128,   8,  256, 2,  "layer",
       16,    0.410, 1.697, 0.055,     0.017,           0.029, 0.265, 0.054, -1, -1,  -1, -1},
      {"L06", kTwo,  2,     "04c0c8e", "DeepSeek-V3", 7168,  2048,  256,   8,  256, 2,  "layer",
       16,    4.998, 4.985, 0.083,     0.026,         0.051, 4.674, 0.167, -1, -1,  -1, -1},
      // bench_moe_single --rounds 20 (median of 20 interleaved rounds), 1 of 4 ranks' counts.
      {"S01", kOne, 1,  "993e4f9", "Mixtral-8x7B", 4096,  14336, 8,   2, 4096, 4, "ffn", 16, 4.499, -1, -1,
       -1,    -1,   -1, -1,        3.086,          1.413, 8171,  8320},
      {"S02", kOne, 1,  "993e4f9", "Qwen3-30B-A3B", 2048,  768,   128,  8, 4096, 4, "ffn", 16, 0.636, -1, -1,
       -1,    -1,   -1, -1,        0.362,           0.273, 32612, 34560},
      {"S03", kOne, 1,  "993e4f9", "DeepSeek-V3", 7168,  2048,  256,  8, 4096, 4, "ffn", 16, 5.260, -1, -1,
       -1,    -1,   -1, -1,        3.251,         2.009, 32815, 36864},
      {"S04", kOne, 1,  "993e4f9", "Mixtral-8x7B", 4096,  14336, 8,  2, 256, 4, "ffn", 16, 0.423, -1, -1,
       -1,    -1,   -1, -1,        0.264,          0.159, 496,   640},
      {"S05", kOne, 1,  "993e4f9", "Qwen3-30B-A3B", 2048,  768,  128, 8, 256, 4, "ffn", 16, 0.162, -1, -1,
       -1,    -1,   -1, -1,        0.103,           0.058, 2025, 4096},
      {"S06", kOne, 1,  "993e4f9", "DeepSeek-V3", 7168,  2048, 256, 8, 256, 4, "ffn", 16, 2.282, -1, -1,
       -1,    -1,   -1, -1,        1.528,         0.754, 2070, 8192},
      // bench_moe_single --world W --shape DeepSeek-V3 --tokens 4096 (median of 10 interleaved rounds).
      {"S07", kOne, 1,  "e2dc746", "DeepSeek-V3", 7168, 2048, 256, 8, 4096, 2, "ffn", 16, 7.842, -1, -1, -1, -1,
       -1,    -1,   -1, -1,        32628,         40192},
      {"S08", kOne, 1,  "e2dc746", "DeepSeek-V3", 7168, 2048, 256, 8, 4096, 4, "ffn", 16, 5.180, -1, -1, -1, -1, -1, -1,
       -1,    -1,   -1, -1},
      {"S09", kOne, 1,  "e2dc746", "DeepSeek-V3", 7168, 2048, 256, 8, 4096, 8, "ffn", 16, 4.787, -1, -1, -1, -1, -1, -1,
       -1,    -1,   -1, -1},
      // The same W = 2 counts with raster groups of 4 and 64 row tiles (the model knows only 16).
      {"S10", kOne, 1,  "e2dc746", "DeepSeek-V3", 7168, 2048, 256, 8, 4096, 2, "ffn", 4, 8.439, -1, -1, -1, -1,
       -1,    -1,   -1, -1,        32628,         40192},
      {"S11", kOne, 1,  "e2dc746", "DeepSeek-V3", 7168, 2048, 256, 8, 4096, 2, "ffn", 64, 11.857, -1, -1, -1, -1,
       -1,    -1,   -1, -1,        32628,         40192},
  };
  return rows;
}

// docs/moe.md, "The layer on 4 H200s": one call of bench_moe_layer under weftrun exec -n 4, a rank
// per GPU, 2026-11-26. No constant of the tuner was fitted to these rows: another GPU model, another
// world size and a later commit than every row above. One run per shape (ms_a -1).
inline const std::vector<MoeMeasured>& moe_measured_rows_4xh200() {
  static const char* kFour = "4 x NVIDIA H200 (NVLink), driver 580.159.04";
  static const std::vector<MoeMeasured> rows = {
      {"H01", kFour, 4,  "18fa772", "Mixtral-8x7B", 4096,  14336, 8,     2,  4096, 4,  "layer",
       16,    4.885, -1, 0.090,     0.174,          0.120, 4.434, 0.426, -1, -1,   -1, -1},
      {"H02", kFour, 4,  "18fa772", "Qwen3-30B-A3B", 2048,  768,   128,   8,  4096, 4,  "layer",
       16,    1.299, -1, 0.085,     0.163,           0.128, 0.603, 0.324, -1, -1,   -1, -1},
      {"H03", kFour, 4,  "18fa772", "DeepSeek-V3", 7168,  2048,  256,   8,  4096, 4,  "layer",
       16,    7.051, -1, 0.183,     0.518,         0.463, 5.153, 1.115, -1, -1,   -1, -1},
      {"H04", kFour, 4,  "18fa772", "Mixtral-8x7B", 4096,  14336, 8,     2,  256, 4,  "layer",
       16,    0.622, -1, 0.076,     0.022,          0.027, 0.452, 0.139, -1, -1,  -1, -1},
      {"H05", kFour, 4,  "18fa772", "Qwen3-30B-A3B", 2048,  768,   128,   8,  256, 4,  "layer",
       16,    0.277, -1, 0.065,     0.021,           0.030, 0.125, 0.050, -1, -1,  -1, -1},
      {"H06", kFour, 4,  "18fa772", "DeepSeek-V3", 7168,  2048,  256,   8,  256, 4,  "layer",
       16,    2.007, -1, 0.129,     0.045,         0.072, 1.655, 0.192, -1, -1,  -1, -1},
      // docs/results/2026-11-27-moe-four-gpus-exchange.md, call CD (round 1 at 4096): after the row
      // kernels' loads were batched; the ms are the op's, the phases its events-between-phases run.
      {"H07", kFour, 4,  "a4847b4", "Mixtral-8x7B", 4096,  14336, 8,     2,  4096, 4,  "layer",
       16,    4.998, -1, 0.081,     0.156,          0.064, 4.477, 0.542, -1, -1,   -1, -1},
      {"H08", kFour, 4,  "a4847b4", "Qwen3-30B-A3B", 2048,  768,   128,   8,  4096, 4,  "layer",
       16,    1.076, -1, 0.067,     0.152,           0.101, 0.548, 0.241, -1, -1,   -1, -1},
      {"H09", kFour, 4,  "a4847b4", "DeepSeek-V3", 7168,  2048,  256,   8,  4096, 4,  "layer",
       16,    6.515, -1, 0.152,     0.487,         0.286, 4.857, 0.979, -1, -1,   -1, -1},
      {"H10", kFour, 4,  "a4847b4", "Mixtral-8x7B", 4096,  14336, 8,     2,  256, 4,  "layer",
       16,    0.566, -1, 0.062,     0.021,          0.021, 0.436, 0.071, -1, -1,  -1, -1},
      {"H11", kFour, 4,  "a4847b4", "Qwen3-30B-A3B", 2048,  768,   128,   8,  256, 4,  "layer",
       16,    0.249, -1, 0.053,     0.021,           0.042, 0.125, 0.036, -1, -1,  -1, -1},
      {"H12", kFour, 4,  "a4847b4", "DeepSeek-V3", 7168,  2048,  256,   8,  256, 4,  "layer",
       16,    1.918, -1, 0.134,     0.042,         0.063, 1.662, 0.105, -1, -1,  -1, -1},
  };
  return rows;
}

// docs/results/2026-11-27-moe-split-one-wave.md, call DD: weftrun bench under its own launcher, 2 x
// NVIDIA H200 (a rank per GPU), tree c9c7ed8, 4096 tokens per rank (median of 20 calls after 5, max
// over ranks; the phases from the events-between-phases run of the same process). Held out: another
// world size on H200, nothing fitted to it.
inline const std::vector<MoeMeasured>& moe_measured_rows_2xh200() {
  static const char* kTwo = "2 x NVIDIA H200 (NVLink), driver 580.159.04";
  static const std::vector<MoeMeasured> rows = {
      {"H13", kTwo,  2,  "c9c7ed8", "Mixtral-8x7B", 4096,  14336, 8,     2,  4096, 2,  "layer",
       16,    4.911, -1, 0.080,     0.091,          0.059, 4.546, 0.357, -1, -1,   -1, -1},
      {"H14", kTwo,  2,  "c9c7ed8", "Qwen3-30B-A3B", 2048,  768,   128,   8,  4096, 2,  "layer",
       16,    0.924, -1, 0.068,     0.062,           0.091, 0.602, 0.120, -1, -1,   -1, -1},
      {"H15", kTwo,  2,  "c9c7ed8", "DeepSeek-V3", 7168,  2048,  256,   8,  4096, 2,  "layer",
       16,    6.877, -1, 0.161,     0.184,         0.272, 5.949, 0.462, -1, -1,   -1, -1},
  };
  return rows;
}

// The hierarchical variant on 2 emulated nodes (socket backend over loopback TCP), 4096 tokens per
// rank, weftrun bench (median of 20 calls after 5, max over ranks):
// N01-N09: docs/results/2026-11-27-moe-across-nodes.md, call BG, 2 x 1 NVIDIA H200, tree 4758956,
//          one process per proxy-channel count;
// N10-N12: docs/results/2026-11-27-moe-four-gpus-exchange.md, call CA, 2 x 2 NVIDIA H200 (a GPU
//          per rank), tree b3fb9e0, 4 channels.
struct MoeNodesMeasured {
  const char* id;
  const char* shape;
  int64_t hidden, ffn, experts, topk, tokens;  // tokens per rank
  int nodes, per_node, channels;
  double ms;  // the layer
  // Per-phase medians of the staged-phase row (events between phases; waits included).
  double route_ms, dispatch_ms, arrange_ms, ffn_ms, combine_ms;
};

inline const std::vector<MoeNodesMeasured>& moe_measured_rows_nodes_h200() {
  static const std::vector<MoeNodesMeasured> rows = {
      {"N01", "Mixtral-8x7B", 4096, 14336, 8, 2, 4096, 2, 1, 1, 24.610, 0.069, 11.308, 0.079, 4.157, 10.108},
      {"N02", "Mixtral-8x7B", 4096, 14336, 8, 2, 4096, 2, 1, 4, 11.280, 0.067, 4.612, 0.078, 4.041, 3.863},
      {"N03", "Mixtral-8x7B", 4096, 14336, 8, 2, 4096, 2, 1, 8, 10.063, 0.068, 3.694, 0.079, 4.126, 3.299},
      {"N04", "Qwen3-30B-A3B", 2048, 768, 128, 8, 4096, 2, 1, 1, 13.175, 0.067, 6.832, 0.094, 0.582, 6.054},
      {"N05", "Qwen3-30B-A3B", 2048, 768, 128, 8, 4096, 2, 1, 4, 6.076, 0.068, 3.469, 0.095, 0.581, 2.841},
      {"N06", "Qwen3-30B-A3B", 2048, 768, 128, 8, 4096, 2, 1, 8, 4.008, 0.067, 2.235, 0.095, 0.583, 1.871},
      {"N07", "DeepSeek-V3", 7168, 2048, 256, 8, 4096, 2, 1, 1, 48.854, 0.131, 22.501, 0.367, 5.754, 21.551},
      {"N08", "DeepSeek-V3", 7168, 2048, 256, 8, 4096, 2, 1, 4, 20.547, 0.132, 8.391, 0.371, 5.707, 7.549},
      {"N09", "DeepSeek-V3", 7168, 2048, 256, 8, 4096, 2, 1, 8, 16.959, 0.131, 6.862, 0.364, 5.726, 6.105},
      {"N10", "Mixtral-8x7B", 4096, 14336, 8, 2, 4096, 2, 2, 4, 14.960, 0.068, 6.932, 0.432, 4.069, 5.718},
      {"N11", "Qwen3-30B-A3B", 2048, 768, 128, 8, 4096, 2, 2, 4, 8.905, 0.067, 5.040, 0.251, 0.548, 4.465},
      {"N12", "DeepSeek-V3", 7168, 2048, 256, 8, 4096, 2, 2, 4, 26.475, 0.132, 13.181, 0.886, 4.799, 10.911},
  };
  return rows;
}

}  // namespace weft::testing
