// GEMM+RS / GEMM+AR across nodes, the benchmark runner's setup: a heap and transport of its own,
// random inputs, the GEMM alone (runtime/exec/gemm_reduce_nodes.h holds the op's setup and schedule).
#include <cuda_bf16.h>

#include <algorithm>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/params.h"
#include "kernels/gemm.h"
#include "runtime/exec/device_data.h"
#include "runtime/ops/cuda_check.h"
#include "runtime/ops/gemm_reduce_nodes.h"
#include "runtime/ops/op_harness.h"

namespace weft::runtime::ops {

using bf16 = __nv_bfloat16;

Status setup_rs_nodes_bench(RsNodes& op, const bootstrap::RankContext& ctx, const Workload& wl,
                            bootstrap::Bootstrap& boot, int sms) {
  const char* name = op.all_reduce ? "gemm_ar" : "gemm_rs";
  WEFT_CHECK(op.place(boot));
  int64_t want = 0, ch = 0;
  WEFT_CHECK(get_param("WEFT_GEMM_REDUCE_PIECES", &want));
  WEFT_CHECK(get_param("WEFT_NET_CHANNELS", &ch));
  uint64_t end = 0;
  WEFT_CHECK(op.size(int(want), int(ch), 0, &end));
  WEFT_CHECK(transport::CudaHeap::create(boot, end, &op.heap));
  WEFT_CUDA_CHECK(cudaMemset(op.heap->local(), 0, end));  // zero slot regions, flags at epoch 0

  transport::TransportOptions opt;
  opt.channels = op.channels;
  opt.workload_signal_mode = to_string(wl.transport.signal_mode);
  opt.workload_backend = to_string(wl.transport.inter_node);
  opt.fifo_memory = transport::cuda_fifo_memory();
  opt.copy_hooks = transport::cuda_copy_hooks(ctx.gpu);
  WEFT_CHECK(transport::Transport::create(boot, op.heap->region(), opt, &op.own_tp));
  std::vector<transport::DeviceFifo> rings;
  for (int c = 0; c < op.channels; ++c) {
    std::unique_ptr<transport::DeviceFifoHandle> f;
    WEFT_CHECK(transport::DeviceFifoHandle::create(op.own_tp->fifo_ring(c), op.own_tp->timeout_s(), &f));
    rings.push_back(f->get());
    op.fifos.push_back(std::move(f));
  }
  std::vector<char*> peers;
  for (int r = 0; r < op.world; ++r) peers.push_back(static_cast<char*>(op.heap->peer(r)));
  op.attach(static_cast<char*>(op.heap->local()), peers, op.own_tp.get(), rings);

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
