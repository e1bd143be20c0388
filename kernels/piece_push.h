// Mover SMs for GEMM+RS / GEMM+AR's partial pieces: a few blocks launched beside the persistent GEMM
// push part of every piece into its owner's staging slot over NVLink as the piece's tiles are
// counted, while the copy engines move the rest. Each GPU then sends through both at once.
//
//   for each step (one other owner's piece, in the GEMM's tile order):
//     thread 0 waits (bounded) until the owner has read its slots of the previous epoch
//       (*clear >= clear_at) and the piece's tiles are counted (*ready >= ready_at)
//     every block copies its share of the piece's rows with 16-byte loads (L2) and stores (peer)
//     then adds 1 to the owner's word for the piece (release, system scope): the part has landed
//     once the word reaches runs x blocks
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"
#include "kernels/frame.h"

namespace weft::kernels {

struct PiecePushStep {
  const __nv_bfloat16* src = nullptr;  // this rank's partial rows (local)
  __nv_bfloat16* dst = nullptr;        // where the owner keeps them (peer-mapped)
  int64_t elems = 0;                   // a multiple of 8
  const uint64_t* ready = nullptr;     // local: the piece's tile count
  uint64_t ready_at = 0;
  const uint64_t* clear = nullptr;  // local: the owner's "slots of the previous epoch read" word
  uint64_t clear_at = 0;
  uint64_t* landed = nullptr;                // the owner's word for this piece (peer-mapped): += 1 per block
  int32_t owner = 0, piece = 0;              // for error records: tile_m = piece, tile_n = owner
  int32_t ready_index = 0, clear_index = 0;  // flag_index of the two waits in an error record
};

struct PiecePushParams {
  static constexpr int kMaxSteps = 28;  // 7 other owners x 4 pieces
  int32_t steps = 0;
  PiecePushStep step[kMaxSteps];
};

// Loads the kernel into the context now. Under lazy module loading (CUDA's default) a kernel's
// first launch waits until the kernels already running have finished; the GEMM beside the movers
// waits for them, so the first launch would hang until the GEMM's gate times out. Call once before
// launching beside a running kernel.
Status prepare_piece_push();

// `blocks` x 512 threads on `stream`. A timed-out wait fills the frame's error record (role
// intra_comm, tile_m = piece, tile_n = owner) and the blocks leave.
Status launch_piece_push(const PiecePushParams& p, const FrameParams& frame, int blocks, cudaStream_t stream);

}  // namespace weft::kernels
