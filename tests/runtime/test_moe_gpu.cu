// The MoE op on a GPU, every rank of a `weftrun exec -n W` job (tests/runtime/moe_gpu.sh): routing
// cases (uniform, Zipf-skewed, every token to one expert, experts that get no token), topk 1, 2 and
// 8, token counts that are not multiples of the 128-row tile; `--variant ffn_combine` (last) runs the
// op with the FFN, combine and reduction in one launch, and checks it gives the staged op's bits. Every call on fresh
// random tokens (each rank's its own: a token delivered to the wrong home or combined from the wrong slot fails its
// row), output poisoned first, checked row by row against an fp32 reference that consumes the op's own top-k ids and
// weights and holds every expert's weights; dropped rows asserted 0; the same input run twice gives the same bits.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/pmix_bootstrap.h"
#include "kernels/moe_nodes_plan.h"
#include "kernels/moe_router.h"
#include "runtime/exec/context.h"
#include "runtime/exec/moe.h"
#include "tests/kernels/gemm_testing.cuh"

namespace runtime = weft::runtime;
namespace bootstrap = weft::bootstrap;
namespace kernels = weft::kernels;
using weft::Status;
using namespace weft::kernels::testing;
using bf16 = __nv_bfloat16;

namespace {

int g_rank = 0;
int g_failed = 0;
const char* g_variant = "staged";  // --variant ffn_combine: the FFN, combine and reduction in one launch;
                                   // --variant hierarchical: across (emulated) nodes, the socket backend
int g_nodes = 1;                   // the job's nodes (weftrun exec --emulate-nodes)
int g_channels = 4;                // hierarchical: proxy channels, WEFT_NET_CHANNELS (a block moves in as many pieces)

bool hierarchical() { return std::string(g_variant) == "hierarchical"; }

// The plan every case starts from: the op, the job's layout and the variant; every SM computes, as
// the staged plan gives it.
runtime::Plan base_plan(runtime::Context& ctx) {
  runtime::Plan plan;
  plan.op = runtime::Op::kMoe;
  plan.world_size = ctx.size();
  plan.nodes = hierarchical() ? g_nodes : 1;
  plan.gpus_per_node = ctx.size() / plan.nodes;
  plan.roles.compute = ctx.sm_count();
  plan.exec.variant = g_variant;
  if (hierarchical()) plan.inter_backend = "socket", plan.exec.signal_mode = "batched", plan.exec.channels = g_channels;
  return plan;
}

#define EXPECT(cond, ...)                                                                \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      fprintf(stderr, "rank %d: FAILED %s:%d: %s: ", g_rank, __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                                      \
      fprintf(stderr, "\n");                                                             \
      ++g_failed;                                                                        \
    }                                                                                    \
  } while (0)

enum class Routing { kUniform, kZipf, kOneExpert, kHalfIdle };
const char* routing_name(Routing r) {
  switch (r) {
    case Routing::kUniform:
      return "uniform";
    case Routing::kZipf:
      return "zipf";
    case Routing::kOneExpert:
      return "one-expert";
    case Routing::kHalfIdle:
      return "half-idle";
  }
  return "?";
}

struct Case {
  int tokens;  // per rank
  int hidden, ffn, experts, topk;
  Routing routing;
  bool counts_first = false;  // heap budget for exactly the rows expert 3's owner needs (one-expert top-1)
  bool graph = false;         // one call captured in a CUDA graph, replayed on fresh tokens
};

// The heap budget whose layout (kernels::moe_heap_layout) reserves `rows` grouped rows (a multiple
// of 128, below the worst case): counts first.
uint64_t budget_for_rows(int64_t tokens, int64_t hidden, int64_t ffn, int64_t experts, int64_t topk, int world,
                         int64_t rows) {
  kernels::MoeShape s;
  s.tokens = int32_t(tokens), s.hidden = int32_t(hidden), s.ffn = int32_t(ffn), s.experts = int32_t(experts);
  s.topk = int32_t(topk), s.world = world;
  kernels::MoeHeapLayout worst;
  const char* why = nullptr;
  if (!kernels::moe_heap_layout(s, 0, &worst, &why)) return 0;
  kernels::MoeNodesHeap nodes;  // across nodes the cross-node regions come out of the same budget
  if (hierarchical() && !kernels::moe_nodes_heap(s, g_nodes, world / g_nodes, g_channels, 0, &nodes, &why)) return 0;
  return uint64_t(worst.x_offset + rows * (2 * hidden + ffn) * 2 + (hierarchical() ? nodes.total_bytes : 0));
}

// Router column bias through feature 0 (every token's x[:, 0] = 1): Zipf 1/(e+1), one expert far
// ahead of the rest, or odd experts far behind (they never get a token while topk <= experts / 2).
__global__ void bias_router(bf16* router, int experts, int mode) {
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    float b = 0.f;
    if (mode == 1) b = -logf(float(e + 1));
    if (mode == 2) b = e == 3 % experts ? 60.f : 0.f;
    if (mode == 3) b = e % 2 ? -60.f : 0.f;
    router[e] = __float2bfloat16_rn(b);  // row 0 of hidden x experts
  }
}
__global__ void set_feature0(bf16* x, int tokens, int hidden) {
  for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < tokens; t += gridDim.x * blockDim.x)
    x[int64_t(t) * hidden] = __float2bfloat16_rn(1.f);
}

// Block per token: ref[t] = Σ_j w_j · bf16(down_e · bf16(SiLU(gate_e x) · (up_e x))), fp32.
__global__ void reference_moe(const bf16* x, const int32_t* ids, const float* w, const bf16* gate, const bf16* up,
                              const bf16* down, int hidden, int ffn, int topk, float* ref) {
  extern __shared__ float sh[];
  float* h = sh;          // ffn
  float* acc = sh + ffn;  // hidden
  const int t = blockIdx.x;
  const bf16* xt = x + int64_t(t) * hidden;
  for (int c = threadIdx.x; c < hidden; c += blockDim.x) acc[c] = 0.f;
  for (int j = 0; j < topk; ++j) {
    const int e = ids[t * topk + j];
    const float wt = w[t * topk + j];
    __syncthreads();
    for (int f = threadIdx.x; f < ffn; f += blockDim.x) {
      const bf16* g = gate + (int64_t(e) * ffn + f) * hidden;
      const bf16* u = up + (int64_t(e) * ffn + f) * hidden;
      float sg = 0.f, su = 0.f;
      for (int k = 0; k < hidden; ++k) {
        const float xv = __bfloat162float(xt[k]);
        sg += xv * __bfloat162float(g[k]);
        su += xv * __bfloat162float(u[k]);
      }
      h[f] = __bfloat162float(__float2bfloat16_rn(sg / (1.f + expf(-sg)) * su));
    }
    __syncthreads();
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
      const bf16* d = down + (int64_t(e) * hidden + c) * ffn;
      float s = 0.f;
      for (int f = 0; f < ffn; ++f) s += h[f] * __bfloat162float(d[f]);
      acc[c] += wt * __bfloat162float(__float2bfloat16_rn(s));
    }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < hidden; c += blockDim.x) ref[int64_t(t) * hidden + c] = acc[c];
}

// Rows whose relative error exceeds `tol` (or that hold a NaN: unwritten poison), in *bad_rows.
__global__ void bad_rows(const bf16* out, const float* ref, int tokens, int hidden, float tol, int* count) {
  const int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (t >= tokens) return;
  double d2 = 0, r2 = 0;
  bool nan = false;
  for (int c = lane; c < hidden; c += 32) {
    const float o = __bfloat162float(out[int64_t(t) * hidden + c]), r = ref[int64_t(t) * hidden + c];
    if (!isfinite(o)) nan = true;
    d2 += double(o - r) * (o - r);
    r2 += double(r) * r;
  }
  for (int off = 16; off > 0; off /= 2) {
    d2 += __shfl_down_sync(0xffffffffu, d2, off);
    r2 += __shfl_down_sync(0xffffffffu, r2, off);
    nan |= __shfl_down_sync(0xffffffffu, nan, off);
  }
  if (lane == 0 && (nan || d2 > double(tol) * tol * (r2 + 1e-12))) atomicAdd(count, 1);
}

template <class T>
T* dalloc(int64_t n) {
  T* p = nullptr;
  WEFT_CUDA_OK(cudaMalloc(&p, size_t(n) * sizeof(T)));
  return p;
}

uint64_t shared_seed(bootstrap::Bootstrap& boot, const std::string& key) {
  uint64_t seed = std::random_device{}() * 0x100000001ull ^ uint64_t(time(nullptr));
  bootstrap::Blob mine(8);
  std::memcpy(mine.data(), &seed, 8);
  std::vector<bootstrap::Blob> all;
  if (boot.allgather(key, mine, &all) != Status::kOk || all.empty() || all[0].size() != 8) {
    fprintf(stderr, "rank %d: seed exchange failed\n", g_rank);
    std::exit(1);
  }
  std::memcpy(&seed, all[0].data(), 8);
  return seed;
}

void run_case(runtime::Context& ctx, const Case& c, int case_no, int calls) {
  const int W = ctx.size(), r = ctx.rank();
  const int64_t T = c.tokens, H = c.hidden, F = c.ffn, E = c.experts, L = E / W, K = c.topk;
  const uint64_t seed = shared_seed(ctx.boot(), "moe.test.seed." + std::to_string(case_no));
  char name[160];
  snprintf(name, sizeof name, "T/rank %lld hidden %lld ffn %lld experts %lld top-%lld %s%s%s", (long long)T,
           (long long)H, (long long)F, (long long)E, (long long)K, routing_name(c.routing),
           c.counts_first ? " counts-first" : "", c.graph ? " graph-replayed" : "");
  // Every expert's weights on every rank (the reference needs them all); the op gets this rank's.
  bf16 *router = dalloc<bf16>(H * E), *gate = dalloc<bf16>(E * F * H), *up = dalloc<bf16>(E * F * H),
       *down = dalloc<bf16>(E * H * F);
  random_bf16(router, H * E, seed + 1, 0.5f);
  random_bf16(gate, E * F * H, seed + 2, 1.f / std::sqrt(float(H)));
  random_bf16(up, E * F * H, seed + 3, 1.f / std::sqrt(float(H)));
  random_bf16(down, E * H * F, seed + 4, 1.f / std::sqrt(float(F)));
  const int mode = c.routing == Routing::kZipf        ? 1
                   : c.routing == Routing::kOneExpert ? 2
                   : c.routing == Routing::kHalfIdle  ? 3
                                                      : 0;
  if (mode) bias_router<<<1, 256>>>(router, int(E), mode);
  WEFT_CUDA_OK(cudaDeviceSynchronize());

  runtime::Plan plan = base_plan(ctx);
  plan.moe.tokens = T * W, plan.moe.hidden = H, plan.moe.ffn = F, plan.moe.experts = E, plan.moe.topk = K;
  // Counts first at the boundary: every token's one expert is expert 3, whose owner needs exactly
  // pad(W T) rows; the budget reserves exactly that (below the worst case, which adds padding).
  const int64_t exact_rows = (W * T + 127) / 128 * 128;
  if (c.counts_first) plan.heap_bytes = budget_for_rows(T, H, F, E, K, W, exact_rows);
  runtime::MoeWeights wts;
  wts.router = router;
  wts.gate = gate + r * L * F * H;
  wts.up = up + r * L * F * H;
  wts.down = down + r * L * H * F;
  std::unique_ptr<runtime::MoeOp> op;
  if (runtime::MoeOp::create(ctx, plan, wts, &op) != Status::kOk) {
    EXPECT(false, "%s: MoeOp::create failed", name);
    return;
  }
  if (c.counts_first) {
    EXPECT(op->capacity_rows() == std::max<int64_t>(exact_rows, L * 128), "%s: counts first reserved %lld rows", name,
           (long long)op->capacity_rows());
    kernels::MoeShape ms;
    ms.tokens = int32_t(T), ms.hidden = int32_t(H), ms.ffn = int32_t(F), ms.experts = int32_t(E), ms.topk = int32_t(K);
    ms.world = W;
    // Below the worst case, counts first; where the exact need is the worst case (one expert per
    // rank, L = 1) the budget keeps the worst case.
    const int64_t worst = kernels::moe_worst_grouped_rows(ms);
    if (exact_rows < worst)
      EXPECT(op->capacity_rows() < worst, "%s: %lld rows reserved, not below the worst case %lld", name,
             (long long)op->capacity_rows(), (long long)worst);
    else
      EXPECT(op->capacity_rows() == worst, "%s: %lld rows reserved, the worst case is %lld", name,
             (long long)op->capacity_rows(), (long long)worst);
  }
  bf16 *x = dalloc<bf16>(T * H), *out = dalloc<bf16>(T * H), *out2 = dalloc<bf16>(T * H);
  float* ref = dalloc<float>(T * H);
  int* bad = dalloc<int>(1);
  int32_t* ids = dalloc<int32_t>(T * K);
  float* weights = dalloc<float>(T * K);
  cudaStream_t s;
  WEFT_CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // The SIMT router (checked against a host reference in test_moe_router) on the same tokens: the
  // op's tensor-core logits may differ in the last bits, so a pair may differ only between experts
  // of near-equal weight.
  float* s_logits = dalloc<float>(T * E);
  float* s_weights = dalloc<float>(T * K);
  int32_t *s_ids = dalloc<int32_t>(T * K), *s_counts = dalloc<int32_t>(E), *s_dropped = dalloc<int32_t>(1);
  int routing_off = 0, routing_swapped = 0;
  int bad_calls = 0, worst_bad = 0;
  cudaGraphExec_t graph = nullptr;
  if (c.graph) {  // the call itself, captured once; the fills and poison stay outside the graph
    cudaGraph_t g = nullptr;
    WEFT_CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    const Status st = op->run(x, out, s);
    WEFT_CUDA_OK(cudaStreamEndCapture(s, &g));
    EXPECT(st == Status::kOk, "%s: run during capture failed", name);
    WEFT_CUDA_OK(cudaGraphInstantiate(&graph, g, 0));
    WEFT_CUDA_OK(cudaGraphDestroy(g));
  }
  for (int call = 0; call < calls; ++call) {
    fill_random_bf16<<<256, 256, 0, s>>>(x, T * H, seed * 131 + uint64_t(r) * 7919 + call, 1.f);
    if (mode) set_feature0<<<64, 256, 0, s>>>(x, int(T), int(H));
    WEFT_CUDA_OK(cudaMemsetAsync(out, 0xFF, size_t(T * H) * 2, s));
    if (graph)
      WEFT_CUDA_OK(cudaGraphLaunch(graph, s));
    else
      EXPECT(op->run(x, out, s) == Status::kOk, "%s: run %d failed", name, call);
    WEFT_CUDA_OK(cudaMemcpyAsync(ids, op->topk_ids(), size_t(T * K) * 4, cudaMemcpyDeviceToDevice, s));
    WEFT_CUDA_OK(cudaMemcpyAsync(weights, op->topk_weights(), size_t(T * K) * 4, cudaMemcpyDeviceToDevice, s));
    reference_moe<<<int(T), 256, size_t(F + H) * 4, s>>>(x, ids, weights, gate, up, down, int(H), int(F), int(K), ref);
    WEFT_CUDA_OK(cudaMemsetAsync(bad, 0, 4, s));
    bad_rows<<<int((T + 7) / 8), 256, 0, s>>>(out, ref, int(T), int(H), 2e-2f, bad);
    int nbad = 0;
    WEFT_CUDA_OK(cudaMemcpyAsync(&nbad, bad, 4, cudaMemcpyDeviceToHost, s));
    WEFT_CUDA_OK(cudaStreamSynchronize(s));
    if (nbad) ++bad_calls, worst_bad = std::max(worst_bad, nbad);
    {
      kernels::MoeRouterArgs ra;
      ra.tokens = x, ra.weight = router, ra.tokens_n = int32_t(T), ra.hidden = int32_t(H), ra.experts = int32_t(E);
      ra.topk = int32_t(K);
      kernels::MoeRouterOut ro;
      ro.logits = s_logits, ro.topk_ids = s_ids, ro.topk_weights = s_weights, ro.counts = s_counts;
      ro.dropped = s_dropped;
      EXPECT(kernels::launch_moe_router(ra, ro, s) == Status::kOk, "%s: SIMT router failed", name);
      std::vector<int32_t> i1(size_t(T * K)), i2(size_t(T * K));
      std::vector<float> w1(size_t(T * K)), w2(size_t(T * K));
      WEFT_CUDA_OK(cudaMemcpyAsync(i1.data(), ids, i1.size() * 4, cudaMemcpyDeviceToHost, s));
      WEFT_CUDA_OK(cudaMemcpyAsync(i2.data(), s_ids, i2.size() * 4, cudaMemcpyDeviceToHost, s));
      WEFT_CUDA_OK(cudaMemcpyAsync(w1.data(), weights, w1.size() * 4, cudaMemcpyDeviceToHost, s));
      WEFT_CUDA_OK(cudaMemcpyAsync(w2.data(), s_weights, w2.size() * 4, cudaMemcpyDeviceToHost, s));
      WEFT_CUDA_OK(cudaStreamSynchronize(s));
      for (size_t i = 0; i < i1.size(); ++i) {
        if (std::fabs(w1[i] - w2[i]) > 2e-3f)
          ++routing_off;
        else if (i1[i] != i2[i])
          ++routing_swapped;
      }
    }
    int64_t dropped = -1;
    EXPECT(op->dropped(&dropped) == Status::kOk && dropped == 0, "%s: call %d dropped %lld rows", name, call,
           (long long)dropped);
  }
  if (graph) WEFT_CUDA_OK(cudaGraphExecDestroy(graph));
  EXPECT(routing_off == 0, "%s: %d (token, k) routing pairs differ from the SIMT router by more than 2e-3 in weight",
         name, routing_off);
  EXPECT(routing_swapped * 100 <= calls * T * K, "%s: %d near-tie swaps against the SIMT router (over 1%%)", name,
         routing_swapped);
  EXPECT(bad_calls == 0, "%s: %d of %d calls had rows off the reference (worst: %d of %lld rows)", name, bad_calls,
         calls, worst_bad, (long long)T);
  // Determinism: the last input again, the same bits.
  WEFT_CUDA_OK(cudaMemsetAsync(out2, 0xFF, size_t(T * H) * 2, s));
  EXPECT(op->run(x, out2, s) == Status::kOk, "%s: repeat run failed", name);
  WEFT_CUDA_OK(cudaStreamSynchronize(s));
  std::vector<uint16_t> a(size_t(T * H)), b(size_t(T * H));
  WEFT_CUDA_OK(cudaMemcpy(a.data(), out, a.size() * 2, cudaMemcpyDeviceToHost));
  WEFT_CUDA_OK(cudaMemcpy(b.data(), out2, b.size() * 2, cudaMemcpyDeviceToHost));
  EXPECT(a == b, "%s: the same input gave different bits", name);
  // ffn_combine sums in the staged op's orders: the staged op on the same input gives the same bits.
  bool same_as_staged = true;
  if (std::string(g_variant) == "ffn_combine" && !c.graph) {
    op.reset();
    runtime::Plan staged = plan;
    staged.exec.variant = "staged";
    EXPECT(runtime::MoeOp::create(ctx, staged, wts, &op) == Status::kOk, "%s: the staged op's create failed", name);
    if (op) {
      WEFT_CUDA_OK(cudaMemsetAsync(out2, 0xFF, size_t(T * H) * 2, s));
      EXPECT(op->run(x, out2, s) == Status::kOk, "%s: the staged run failed", name);
      WEFT_CUDA_OK(cudaStreamSynchronize(s));
      WEFT_CUDA_OK(cudaMemcpy(b.data(), out2, b.size() * 2, cudaMemcpyDeviceToHost));
      same_as_staged = a == b;
      EXPECT(same_as_staged, "%s: %s and staged gave different bits on the same input", name, g_variant);
    }
  }
  // How the rows spread (this rank's experts): the case did what its name says.
  std::vector<int32_t> h_ids(size_t(T * K));
  WEFT_CUDA_OK(cudaMemcpy(h_ids.data(), ids, h_ids.size() * 4, cudaMemcpyDeviceToHost));
  std::vector<int64_t> per_expert(static_cast<size_t>(E), 0);
  for (int32_t id : h_ids)
    if (id >= 0 && id < E) ++per_expert[size_t(id)];
  int idle = 0;
  for (int64_t n : per_expert) idle += n == 0;
  if (c.routing == Routing::kOneExpert)
    EXPECT(per_expert[3 % E] == T, "%s: expert 3 got %lld of %lld tokens", name, (long long)per_expert[3 % E],
           (long long)T);
  if (c.routing == Routing::kHalfIdle) EXPECT(idle >= E / 2, "%s: only %d idle experts", name, idle);
  printf(
      "rank %d: moe %s %s: %d calls %s, dropped 0, repeat identical %s%s, near-tie swaps vs SIMT router %d, idle "
      "experts (this rank's tokens) %d, heap %llu B, grouped rows %lld\n",
      r, g_variant, name, calls, bad_calls ? "FAILED" : "matched", a == b ? "yes" : "NO",
      std::string(g_variant) != "ffn_combine" || c.graph ? ""
                                                         : (same_as_staged ? ", staged's bits" : ", NOT staged's bits"),
      routing_swapped, idle, (unsigned long long)op->heap_bytes(), (long long)op->capacity_rows());
  op.reset();
  cudaStreamDestroy(s);
  for (void* p : std::initializer_list<void*>{router, gate, up, down, x, out, out2, ref, bad, ids, weights, s_logits,
                                              s_weights, s_ids, s_counts, s_dropped})
    cudaFree(p);
}

// --stall (2+ ranks, small WEFT_DEVICE_TIMEOUT): rank 1 never calls run. Rank 0's call must end
// within the timeout with the context poisoned, the reason naming rank 1 and what was awaited, and
// its next call refused at once; then both ranks leave through the bootstrap.
int stall(runtime::Context& ctx) {
  const int r = ctx.rank();
  const int64_t T = 64, H = 256, F = 128, E = 8, L = E / ctx.size(), K = 2;
  bf16 *router = dalloc<bf16>(H * E), *w = dalloc<bf16>(L * F * H * 3), *x = dalloc<bf16>(T * H),
       *out = dalloc<bf16>(T * H);
  random_bf16(router, H * E, 1);
  random_bf16(w, L * F * H * 3, 2);
  random_bf16(x, T * H, 3);
  WEFT_CUDA_OK(cudaDeviceSynchronize());
  runtime::Plan plan = base_plan(ctx);
  plan.moe.tokens = T * ctx.size(), plan.moe.hidden = H, plan.moe.ffn = F, plan.moe.experts = E, plan.moe.topk = K;
  std::unique_ptr<runtime::MoeOp> op;
  EXPECT(runtime::MoeOp::create(ctx, plan, runtime::MoeWeights{router, w, w + L * F * H, w + 2 * L * F * H}, &op) ==
             Status::kOk,
         "stall: create failed");
  if (r == 0 && op) {
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT(op->run(x, out, nullptr) == Status::kOk, "stall: the first call should be accepted");
    cudaDeviceSynchronize();  // bounded: the device wait times out
    for (int i = 0; i < 200 && !ctx.poisoned(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT(ctx.poisoned(), "stall: the context was not poisoned after %.1f s", s);
    const std::string why = ctx.poison_reason();
    // Across nodes rank 1 is on the other node (one rank per node) or a node-mate (dispatch flag).
    const bool remote = hierarchical() && ctx.size() == g_nodes;
    EXPECT(why.find(remote ? "for rank 1's tokens for this node over the network" : "for rank 1's dispatched tokens") !=
               std::string::npos,
           "stall: reason '%s'", why.c_str());
    EXPECT(op->run(x, out, nullptr) == Status::kPeerFailed, "stall: a call after the failure must fail fast");
    printf("rank 0: moe stall: call ended after %.1f s, context poisoned: %s\n", s, why.c_str());
  }
  Status st = ctx.boot().barrier("moe.test.stall.done");
  EXPECT(st == Status::kOk, "stall: the ranks could not meet after the failure");
  op.reset();
  for (void* p : {static_cast<void*>(router), static_cast<void*>(w), static_cast<void*>(x), static_cast<void*>(out)})
    cudaFree(p);
  printf("rank %d: test_moe_gpu --stall %s (%d failures)\n", r, g_failed ? "FAILED" : "passed", g_failed);
  return g_failed ? 1 : 0;
}

// --overflow: counts first with one 128-row tile fewer than expert 3's owner needs. That rank's call
// must fail with the rows needed and reserved in the context's reason (no silent truncation); the
// other ranks' calls complete; then every rank leaves through the bootstrap.
int overflow(runtime::Context& ctx) {
  const int W = ctx.size(), r = ctx.rank();
  const int64_t T = 1000, H = 256, F = 128, E = 4, L = E / W, K = 1;
  const int64_t need = (W * T + 127) / 128 * 128, owner = 3 / L;
  bf16 *router = dalloc<bf16>(H * E), *w = dalloc<bf16>(L * F * H * 3), *x = dalloc<bf16>(T * H),
       *out = dalloc<bf16>(T * H);
  random_bf16(router, H * E, 11, 0.5f);
  bias_router<<<1, 256>>>(router, int(E), 2);
  random_bf16(w, L * F * H * 3, 12, 0.05f);
  random_bf16(x, T * H, 13 + r);
  set_feature0<<<64, 256>>>(x, int(T), int(H));
  WEFT_CUDA_OK(cudaDeviceSynchronize());
  runtime::Plan plan = base_plan(ctx);
  plan.moe.tokens = T * W, plan.moe.hidden = H, plan.moe.ffn = F, plan.moe.experts = E, plan.moe.topk = K;
  plan.heap_bytes = budget_for_rows(T, H, F, E, K, W, need - 128);
  std::unique_ptr<runtime::MoeOp> op;
  EXPECT(runtime::MoeOp::create(ctx, plan, runtime::MoeWeights{router, w, w + L * F * H, w + 2 * L * F * H}, &op) ==
             Status::kOk,
         "overflow: create failed");
  if (op) {
    EXPECT(op->run(x, out, nullptr) == Status::kOk, "overflow: the call should be accepted");
    cudaDeviceSynchronize();
    for (int i = 0; i < 100 && r == owner && !ctx.poisoned(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const std::string why = ctx.poison_reason();
    if (r == owner) {
      char want[128];
      snprintf(want, sizeof want, "need %lld grouped rows and %lld are reserved", (long long)need,
               (long long)(need - 128));
      EXPECT(ctx.poisoned() && why.find(want) != std::string::npos, "overflow: reason '%s', expected '%s'", why.c_str(),
             want);
      EXPECT(op->run(x, out, nullptr) == Status::kPeerFailed, "overflow: a later call must fail fast");
    } else {
      EXPECT(!ctx.poisoned(), "overflow: rank %d (not the owner) poisoned: %s", r, why.c_str());
    }
    printf("rank %d: moe overflow (owner of expert 3: rank %lld): %s\n", r, (long long)owner,
           ctx.poisoned() ? why.c_str() : "call completed");
  }
  EXPECT(ctx.boot().barrier("moe.test.overflow.done") == Status::kOk, "overflow: the ranks could not meet");
  op.reset();
  for (void* p : {static_cast<void*>(router), static_cast<void*>(w), static_cast<void*>(x), static_cast<void*>(out)})
    cudaFree(p);
  printf("rank %d: test_moe_gpu --overflow %s (%d failures)\n", r, g_failed ? "FAILED" : "passed", g_failed);
  return g_failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (!bootstrap::started_under_pmix()) {
    fprintf(stderr, "test_moe_gpu runs under `weftrun exec -n W` (tests/runtime/moe_gpu.sh)\n");
    return 2;
  }
  std::unique_ptr<bootstrap::PmixBootstrap> boot;
  if (bootstrap::PmixBootstrap::connect(&boot) != Status::kOk) return 1;
  g_rank = boot->info().rank;
  g_nodes = boot->info().num_nodes;
  if (const char* c = getenv("WEFT_NET_CHANNELS")) g_channels = std::max(1, std::min(8, atoi(c)));
  int gpus = 0;
  WEFT_CUDA_OK(cudaGetDeviceCount(&gpus));
  WEFT_CUDA_OK(cudaSetDevice(boot->info().local_rank % gpus));
  std::unique_ptr<runtime::Context> ctx;
  if (runtime::Context::create(*boot, uint64_t(1) << 30, &ctx) != Status::kOk) return 1;
  if (argc > 2 && std::string(argv[argc - 2]) == "--variant") {
    g_variant = argv[argc - 1];
    argc -= 2;
  }
  if (argc > 1 && std::string(argv[1]) == "--overflow") {
    const int rc = overflow(*ctx);
    ctx.reset();
    return rc;
  }
  if (argc > 1 && std::string(argv[1]) == "--stall") {
    if (ctx->size() < 2) {
      fprintf(stderr, "--stall needs 2 or more ranks\n");
      return 2;
    }
    const int rc = stall(*ctx);
    ctx.reset();
    return rc;
  }
  const Case cases[] = {
      {256, 512, 256, 8, 2, Routing::kUniform},          {200, 256, 128, 8, 1, Routing::kZipf},
      {96, 512, 384, 16, 8, Routing::kUniform},          {333, 256, 256, 16, 2, Routing::kHalfIdle},
      {4096, 256, 128, 16, 8, Routing::kOneExpert},      {1, 256, 128, 8, 2, Routing::kUniform},
      {1000, 256, 128, 4, 1, Routing::kOneExpert, true}, {256, 512, 256, 8, 2, Routing::kUniform, false, true},
  };
  int no = 0;
  for (const Case& c : cases) run_case(*ctx, c, no++, c.tokens >= 4096 ? 3 : 20);
  EXPECT(!ctx->poisoned(), "the context was poisoned: %s", ctx->poison_reason().c_str());
  ctx.reset();
  printf("rank %d: test_moe_gpu %s (%d failures)\n", g_rank, g_failed ? "FAILED" : "passed", g_failed);
  return g_failed ? 1 : 0;
}
