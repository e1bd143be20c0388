// The multi-node GEMM+RS/AR kernel: GEMM compute blocks and the inter_send pusher in one persistent
// launch (kernels/gemm_reduce_nodes.h draws the roles).
#include <cuda_runtime.h>

#include "base/log.h"
#include "kernels/gemm_reduce_nodes.h"
#include "kernels/gemm_sm90.cuh"
#include "transport/fifo_device.cuh"

namespace weft::kernels {
namespace {

__device__ __forceinline__ void note_push_error(const RsNodesKernelParams& p, int rc, int32_t peer) {
  if (atomicCAS(p.push_error, 0, rc) == 0) *p.push_error_peer = peer;
}

// inter_send: thread 0 first frees the rail peers' sends of the last run (this launch starts after
// the last one's GEMM read its slots). Then thread t feeds channel t with messages t, t + channels,
// ... in the plan's order, each once its rows are final (its shard's tile count) and, when it goes
// into a peer's slot, once that peer has freed the slot.
__device__ void inter_send(const RsNodesKernelParams& p) {
  const int32_t ch = int32_t(threadIdx.x);
  if (ch == 0)
    for (int32_t i = 0; i < p.num_rails; ++i) {
      const int rc =
          transport::device::push_signal<false>(p.fifo[0], p.rail_peer[i], p.rail_freed_remote[i], p.epoch - 1);
      if (rc != 0) {
        note_push_error(p, rc, p.rail_peer[i]);
        return;
      }
    }
  if (ch >= p.channels) return;
  for (int32_t m = ch; m < p.num_msgs; m += p.channels) {
    const RsNodesMessage msg = p.msgs[m];
    if (p.compute && msg.wait_shard >= 0 &&
        !frame_wait_flag(p.frame, p.tiles + msg.wait_shard, p.tile_target, Role::kInterSend, -1, msg.peer,
                         msg.wait_shard))
      return;
    if (msg.rail >= 0 && !frame_wait_flag(p.frame, p.rail_freed_local[msg.rail], p.epoch - 1, Role::kInterSend, -1,
                                          msg.peer, -2 - msg.rail))
      return;
    const int rc = transport::device::push_put_signal<false>(p.fifo[ch], msg.peer, msg.src_off, msg.dst_off, msg.bytes,
                                                             msg.flag_off, p.epoch);
    if (rc != 0) {
      note_push_error(p, rc, msg.peer);
      return;
    }
  }
}

// The exchange alone: block 0 waits for everything this rank receives through the proxy.
__device__ void wait_all(const RsNodesKernelParams& p) {
  for (int32_t i = threadIdx.x; i < p.num_waits; i += blockDim.x)
    if (!frame_wait_flag(p.frame, p.waits[i], p.epoch, Role::kCompute, -1, -1, i)) return;
}

__global__ void __launch_bounds__(GemmConfig::kThreads, 1)
    gemm_reduce_nodes_kernel(const __grid_constant__ RsNodesKernelParams p) {
  extern __shared__ uint8_t smem[];
  const Role role = p.frame.roles.role_of(int32_t(blockIdx.x));
  const int32_t idx = p.frame.roles.index_in_role(int32_t(blockIdx.x));
  if (role == Role::kCompute) {
    if (p.compute)
      gemm_compute_block<1>(p.gemm, p.frame, p.epi, p.gate, p.signal, idx, p.frame.roles.compute, smem);
    else if (idx == 0)
      wait_all(p);
  } else if (role == Role::kInterSend) {
    if (idx == 0) inter_send(p);
  }
  frame_note_launch(p.frame, KernelKind::kGemmReduceNodes);  // at the end, as the GEMM kernel's (no spill)
}

}  // namespace

const void* gemm_reduce_nodes_kernel_ptr() { return reinterpret_cast<const void*>(gemm_reduce_nodes_kernel); }

Status launch_gemm_reduce_nodes(const RsNodesKernelParams& p, cudaStream_t stream) {
  const int smem = int(gemm_smem_bytes());
  cudaError_t err = cudaFuncSetAttribute(gemm_reduce_nodes_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err == cudaSuccess) {
    gemm_reduce_nodes_kernel<<<unsigned(p.frame.roles.total()), GemmConfig::kThreads, size_t(smem), stream>>>(p);
    err = cudaGetLastError();
  }
  if (err != cudaSuccess) {
    WEFT_WARN(kKernel, "gemm_reduce_nodes: rank %d: launch of %d blocks failed: %s", p.frame.rank,
              p.frame.roles.total(), cudaGetErrorString(err));
    return Status::kCudaError;
  }
  return Status::kOk;
}

}  // namespace weft::kernels
