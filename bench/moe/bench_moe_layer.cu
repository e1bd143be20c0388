// The MoE layer op (runtime/exec/moe.h) timed on every rank of a `weftrun exec -n W` job: shapes from
// public model configs (Mixtral-8x7B, Qwen3-30B-A3B, DeepSeek-V3 sizes) at 4096 and 256 tokens per
// rank, fresh random tokens and weights, CUDA events around each call, median of --iters calls after
// 5 warm-ups. Rank 0 prints one markdown row per shape with the slowest rank's median (the layer
// ends when its last rank does). Run the PyTorch sequential layer (bench/peers/moe_sequential.py,
// torchrun) in the same call on the same machine to compare.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_ranks.h"
#include "bench/gemm/bench_timing.h"
#include "bootstrap/pmix_bootstrap.h"
#include "kernels/moe_plan.h"
#include "runtime/exec/context.h"
#include "runtime/exec/moe.h"

namespace runtime = weft::runtime;
namespace bootstrap = weft::bootstrap;
using weft::Status;
using namespace weft::kernels::testing;
using bf16 = __nv_bfloat16;

namespace {

struct Shape {
  const char* name;
  int hidden, ffn, experts, topk;
};
constexpr Shape kShapes[] = {
    {"Mixtral-8x7B", 4096, 14336, 8, 2},
    {"Qwen3-30B-A3B", 2048, 768, 128, 8},
    {"DeepSeek-V3", 7168, 2048, 256, 8},
};

template <class T>
T* dalloc(int64_t n) {
  T* p = nullptr;
  WEFT_CUDA_OK(cudaMalloc(&p, size_t(n) * sizeof(T)));
  return p;
}

// Zipf-skewed routing: row 0 of the router (feature 0, which set_feature0 makes 1 for every token)
// biases expert e by -ln(e + 1), so expert e's share falls as 1/(e + 1) on top of the random part.
__global__ void zipf_router_row(bf16* router, int experts) {
  for (int e = threadIdx.x; e < experts; e += blockDim.x) router[e] = __float2bfloat16_rn(-logf(float(e + 1)));
}
__global__ void set_feature0(bf16* x, int64_t tokens, int64_t hidden) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < tokens; t += int64_t(gridDim.x) * blockDim.x)
    x[t * hidden] = __float2bfloat16_rn(1.f);
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 20;
  bool zipf = false, graph = false;
  std::vector<int> token_list = {4096, 256};
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc)
      iters = std::max(1, std::min(1000, std::atoi(argv[++i])));
    else if (!std::strcmp(argv[i], "--tokens") && i + 1 < argc)
      token_list = {std::max(1, std::min(65536, std::atoi(argv[++i])))};
    else if (!std::strcmp(argv[i], "--routing") && i + 1 < argc && !std::strcmp(argv[i + 1], "zipf"))
      zipf = true, ++i;
    else if (!std::strcmp(argv[i], "--routing") && i + 1 < argc && !std::strcmp(argv[i + 1], "uniform"))
      ++i;
    else if (!std::strcmp(argv[i], "--graph"))
      graph = true;
    else {
      fprintf(stderr,
              "usage: weftrun exec -n W -- bench_moe_layer [--iters N] [--tokens T] [--routing uniform|zipf] "
              "[--graph]\n");
      return 2;
    }
  }
  if (!bootstrap::started_under_pmix()) {
    fprintf(stderr, "bench_moe_layer runs under `weftrun exec -n W`\n");
    return 2;
  }
  std::unique_ptr<bootstrap::PmixBootstrap> boot;
  if (bootstrap::PmixBootstrap::connect(&boot) != Status::kOk) return 1;
  const int rank = boot->info().rank, W = boot->info().size;
  int gpus = 0;
  WEFT_CUDA_OK(cudaGetDeviceCount(&gpus));
  WEFT_CUDA_OK(cudaSetDevice(boot->info().local_rank % gpus));
  // The heap holds the largest shape's worst-case layout (the op's default: no counts exchanged
  // first), plus 64 MiB for the context's own regions.
  int64_t heap = 0;
  for (int T : token_list)
    for (const Shape& sh : kShapes) {
      weft::kernels::MoeShape ms;
      ms.tokens = T, ms.hidden = int32_t(sh.hidden), ms.ffn = int32_t(sh.ffn), ms.experts = int32_t(sh.experts);
      ms.topk = int32_t(sh.topk), ms.world = W;
      weft::kernels::MoeHeapLayout layout;
      const char* why = nullptr;
      if (sh.experts % W == 0 && weft::kernels::moe_heap_layout(ms, 0, &layout, &why))
        heap = std::max(heap, layout.total_bytes);
    }
  std::unique_ptr<runtime::Context> ctx;
  if (runtime::Context::create(*boot, uint64_t(heap) + (uint64_t(64) << 20), &ctx) != Status::kOk) return 1;
  cudaDeviceProp prop{};
  WEFT_CUDA_OK(cudaGetDeviceProperties(&prop, boot->info().local_rank % gpus));
  if (rank == 0) {
    printf("# %s, %d ranks on %d GPU(s), %s routing, median of %d calls after 5 warm-ups, slowest rank%s\n", prop.name,
           W, std::min(W, gpus), zipf ? "Zipf-skewed" : "near-uniform", iters,
           graph ? "; graph: the call captured once and replayed" : "");
    printf(
        "| shape | T/rank | weft layer ms |%s route | dispatch | arrange (+wait) | grouped FFN | combine (+wait) |\n"
        "|---|---|---|%s---|---|---|---|---|\n",
        graph ? " graph ms |" : "", graph ? "---|" : "");
  }
  int shape_no = 0;
  for (int T : token_list)
    for (const Shape& sh : kShapes) {
      ++shape_no;
      const int64_t H = sh.hidden, F = sh.ffn, E = sh.experts, L = E / W, K = sh.topk;
      if (E % W) continue;
      const uint64_t seed = uint64_t(time(nullptr)) * 7 + uint64_t(rank) * 1000003 + shape_no;
      bf16 *router = dalloc<bf16>(H * E), *gate = dalloc<bf16>(L * F * H), *up = dalloc<bf16>(L * F * H),
           *down = dalloc<bf16>(L * H * F), *x = dalloc<bf16>(int64_t(T) * H), *out = dalloc<bf16>(int64_t(T) * H);
      random_bf16(router, H * E, uint64_t(time(nullptr)) / 60 + shape_no, 0.05f);  // the same on every rank
      random_bf16(gate, L * F * H, seed + 1, 0.05f);
      random_bf16(up, L * F * H, seed + 2, 0.05f);
      random_bf16(down, L * H * F, seed + 3, 0.05f);
      random_bf16(x, int64_t(T) * H, seed + 4, 1.f);
      if (zipf) {
        zipf_router_row<<<1, 256>>>(router, int(E));
        set_feature0<<<64, 256>>>(x, T, H);
      }
      WEFT_CUDA_OK(cudaDeviceSynchronize());
      runtime::Plan plan;
      plan.op = runtime::Op::kMoe;
      plan.world_size = W, plan.nodes = 1, plan.gpus_per_node = W;
      plan.moe.tokens = int64_t(T) * W, plan.moe.hidden = H, plan.moe.ffn = F, plan.moe.experts = E;
      plan.roles.compute = ctx->sm_count();
      plan.moe.topk = K;
      runtime::MoeWeights wts{router, gate, up, down};
      std::unique_ptr<runtime::MoeOp> op;
      if (runtime::MoeOp::create(*ctx, plan, wts, &op) != Status::kOk) {
        fprintf(stderr, "rank %d: %s T=%d: MoeOp::create failed\n", rank, sh.name, T);
        return 1;
      }
      cudaStream_t s;
      WEFT_CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      const double ms = weft::bench::time_ms(
          iters, 1, s,
          [&](int) {
            if (op->run(x, out, s) != Status::kOk) std::exit(1);
          },
          [](cudaEvent_t) {});
      int64_t dropped = -1;
      if (op->dropped(&dropped) != Status::kOk || dropped != 0) {
        fprintf(stderr, "rank %d: %s: %lld rows dropped\n", rank, sh.name, (long long)dropped);
        return 1;
      }
      const double worst = weft::bench::allgather_max(*boot, "bench.moe." + std::to_string(shape_no), ms);
      // The same call captured in a CUDA graph once and replayed (a decode step's launch cost).
      double graph_worst = 0;
      if (graph) {
        cudaGraph_t g = nullptr;
        cudaGraphExec_t ge = nullptr;
        WEFT_CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        const Status captured = op->run(x, out, s);
        WEFT_CUDA_OK(cudaStreamEndCapture(s, &g));
        if (captured != Status::kOk) {
          fprintf(stderr, "rank %d: %s: the call could not be captured\n", rank, sh.name);
          return 1;
        }
        WEFT_CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
        WEFT_CUDA_OK(cudaGraphDestroy(g));
        const double gms = weft::bench::time_ms(
            iters, 1, s, [&](int) { WEFT_CUDA_OK(cudaGraphLaunch(ge, s)); }, [](cudaEvent_t) {});
        WEFT_CUDA_OK(cudaStreamSynchronize(s));
        WEFT_CUDA_OK(cudaGraphExecDestroy(ge));
        if (op->dropped(&dropped) != Status::kOk || dropped != 0) {
          fprintf(stderr, "rank %d: %s: %lld rows dropped in the replays\n", rank, sh.name, (long long)dropped);
          return 1;
        }
        graph_worst = weft::bench::allgather_max(*boot, "bench.moe.graph." + std::to_string(shape_no), gms);
      }
      // Where the time goes: each phase's median over more calls, on the slowest rank for that phase.
      cudaEvent_t ev[runtime::MoeOp::kPhases + 1];
      for (auto& e : ev) WEFT_CUDA_OK(cudaEventCreate(&e));
      op->record_phases(ev);
      std::vector<std::vector<float>> ph(runtime::MoeOp::kPhases);
      for (int i = 0; i < iters; ++i) {
        if (op->run(x, out, s) != Status::kOk) std::exit(1);
        WEFT_CUDA_OK(cudaStreamSynchronize(s));
        for (int p = 0; p < runtime::MoeOp::kPhases; ++p) {
          float v = 0;
          WEFT_CUDA_OK(cudaEventElapsedTime(&v, ev[p], ev[p + 1]));
          ph[size_t(p)].push_back(v);
        }
      }
      op->record_phases(nullptr);
      for (auto& e : ev) cudaEventDestroy(e);
      double phase_ms[runtime::MoeOp::kPhases];
      for (int p = 0; p < runtime::MoeOp::kPhases; ++p)
        phase_ms[p] =
            weft::bench::allgather_max(*boot, "bench.moe.ph." + std::to_string(shape_no) + "." + std::to_string(p),
                                       weft::bench::median(ph[size_t(p)]));
      if (rank == 0) {
        char g[32] = "";
        if (graph) snprintf(g, sizeof g, " %.3f |", graph_worst);
        printf("| %s | %d | %.3f |%s %.3f | %.3f | %.3f | %.3f | %.3f |\n", sh.name, T, worst, g, phase_ms[0],
               phase_ms[1], phase_ms[2], phase_ms[3], phase_ms[4]);
      }
      fflush(stdout);
      op.reset();
      cudaStreamDestroy(s);
      for (void* p : {static_cast<void*>(router), static_cast<void*>(gate), static_cast<void*>(up),
                      static_cast<void*>(down), static_cast<void*>(x), static_cast<void*>(out)})
        cudaFree(p);
    }
  ctx.reset();
  return 0;
}
