// Kernel behind reduce_slots.h.
#include "base/log.h"
#include "kernels/frame.cuh"
#include "kernels/reduce_slots.h"

namespace weft::kernels {
namespace {

// Thread 0 waits for every flag; the block learns the outcome through shared memory.
__device__ bool wait_all(const FrameParams& f, const uint64_t* flags, int32_t count, uint64_t expected) {
  __shared__ int ok;
  __syncthreads();  // `ok` may still be read from the previous call
  if (threadIdx.x == 0) {
    ok = 1;
    for (int32_t s = 0; s < count && ok; ++s)
      if (!frame_wait_flag(f, flags + s, expected, Role::kIntraComm, -1, -1, s)) ok = 0;
  }
  __syncthreads();
  return ok != 0;
}

// Counts this block at GPU scope once all its threads are done; true in every thread of the block
// that completes the count of this launch (the last one).
__device__ bool last_block(uint64_t* counter, uint64_t epoch) {
  __shared__ int last;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint64_t before;
    asm volatile("atom.acq_rel.gpu.global.add.u64 %0, [%1], 1;" : "=l"(before) : "l"(counter) : "memory");
    last = before + 1 == epoch * gridDim.x;
  }
  __syncthreads();
  return last != 0;
}

// The last block publishes `epoch` at entry `rank` of every rank's flag array section `section`.
__device__ void publish(const PeerReduceArgs& a, int32_t section) {
  if (threadIdx.x != 0) return;
  __threadfence_system();
  for (int32_t q = 0; q < a.ranks; ++q) flag_store_release(a.flags_out[q] + section * a.ranks + a.rank, a.epoch);
}

__device__ __forceinline__ void add8(const uint4& raw, float (&acc)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 x = __bfloat1622float2(h[j]);
    acc[2 * j] += x.x;
    acc[2 * j + 1] += x.y;
  }
}

__global__ void peer_reduce_kernel(const PeerReduceArgs a, const FrameParams f) {
  // The GEMM before this kernel on the stream has completed: its partial is in memory.
  frame_note_launch(f, KernelKind::kPeerReduce);  // where the op keeps a record of this launch
  if (blockIdx.x == 0) publish(a, 0);
  if (!wait_all(f, a.flags_in, a.ranks, a.epoch)) return;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t vecs = a.elems % 8 == 0 ? a.elems / 8 : 0;
  for (int64_t v = first; v < vecs; v += stride) {
    uint4 raw[PeerReduceArgs::kMaxRanks];
#pragma unroll
    for (int32_t q = 0; q < PeerReduceArgs::kMaxRanks; ++q)
      if (q < a.ranks) raw[q] = reinterpret_cast<const uint4*>(a.src[q])[v];  // all loads in flight at once
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
    for (int32_t q = 0; q < PeerReduceArgs::kMaxRanks; ++q)
      if (q < a.ranks) add8(raw[q], acc);
    uint4 out;
    __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
    for (int j = 0; j < 4; ++j) o[j] = __floats2bfloat162_rn(acc[2 * j], acc[2 * j + 1]);
    reinterpret_cast<uint4*>(a.out)[v] = out;
  }
  for (int64_t i = vecs * 8 + first; i < a.elems; i += stride) {
    float acc = 0;
    for (int32_t q = 0; q < a.ranks; ++q) acc += __bfloat162float(a.src[q][i]);
    a.out[i] = __float2bfloat16_rn(acc);
  }
  bool last = last_block(a.arrive, a.epoch);
  if (a.all_gather) {
    if (last) publish(a, 1);
    if (!wait_all(f, a.flags_in + a.ranks, a.ranks, a.epoch)) return;
    for (int32_t q = 0; q < a.ranks; ++q) {
      if (q == a.rank) continue;
      const uint4* s = reinterpret_cast<const uint4*>(a.gather_src[q]);
      uint4* d = reinterpret_cast<uint4*>(a.gather_dst[q]);
      for (int64_t v = first; v < vecs; v += stride) d[v] = s[v];
      for (int64_t i = vecs * 8 + first; i < a.elems; i += stride) a.gather_dst[q][i] = a.gather_src[q][i];
    }
    last = last_block(a.arrive + 1, a.epoch);
  }
  if (!last) return;
  publish(a, 2);
  wait_all(f, a.flags_in + 2 * a.ranks, a.ranks, a.epoch);
}

// ---- small-shape reduction (small_reduce_plan.h) -------------------------------------------------

constexpr int32_t kSmallReduceTag = -2;  // tile_m of this kernel's error records

// Thread 0: waits (bounded) for words_in[first + q] >= expected for every q (but `skip`); false once
// a wait timed out or another block failed.
__device__ bool wait_words(const FrameParams& f, const SmallReduceArgs& a, int32_t first, uint64_t expected,
                           int32_t skip) {
  for (int32_t q = 0; q < a.plan.ranks; ++q) {
    if (q == skip) continue;
    if (!frame_wait_flag(f, a.words_in + first + q, expected, Role::kIntraComm, kSmallReduceTag, q, first + q))
      return false;
  }
  return true;
}

__device__ __forceinline__ uint4 pack8(const float (&acc)[8]) {
  uint4 out;
  __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
  for (int j = 0; j < 4; ++j) o[j] = __floats2bfloat162_rn(acc[2 * j], acc[2 * j + 1]);
  return out;
}

// This thread's vectors: all kUnroll x W loads issued before any is used, summed in rank order.
__device__ __forceinline__ void reduce_vectors(const SmallReduceArgs& a) {
  constexpr int kR = SmallReducePlan::kMaxRanks, kU = SmallReducePlan::kUnroll;
  const SmallReducePlan& p = a.plan;
  const uint4* src[kR];
#pragma unroll
  for (int q = 0; q < kR; ++q) src[q] = q < p.ranks ? reinterpret_cast<const uint4*>(a.src[q] + p.region) : nullptr;
  uint4* out = reinterpret_cast<uint4*>(a.out);
  const bool push = p.pushes() && !(a.skip & kSmallReduceSkipPush);
  const int64_t passes = p.passes();
  for (int64_t pass = 0; pass < passes; ++pass) {
    int64_t v[kU];
    uint4 raw[kU][kR];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      v[u] = p.vec_at(pass, u, int32_t(blockIdx.x), int32_t(threadIdx.x));
#pragma unroll
      for (int q = 0; q < kR; ++q)
        if (q < p.ranks && v[u] < p.vecs) raw[u][q] = __ldcg(src[q] + v[u]);  // L2 only: written by another GPU
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      if (v[u] >= p.vecs) continue;
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
      for (int q = 0; q < kR; ++q)
        if (q < p.ranks) add8(raw[u][q], acc);
      const uint4 sum = pack8(acc);
      out[v[u]] = sum;
      if (push) {
#pragma unroll
        for (int q = 0; q < kR; ++q)
          if (q < p.ranks && q != p.rank) reinterpret_cast<uint4*>(a.push[q])[v[u]] = sum;
      }
    }
  }
}

__global__ void __launch_bounds__(SmallReducePlan::kThreads)
    small_reduce_kernel(const SmallReduceArgs a, const FrameParams f) {
  // Launched as a dependent of the GEMM: its partial is complete and visible past this point.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  frame_note_launch(f, KernelKind::kPeerReduce);  // where the runtime op keeps a record of this launch
  const SmallReducePlan& p = a.plan;
  __shared__ int ok;
  if (threadIdx.x == 0) {
    if (a.tiles[0]) {  // every GEMM's tiles of this run are counted: read the counts over NVLink
      ok = 1;
      for (int32_t q = 0; q < p.ranks && ok; ++q)
        ok = frame_wait_flag(f, a.tiles[q], a.tiles_target, Role::kIntraComm, kSmallReduceTag, q, p.tiles_word());
    } else {
      if (blockIdx.x == 0) {
        __threadfence_system();
        for (int32_t q = 0; q < p.ranks; ++q) flag_store_release(a.words_out[q] + p.ready_word(p.rank), a.epoch);
      }
      ok = wait_words(f, a, p.ready_word(0), a.epoch, -1) ? 1 : 0;
    }
  }
  __syncthreads();
  if (!ok) return;
  if (!(a.skip & kSmallReduceSkipData)) reduce_vectors(a);
  if (!p.pushes()) return;
  // Two-shot: this block's pushes are complete at system scope before each peer's count moves.
  __syncthreads();
  if (threadIdx.x != 0) return;
  __threadfence_system();
  for (int32_t q = 0; q < p.ranks; ++q)
    if (q != p.rank) flag_add_release(a.words_out[q] + p.gathered_word(p.rank), 1);
  if (blockIdx.x == 0) wait_words(f, a, p.gathered_word(0), a.gathered, p.rank);
}

}  // namespace

Status launch_peer_reduce(const PeerReduceArgs& args, const FrameParams& frame, int blocks, cudaStream_t stream) {
  if (args.ranks <= 0 || args.ranks > PeerReduceArgs::kMaxRanks || args.rank < 0 || args.rank >= args.ranks ||
      !args.out || !args.flags_in || !args.arrive || blocks <= 0) {
    WEFT_WARN(kKernel, "peer_reduce: bad arguments (rank %d of %d, %d blocks)", args.rank, args.ranks, blocks);
    return Status::kInvalidArgument;
  }
  peer_reduce_kernel<<<blocks, 256, 0, stream>>>(args, frame);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    WEFT_WARN(kKernel, "peer_reduce launch failed: %s", cudaGetErrorString(e));
    return Status::kCudaError;
  }
  return Status::kOk;
}

Status launch_small_reduce(const SmallReduceArgs& a, const FrameParams& frame, bool after_previous,
                           cudaStream_t stream) {
  const SmallReducePlan& p = a.plan;
  bool ok = p.ranks > 0 && p.ranks <= SmallReducePlan::kMaxRanks && p.rank >= 0 && p.rank < p.ranks && p.blocks > 0 &&
            p.vecs > 0 && a.out && a.words_in && a.epoch > 0 && (!p.pushes() || a.gathered > 0);
  for (int32_t q = 0; ok && q < p.ranks; ++q)
    ok = a.src[q] && a.words_out[q] && (!p.pushes() || q == p.rank || a.push[q]) &&
         (!a.tiles[0] || (a.tiles[q] && a.tiles_target > 0));
  if (!ok) {
    WEFT_WARN(kKernel,
              "small_reduce: rank %d of %d: bad arguments (%d blocks, %lld vectors, epoch %llu, a null "
              "pointer?)",
              p.rank, p.ranks, p.blocks, static_cast<long long>(p.vecs), static_cast<unsigned long long>(a.epoch));
    return Status::kInvalidArgument;
  }
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  cfg.gridDim = dim3(unsigned(p.blocks));
  cfg.blockDim = dim3(SmallReducePlan::kThreads);
  cfg.stream = stream;
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = after_previous ? 1 : 0;
  cudaError_t e = cudaLaunchKernelEx(&cfg, small_reduce_kernel, a, frame);
  if (e == cudaSuccess) e = cudaGetLastError();
  if (e != cudaSuccess) {
    WEFT_WARN(kKernel, "small_reduce: rank %d launch failed: %s", p.rank, cudaGetErrorString(e));
    return Status::kCudaError;
  }
  return Status::kOk;
}

void describe_small_reduce_error(const DeviceError& e, const SmallReducePlan& plan, const char* what) {
  if (e.status == 0 || !e.committed || e.kind != int32_t(DeviceErrorKind::kFlagTimeout) || e.tile_m != kSmallReduceTag)
    return;
  const bool ready = e.flag_index < plan.ranks;
  if (e.flag_index == plan.tiles_word()) {
    WEFT_WARN(kKernel,
              "%s: rank %d %s (small-shape reduction, block %d) gave up after %.3f s waiting for peer %d's "
              "GEMM to finish its tiles of this run (its tile count >= %llu, last seen %llu)",
              what, e.rank, to_string(static_cast<Role>(e.role)), e.block, double(e.waited_ns) * 1e-9, e.tile_n,
              static_cast<unsigned long long>(e.expected), static_cast<unsigned long long>(e.seen));
    return;
  }
  WEFT_WARN(kKernel,
            "%s: rank %d %s (small-shape reduction, block %d) gave up after %.3f s waiting for peer %d: %s "
            "(flag word %d >= %llu, last seen %llu)",
            what, e.rank, to_string(static_cast<Role>(e.role)), e.block, double(e.waited_ns) * 1e-9, e.tile_n,
            ready ? "its partial of this run to be complete (ready)" : "its reduced rows to arrive here (gathered)",
            e.flag_index, static_cast<unsigned long long>(e.expected), static_cast<unsigned long long>(e.seen));
}

}  // namespace weft::kernels
