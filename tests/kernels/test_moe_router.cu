// GPU tests of the MoE router (kernels/moe_router.h) against a host reference on fresh random
// inputs with poisoned outputs: logits (fp64 host dot products, fp32 tolerance), then top-k, ties,
// weights, counts and offsets recomputed on the host from the device's own logits (so that the
// routing is checked bit for bit, not across two summation orders). Exits 77 without a Hopper GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/moe_plan.h"
#include "kernels/moe_router.h"
#include "tests/kernels/gemm_testing.cuh"

using namespace weft::kernels;
using namespace weft::kernels::testing;
using weft::Status;

namespace {

float bf16_to_float(__nv_bfloat16 v) {
  uint16_t bits;
  std::memcpy(&bits, &v, 2);
  const uint32_t f = uint32_t(bits) << 16;
  float out;
  std::memcpy(&out, &f, 4);
  return out;
}

struct RouterCase {
  int tokens, hidden, experts, topk;
  int tie_groups;  // > 0: expert e's weight column is column e % tie_groups (forced ties)
};

void check_router(const RouterCase& rc) {
  CAPTURE(rc.tokens);
  CAPTURE(rc.hidden);
  CAPTURE(rc.experts);
  CAPTURE(rc.topk);
  CAPTURE(rc.tie_groups);
  require_hopper();
  const int T = rc.tokens, H = rc.hidden, E = rc.experts, K = rc.topk;
  DevBuf<__nv_bfloat16> x(int64_t(T) * H), w(int64_t(H) * E);
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  random_bf16(x.p, int64_t(T) * H, seed);
  random_bf16(w.p, int64_t(H) * E, seed + 1, 0.05f);
  std::vector<__nv_bfloat16> hx = to_host(x.p, int64_t(T) * H), hw = to_host(w.p, int64_t(H) * E);
  if (rc.tie_groups > 0) {
    for (int h = 0; h < H; ++h)
      for (int e = rc.tie_groups; e < E; ++e) hw[size_t(h) * E + e] = hw[size_t(h) * E + e % rc.tie_groups];
    WEFT_CUDA_OK(cudaMemcpy(w.p, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
  }
  DevBuf<float> logits(int64_t(T) * E), wts(int64_t(T) * K);
  DevBuf<int32_t> ids(int64_t(T) * K), counts(E), dropped(1), offsets(E + 1);
  // Poison: NaN logits/weights, -7 ids, counts and offsets garbage (the launch must zero counts).
  WEFT_CUDA_OK(cudaMemset(logits.p, 0xFF, size_t(T) * E * 4));
  WEFT_CUDA_OK(cudaMemset(wts.p, 0xFF, size_t(T) * K * 4));
  WEFT_CUDA_OK(cudaMemset(ids.p, 0xF9, size_t(T) * K * 4));
  WEFT_CUDA_OK(cudaMemset(counts.p, 0x5A, size_t(E) * 4));
  WEFT_CUDA_OK(cudaMemset(dropped.p, 0x5A, 4));
  WEFT_CUDA_OK(cudaMemset(offsets.p, 0x5A, size_t(E + 1) * 4));
  MoeRouterArgs a;
  a.tokens = x.p, a.weight = w.p, a.tokens_n = T, a.hidden = H, a.experts = E, a.topk = K;
  MoeRouterOut o;
  o.logits = logits.p, o.topk_ids = ids.p, o.topk_weights = wts.p, o.counts = counts.p, o.dropped = dropped.p;
  o.offsets = offsets.p;
  REQUIRE(launch_moe_router(a, o, nullptr) == Status::kOk);
  WEFT_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float> dl = to_host(logits.p, int64_t(T) * E), dw = to_host(wts.p, int64_t(T) * K);
  const std::vector<int32_t> di = to_host(ids.p, int64_t(T) * K), dc = to_host(counts.p, E);
  const std::vector<int32_t> dd = to_host(dropped.p, 1), doff = to_host(offsets.p, E + 1);

  // 1. Logits against fp64 dot products of the same bf16 values.
  double worst = 0;
  for (int t = 0; t < T; ++t)
    for (int e = 0; e < E; ++e) {
      double ref = 0, mag = 0;
      for (int h = 0; h < H; ++h) {
        const double p = double(bf16_to_float(hx[size_t(t) * H + h])) * bf16_to_float(hw[size_t(h) * E + e]);
        ref += p;
        mag += std::fabs(p);
      }
      const double err = std::fabs(dl[size_t(t) * E + e] - ref) / (mag + 1e-30);
      REQUIRE(std::isfinite(dl[size_t(t) * E + e]));
      worst = std::max(worst, err);
    }
  MESSAGE("logits: worst |err| / sum |terms| = " << worst);
  REQUIRE(worst < 1e-5);

  // 2. Routing from the device's logits: softmax fp32, top-k ties to the lower index, renormalised.
  REQUIRE(dd[0] == 0);  // the dropped-token counter
  std::vector<int32_t> hc(E, 0);
  int ties_seen = 0;
  for (int t = 0; t < T; ++t) {
    const float* l = &dl[size_t(t) * E];
    float mx = -INFINITY;
    for (int e = 0; e < E; ++e) mx = std::max(mx, l[e]);
    float sum = 0;
    for (int e = 0; e < E; ++e) sum += std::exp(l[e] - mx);
    std::vector<int> order(E);
    for (int e = 0; e < E; ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(), [&](int p, int q) { return l[p] > l[q]; });
    float psum = 0;
    for (int j = 0; j < K; ++j) psum += std::exp(l[order[j]] - mx) / sum;
    for (int j = 0; j < K; ++j) {
      CAPTURE(t);
      CAPTURE(j);
      REQUIRE(di[size_t(t) * K + j] == order[j]);
      const float want = std::exp(l[order[j]] - mx) / sum / psum;
      REQUIRE(std::fabs(dw[size_t(t) * K + j] - want) <= 1e-5f * std::max(1.f, want));
      ++hc[order[j]];
      if (j + 1 < E && l[order[j]] == l[order[j + 1]]) ++ties_seen;
    }
    float wsum = 0;
    for (int j = 0; j < K; ++j) wsum += dw[size_t(t) * K + j];
    REQUIRE(std::fabs(wsum - 1.f) < 1e-5f);
  }
  if (rc.tie_groups > 0) {
    MESSAGE("exact ties met inside the top-k: " << ties_seen);
    REQUIRE(ties_seen > 0);  // the case really exercised the tie rule
  }
  REQUIRE(dc == hc);
  std::vector<int32_t> hoff(E + 1);
  moe_expert_offsets(hc.data(), E, kMoeTileRows, hoff.data());
  REQUIRE(doff == hoff);
}

}  // namespace

TEST_CASE("moe router: topk 1, 2, 8 over 8, 128 and 256 experts") {
  for (int experts : {8, 128, 256})
    for (int topk : {1, 2, 8}) check_router({1000, 1024, experts, topk, 0});
}

TEST_CASE("moe router: forced ties go to the lower expert index") {
  // Columns repeat every 2 / 4 experts: every logit has bitwise-equal twins.
  check_router({300, 512, 8, 2, 4});
  check_router({300, 512, 8, 8, 2});
  check_router({300, 512, 128, 8, 4});
  check_router({300, 512, 256, 8, 2});
}

TEST_CASE("moe router: hidden not a multiple of the chunk, one token, few tokens") {
  check_router({1, 7168 - 8, 256, 8, 0});
  check_router({33, 2056, 128, 8, 0});
  check_router({77, 4096, 8, 2, 0});
}

TEST_CASE("moe router: bad arguments are refused") {
  MoeRouterArgs a;
  MoeRouterOut o;
  a.tokens_n = 16, a.hidden = 64, a.experts = 8, a.topk = 9;
  CHECK(launch_moe_router(a, o, nullptr) == Status::kInvalidArgument);
  a.topk = 2, a.hidden = 60;
  CHECK(launch_moe_router(a, o, nullptr) == Status::kInvalidArgument);
}
