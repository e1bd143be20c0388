// GEMM+RS / GEMM+AR, peer path (small M, latency-bound): the GEMM stores the partial in a buffer
// every rank maps, then one kernel sums this rank's rows of all partials over NVLink (and, for
// AllReduce, gathers every rank's reduced rows).
#include <chrono>
#include <string>
#include <vector>

#include "kernels/gemm.h"
#include "kernels/reduce_slots.h"
#include "runtime/ops/cuda_check.h"
#include "runtime/ops/gemm_reduce.h"

namespace weft::runtime::ops {

using bf16 = __nv_bfloat16;

Status GemmReduce::enqueue_peer() {
  kernels::EpiStoreBf16 epi{partial.local<bf16>(), n, n % 2 == 0};
  WEFT_CHECK(kernels::launch_gemm(gemm, frame_params, epi, kernels::FlagGate{}, kernels::TileSignal{}, main));
  kernels::PeerReduceArgs pr;
  pr.ranks = world;
  pr.rank = rank;
  pr.elems = m_loc * n;
  const int64_t own = int64_t(rank) * m_loc * n;
  pr.out = all_reduce ? c_full.local<bf16>() + own : out;
  pr.all_gather = all_reduce;
  for (int q = 0; q < world; ++q) {
    pr.src[q] = partial.peer<bf16>(q) + own;
    pr.flags_out[q] = peer_flags.peer<uint64_t>(q);
    if (all_reduce) {
      pr.gather_src[q] = c_full.peer<bf16>(q) + int64_t(q) * m_loc * n;
      pr.gather_dst[q] = c_full.local<bf16>() + int64_t(q) * m_loc * n;
    }
  }
  pr.flags_in = peer_flags.local<uint64_t>();
  pr.arrive = arrive;
  pr.epoch = epoch;
  return kernels::launch_peer_reduce(pr, frame_params, peer_blocks, main);
}

}  // namespace weft::runtime::ops
