// Host API of the multi-node GEMM+ReduceScatter / GEMM+AllReduce kernel: one persistent launch with
// two SM roles (the plan is kernels/gemm_reduce_nodes_plan.h, the runner
// runtime/ops/gemm_reduce_nodes_op.cpp).
//
//   blocks [0, compute)   compute: the GEMM over this rank's positions (A's rows in position order),
//                         one M-shard per (position, piece); the reduce range's tiles add the staged
//                         slots in the epilogue (EpiReduceSlots); gated tiles wait on FlagGate; every
//                         tile counts on its shard (TileSignal, GPU scope)
//   last block            inter_send: first tells each rail peer that its sends of the last run are
//                         consumed ("freed", through the proxy); then, one thread per proxy channel,
//                         pushes each message (put + signal) once its shard's tiles are all counted
//                         and, for a reduce-scatter message, once the peer has freed its slot
//
// NVLink moves and the gates' AND of several arrivals are the copy engines' and stream waits' job
// (the runner's streams), as in the one-node op.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"
#include "kernels/frame.h"
#include "kernels/gemm_epilogues.h"
#include "kernels/gemm_types.h"
#include "transport/device_fifo.h"

namespace weft::kernels {

// A proxy message: bytes from this rank's heap to a peer's heap, then the peer's flag = epoch.
struct RsNodesMessage {
  int32_t peer = -1;
  int32_t wait_shard = -1;  // send once tiles[wait_shard] >= the run's count (-1: at once)
  int32_t rail = -1;        // index into RsNodesKernelParams::rail_*: wait for that peer's "freed" first (-1: no)
  int32_t pad = 0;
  uint64_t src_off = 0, dst_off = 0, bytes = 0, flag_off = 0;
};

struct RsNodesKernelParams {
  static constexpr int kMaxChannels = 8, kMaxRails = 8;
  GemmParams gemm;     // A in position order, num_shards = positions x pieces, first_shard 0
  FrameParams frame;   // roles: compute, inter_send (1)
  EpiReduceSlots epi;  // reduce range [lo, hi) = the positions of g2, g3, g4
  FlagGate gate;       // per shard: gate[shard] >= epoch (never-waiting shards hold a huge value)
  TileSignal signal;   // per shard, +1 per tile
  transport::DeviceFifo fifo[kMaxChannels];
  int32_t channels = 1;
  int32_t num_rails = 0;
  int32_t rail_peer[kMaxRails] = {};
  uint64_t rail_freed_remote[kMaxRails] = {};        // heap offset of rail_freed[this rank] at the peer
  const uint64_t* rail_freed_local[kMaxRails] = {};  // this rank's rail_freed[peer]
  const RsNodesMessage* msgs = nullptr;              // device array
  int32_t num_msgs = 0;
  const uint64_t* tiles = nullptr;  // the TileSignal counts
  uint64_t tile_target = 0;         // a shard is done when its count reaches this
  uint64_t epoch = 0;
  int32_t compute = 1;                     // 0: the exchange alone (no GEMM, no tile waits)
  const uint64_t* const* waits = nullptr;  // exchange alone: compute block 0 waits for each >= epoch
  int32_t num_waits = 0;
  int32_t* push_error = nullptr;       // device word: first failed push's status (0: none)
  int32_t* push_error_peer = nullptr;  // and its peer
};

// The kernel, for transport::preload_kernels.
const void* gemm_reduce_nodes_kernel_ptr();
// Launches grid = frame.roles.total() blocks on `stream`.
Status launch_gemm_reduce_nodes(const RsNodesKernelParams& p, cudaStream_t stream);

}  // namespace weft::kernels
