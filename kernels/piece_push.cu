// Mover SMs for GEMM+RS / GEMM+AR's partial pieces (piece_push.h has the picture).
#include "base/log.h"
#include "kernels/frame.cuh"
#include "kernels/piece_push.h"
#include "kernels/vec_copy.cuh"

namespace weft::kernels {
namespace {

constexpr int kThreads = 512;
constexpr int kUnroll = 8;  // 16-byte loads in flight per thread: 64 KiB per block

__global__ void __launch_bounds__(kThreads)
    piece_push_kernel(const __grid_constant__ PiecePushParams p, const FrameParams f) {
  frame_note_launch(f, KernelKind::kPiecePush);  // where the op keeps a record of its movers
  __shared__ int ok;
  for (int32_t i = 0; i < p.steps; ++i) {
    const PiecePushStep& s = p.step[i];
    if (threadIdx.x == 0) {
      bool go = !s.clear || frame_wait_flag(f, s.clear, s.clear_at, Role::kIntraComm, s.piece, s.owner, s.clear_index);
      ok = go && frame_wait_flag(f, s.ready, s.ready_at, Role::kIntraComm, s.piece, s.owner, s.ready_index);
    }
    __syncthreads();
    if (!ok) return;
    const int64_t vecs = s.elems / 8;
    const int64_t per = (vecs + gridDim.x - 1) / gridDim.x;
    const int64_t v0 = per * blockIdx.x;
    const int64_t n = (v0 + per < vecs ? v0 + per : vecs) - v0;
    // The GEMM beside this kernel wrote the partial: read it through L2, never the non-coherent path.
    vec::block_copy<kThreads, kUnroll, true>(reinterpret_cast<const uint4*>(s.src) + v0,
                                             reinterpret_cast<uint4*>(s.dst) + v0, n);
    __syncthreads();  // every thread's stores before the release below (cumulative through the barrier)
    if (threadIdx.x == 0) flag_add_release(s.landed, 1);
  }
}

}  // namespace

Status prepare_piece_push() {
  cudaFuncAttributes attr;
  const cudaError_t err = cudaFuncGetAttributes(&attr, piece_push_kernel);
  if (err != cudaSuccess) {
    WEFT_WARN(kKernel, "piece push: cannot load the kernel: %s", cudaGetErrorString(err));
    return Status::kCudaError;
  }
  return Status::kOk;
}

Status launch_piece_push(const PiecePushParams& p, const FrameParams& frame, int blocks, cudaStream_t stream) {
  if (blocks < 1 || p.steps < 0 || p.steps > PiecePushParams::kMaxSteps) {
    WEFT_WARN(kKernel, "rank %d: piece push: %d blocks and %d steps (1 or more blocks, at most %d steps)", frame.rank,
              blocks, p.steps, PiecePushParams::kMaxSteps);
    return Status::kInvalidArgument;
  }
  for (int32_t i = 0; i < p.steps; ++i) {
    const PiecePushStep& s = p.step[i];
    if (!s.src || !s.dst || !s.ready || !s.landed || s.elems < 0 || s.elems % 8 ||
        (reinterpret_cast<uintptr_t>(s.src) | reinterpret_cast<uintptr_t>(s.dst)) % 16) {
      WEFT_WARN(kKernel,
                "rank %d: piece push step %d (owner %d, piece %d): needs 16-byte aligned source and "
                "destination, a multiple of 8 elements and ready / landed words",
                frame.rank, i, s.owner, s.piece);
      return Status::kInvalidArgument;
    }
  }
  piece_push_kernel<<<blocks, kThreads, 0, stream>>>(p, frame);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    WEFT_WARN(kKernel, "rank %d: piece push launch (%d blocks): %s", frame.rank, blocks, cudaGetErrorString(err));
    return Status::kCudaError;
  }
  return Status::kOk;
}

}  // namespace weft::kernels
