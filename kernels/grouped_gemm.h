// Host API of the grouped GEMM over per-expert token counts known only on the device:
// Y_e = X_e * W_e^T for every expert e (bf16 in, fp32 accumulate, bf16 out), and the same with a
// fused SwiGLU epilogue (H_e = SiLU(X_e Wg_e^T) * (X_e Wu_e^T)) for the gate/up projection.
//
// Layout (moe_plan.h): X is capacity_rows x k, expert e's rows at offsets[e] .. offsets[e] +
// counts[e], offsets padded to 128 rows (so a row tile never holds two experts); W is experts x n
// x k (each W_e K-major, as nn.Linear stores it); Y is capacity_rows x n_out with the same row
// offsets. Rows past an expert's count (its padding) are not written (a 64-row half of a tile that
// reaches past the count is stored from registers, row by row; the others through TMA). The host never reads the
// counts: the persistent kernel reads offsets[experts] and walks (row tile, n block) units.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"
#include "kernels/frame.h"
#include "kernels/moe_plan.h"

namespace weft::kernels {

enum class GroupedEpilogue : int32_t {
  kStore = 0,   // Y = X W^T, n_out = n
  kSwiGlu = 1,  // W interleaved per 256 rows: [128 gate rows | the same 128 up rows]; n_out = n / 2
};

struct GroupedGemmArgs {
  int32_t experts = 0;
  int64_t capacity_rows = 0;  // rows of X and Y (a multiple of 128); more routed rows are counted as dropped
  int32_t n = 0, k = 0;       // W_e: n x k; k a multiple of 8
  const __nv_bfloat16* x = nullptr;
  const __nv_bfloat16* w = nullptr;
  const int32_t* counts = nullptr;   // device, experts
  const int32_t* offsets = nullptr;  // device, experts + 1 (launch_moe_offsets)
  __nv_bfloat16* y = nullptr;
  GroupedEpilogue epilogue = GroupedEpilogue::kStore;
  int32_t group_m = 16;        // row tiles per raster group (moe_grouped_tile_at)
  int32_t* dropped = nullptr;  // device word (optional): routed rows beyond capacity_rows are added here
};

// Device-ready arguments.
struct GroupedGemmParams {
  CUtensorMap tmap_x;  // capacity_rows x k, box {64, 128}
  CUtensorMap tmap_w;  // (experts n) x k, box {64, 256}
  CUtensorMap tmap_y;  // capacity_rows x ldy, box {64, 64}: the epilogue's TMA stores
  const int32_t* counts = nullptr;
  const int32_t* offsets = nullptr;
  __nv_bfloat16* y = nullptr;
  int32_t* dropped = nullptr;
  int64_t ldy = 0;
  int32_t experts = 0, n = 0, k = 0, k_iters = 0, n_blocks = 0, group_m = 16, capacity_tiles = 0;
  int32_t epilogue = 0;
  // 1: a consumer's 64-row half whose rows are all its expert's leaves through shared memory and TMA
  // (tmap_y); the half holding an expert's last rows, and every half with 0, from registers.
  int32_t store_tma = 1;
  // Split over K (set on the expert FFN's down params; enable_grouped_split): where down's (row tile,
  // column block) pairs would leave the launch's blocks idle, each pair runs as 2 to 4 units over
  // parts of K (moe_split_parts, chosen on the device from the counts), and so do gate/up's pairs of
  // its last, partial wave where no down unit can run beside them (moe_up_tail_parts); each part's
  // fp32 sums go to split_ws and the last part to finish sums every part's in K order and stores
  // (for gate/up, SiLU(gate) up of the sums). nullptr: never split.
  float* split_ws = nullptr;      // split_slots x 128 x 256 fp32: one slot per (row tile, column block, part)
  uint32_t* split_cnt = nullptr;  // split_slots x 8 arrival words, zeroed by each launch
  int32_t split_slots = 0;
  int32_t split_sms = 0;             // set by the launch: its blocks (frame.roles.compute)
  int32_t split_max = kMoeMaxSplit;  // the most parts a pair is split into (the plan's split_k)
  // Benchmarks only (bench_moe_single --split-sweep): parts forced instead of moe_split_parts'
  // choice, lowered until they fit the slots and kMoeMinSplitIters; 0: moe_split_parts decides.
  int32_t split_fixed = 0;
  // Benchmarks only: 0 keeps gate/up's last wave whole (the split of down alone, as before it).
  int32_t split_tail = 1;
};

// Bytes enable_grouped_split needs for `slots` slots (a split is taken only where its units fit the
// slots: gate/up's last wave and down each take at most one wave of the blocks, so two per SM never
// hold either back).
int64_t grouped_split_bytes(int32_t slots);
// Lets the FFN split `down` over K (see GroupedGemmParams::split_ws): `mem` is device memory of
// grouped_split_bytes(slots) bytes that nothing else uses while a launch runs. Where the split is
// taken, Y's K sums run in another order than unsplit: the bits repeat from call to call for the
// same counts and blocks, but a row's bits depend on whether the call split (on the other rows'
// counts and on the blocks), so they are not the same as the unsplit FFN's.
Status enable_grouped_split(GroupedGemmParams* down, void* mem, int32_t slots);
// For the launches of the FFN (launch_grouped_ffn, launch_moe_ffn_combine): refuses a split on
// gate/up or one without its workspace (kInvalidArgument, logged), else gives `down` as a launch on
// frame's blocks runs it (split_sms = frame.roles.compute), its arrival words zeroed on `stream`.
Status grouped_split_for_launch(const GroupedGemmParams& up, const GroupedGemmParams& down, const FrameParams& frame,
                                cudaStream_t stream, GroupedGemmParams* out);

// Checks the arguments (logging why once) and encodes the tensor maps.
Status make_grouped_gemm_params(const GroupedGemmArgs& args, GroupedGemmParams* out);

// Launches the persistent grouped GEMM on frame.roles.compute blocks (one per SM).
Status launch_grouped_gemm(const GroupedGemmParams& p, const FrameParams& frame, cudaStream_t stream);

// The expert FFN in one persistent launch: up (kSwiGlu, writing H) then down (kStore, reading H)
// over the same counts and offsets; a down unit of row tile m starts once every gate/up unit of
// tile m has stored its columns (tile_done[m], bounded wait through the frame). Units are claimed
// in order from a counter, so the waits end even when not every block is resident. tile_done:
// device, up.capacity_tiles + 1 words (the counters and the claim counter), zeroed on the stream
// by this call. The same bits as the two launches. frame.roles.compute blocks, at most the SMs.
// Not checkable here (both inside tensor maps): that down's X is up's output H; the caller makes
// them so.
Status launch_grouped_ffn(const GroupedGemmParams& up, const GroupedGemmParams& down, uint64_t* tile_done,
                          const FrameParams& frame, cudaStream_t stream);

// w13[e] = rows interleaved per 128: gate rows [128 i, 128 i + 128) then the same rows of up, for
// the SwiGLU epilogue (done once when the weights are loaded). gate, up: experts x ffn x k;
// w13: experts x 2 ffn x k; ffn a multiple of 128.
Status launch_interleave_gate_up(const __nv_bfloat16* gate, const __nv_bfloat16* up, int32_t experts, int32_t ffn,
                                 int32_t k, __nv_bfloat16* w13, cudaStream_t stream);

}  // namespace weft::kernels
