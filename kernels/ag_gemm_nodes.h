// Host API of the multi-node AllGather+GEMM kernel: one persistent launch with three SM roles.
//
//   blocks [0, compute)            compute: the GEMM core over the rank's shard order (positions x
//                                  chunks as M-shards), each chunk gated by its flag
//   next intra_comm blocks         forward chunks that arrived over the net to the node-mates (NVLink
//                                  stores), then raise the mates' flags
//   next inter_send blocks (1)     push the rank's own shard, chunk by chunk, to its rail peers through
//                                  the device FIFO (one thread per channel, chunks round-robin)
//
// "Freed" round: at its start a launch tells the rail peers (a signal through the proxy) and the
// node-mates (a store over NVLink) that its last run is over, so they may write into it; a put or a
// forward into a peer waits for that peer's word first. The runtime op also raises the words at the
// end of each run (launch_ag_gemm_nodes_freed), which its copy into position 0 waits for.
//
// The plan (which shard goes where) is kernels/ag_gemm_nodes_plan.h; the benchmark runner is
// runtime/ops/ag_gemm_nodes_op.cpp, the runtime op runtime/exec/ag_gemm_nodes.cpp.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"
#include "kernels/ag_gemm_nodes_plan.h"
#include "kernels/frame.h"
#include "kernels/gemm_epilogues.h"
#include "kernels/gemm_types.h"
#include "transport/device_fifo.h"

namespace weft::kernels {

// The plan's moves as the kernel reads them (heap offsets are identical on every rank).
struct AgNodesDeviceMoves {
  static constexpr int kMaxSends = 8, kMaxForwards = 8, kMaxTargets = 8, kMaxChannels = 8;
  int32_t num_sends = 0;
  int32_t send_peer[kMaxSends] = {};
  int32_t send_dst_pos[kMaxSends] = {};
  int32_t num_forwards = 0;
  int32_t num_targets = 0;  // node-mates per forward
  int32_t fwd_src_pos[kMaxForwards] = {};
  int32_t fwd_mate[kMaxForwards][kMaxTargets] = {};
  int32_t fwd_dst_pos[kMaxForwards][kMaxTargets] = {};
  int32_t positions = 0;  // world size
  int32_t chunks = 1;     // per shard
  uint64_t a_offset = 0;  // heap offset of position 0 (positions follow, shard_bytes apart)
  uint64_t shard_bytes = 0;
  uint64_t chunk_bytes = 0;
  uint64_t flags_offset = 0;  // heap offset of flags[positions * chunks]
  // Heap offset of freed[2 * positions] (job ranks q): freed[q] = e once rail peer q's launch of run e
  // + 1 started, so its run e no longer reads what this rank put into it; freed[positions + q] the
  // same from node-mate q for this rank's forwards. A run e waits for freed >= e - 1 before writing
  // into a peer (back-to-back runs need no barrier).
  uint64_t freed_offset = 0;
};

// The plan's moves in the kernel's form, with the heap layout (offsets equal on every rank). The plan
// must fit the arrays (at most kMaxSends sends, kMaxForwards forwards, kMaxTargets node-mates): the
// runner refuses a larger one first.
inline AgNodesDeviceMoves ag_nodes_device_moves(const AgNodesPlan& plan, int32_t chunks, uint64_t a_offset,
                                                uint64_t shard_bytes, uint64_t flags_offset, uint64_t freed_offset) {
  AgNodesDeviceMoves m;
  m.num_sends = int32_t(plan.sends.size());
  for (int32_t s = 0; s < m.num_sends; ++s) {
    m.send_peer[s] = plan.sends[size_t(s)].peer;
    m.send_dst_pos[s] = plan.sends[size_t(s)].dst_pos;
  }
  m.num_forwards = int32_t(plan.forwards.size());
  m.num_targets = plan.per_node - 1;
  for (int32_t f = 0; f < m.num_forwards; ++f) {
    m.fwd_src_pos[f] = plan.forwards[size_t(f)].src_pos;
    for (int32_t t = 0; t < m.num_targets; ++t) {
      m.fwd_mate[f][t] = plan.forwards[size_t(f)].to[size_t(t)].first;
      m.fwd_dst_pos[f][t] = plan.forwards[size_t(f)].to[size_t(t)].second;
    }
  }
  m.positions = plan.world;
  m.chunks = chunks;
  m.a_offset = a_offset;
  m.shard_bytes = shard_bytes;
  m.chunk_bytes = shard_bytes / uint64_t(chunks);
  m.flags_offset = flags_offset;
  m.freed_offset = freed_offset;
  return m;
}

struct AgNodesKernelParams {
  GemmParams gemm;     // A = the heap's positions, num_shards = positions * chunks, first_shard 0
  FrameParams frame;   // roles: compute, intra_comm, inter_send
  EpiScatterBf16 epi;  // dst[position] = C rows of the shard at that position
  FlagGate gate;       // flags (per shard = per chunk), expected = epoch
  AgNodesDeviceMoves moves;
  transport::DeviceFifo fifo[AgNodesDeviceMoves::kMaxChannels];
  int32_t channels = 1;
  char* heap = nullptr;          // this rank's heap
  char* const* peers = nullptr;  // device table of heap bases (same node; CudaHeap)
  uint64_t epoch = 0;
  int32_t compute = 1;                 // 0: no GEMM; compute block 0 waits for every flag (gather alone)
  int32_t* push_error = nullptr;       // device word: first failed push's status (0: none)
  int32_t* push_error_peer = nullptr;  // and the peer it was for
};

// Dynamic shared memory per block (the GEMM's).
size_t ag_gemm_nodes_smem_bytes();
// The kernel, for transport::preload_kernels.
const void* ag_gemm_nodes_kernel_ptr();
// Launches grid = frame.roles.total() blocks on `stream`.
Status launch_ag_gemm_nodes(const AgNodesKernelParams& p, cudaStream_t stream);

// The runtime op's end of a run (runtime/exec/ag_gemm_nodes.h), launched behind the kernel on its
// stream: one thread raises this rank's freed word to `epoch` in every rail peer (a signal through
// FIFO channel 0) and every node-mate (a store over NVLink). A new shard may be copied into a
// rank's position 0 once its peers' words say they are done with the last one.
Status launch_ag_gemm_nodes_freed(const AgNodesKernelParams& p, cudaStream_t stream);
const void* ag_gemm_nodes_freed_kernel_ptr();

}  // namespace weft::kernels
