// The persistent warp-specialized bf16 GEMM main loop for sm_90a, written once for every kernel
// that computes C = A * B^T tiles: the standalone GEMM and the fused communication kernels.
//
//   block (384 threads) = warpgroup 0: producer  (setmaxnreg 40; one thread issues TMA loads)
//                         warpgroups 1, 2: consumers (setmaxnreg 232; wgmma m64n256k16, each
//                                          owns 64 rows of the 128 x 256 tile)
//
//   global A (M x K) ──TMA──► smem ring of kStages {A 128x64, B 256x64} ──wgmma──► fp32 regs
//   global B (N x K) ──TMA──┘   full[s]: TMA bytes landed      empty[s]: 8 consumer warps done
//                                                                 │
//                           epilogue (per tile, from registers) ◄─┘ store / add / signal
//
// A fused kernel calls gemm_compute_block() from the compute branch of its role switch and
// supplies: an Epilogue (where a finished fp32 pair goes: local or peer store, add into a peer's
// heap), a FlagGate (flag the producer waits on before loading a tile's operands: e.g. "rank r's
// rows of A have arrived") and a TileSignal (flag bumped after a tile is stored).
#pragma once

#include <cuda_bf16.h>

#include "kernels/frame.cuh"
#include "kernels/gemm_epilogues.h"
#include "kernels/gemm_types.h"
#include "kernels/sm90.cuh"
#include "kernels/tile_scheduler.h"

namespace weft::kernels {

#if defined(__CUDACC__)

namespace gemm_detail {

struct __align__(1024) SharedStorage {
  __nv_bfloat16 a[GemmConfig::kStages][GemmConfig::kTileM * GemmConfig::kTileK];
  __nv_bfloat16 b[GemmConfig::kStages][GemmConfig::kTileN * GemmConfig::kTileK];
  uint64_t full[GemmConfig::kStages];
  uint64_t empty[GemmConfig::kStages];
  int32_t abort;
};
static_assert(sizeof(__nv_bfloat16) * GemmConfig::kTileM * GemmConfig::kTileK % 1024 == 0,
              "every A stage must stay 1024-B aligned for the 128B swizzle");
static_assert(sizeof(SharedStorage) + 1024 <= 227 * 1024, "shared-memory budget of one H100/H200 block");

// Bounded wait on an in-block barrier; false when the launch is abandoned (this or another
// block timed out), so the caller leaves its role function. The clock and the launch-wide abort
// word are read only every 1024 failed tries: every waiting thread of every SM polling one
// global word would flood its L2 slice and slow the copy engine's loads down with it.
__device__ __forceinline__ bool wait_barrier(uint64_t* bar, uint32_t phase, const FrameParams& f, const TileCoord& c) {
  if (sm90::mbar_try_wait(bar, phase)) return true;
  uint64_t start = 0;
  for (uint32_t tries = 1;; ++tries) {
    if (sm90::mbar_try_wait(bar, phase)) return true;
    if ((tries & 1023) == 0) {
      const uint64_t now = globaltimer_ns();
      if (start == 0) start = now;
      if (frame_aborted(f)) return false;
      // Twice the flag bound: a producer gated on a slow flag must time out (and say why) first.
      if (now - start > 2 * f.timeout_ns) {
        frame_record_error(f, DeviceErrorKind::kBarrierTimeout, Role::kCompute, c.m_block, c.n_block, -1, bar, phase, 0,
                           now - start);
        return false;
      }
    }
  }
}

__device__ __forceinline__ int32_t flag_index(int32_t granularity, const GemmParams& g, const TileCoord& c) {
  return granularity == kFlagPerShard ? c.shard : c.m_block * g.n_blocks + c.n_block;
}

// Releases a ring stage: one arrival per consumer warp on the stage's `empty` barrier of every
// CTA of the cluster (each CTA's producer multicasts into all of them).
template <int kCluster>
__device__ __forceinline__ void release_stage(uint64_t* bar) {
  if constexpr (kCluster == 1) {
    sm90::mbar_arrive(bar);
  } else {
#pragma unroll
    for (uint32_t r = 0; r < kCluster; ++r) sm90::mbar_arrive_cluster(bar, r);
  }
}

// The CTA's own 128-row tile inside the cluster tile `cc`.
template <int kCluster>
__device__ __forceinline__ TileCoord cta_tile(const TileCoord& cc, uint32_t cta) {
  TileCoord c = cc;
  c.m_block = cc.m_block * kCluster + int32_t(cta);
  return c;
}

template <int kCluster>
__device__ __forceinline__ void producer_loop(const GemmParams& g, const FrameParams& f, const FlagGate& gate,
                                              SharedStorage& s, uint32_t cta, int32_t cluster_idx, int32_t clusters) {
  using Cfg = GemmConfig;
  constexpr uint32_t kStageBytes = (Cfg::kTileM + Cfg::kTileN) * Cfg::kTileK * sizeof(__nv_bfloat16);
  constexpr int32_t kBRows = Cfg::kTileN / kCluster;  // rows of B this CTA loads (and multicasts)
  const int32_t k_iters = (g.k + Cfg::kTileK - 1) / Cfg::kTileK;
  uint32_t it = 0;
  for (PersistentTileIter t(g.sched, cluster_idx, clusters); t.valid(); t.advance()) {
    const TileCoord c = cta_tile<kCluster>(t.current(), cta);
    bool ok = true;
    if (gate.flags && (gate.granularity == kFlagPerShard || c.m_block < g.cta_m_blocks)) {
      const int32_t idx = flag_index(gate.granularity, g, c);
      ok = frame_wait_flag(f, gate.flags + idx, gate.expected, Role::kCompute, c.m_block, c.n_block, idx);
      // The data behind the flag is read by the copy engine (async proxy) next.
      asm volatile("fence.proxy.async.global;" ::: "memory");
    }
    if (!ok) {
      // Wake this CTA's consumers with an empty arrival on the next stage; they see `abort`.
      const uint32_t stage = it % Cfg::kStages, phase = (it / Cfg::kStages) & 1;
      if (!wait_barrier(&s.empty[stage], phase ^ 1, f, c)) return;
      s.abort = 1;
      sm90::mbar_arrive(&s.full[stage]);
      return;
    }
    const int32_t row_a = c.m_block * Cfg::kTileM;
    const int32_t row_b = c.n_block * Cfg::kTileN + int32_t(cta) * kBRows;
    for (int32_t kb = 0; kb < k_iters; ++kb, ++it) {
      const uint32_t stage = it % Cfg::kStages, phase = (it / Cfg::kStages) & 1;
      if (!wait_barrier(&s.empty[stage], phase ^ 1, f, c)) return;
      // A (own) + all of B (own part + the peers' multicast parts) land on this barrier.
      sm90::mbar_arrive_expect_tx(&s.full[stage], kStageBytes);
      sm90::tma_load_2d(s.a[stage], &g.tmap_a, &s.full[stage], kb * Cfg::kTileK, row_a);
      if constexpr (kCluster == 1) {
        sm90::tma_load_2d(s.b[stage], &g.tmap_b, &s.full[stage], kb * Cfg::kTileK, row_b);
      } else {
        sm90::tma_load_2d_multicast(s.b[stage] + cta * kBRows * Cfg::kTileK, &g.tmap_b, &s.full[stage],
                                    kb * Cfg::kTileK, row_b, uint16_t((1u << kCluster) - 1));
      }
    }
  }
}

template <int kCluster, class Epilogue>
__device__ __forceinline__ void consumer_loop(const GemmParams& g, const FrameParams& f, const Epilogue& epi,
                                              const TileSignal& signal, SharedStorage& s, uint32_t cta,
                                              int32_t cluster_idx, int32_t clusters) {
  using Cfg = GemmConfig;
  const int32_t k_iters = (g.k + Cfg::kTileK - 1) / Cfg::kTileK;
  const int32_t consumer = threadIdx.x / 128 - 1;  // which 64-row half of the tile
  const int32_t t128 = threadIdx.x % 128;
  const int32_t warp = t128 / 32, lane = t128 % 32;
  float acc[128];
  uint32_t it = 0;
  for (PersistentTileIter t(g.sched, cluster_idx, clusters); t.valid(); t.advance()) {
    const TileCoord c = cta_tile<kCluster>(t.current(), cta);
    for (int32_t kb = 0; kb < k_iters; ++kb, ++it) {
      const uint32_t stage = it % Cfg::kStages, phase = (it / Cfg::kStages) & 1;
      if (!wait_barrier(&s.full[stage], phase, f, c) || *reinterpret_cast<volatile int32_t*>(&s.abort)) {
        sm90::wgmma_wait<0>();  // leave nothing in flight (else the compiler waits on every path)
        return;
      }
      const uint64_t desc_a = sm90::make_smem_desc_sw128(s.a[stage] + consumer * 64 * Cfg::kTileK);
      const uint64_t desc_b = sm90::make_smem_desc_sw128(s.b[stage]);
      sm90::wgmma_fence();
#pragma unroll
      for (int k = 0; k < Cfg::kTileK / 16; ++k) {
        // +32 bytes per k16 step inside the swizzled 128-byte row: +2 in the >>4 address field.
        sm90::wgmma_m64n256k16(acc, desc_a + 2 * k, desc_b + 2 * k, (kb > 0 || k > 0) ? 1 : 0);
      }
      sm90::wgmma_commit();
      // Keep one k-block of MMAs in flight; the one before it is done reading its stage.
      sm90::wgmma_wait<1>();
      if (kb > 0 && lane == 0) release_stage<kCluster>(&s.empty[(it - 1) % Cfg::kStages]);
    }
    sm90::wgmma_wait<0>();
    if (lane == 0) release_stage<kCluster>(&s.empty[(it - 1) % Cfg::kStages]);
    if (c.m_block >= g.cta_m_blocks) continue;  // the cluster's second tile hangs past M

    // Epilogue straight from the accumulator fragment: thread holds, for j in [0, 32),
    // rows r and r+8, columns 8j + 2*(lane%4) + {0, 1}.
    const int32_t row = c.m_block * Cfg::kTileM + consumer * 64 + warp * 16 + lane / 4;
    const int32_t col0 = c.n_block * Cfg::kTileN + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const int32_t col = col0 + 8 * j;
      if (col < g.n) {
        const bool two = col + 1 < g.n;
        if (row < g.m) epi.pair(row, col, acc[4 * j + 0], acc[4 * j + 1], two);
        if (row + 8 < g.m) epi.pair(row + 8, col, acc[4 * j + 2], acc[4 * j + 3], two);
      }
    }
    if (signal.flags) {
      // Every consumer thread's stores of this tile happen before the release below.
      sm90::named_barrier_sync(1, Cfg::kConsumers * 128);
      if (t128 == 0 && consumer == 0) {
        __threadfence_system();
        flag_add_release(signal.flags + flag_index(signal.granularity, g, c), signal.add);
      }
    }
  }
}

}  // namespace gemm_detail

constexpr size_t gemm_smem_bytes() { return sizeof(gemm_detail::SharedStorage) + 1024; }

// The compute role of a persistent GEMM block. All 384 threads of the block call it; it returns
// when this block's tiles are done or the launch was abandoned after a timeout.
//   kCluster: GemmParams::cluster_m (1 or 2); the launch must use clusters of that many CTAs
//     along x, compute blocks must start at block 0 and come in whole clusters.
//   block_in_role / blocks_in_role: this block's index among the compute blocks and their count.
//   smem_raw: the kernel's dynamic shared memory (at least gemm_smem_bytes()).
template <int kCluster, class Epilogue>
__device__ __forceinline__ void gemm_compute_block(const GemmParams& g, const FrameParams& f, const Epilogue& epi,
                                                   const FlagGate& gate, const TileSignal& signal,
                                                   int32_t block_in_role, int32_t blocks_in_role, uint8_t* smem_raw) {
  static_assert(kCluster == 1 || kCluster == 2, "cluster of 1 or 2 CTAs along M");
  using Cfg = GemmConfig;
  using gemm_detail::SharedStorage;
  SharedStorage& s =
      *reinterpret_cast<SharedStorage*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const uint32_t cta = kCluster > 1 ? sm90::cluster_ctarank() : 0;
  const int32_t cluster_idx = block_in_role / kCluster, clusters = blocks_in_role / kCluster;

  if (threadIdx.x == 0) {
    for (int i = 0; i < Cfg::kStages; ++i) {
      sm90::mbar_init(&s.full[i], 1);
      sm90::mbar_init(&s.empty[i], Cfg::kConsumers * 4 * kCluster);
    }
    s.abort = 0;
    sm90::fence_barrier_init();
    sm90::tma_prefetch_desc(&g.tmap_a);
    sm90::tma_prefetch_desc(&g.tmap_b);
  }
  // Peers arrive on (and multicast into) this CTA's barriers: all must be initialised first.
  if constexpr (kCluster > 1)
    sm90::cluster_sync();
  else
    __syncthreads();

  // No thread leaves before the cluster's final barrier: a peer may still arrive on this CTA's
  // barriers or write into its shared memory until then.
  if (threadIdx.x < 128) {
    sm90::setmaxnreg_dec<40>();
    if (threadIdx.x == 0) gemm_detail::producer_loop<kCluster>(g, f, gate, s, cta, cluster_idx, clusters);
    __syncwarp();
    if constexpr (kCluster > 1) sm90::cluster_sync();
  } else {
    sm90::setmaxnreg_inc<232>();
    gemm_detail::consumer_loop<kCluster>(g, f, epi, signal, s, cta, cluster_idx, clusters);
    if constexpr (kCluster > 1) sm90::cluster_sync();
  }
}

// The standalone GEMM kernel: the frame with the compute role only (blocks given to other roles
// have nothing to do here; the benchmark uses them to model SMs lent to communication).
template <class Epilogue>
struct GemmKernelParams {
  GemmParams gemm;
  FrameParams frame;
  Epilogue epi;
  FlagGate gate;
  TileSignal signal;
};

template <int kCluster, class Epilogue>
__global__ void __launch_bounds__(GemmConfig::kThreads, 1)
    gemm_persistent_kernel(const __grid_constant__ GemmKernelParams<Epilogue> p) {
  extern __shared__ uint8_t gemm_smem[];
  if (p.frame.roles.role_of(blockIdx.x) == Role::kCompute) {
    gemm_compute_block<kCluster>(p.gemm, p.frame, p.epi, p.gate, p.signal, int32_t(blockIdx.x), p.frame.roles.compute,
                                 gemm_smem);
  }
}

#endif  // __CUDACC__

}  // namespace weft::kernels
