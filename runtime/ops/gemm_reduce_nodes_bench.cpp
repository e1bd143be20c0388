// GEMM+RS / GEMM+AR across nodes, the benchmark runner's setup: a context of its own,
// random inputs, the GEMM alone (runtime/exec/gemm_reduce_nodes.h holds the op's setup and schedule).
#include <cuda_bf16.h>

#include <algorithm>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/params.h"
#include "kernels/gemm.h"
#include "runtime/exec/context.h"
#include "runtime/exec/device_data.h"
#include "runtime/ops/cuda_check.h"
#include "runtime/ops/gemm_reduce_nodes.h"
#include "runtime/ops/op_harness.h"

namespace weft::runtime::ops {

using bf16 = __nv_bfloat16;

Status setup_rs_nodes_bench(RsNodes& op, const Workload& wl, bootstrap::Bootstrap& boot, int sms) {
  const char* name = op.all_reduce ? "gemm_ar" : "gemm_rs";
  WEFT_CHECK(op.place(boot));
  int64_t want = 0, ch = 0;
  WEFT_CHECK(get_param("WEFT_GEMM_REDUCE_PIECES", &want));
  WEFT_CHECK(get_param("WEFT_NET_CHANNELS", &ch));
  uint64_t end = 0;
  WEFT_CHECK(op.size(int(want), int(ch), 0, &end));
  // A context of the runner's own, as a program's: the op's layout in its first arena (offset 0),
  // its transport and rings.
  WEFT_CHECK(Context::create(boot, (end + 4095) / 4096 * 4096, &op.own_ctx));
  Context& c = *op.own_ctx;
  uint64_t arena = 0;
  WEFT_CHECK(c.reserve(end, std::string(name) + " across nodes (bench)", &arena));
  if (arena != 0) {
    WEFT_WARN(kKernel, "rank %d: %s across nodes: the runner's arena starts at %llu, not 0", op.rank, name,
              (unsigned long long)arena);
    return Status::kInternal;
  }
  WEFT_CUDA_CHECK(cudaMemset(c.local(0), 0, end));  // zero slot regions, flags at epoch 0
  transport::Transport* tp = nullptr;
  WEFT_CHECK(c.transport(op.channels, to_string(wl.transport.inter_node), to_string(wl.transport.signal_mode), &tp));
  std::vector<transport::DeviceFifo> rings;
  for (int r = 0; r < op.channels; ++r) rings.push_back(c.fifo(r));
  std::vector<char*> peers;
  for (int r = 0; r < op.world; ++r) peers.push_back(static_cast<char*>(c.peer(r, 0)));
  op.attach(static_cast<char*>(c.local(0)), peers, tp, rings);

  RoleCounts roles;
  roles.inter_send = 1;
  roles.compute = sms - roles.inter_send;
  int32_t group_m = 16;
  WEFT_CHECK(gemm_group(&group_m));
  WEFT_CHECK(op.prepare(roles, group_m, nullptr));

  WEFT_CUDA_CHECK(cudaMalloc(&op.a, size_t(op.m * op.k_loc) * sizeof(bf16)));
  WEFT_CUDA_CHECK(cudaMalloc(&op.b, size_t(op.n * op.k_loc) * sizeof(bf16)));
  WEFT_CUDA_CHECK(cudaMalloc(&op.ref, size_t(op.result_elems()) * sizeof(bf16)));
  WEFT_CUDA_CHECK(cudaMalloc(&op.ref_partial, size_t(op.m * op.n) * sizeof(bf16)));
  WEFT_CUDA_CHECK(cudaMalloc(&op.scratch, size_t(op.m * op.n) * sizeof(bf16)));
  uint64_t seed = 0;
  WEFT_CHECK(shared_seed(boot, std::string("weft.") + name + "_nodes.seed", &seed));
  WEFT_CHECK(fill_random_bf16(op.a, op.m * op.k_loc, seed, op.rank, 1.0f, op.main));
  WEFT_CHECK(fill_random_bf16(op.b, op.n * op.k_loc, seed + 1, op.rank, 1.0f, op.main));
  WEFT_CUDA_CHECK(cudaStreamSynchronize(op.main));
  WEFT_CHECK(op.set_b(op.b));
  kernels::GemmArgs args;  // weft's GEMM alone, on A in global order
  args.m = op.m;
  args.n = op.n;
  args.k = op.k_loc;
  args.a = op.a;
  args.b = op.b;
  args.num_shards = 1;
  args.first_shard = 0;
  args.group_m = group_m;
  WEFT_CHECK(kernels::make_gemm_params(args, &op.gemm_alone));
  WEFT_CUDA_CHECK(cudaDeviceSynchronize());
  return boot.barrier(std::string("weft.") + name + "_nodes.setup");  // heaps zeroed everywhere first
}

}  // namespace weft::runtime::ops

namespace weft::runtime {

Status RsNodes::enqueue_gemm_alone() {
  kernels::EpiStoreBf16 epi{scratch, n, n % 2 == 0};
  return kernels::launch_gemm(gemm_alone, frame_params, epi, kernels::FlagGate{}, kernels::TileSignal{}, main,
                              ops::bench_gemm_options());
}

}  // namespace weft::runtime
