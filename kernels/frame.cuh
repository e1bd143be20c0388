// Device side of the SM-role kernel frame: role of a block, bounded flag waits, flag signals and
// the timeout error record. Included by every persistent kernel (.cu files only).
//
//   grid = SM count:  [0, compute) compute | intra_comm | inter_send | inter_reduce
//                     blockIdx.x -> role through RoleCounts (runtime/roles.h)
//
// Flags are monotonically increasing uint64 epochs in device (or peer-mapped) memory: the
// writer releases (after its data), the reader acquires and waits for flag >= expected. Every
// wait is bounded by FrameParams::timeout_ns (WEFT_DEVICE_TIMEOUT) measured on %globaltimer;
// the first block to time out claims the error record and fills it, every other waiting block
// sees the claim and leaves, and the host reports the record after the kernel returns.
#pragma once

#include <cstdint>

#include "base/roles.h"
#include "kernels/device_error.h"

namespace weft::kernels {

// What a launch really was, written by the kernel itself (device memory; kernels/frame.h reads it
// back): `weftrun run` reports the plan it executed from this record, not from its input.
enum class KernelKind : int32_t {
  kNone = 0,
  kGemm = 1,
  kAgGemmFused = 2,
  kPiecePush = 3,
  kAgGemmNodes = 4,
  kGemmReduceNodes = 5,
  kPeerReduce = 6,       // GEMM+RS/AR's peer variant: the reduction over NVLink after the GEMM
  kGemmReduceSlots = 7,  // the GEMM core with the reducing epilogue (GEMM+RS/AR's overlap variant)
  kMoeFfnCombine = 8     // the MoE layer's expert FFN, combine and home reduction in one launch
};
struct LaunchRecord {
  int32_t launches;           // blocks 0 of the launches since the record was cleared
  int32_t kernel;             // KernelKind of the last launch
  int32_t grid;               // gridDim.x
  int32_t cluster;            // CTAs per cluster
  int32_t blocks[kNumRoles];  // blocks that ran, by the role the frame gave them (summed over launches)
  // The GEMM with the reducing epilogue (kGemmReduceSlots) also writes the schedule it walked:
  int32_t shards;    // M-shards of its tile order (GEMM+RS/AR's overlap variant: ranks x pieces)
  int32_t lag;       // piece-major order: own piece j ran after round j + lag; 0: rotated order
  int32_t epilogue;  // kEpilogue* bits: where its epilogue stored
  int32_t parts;     // the expert FFN (gate/up then down in one launch): the most K parts of a (row tile, column
                     // block) pair in its last launch (down's or gate/up's last wave's)
};
static_assert(sizeof(LaunchRecord) == 48, "LaunchRecord is read by the host as 12 words");
constexpr int32_t kEpilogueRemotePartials = 1;  // partial tiles into their owners' slots (sends by the epilogue)
constexpr int32_t kEpilogueBroadcast = 2;       // reduced tiles into every peer's C (gathers by the epilogue)

// Launch-wide frame arguments (by value, part of every persistent kernel's Params).
struct FrameParams {
  RoleCounts roles;
  int32_t rank = 0;
  uint64_t timeout_ns = 10ull * 1000 * 1000 * 1000;
  DeviceError* error = nullptr;    // host-mapped record
  int32_t* error_claim = nullptr;  // device word: 0 until some block times out
  LaunchRecord* launch = nullptr;  // device record of the launch; nullptr: not recorded
};

#if defined(__CUDACC__)

__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Flags may be written by another GPU over NVLink, hence system scope.
__device__ __forceinline__ uint64_t flag_load_acquire(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void flag_store_release(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void flag_add_release(uint64_t* p, uint64_t v) {
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Called once per block, at kernel entry or (the GEMM kernel) at its end: counts the block under its
// role (one atomic per block). The host reads the record only once the launch is over.
__device__ __forceinline__ void frame_note_launch(const FrameParams& f, KernelKind kind) {
  if (!f.launch || threadIdx.x != 0) return;
  atomicAdd(&f.launch->blocks[int(f.roles.role_of(int32_t(blockIdx.x)))], 1);
  if (blockIdx.x == 0) {
    uint32_t cluster;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(cluster));
    f.launch->kernel = int32_t(kind);
    f.launch->grid = int32_t(gridDim.x);
    f.launch->cluster = int32_t(cluster);
    atomicAdd(&f.launch->launches, 1);
  }
}

// The schedule a launch walked (LaunchRecord::shards, lag, epilogue), by block 0 only.
__device__ __forceinline__ void frame_note_schedule(const FrameParams& f, int32_t shards, int32_t lag,
                                                    int32_t epilogue) {
  if (!f.launch || threadIdx.x != 0 || blockIdx.x != 0) return;
  f.launch->shards = shards;
  f.launch->lag = lag;
  f.launch->epilogue = epilogue;
}

__device__ __forceinline__ bool frame_aborted(const FrameParams& f) {
  return f.error_claim && *reinterpret_cast<volatile const int32_t*>(f.error_claim) != 0;
}

// Fills the error record if this is the first failure of the launch. Safe from any one thread.
__device__ inline void frame_record_error(const FrameParams& f, DeviceErrorKind kind, Role role, int32_t tile_m,
                                          int32_t tile_n, int32_t flag_index, const void* addr, uint64_t expected,
                                          uint64_t seen, uint64_t waited_ns) {
  if (!f.error_claim || !f.error) __trap();  // launched without a FrameHost: nowhere to report
  if (atomicCAS(f.error_claim, 0, 1) != 0) return;
  volatile DeviceError* e = f.error;
  e->kind = int32_t(kind);
  e->rank = f.rank;
  e->role = int32_t(role);
  e->block = int32_t(blockIdx.x);
  e->tile_m = tile_m;
  e->tile_n = tile_n;
  e->flag_index = flag_index;
  e->flag_addr = reinterpret_cast<uint64_t>(addr);
  e->expected = expected;
  e->seen = seen;
  e->waited_ns = waited_ns;
  e->status = 1;
  __threadfence_system();
  e->committed = 1;
  __threadfence_system();
}

// Waits until *flag >= expected (acquire). False when the wait timed out (the record is written)
// or another block already failed: the caller then leaves its role function.
__device__ inline bool frame_wait_flag(const FrameParams& f, const uint64_t* flag, uint64_t expected, Role role,
                                       int32_t tile_m, int32_t tile_n, int32_t flag_index) {
  uint64_t v = flag_load_acquire(flag);
  if (v >= expected) return true;
  const uint64_t start = globaltimer_ns();
  for (uint32_t i = 1;; ++i) {
    v = flag_load_acquire(flag);
    if (v >= expected) return true;
    if ((i & 15) == 0) {
      const uint64_t waited = globaltimer_ns() - start;
      if (waited > f.timeout_ns) {
        frame_record_error(f, DeviceErrorKind::kFlagTimeout, role, tile_m, tile_n, flag_index, flag, expected, v,
                           waited);
        return false;
      }
      if (frame_aborted(f)) return false;
    }
    __nanosleep(100);
  }
}

#endif  // __CUDACC__

}  // namespace weft::kernels
