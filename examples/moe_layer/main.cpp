// Calls weft's MoE layer on this program's own tokens and weights in a loop, new tokens every call,
// and checks sampled tokens of every call on the host: their routing (softmax of the logits, the
// top-k, weights renormalised over the k) and their output (Σ weight · SwiGLU expert).
//
// Every value comes from a counter-based generator of (what, index), so every rank can make any
// expert's weights and the reference needs no communication.
#include <cuda_runtime.h>
#include <weft/weft.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

uint16_t to_bf16(float f) {  // round to nearest even
  uint32_t u;
  memcpy(&u, &f, 4);
  return uint16_t((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}
float from_bf16(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
// A value in [-scale, scale) from (what, index), rounded to bf16.
uint16_t value(uint64_t what, uint64_t index, float scale) {
  uint64_t x = (what * 0x9E3779B97F4A7C15ull) ^ (index * 0x165667B19E3779F9ull);
  x ^= x >> 31;
  x *= 0x7FB5D329728EA185ull;
  x ^= x >> 27;
  return to_bf16(scale * float(int64_t(x >> 40) - (1 << 23)) / float(1 << 23));
}
enum What : uint64_t { kRouter = 1, kGate = 2, kUp = 3, kDown = 4, kTokens = 100 };  // tokens: + call * 64 + rank

#define CHECK_CUDA(call)                                          \
  do {                                                            \
    cudaError_t e_ = (call);                                      \
    if (e_ != cudaSuccess) {                                      \
      fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_)); \
      return 1;                                                   \
    }                                                             \
  } while (0)

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: weftrun exec -n N -- %s MOE_WORKLOAD.yaml [CALLS]\n", argv[0]);
    return 2;
  }
  const int calls = argc > 2 ? std::max(1, std::min(1000, atoi(argv[2]))) : 10;
  std::unique_ptr<weft::Context> ctx;
  if (weft::Context::create({}, &ctx) != weft::Status::kOk) return 1;
  weft::Plan plan;
  std::string err;
  if (ctx->plan(argv[1], &plan, &err) != weft::Status::kOk || !plan.runnable()) {
    fprintf(stderr, "rank %d: no plan: %s%s\n", ctx->rank(), err.c_str(), plan.why_not().c_str());
    return 1;
  }
  // The shape, from the plan's JSON (the example reads nothing else of it).
  const std::string js = plan.json();
  auto field = [&](const char* key) {
    const size_t at = js.find(std::string("\"") + key + "\":");
    return at == std::string::npos ? 0LL : atoll(js.c_str() + at + strlen(key) + 3);
  };
  const int rank = ctx->rank(), world = ctx->size();
  const int64_t H = field("hidden"), F = field("ffn"), E = field("experts"), K = field("topk");
  const int64_t T = field("tokens") / world, L = E / world;
  if (H <= 0 || F <= 0 || E <= 0 || K <= 0 || T <= 0 || E % world) {
    fprintf(stderr, "rank %d: %s is not an moe workload this example can read\n", rank, argv[1]);
    return 1;
  }
  const float sh = 1.f / std::sqrt(float(H)), sf = 1.f / std::sqrt(float(F));
  auto weight = [&](What w, int64_t e, int64_t i) {
    return value(w * 1000003 + uint64_t(e), uint64_t(i), w == kDown ? sf : w == kRouter ? 1.f : sh);
  };
  std::vector<uint16_t> router(size_t(H * E)), gate(size_t(L * F * H)), up(gate.size()), down(size_t(L * H * F));
  for (int64_t i = 0; i < H * E; ++i) router[size_t(i)] = weight(kRouter, 0, i);
  for (int64_t l = 0; l < L; ++l)
    for (int64_t i = 0; i < F * H; ++i) {
      gate[size_t(l * F * H + i)] = weight(kGate, rank * L + l, i);
      up[size_t(l * F * H + i)] = weight(kUp, rank * L + l, i);
      down[size_t(l * F * H + i)] = weight(kDown, rank * L + l, i);
    }
  void *d_router, *d_gate, *d_up, *d_down, *x, *y;
  CHECK_CUDA(cudaMalloc(&d_router, router.size() * 2));
  CHECK_CUDA(cudaMalloc(&d_gate, gate.size() * 2));
  CHECK_CUDA(cudaMalloc(&d_up, up.size() * 2));
  CHECK_CUDA(cudaMalloc(&d_down, down.size() * 2));
  CHECK_CUDA(cudaMalloc(&x, size_t(T * H) * 2));
  CHECK_CUDA(cudaMalloc(&y, size_t(T * H) * 2));
  CHECK_CUDA(cudaMemcpy(d_router, router.data(), router.size() * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(d_gate, gate.data(), gate.size() * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(d_up, up.data(), up.size() * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(d_down, down.data(), down.size() * 2, cudaMemcpyHostToDevice));
  std::unique_ptr<weft::Moe> op;
  if (weft::Moe::create(*ctx, plan, {d_router, d_gate, d_up, d_down}, &op) != weft::Status::kOk) return 1;
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreate(&s));
  std::vector<uint16_t> hx(size_t(T * H)), hy(size_t(T * H));
  std::vector<int32_t> ids(size_t(T * K));
  std::vector<float> wts(size_t(T * K));
  int bad = 0;
  for (int call = 0; call < calls && !bad; ++call) {
    for (int64_t i = 0; i < T * H; ++i) hx[size_t(i)] = value(kTokens + uint64_t(call) * 64 + rank, uint64_t(i), 1.f);
    CHECK_CUDA(cudaMemcpyAsync(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice, s));
    CHECK_CUDA(cudaMemsetAsync(y, 0xFF, hy.size() * 2, s));  // NaN: a row nothing wrote fails
    if (op->run(x, y, s) != weft::Status::kOk) {
      fprintf(stderr, "rank %d: call %d failed: %s\n", rank, call, ctx->failure().c_str());
      return 1;
    }
    CHECK_CUDA(cudaMemcpyAsync(hy.data(), y, hy.size() * 2, cudaMemcpyDeviceToHost, s));
    CHECK_CUDA(cudaMemcpyAsync(ids.data(), op->topk_ids(), ids.size() * 4, cudaMemcpyDeviceToHost, s));
    CHECK_CUDA(cudaMemcpyAsync(wts.data(), op->topk_weights(), wts.size() * 4, cudaMemcpyDeviceToHost, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    for (int sample = 0; sample < 8; ++sample) {
      const int64_t t = (int64_t(sample) * 7919 + call * 104729) % T;
      const uint16_t* xt = &hx[size_t(t * H)];
      // Routing: the chosen experts' probabilities must be the k largest (up to rounding) and the
      // weights must be theirs renormalised.
      std::vector<double> logit(static_cast<size_t>(E)), prob(static_cast<size_t>(E));
      double mx = -1e300, sum = 0;
      for (int64_t e = 0; e < E; ++e) {
        for (int64_t h = 0; h < H; ++h)
          logit[size_t(e)] += double(from_bf16(xt[h])) * from_bf16(router[size_t(h * E + e)]);
        mx = std::max(mx, logit[size_t(e)]);
      }
      for (int64_t e = 0; e < E; ++e) sum += prob[size_t(e)] = std::exp(logit[size_t(e)] - mx);
      std::vector<double> sorted(prob);
      std::sort(sorted.rbegin(), sorted.rend());
      double chosen = 0;
      for (int64_t j = 0; j < K; ++j) chosen += prob[size_t(ids[size_t(t * K + j)])];
      for (int64_t j = 0; j < K; ++j) {
        const int32_t e = ids[size_t(t * K + j)];
        const double want = prob[size_t(e)] / chosen;
        if (e < 0 || e >= E || prob[size_t(e)] < sorted[size_t(K - 1)] * (1 - 1e-3) ||
            std::fabs(wts[size_t(t * K + j)] - want) > 1e-3) {
          fprintf(stderr, "rank %d: call %d: token %lld: expert %d with weight %g is not a top-%lld choice (%g)\n",
                  rank, call, (long long)t, e, wts[size_t(t * K + j)], (long long)K, want);
          ++bad;
        }
      }
      // Output: Σ_j w_j · down_e(SiLU(gate_e x) · up_e x), H and Y rounded to bf16 where the op rounds.
      std::vector<double> ref(static_cast<size_t>(H), 0.0);
      for (int64_t j = 0; j < K; ++j) {
        const int32_t e = ids[size_t(t * K + j)];
        if (e < 0 || e >= E) continue;
        std::vector<float> hmid(static_cast<size_t>(F));
        for (int64_t f = 0; f < F; ++f) {
          double g = 0, u = 0;
          for (int64_t h = 0; h < H; ++h) {
            g += double(from_bf16(xt[h])) * from_bf16(weight(kGate, e, f * H + h));
            u += double(from_bf16(xt[h])) * from_bf16(weight(kUp, e, f * H + h));
          }
          hmid[size_t(f)] = from_bf16(to_bf16(float(g / (1 + std::exp(-g)) * u)));
        }
        for (int64_t c = 0; c < H; ++c) {
          double acc = 0;
          for (int64_t f = 0; f < F; ++f) acc += double(hmid[size_t(f)]) * from_bf16(weight(kDown, e, c * F + f));
          ref[size_t(c)] += wts[size_t(t * K + j)] * from_bf16(to_bf16(float(acc)));
        }
      }
      double d2 = 0, r2 = 0;
      for (int64_t c = 0; c < H; ++c) {
        const double got = from_bf16(hy[size_t(t * H + c)]);
        d2 += (got - ref[size_t(c)]) * (got - ref[size_t(c)]);
        r2 += ref[size_t(c)] * ref[size_t(c)];
      }
      if (!(d2 <= 4e-4 * r2 + 1e-12)) {  // relative error 2%, NaN fails
        fprintf(stderr, "rank %d: call %d: token %lld: output off the reference (rel err %g)\n", rank, call,
                (long long)t, std::sqrt(d2 / (r2 + 1e-30)));
        ++bad;
      }
    }
  }
  if (rank == 0) printf("moe_layer: %d calls of %s on %d ranks: %s\n", calls, argv[1], world, bad ? "WRONG" : "ok");
  op.reset();
  cudaFree(d_router), cudaFree(d_gate), cudaFree(d_up), cudaFree(d_down), cudaFree(x), cudaFree(y);
  cudaStreamDestroy(s);
  return bad ? 1 : 0;
}
