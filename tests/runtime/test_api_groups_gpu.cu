// Rank groups through the public API (runtime/weft.h), on a GPU, under `weftrun exec -n 4` (api_gpu.sh):
// a context of 1 x 2 groups runs one AllGather+GEMM per group at once, then one GEMM+ReduceScatter
// and one GEMM+AllReduce per group (the model's plan: the overlap variant where every rank has a GPU
// of its own, else peer). Every rank's inputs encode its job rank; after each of 10 calls (C poisoned
// first) every rank's C matches a reference over its own group's members only, so a shard gathered
// from the other group, a partial summed from it, or one from the wrong rank, fails.
#define DOCTEST_CONFIG_IMPLEMENT
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <doctest/doctest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "runtime/plan.h"  // the plan's variant, for the message
#include "runtime/weft.h"

namespace {

using weft::Status;

// A workload small enough for the per-element reference below.
const char* kGrouped =
    "name: api-two-groups\nop: ag_gemm\ndtype: bf16\nshape: {m: 1024, n: 1024, k: 512}\n"
    "layout: {nodes: 1, gpus_per_node: 4}\ngroup: {nodes: 1, gpus_per_node: 2}\nroles: auto\n";
// GEMM+RS / GEMM+AR: 512 rows per group member (whole tiles), K split over the group's two members.
std::string reduce_workload(const char* op) {
  return std::string("name: api-two-groups-") + op + "\nop: " + op +
         "\ndtype: bf16\nshape: {m: 1024, n: 768, k: 512}\nlayout: {nodes: 1, gpus_per_node: 4}\n"
         "group: {nodes: 1, gpus_per_node: 2}\n";
}

__device__ float value(uint64_t job_rank, uint64_t which, uint64_t call, uint64_t i) {
  uint64_t x = (job_rank + 1) * 0xC2B2AE3D27D4EB4Full ^ (which + 1) * 0x9E3779B97F4A7C15ull ^
               call * 0x165667B19E3779F9ull ^ i * 0xD6E8FEB86659FD93ull;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return float(int(x % 128) - 64) / 64.f;  // exact in bf16
}
__global__ void fill(__nv_bfloat16* p, int64_t n, uint64_t job_rank, uint64_t which, uint64_t call) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16(value(job_rank, which, call, i));
}
// C[i][j] for this rank (m x n_loc): row i of the gathered A is row i % m_loc of the shard of the
// group member i / m_loc, whose job rank is first_member + i / m_loc.
__global__ void check(const __nv_bfloat16* c, int64_t m, int64_t n, int64_t k, int64_t m_loc, uint64_t first_member,
                      uint64_t me, uint64_t call, unsigned long long* bad) {
  const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= m * n) return;
  const int64_t i = idx / n, j = idx % n;
  const uint64_t owner = first_member + uint64_t(i / m_loc);
  float acc = 0;
  for (int64_t x = 0; x < k; ++x) acc += value(owner, 0, call, (i % m_loc) * k + x) * value(me, 1, call, j * k + x);
  const float got = __bfloat162float(c[idx]);
  if (!(fabsf(got - acc) <= 0.01f * fabsf(acc) + 0.05f)) atomicAdd(bad, 1ull);
}

// GEMM+RS/AR: C[i][j] (rows row0.. of the result) = sum over the group's members q of
// A_q[row0 + i] . B_q[j], A_q m x k_loc and B_q n x k_loc regenerated from q's job rank.
__global__ void check_reduce(const __nv_bfloat16* c, int64_t rows, int64_t row0, int64_t n, int64_t k_loc,
                             uint64_t first_member, int members, uint64_t call, unsigned long long* bad) {
  const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= rows * n) return;
  const int64_t i = row0 + idx / n, j = idx % n;
  float acc = 0;
  for (int q = 0; q < members; ++q)
    for (int64_t x = 0; x < k_loc; ++x)
      acc += value(first_member + q, 0, call, i * k_loc + x) * value(first_member + q, 1, call, j * k_loc + x);
  const float got = __bfloat162float(c[idx]);
  // The partials are rounded to bf16 before they are summed.
  if (!(fabsf(got - acc) <= 0.02f * fabsf(acc) + 0.25f)) atomicAdd(bad, 1ull);
}

#define CUDA_OK(x) REQUIRE((x) == cudaSuccess)

std::string g_workload;

// A context of two 1 x 2 groups in the 4-rank job.
std::unique_ptr<weft::Context> group_context() {
  std::unique_ptr<weft::Context> ctx;
  weft::Context::Options o;
  o.group_nodes = 1, o.group_gpus = 2;
  REQUIRE(weft::Context::create(o, &ctx) == Status::kOk);
  REQUIRE(ctx->size() == 2);
  REQUIRE(ctx->groups() == 2);
  return ctx;
}

// Ten calls: `enqueue(call)` puts the call's fresh inputs, C poisoned, the op's call and the check
// (counting wrong elements into *bad) on `s`; each call's count is read back within 60 s (a stuck
// op fails the test instead of hanging it). Returns the wrong elements over all calls.
unsigned long long ten_checked_calls(cudaStream_t s, unsigned long long* bad, const std::string& who,
                                     const std::function<void(uint64_t call)>& enqueue) {
  unsigned long long total = 0;
  for (uint64_t call = 0; call < 10; ++call) {
    CUDA_OK(cudaMemsetAsync(bad, 0, sizeof(unsigned long long), s));
    enqueue(call);
    unsigned long long h = 0;
    CUDA_OK(cudaMemcpyAsync(&h, bad, sizeof h, cudaMemcpyDeviceToHost, s));
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (cudaStreamQuery(s) == cudaErrorNotReady && std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    INFO(who << " call " << call);
    REQUIRE_MESSAGE(cudaStreamQuery(s) == cudaSuccess, "the call and its check did not finish within 60 s");
    CHECK(h == 0);
    total += h;
  }
  return total;
}

}  // namespace

TEST_CASE("two 1 x 2 groups through the API: each group gathers its own shards, every C right") {
  std::unique_ptr<weft::Context> ctx = group_context();
  CHECK(ctx->group() == ctx->job_rank() / 2);
  CHECK(ctx->rank() == ctx->job_rank() % 2);
  weft::Plan plan;
  std::string err;
  REQUIRE_MESSAGE(ctx->plan(g_workload, &plan, &err) == Status::kOk, err);
  std::unique_ptr<weft::AgGemm> op;
  REQUIRE(weft::AgGemm::create(*ctx, plan, &op) == Status::kOk);
  const int64_t m = op->m(), n = op->n_local(), k = op->k(), m_loc = m / ctx->size();
  __nv_bfloat16 *a = nullptr, *b = nullptr, *c = nullptr;
  unsigned long long* bad = nullptr;
  CUDA_OK(cudaMalloc(&a, size_t(m_loc * k) * 2));
  CUDA_OK(cudaMalloc(&b, size_t(n * k) * 2));
  CUDA_OK(cudaMalloc(&c, size_t(m * n) * 2));
  CUDA_OK(cudaMalloc(&bad, sizeof(unsigned long long)));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const uint64_t me = uint64_t(ctx->job_rank()), first = uint64_t(ctx->group() * ctx->size());
  const std::string who = "job rank " + std::to_string(me) + " (group " + std::to_string(ctx->group()) + ")";
  const unsigned long long total = ten_checked_calls(s, bad, who, [&](uint64_t call) {
    fill<<<256, 256, 0, s>>>(a, m_loc * k, me, 0, call);
    fill<<<256, 256, 0, s>>>(b, n * k, me, 1, call);
    CUDA_OK(cudaMemsetAsync(c, 0xFF, size_t(m * n) * 2, s));  // NaN: an element never written fails
    REQUIRE(op->run(a, b, c, s) == Status::kOk);
    check<<<int((m * n + 255) / 256), 256, 0, s>>>(c, m, n, k, m_loc, first, me, call, bad);
  });
  MESSAGE("job rank " << me << ": group " << ctx->group() << " of " << ctx->groups() << ", rank " << ctx->rank()
                      << " of " << ctx->size() << ": 10 calls, " << total << " elements wrong");
  cudaStreamDestroy(s);
  cudaFree(a), cudaFree(b), cudaFree(c), cudaFree(bad);
  op.reset();
  ctx.reset();
}

TEST_CASE("two 1 x 2 groups through the API: GEMM+ReduceScatter and GEMM+AllReduce per group, every C right") {
  std::unique_ptr<weft::Context> ctx = group_context();
  const uint64_t me = uint64_t(ctx->job_rank()), first = uint64_t(ctx->group() * ctx->size());
  for (const char* op_name : {"gemm_rs", "gemm_ar"}) {
    CAPTURE(op_name);
    const char* tmp = getenv("TMPDIR");
    const std::string path = std::string(tmp && *tmp ? tmp : "/tmp") + "/weft-api-groups-" + op_name + "-" +
                             std::to_string(getpid()) + ".yaml";
    std::ofstream(path) << reduce_workload(op_name);
    weft::Plan plan;
    std::string err;
    REQUIRE_MESSAGE(ctx->plan(path, &plan, &err) == Status::kOk, err);
    unlink(path.c_str());
    std::unique_ptr<weft::GemmReduce> op;
    REQUIRE(weft::GemmReduce::create(*ctx, plan, &op) == Status::kOk);
    const int64_t m = op->m(), n = op->n(), kl = op->k_local(), rows = op->c_rows();
    const int64_t row0 = op->all_reduce() ? 0 : int64_t(ctx->rank()) * (m / ctx->size());
    __nv_bfloat16 *a = nullptr, *b = nullptr, *c = nullptr;
    unsigned long long* bad = nullptr;
    CUDA_OK(cudaMalloc(&a, size_t(m * kl) * 2));
    CUDA_OK(cudaMalloc(&b, size_t(n * kl) * 2));
    CUDA_OK(cudaMalloc(&c, size_t(rows * n) * 2));
    CUDA_OK(cudaMalloc(&bad, sizeof(unsigned long long)));
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const std::string who =
        "job rank " + std::to_string(me) + " (group " + std::to_string(ctx->group()) + ") " + op_name;
    const unsigned long long total = ten_checked_calls(s, bad, who, [&](uint64_t call) {
      fill<<<256, 256, 0, s>>>(a, m * kl, me, 0, call);
      fill<<<256, 256, 0, s>>>(b, n * kl, me, 1, call);
      CUDA_OK(cudaMemsetAsync(c, 0xFF, size_t(rows * n) * 2, s));  // NaN: an element never written fails
      REQUIRE(op->run(a, b, c, s) == Status::kOk);
      check_reduce<<<int((rows * n + 255) / 256), 256, 0, s>>>(c, rows, row0, n, kl, first, ctx->size(), call, bad);
    });
    MESSAGE("job rank " << me << ": " << std::string(op_name) << " (" << plan.get().exec.variant << ") in group "
                        << ctx->group() << ": 10 calls, " << total << " elements wrong");
    cudaStreamDestroy(s);
    cudaFree(a), cudaFree(b), cudaFree(c), cudaFree(bad);
    op.reset();
  }
  ctx.reset();
}

int main(int argc, char** argv) {
  // Every rank writes the same file under its own name (no rank waits for another's).
  const char* tmp = getenv("TMPDIR");
  g_workload = std::string(tmp && *tmp ? tmp : "/tmp") + "/weft-api-groups-" + std::to_string(getpid()) + ".yaml";
  std::ofstream(g_workload) << kGrouped;
  doctest::Context dt(argc, argv);
  const int rc = dt.run();
  unlink(g_workload.c_str());
  return rc;
}
