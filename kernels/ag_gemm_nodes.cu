// The multi-node AllGather+GEMM kernel: GEMM compute blocks, intra_comm forwarders and the inter_send
// pusher in one persistent launch (kernels/ag_gemm_nodes.h draws the roles).
#include <cuda_runtime.h>

#include "base/log.h"
#include "kernels/ag_gemm_nodes.h"
#include "kernels/gemm_sm90.cuh"
#include "transport/fifo_device.cuh"

namespace weft::kernels {
namespace {

__device__ __forceinline__ uint64_t* flag_at(char* heap, const AgNodesDeviceMoves& m, int32_t pos, int32_t chunk) {
  return reinterpret_cast<uint64_t*>(heap + m.flags_offset) + int64_t(pos) * m.chunks + chunk;
}

// freed[q] (rail peer q) or freed[positions + q] (node-mate q), in `heap`.
__device__ __forceinline__ uint64_t* freed_at(char* heap, const AgNodesDeviceMoves& m, int32_t index) {
  return reinterpret_cast<uint64_t*>(heap + m.freed_offset) + index;
}

__device__ __forceinline__ uint64_t chunk_offset(const AgNodesDeviceMoves& m, int32_t pos, int32_t chunk) {
  return m.a_offset + uint64_t(pos) * m.shard_bytes + uint64_t(chunk) * m.chunk_bytes;
}

// inter_send: thread t feeds channel t; it pushes chunks t, t + channels, ... in rising order (each
// to every rail peer), so every channel's stream carries the early chunks first. A put+signal per
// chunk: the peer's flag for that chunk rises after the chunk's bytes (the proxy's signal mode
// decides how: serial, fenced or batched).
// Thread 0 first frees the rail peers' puts of the last run (this launch starts after the last one's
// GEMM and forwards read them); a put waits until its peer has freed this rank's last one.
__device__ void inter_send(const AgNodesKernelParams& p) {
  const AgNodesDeviceMoves& m = p.moves;
  const int32_t ch = int32_t(threadIdx.x);
  if (ch == 0)
    for (int32_t s = 0; s < m.num_sends; ++s) {
      const int rc = transport::device::push_signal<false>(
          p.fifo[0], m.send_peer[s], m.freed_offset + uint64_t(p.frame.rank) * sizeof(uint64_t), p.epoch - 1);
      if (rc != 0) {
        if (atomicCAS(p.push_error, 0, rc) == 0) *p.push_error_peer = m.send_peer[s];
        return;
      }
    }
  if (ch >= p.channels) return;
  for (int32_t c = ch; c < m.chunks; c += p.channels) {
    for (int32_t s = 0; s < m.num_sends; ++s) {
      const int32_t peer = m.send_peer[s], dst = m.send_dst_pos[s];
      if (!frame_wait_flag(p.frame, freed_at(p.heap, m, peer), p.epoch - 1, Role::kInterSend, -1, peer, -2 - s)) return;
      const uint64_t flag = m.flags_offset + (uint64_t(dst) * m.chunks + c) * sizeof(uint64_t);
      const int rc = transport::device::push_put_signal<false>(p.fifo[ch], peer, chunk_offset(m, 0, c),
                                                               chunk_offset(m, dst, c), m.chunk_bytes, flag, p.epoch);
      if (rc != 0) {
        if (atomicCAS(p.push_error, 0, rc) == 0) *p.push_error_peer = peer;
        return;
      }
    }
  }
}

// intra_comm: work items (chunk, forward) in chunk-major order, dealt round-robin to the blocks.
// Each waits for the chunk's flag (set by this rank's proxy after the chunk's bytes), copies the
// chunk into every node-mate's heap over NVLink, then releases the mates' flags.
// Block 0 first frees the node-mates' forwards of the last run; a forward into a mate waits until
// that mate has freed this rank's last one.
__device__ void forward(const AgNodesKernelParams& p, int32_t block, int32_t blocks) {
  const AgNodesDeviceMoves& m = p.moves;
  __shared__ int32_t ok;
  const int32_t items = m.num_forwards * m.chunks;
  if (block == 0 && threadIdx.x == 0 && m.num_forwards > 0)
    for (int32_t t = 0; t < m.num_targets; ++t)
      flag_store_release(freed_at(p.peers[m.fwd_mate[0][t]], m, m.positions + p.frame.rank), p.epoch - 1);
  for (int32_t it = block; it < items; it += blocks) {
    const int32_t c = it / m.num_forwards, f = it % m.num_forwards;
    const int32_t src_pos = m.fwd_src_pos[f];
    if (threadIdx.x == 0) {
      ok = frame_wait_flag(p.frame, flag_at(p.heap, m, src_pos, c), p.epoch, Role::kIntraComm, -1, -1,
                           src_pos * m.chunks + c);
      for (int32_t t = 0; ok && t < m.num_targets; ++t)
        ok = frame_wait_flag(p.frame, freed_at(p.heap, m, m.positions + m.fwd_mate[f][t]), p.epoch - 1,
                             Role::kIntraComm, -1, m.fwd_mate[f][t], -2 - t);
    }
    __syncthreads();
    if (!ok) return;
    const uint4* src = reinterpret_cast<const uint4*>(p.heap + chunk_offset(m, src_pos, c));
    const int64_t n = int64_t(m.chunk_bytes / sizeof(uint4));
    for (int32_t t = 0; t < m.num_targets; ++t) {
      uint4* dst = reinterpret_cast<uint4*>(p.peers[m.fwd_mate[f][t]] + chunk_offset(m, m.fwd_dst_pos[f][t], c));
      constexpr int kUnroll = 4;
      const int64_t stride = int64_t(blockDim.x) * kUnroll;
      int64_t i = threadIdx.x;
      for (; i + (kUnroll - 1) * blockDim.x < n; i += stride) {
        uint4 v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) v[u] = __ldcg(src + i + u * blockDim.x);  // written by the proxy's copies
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) dst[i + u * blockDim.x] = v[u];
      }
      for (; i < n; i += blockDim.x) dst[i] = __ldcg(src + i);
    }
    __syncthreads();  // every thread's stores of the chunk before the flags
    if (threadIdx.x == 0) {
      __threadfence_system();
      for (int32_t t = 0; t < m.num_targets; ++t)
        flag_store_release(flag_at(p.peers[m.fwd_mate[f][t]], m, m.fwd_dst_pos[f][t], c), p.epoch);
    }
  }
}

// Gather alone (compute == 0): block 0 waits until every chunk of every position has arrived.
__device__ void wait_all(const AgNodesKernelParams& p) {
  const AgNodesDeviceMoves& m = p.moves;
  const int32_t flags = m.positions * m.chunks;
  for (int32_t i = threadIdx.x; i < flags; i += blockDim.x)
    if (!frame_wait_flag(p.frame, reinterpret_cast<uint64_t*>(p.heap + m.flags_offset) + i, p.epoch, Role::kCompute, -1,
                         -1, i))
      return;
}

__global__ void __launch_bounds__(GemmConfig::kThreads, 1)
    ag_gemm_nodes_kernel(const __grid_constant__ AgNodesKernelParams p) {
  extern __shared__ uint8_t smem[];
  const Role role = p.frame.roles.role_of(int32_t(blockIdx.x));
  const int32_t idx = p.frame.roles.index_in_role(int32_t(blockIdx.x));
  if (role == Role::kCompute) {
    if (p.compute)
      gemm_compute_block<1>(p.gemm, p.frame, p.epi, p.gate, TileSignal{}, idx, p.frame.roles.compute, smem);
    else if (idx == 0)
      wait_all(p);
  } else if (role == Role::kIntraComm) {
    forward(p, idx, p.frame.roles.intra_comm);
  } else if (role == Role::kInterSend) {
    if (idx == 0) inter_send(p);
  }
  frame_note_launch(p.frame, KernelKind::kAgGemmNodes);  // at the end, as the GEMM kernel's (no spill)
}

// The end of a run (one thread, launched behind the kernel on its stream): tells the rail peers
// (through the proxy) and the node-mates (over NVLink) that this rank's run `epoch` is over, so
// they may overwrite what it read (their next shard, their next puts and forwards).
__global__ void ag_gemm_nodes_freed_kernel(const __grid_constant__ AgNodesKernelParams p) {
  const AgNodesDeviceMoves& m = p.moves;
  if (threadIdx.x != 0) return;
  // The node-mates first: a failed push below must not leave them waiting on this rank's word.
  if (m.num_forwards > 0) {
    __threadfence_system();
    for (int32_t t = 0; t < m.num_targets; ++t)
      flag_store_release(freed_at(p.peers[m.fwd_mate[0][t]], m, m.positions + p.frame.rank), p.epoch);
  }
  for (int32_t s = 0; s < m.num_sends; ++s) {
    const int rc = transport::device::push_signal<false>(
        p.fifo[0], m.send_peer[s], m.freed_offset + uint64_t(p.frame.rank) * sizeof(uint64_t), p.epoch);
    if (rc != 0) {
      if (atomicCAS(p.push_error, 0, rc) == 0) *p.push_error_peer = m.send_peer[s];
      return;
    }
  }
}

}  // namespace

size_t ag_gemm_nodes_smem_bytes() { return gemm_smem_bytes(); }

const void* ag_gemm_nodes_kernel_ptr() { return reinterpret_cast<const void*>(ag_gemm_nodes_kernel); }
const void* ag_gemm_nodes_freed_kernel_ptr() { return reinterpret_cast<const void*>(ag_gemm_nodes_freed_kernel); }

Status launch_ag_gemm_nodes_freed(const AgNodesKernelParams& p, cudaStream_t stream) {
  ag_gemm_nodes_freed_kernel<<<1, 32, 0, stream>>>(p);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    WEFT_WARN(kKernel, "ag_gemm_nodes: rank %d: launch of the end-of-run kernel failed: %s", p.frame.rank,
              cudaGetErrorString(err));
    return Status::kCudaError;
  }
  return Status::kOk;
}

Status launch_ag_gemm_nodes(const AgNodesKernelParams& p, cudaStream_t stream) {
  const int smem = int(gemm_smem_bytes());
  cudaError_t err = cudaFuncSetAttribute(ag_gemm_nodes_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err == cudaSuccess) {
    ag_gemm_nodes_kernel<<<unsigned(p.frame.roles.total()), GemmConfig::kThreads, size_t(smem), stream>>>(p);
    err = cudaGetLastError();
  }
  if (err != cudaSuccess) {
    WEFT_WARN(kKernel, "ag_gemm_nodes: rank %d: launch of %d blocks failed: %s", p.frame.rank, p.frame.roles.total(),
              cudaGetErrorString(err));
    return Status::kCudaError;
  }
  return Status::kOk;
}

}  // namespace weft::kernels
