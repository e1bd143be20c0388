// Host API of the persistent sm_90a bf16 GEMM: validate + encode arguments, launch, SM count.
//
// Layout ("TN", both operands K-major, what wgmma reads without transposes):
//   A: M x K row-major (lda >= K)      B: N x K row-major (ldb >= K)      C = A * B^T: M x N
// bf16 in, fp32 accumulate; the epilogue decides what C is (bf16 store, fp32/bf16 add).
// Any M, N >= 1 is handled (the copy engine zero-fills out-of-bounds loads, stores are
// guarded); K and the leading dimensions must be multiples of 8 (16-byte rows for the copy
// engine) and A, B 16-byte aligned — anything else is rejected with a message saying so.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"
#include "kernels/frame.h"
#include "kernels/gemm_epilogues.h"
#include "kernels/gemm_types.h"

namespace weft::kernels {

// User-facing arguments (CUTLASS habit: Arguments apart from device-ready Params).
struct GemmArgs {
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;         // bf16
  int64_t lda = 0;                 // elements; 0 = k
  const void* b = nullptr;         // bf16
  int64_t ldb = 0;                 // elements; 0 = k
  int32_t cluster_m = 1;           // CTAs per cluster along M sharing B through TMA multicast (1 or 2);
                                   // 2 is correct and tested but measured slower (docs/gemm.md)
  int32_t group_m = 16;            // raster group height in cluster tiles (L2 reuse; docs/gemm.md)
  int32_t num_shards = 1;          // M-shards of the tile order (see tile_scheduler.h); M / num_shards
                                   // must be a multiple of cluster_m * 128 rows
  int32_t first_shard = 0;         // shard computed first (rank-rotated order)
  int32_t piece_major_owners = 0;  // > 0: piece-major order over owners x (num_shards / owners) pieces
  int32_t piece_major_owner = 0;   //   with this owner's piece j after round j + lag (tile_scheduler.h)
  int32_t piece_major_lag = 1;
};

// Checks the arguments (logging the reason once) and builds the device-ready params: tensor
// maps through the driver entry point (no -lcuda), tile schedule.
Status make_gemm_params(const GemmArgs& args, GemmParams* out);

// Dynamic shared memory one compute block needs, and the blocks-per-SM the kernel is built for.
size_t gemm_shared_bytes();

// SM count of the current device.
Status device_sm_count(int* out);

// Turns on the shared-memory + TMA store epilogue of g for C = epi (encodes C's tensor map) when
// epi allows it (paired stores, ldc % 8 == 0, 16-byte aligned C); otherwise leaves it off (stores
// from registers). launch_gemm(EpiStoreBf16) does this itself; a fused kernel that calls
// gemm_compute_block() with an EpiStoreBf16 calls it once per C.
Status enable_tma_store(const EpiStoreBf16& epi, GemmParams* g);
// The same for EpiReduceSlots' partial tiles (C = epi.partial).
Status enable_tma_store(const EpiReduceSlots& epi, GemmParams* g);
// EpiReduceSlots' own tiles through shared memory + TMA: encodes epi->own_map[0] for epi->out
// (rows [lo, hi) of C as rows 0..) and own_map[1 + i] for peers[i] (the same rows in a peer's
// memory; set epi->bcast_flags too), and sets own_maps. Without peers it leaves the own tiles on
// register stores where the layout does not allow TMA; with peers that is an error.
Status enable_own_tma_store(const GemmParams& g, __nv_bfloat16* const* peers, int npeers, EpiReduceSlots* epi);
// EpiReduceSlots' partial tiles straight into their owners' memory: owner o (of `owners`, each
// hi - lo rows; this rank is lo / (hi - lo)) gets this rank's tiles of its rows at slots[o] (rows
// 0.., ldc epi->ldc) and counts them in counts[o][piece] (pieces of rows_per_piece rows).
Status enable_remote_partials(const GemmParams& g, __nv_bfloat16* const* slots, uint64_t* const* counts, int owners,
                              int rows_per_piece, EpiReduceSlots* epi);
// EpiReduceSlots' staged partials through the GEMM's TMA ring instead of the consumers' global
// loads: encodes epi->slot_map[i] for epi->slots[i] and sets slot_maps. Needs own tiles through
// TMA (enable_own_tma_store first); where the layout does not allow it (16-byte aligned slots,
// ldc a multiple of 8, at most EpiReduceSlots::kMaxRingSlots slots) it leaves slot_maps at 0, which
// is still correct.
Status enable_slot_loads(const GemmParams& g, EpiReduceSlots* epi);

// Splits the last wave's tiles along K, into at most `max_split` slices, when they would leave blocks
// idle (TileSchedule::plan_split) for `compute_blocks` compute blocks, and points g at a workspace for
// the fp32 partials owned by `stream` (launches on one stream must not overlap). launch_gemm does
// this itself (with GemmOptions::split_tail); a fused kernel that calls gemm_compute_block() calls it
// once per launch configuration. Leaves g unsplit when it does not pay, no workspace can be had, or
// `max_split` is 1. `chunked` = false: K-slices only, no chunks (TileSchedule::plan_split).
// launch_gemm and the fused AllGather+GEMM kernel allow chunks only for a static walk (no
// GemmParams::claims: with claimed tiles the chunked tail measured slower, docs/gemm.md); GEMM+RS/AR's
// kernel (EpiReduceSlots) walks K-slices only.
Status enable_tail_split(int32_t compute_blocks, cudaStream_t stream, GemmParams* g, bool chunked = true,
                         int32_t max_split = kMaxTailSplit);

// Has g's compute blocks claim their work units one at a time instead of taking every B-th
// (GemmParams::claims): the claim words belong to `stream` (launches on one stream must not
// overlap). Leaves g static for cluster_m 2 or when the words cannot be had. launch_gemm does this
// itself (with GemmOptions::dynamic_tiles, except with EpiReduceSlots, measured slower); a fused
// kernel that calls gemm_compute_block() calls it once per launch configuration.
Status enable_dynamic_tiles(cudaStream_t stream, GemmParams* g);

// Launches the standalone persistent GEMM: grid = frame.roles.total() blocks in clusters of
// g.cluster_m, the first frame.roles.compute of them compute (both counts multiples of
// cluster_m); the rest model SMs lent to other roles and exit. `opt` says which of the split tail,
// tile claims and TMA stores it sets up on a copy of g (those g already has stay).
Status launch_gemm(const GemmParams& g, const FrameParams& frame, const EpiStoreBf16& epi, const FlagGate& gate,
                   const TileSignal& signal, cudaStream_t stream, const GemmOptions& opt = GemmOptions{});
Status launch_gemm(const GemmParams& g, const FrameParams& frame, const EpiAddF32& epi, const FlagGate& gate,
                   const TileSignal& signal, cudaStream_t stream, const GemmOptions& opt = GemmOptions{});
Status launch_gemm(const GemmParams& g, const FrameParams& frame, const EpiAddBf16& epi, const FlagGate& gate,
                   const TileSignal& signal, cudaStream_t stream, const GemmOptions& opt = GemmOptions{});
Status launch_gemm(const GemmParams& g, const FrameParams& frame, const EpiScatterBf16& epi, const FlagGate& gate,
                   const TileSignal& signal, cudaStream_t stream, const GemmOptions& opt = GemmOptions{});
Status launch_gemm(const GemmParams& g, const FrameParams& frame, const EpiReduceSlots& epi, const FlagGate& gate,
                   const TileSignal& signal, cudaStream_t stream, const GemmOptions& opt = GemmOptions{});

}  // namespace weft::kernels
