// GPU tests of the multi-node GEMM+ReduceScatter / GEMM+AllReduce kernel (kernels/gemm_reduce_nodes.h)
// on its own, without weftrun or NCCL: ranks forked as emulated nodes (2 x 2 and 4 x 1), driven through
// the op's setup and enqueue (runtime/exec/gemm_reduce_nodes.h, the runner's setup_rs_nodes_bench), the device FIFO,
// proxy and socket backend between nodes, CUDA IPC and copy engines within a node.
//   - Every rank's A and B encode that rank in every element; after each of three calls (every buffer
//     a call writes poisoned first) this rank's rows (ReduceScatter) or all of C (AllReduce) match an
//     fp32 reference summed over every rank's K slice: a misrouted or missing partial, an unwritten
//     element or a row block summed twice fails.
//   - The cross-node exchange alone (no GEMM) completes between them.
// One rank per GPU where there are enough; otherwise ranks share GPUs and compute on 16 SMs each (the
// protocol, not NVLink). Exits 77 (skipped) where no Hopper GPU is visible.
#include <cuda_runtime.h>
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bootstrap/rank_context.h"
#include "fork_gpu.h"
#include "kernels/gemm.h"
#include "local_bootstrap.h"
#include "runtime/ops/gemm_reduce_nodes.h"
#include "runtime/workload.h"
#include "tests/kernels/gemm_testing.cuh"

using weft::Status;
namespace kt = weft::kernels::testing;
namespace ops = weft::runtime::ops;
using bf16 = __nv_bfloat16;

namespace {

constexpr int kRanks = 4;
constexpr int64_t kRowsPerRank = 256, kN = 512, kKPerRank = 64;

// An exactly representable bf16 (a multiple of 1/64 in [-1, 1)) that depends on the source rank and
// on which matrix (0: A, 1: B) it belongs to.
__host__ __device__ inline float rank_value(int rank, int which, int64_t i) {
  const uint32_t h = uint32_t(i) * 2654435761u ^ (uint32_t(rank + 1) * 0x9E3779B9u) ^ (uint32_t(which) << 30);
  return float(int((h >> 8) % 128) - 64) / 64.f;
}

// rows x cols, row-major, ld = ld; value index i = row * cols + col.
__global__ void fill_rank(bf16* p, int64_t rows, int64_t cols, int64_t ld, int rank, int which) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * cols;
       i += int64_t(gridDim.x) * blockDim.x)
    p[(i / cols) * ld + i % cols] = __float2bfloat16(rank_value(rank, which, i));
}

int rank_body(weft::testing::ForkBootstrap& boot, int ngpu, bool all_reduce, int nodes) {
  const auto& info = boot.info();
  const int W = info.size, me = info.rank, dev = me % ngpu;
  FORK_CUDA_TRY(cudaSetDevice(dev));
  const int64_t m = kRowsPerRank * W, k = kKPerRank * W;
  const std::string text =
      std::string("op: ") + (all_reduce ? "gemm_ar" : "gemm_rs") + "\ndtype: bf16\nshape: {m: " + std::to_string(m) +
      ", n: " + std::to_string(kN) + ", k: " + std::to_string(k) + "}\nlayout: {nodes: " + std::to_string(nodes) +
      ", gpus_per_node: " + std::to_string(W / nodes) + "}\ntransport: {inter_node: socket, signal_mode: batched}\n";
  weft::runtime::Workload wl;
  std::string err;
  if (weft::runtime::parse_workload(text, "test.yaml", &wl, &err) != Status::kOk) return boot.report(err), 21;
  ops::RsNodes op;
  op.all_reduce = all_reduce;
  op.rank = me;
  op.world = W;
  op.m = m;
  op.n = kN;
  op.k_loc = kKPerRank;
  op.m_loc = kRowsPerRank;
  int sms = 0;
  FORK_TRY(weft::kernels::device_sm_count(&sms), 22);
  // Sharing a GPU, every rank's persistent launch must fit beside the others' (and the copies').
  FORK_TRY(ops::setup_rs_nodes_bench(op, wl, boot, ngpu < W ? 17 : sms), 23);

  // This rank's A (m x k/W) and B (n x k/W) in place of the setup's random ones (enqueue copies A into
  // position order on every call); the reference: C = Σ_q A_q B_qᵀ = [A_0 | A_1 | ...] [B_0 | B_1 | ...]ᵀ.
  fill_rank<<<256, 256>>>(op.a, m, kKPerRank, kKPerRank, me, 0);
  fill_rank<<<256, 256>>>(op.b, kN, kKPerRank, kKPerRank, me, 1);
  kt::DevBuf<bf16> a_full(m * k), b_full(kN * k);
  kt::DevBuf<float> ref(m * kN);
  for (int q = 0; q < W; ++q) {
    fill_rank<<<256, 256>>>(a_full.p + q * kKPerRank, m, kKPerRank, k, q, 0);
    fill_rank<<<256, 256>>>(b_full.p + q * kKPerRank, kN, kKPerRank, k, q, 1);
  }
  kt::reference(a_full.p, b_full.p, nullptr, ref.p, int(m), int(kN), int(k));
  FORK_CUDA_TRY(cudaDeviceSynchronize());
  const float* want = all_reduce ? ref.p : ref.p + int64_t(me) * kRowsPerRank * kN;

  std::string summary = "rank " + std::to_string(me) + " " + (all_reduce ? "AllReduce" : "ReduceScatter") + " " +
                        std::to_string(nodes) + " x " + std::to_string(W / nodes) + ", " + std::to_string(op.pieces) +
                        " pieces, " + std::to_string(op.nslots()) + " staged slots";
  for (int call = 1; call <= 4; ++call) {
    const bool compute = call != 3;  // call 3: the cross-node exchange alone
    FORK_TRY(op.poison(), 30);
    FORK_TRY(boot.barrier("call." + std::to_string(call)), 31);  // nobody writes into a slot being poisoned
    FORK_TRY(op.enqueue(op.a, op.b, op.main, compute), 32);
    FORK_TRY(op.sync(compute ? "gemm_reduce_nodes" : "gemm_reduce_nodes exchange"), 33);
    FORK_TRY(op.check(compute ? "gemm_reduce_nodes" : "gemm_reduce_nodes exchange"), 34);
    std::string line = "; call " + std::to_string(call);
    if (compute) {
      const kt::Compared c = kt::compare(op.result(), want, op.result_elems());
      line += ": rel err " + std::to_string(c.rel_err) + ", " + std::to_string(c.bad) + " unwritten";
      summary += line;
      if (c.bad || !(c.rel_err < 1e-2)) return boot.report(summary), 35;
    } else {
      summary += line + ": exchange alone ok";
    }
    // The socket backend stages a put from the heap when its proxy next runs, which may be after this
    // rank saw its own call complete: every put has left before the next call's poison, and every
    // rank is past this call (the race made a rail peer's whole result NaN now and then).
    FORK_TRY(op.tp->flush(), 36);
    FORK_TRY(boot.barrier("called." + std::to_string(call)), 36);
  }
  FORK_TRY(op.tp->flush(), 36);
  FORK_TRY(boot.barrier("done"), 37);  // every rank has all it waits for: the transports may stop
  op.tp = nullptr;
  op.own_ctx.reset();  // rings, transport, then the heap's collective close
  boot.report(summary);
  return 0;
}

void run_case(bool all_reduce, int nodes) {
  const int ngpu = weft::testing::fork_gpus_or_skip(kRanks, true);
  const auto res = weft::testing::run_forked(
      kRanks, kRanks / nodes, [&](weft::testing::ForkBootstrap& b) { return rank_body(b, ngpu, all_reduce, nodes); },
      240);
  for (const auto& r : res) {
    MESSAGE(r.report);
    CAPTURE(r.rank);
    CHECK(r.exited);
    CHECK(r.exit_code == 0);
  }
}

}  // namespace

TEST_CASE("gemm_reduce_nodes: ReduceScatter across 2 nodes x 2") { run_case(false, 2); }
TEST_CASE("gemm_reduce_nodes: AllReduce across 2 nodes x 2") { run_case(true, 2); }
TEST_CASE("gemm_reduce_nodes: ReduceScatter across 4 nodes x 1") { run_case(false, 4); }
TEST_CASE("gemm_reduce_nodes: AllReduce across 4 nodes x 1") { run_case(true, 4); }
