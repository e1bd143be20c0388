// Calls weft's AllGather+GEMM on this program's own buffers in a loop, with new inputs every call,
// and checks every call's C on the host against its own reference at sampled points.
//
// Each rank makes its shard of A and its B from a counter-based generator of (call, rank, index), so
// every rank can compute any element of any rank's A: the reference needs no communication.
#include <cuda_runtime.h>
#include <weft/weft.h>

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
// A value in [-1, 1) from (call, rank, index), rounded to bf16.
uint16_t value(uint64_t call, uint64_t rank, uint64_t index, uint64_t which) {
  uint64_t x =
      (call * 0x9E3779B97F4A7C15ull) ^ (rank * 0xC2B2AE3D27D4EB4Full) ^ (index * 0x165667B19E3779F9ull) ^ (which << 60);
  x ^= x >> 31;
  x *= 0x7FB5D329728EA185ull;
  x ^= x >> 27;
  return to_bf16(float(int64_t(x >> 40) - (1 << 23)) / float(1 << 23));
}

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
    fprintf(stderr, "usage: weftrun exec -n N -- %s WORKLOAD.yaml [CALLS]\n", argv[0]);
    return 2;
  }
  const int calls = argc > 2 ? atoi(argv[2]) : 20;
  std::unique_ptr<weft::Context> ctx;
  if (weft::Context::create({}, &ctx) != weft::Status::kOk) return 1;
  weft::Plan plan;
  std::string err;
  if (ctx->plan(argv[1], &plan, &err) != weft::Status::kOk || !plan.runnable()) {
    fprintf(stderr, "rank %d: no plan: %s%s\n", ctx->rank(), err.c_str(), plan.why_not().c_str());
    return 1;
  }
  std::unique_ptr<weft::AgGemm> op;
  if (weft::AgGemm::create(*ctx, plan, &op) != weft::Status::kOk) return 1;
  const int rank = ctx->rank(), world = ctx->size();
  const int64_t m = op->m(), n = op->n_local(), k = op->k(), m_loc = m / world;

  void *a = nullptr, *b = nullptr, *c = nullptr;
  CHECK_CUDA(cudaMalloc(&a, size_t(m_loc * k) * 2));
  CHECK_CUDA(cudaMalloc(&b, size_t(n * k) * 2));
  CHECK_CUDA(cudaMalloc(&c, size_t(m * n) * 2));
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreate(&s));
  std::vector<uint16_t> ha(size_t(m_loc * k)), hb(size_t(n * k)), hc(size_t(m * n));
  int bad = 0;
  for (int call = 0; call < calls && !bad; ++call) {
    for (int64_t i = 0; i < m_loc * k; ++i) ha[size_t(i)] = value(call, rank, i, 0);
    for (int64_t i = 0; i < n * k; ++i) hb[size_t(i)] = value(call, rank, i, 1);
    CHECK_CUDA(cudaMemcpyAsync(a, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice, s));
    CHECK_CUDA(cudaMemcpyAsync(b, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice, s));
    CHECK_CUDA(cudaMemsetAsync(c, 0xFF, hc.size() * 2, s));  // NaN: an element nothing wrote fails
    if (op->run(a, b, c, s) != weft::Status::kOk) {
      fprintf(stderr, "rank %d: call %d failed: %s\n", rank, call, ctx->failure().c_str());
      return 1;
    }
    CHECK_CUDA(cudaMemcpyAsync(hc.data(), c, hc.size() * 2, cudaMemcpyDeviceToHost, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    // 64 sampled elements, every rank's rows among them.
    for (int t = 0; t < 64; ++t) {
      const int64_t i = (int64_t(t) * 7919 + call * 104729) % m, j = (int64_t(t) * 31337 + call) % n;
      const int64_t owner = i / m_loc, row = i % m_loc;
      double ref = 0, mag = 0;
      for (int64_t x = 0; x < k; ++x) {
        const double p = double(from_bf16(value(call, owner, row * k + x, 0))) * from_bf16(hb[size_t(j * k + x)]);
        ref += p;
        mag += std::fabs(p);
      }
      const double got = from_bf16(hc[size_t(i * n + j)]);
      if (!(std::fabs(got - ref) <= 1e-2 * mag + 1e-2)) {
        fprintf(stderr, "rank %d: call %d: C[%lld][%lld] = %g, expected %g\n", rank, call, (long long)i, (long long)j,
                got, ref);
        ++bad;
      }
    }
  }
  if (rank == 0) printf("ag_gemm_loop: %d calls of %s on %d ranks: %s\n", calls, argv[1], world, bad ? "WRONG" : "ok");
  op.reset();
  cudaFree(a), cudaFree(b), cudaFree(c), cudaStreamDestroy(s);
  return bad ? 1 : 0;
}
