// What the API's GPU tests share (test_api_gpu, test_api_nodes_gpu): small kernels (data regenerated
// from (seed, rank), poison, a per-rank delay, AllGather+GEMM's reference, a comparison) and one
// checked AllGather+GEMM problem on the job's context.
#pragma once

#include <cuda_runtime.h>
#include <doctest/doctest.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "runtime/exec/context.h"
#include "runtime/weft.h"

namespace {

using weft::Status;
std::unique_ptr<weft::Context> g_ctx;

__device__ uint16_t hash_bf16(uint64_t seed, uint64_t rank, uint64_t i) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ (rank + 1) * 0xC2B2AE3D27D4EB4Full ^ i * 0x165667B19E3779F9ull;
  x ^= x >> 31;
  x *= 0x7FB5D329728EA185ull;
  x ^= x >> 27;
  const float f = float(int64_t(x >> 40) - (1 << 23)) / float(1 << 23);
  uint32_t u = __float_as_uint(f);
  return uint16_t((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}
__device__ float bf16_to_float(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }

__global__ void fill(uint16_t* p, int64_t n, uint64_t seed, uint64_t rank) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = hash_bf16(seed, rank, i);
}
__global__ void poison(uint16_t* p, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = 0xFFFF;  // NaN
}
__global__ void delay(int64_t cycles) {
  const int64_t start = clock64();
  while (clock64() - start < cycles) {
  }
}
// c_ref[i][j] = sum_x A[i][x] * B[j][x] with A's row i regenerated from its owner's seed.
__global__ void reference(float* c_ref, const uint16_t* b, int64_t m, int64_t n, int64_t k, int64_t m_loc,
                          uint64_t seed) {
  const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= m * n) return;
  const int64_t i = idx / n, j = idx % n, owner = i / m_loc, row = i % m_loc;
  float acc = 0;
  for (int64_t x = 0; x < k; ++x)
    acc += bf16_to_float(hash_bf16(seed, owner, row * k + x)) * bf16_to_float(b[j * k + x]);
  c_ref[idx] = acc;
}
// bad[0]: elements off by more than bf16 rounding allows (or NaN: never written).
__global__ void compare(const uint16_t* c, const float* c_ref, int64_t n, unsigned long long* bad) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float got = bf16_to_float(c[i]), ref = c_ref[i];
    if (!(fabsf(got - ref) <= 0.02f * fabsf(ref) + 0.05f)) atomicAdd(bad, 1ull);
  }
}
// ---- one AllGather+GEMM problem on this job ----

std::string workload(const std::string& name, int m, int n, int k, const std::string& extra = "") {
  const std::string path = "/tmp/weft-api-" + std::to_string(getppid()) + "-" + name + ".yaml";
  if (g_ctx->rank() == 0) {
    FILE* f = fopen(path.c_str(), "w");
    REQUIRE(f != nullptr);
    const int nodes = g_ctx->get().boot().info().num_nodes;  // the job's (weftrun exec --emulate-nodes)
    fprintf(
        f,
        "name: %s\nop: ag_gemm\ndtype: bf16\nshape: {m: %d, n: %d, k: %d}\nlayout: {nodes: %d, gpus_per_node: %d}\n%s",
        name.c_str(), m, n, k, nodes, g_ctx->size() / nodes, extra.c_str());
    fclose(f);
  }
  return path;
}

struct Problem {
  std::unique_ptr<weft::AgGemm> op;
  int64_t m = 0, n = 0, k = 0, m_loc = 0;
  uint16_t *a = nullptr, *b = nullptr, *c = nullptr;
  float* c_ref = nullptr;
  unsigned long long* bad = nullptr;

  void create(const std::string& name, int m_, int n_, int k_, const std::string& extra = "") {
    weft::Plan plan;
    std::string err;
    REQUIRE_MESSAGE(g_ctx->plan(workload(name, m_, n_, k_, extra), &plan, &err) == Status::kOk, err);
    REQUIRE_MESSAGE(plan.runnable(), plan.why_not());
    REQUIRE(weft::AgGemm::create(*g_ctx, plan, &op) == Status::kOk);
    m = op->m(), n = op->n_local(), k = op->k(), m_loc = m / g_ctx->size();
    REQUIRE(cudaMalloc(&a, size_t(m_loc * k) * 2) == cudaSuccess);
    REQUIRE(cudaMalloc(&b, size_t(n * k) * 2) == cudaSuccess);
    REQUIRE(cudaMalloc(&c, size_t(m * n) * 2) == cudaSuccess);
    REQUIRE(cudaMalloc(&c_ref, size_t(m * n) * 4) == cudaSuccess);
    REQUIRE(cudaMallocManaged(&bad, 8) == cudaSuccess);
    *bad = 0;
  }
  ~Problem() {
    op.reset();
    for (void* p : {(void*)a, (void*)b, (void*)c, (void*)c_ref, (void*)bad}) cudaFree(p);
  }
  // One checked call on `s`: fresh A and B, poisoned C before, A poisoned right after, C compared.
  Status call(uint64_t seed, cudaStream_t s, int64_t delay_cycles = 0) {
    const int rank = g_ctx->rank();
    fill<<<64, 256, 0, s>>>(a, m_loc * k, seed, uint64_t(rank));
    fill<<<64, 256, 0, s>>>(b, n * k, seed, uint64_t(1000 + rank));
    poison<<<64, 256, 0, s>>>(c, m * n);
    if (delay_cycles > 0) delay<<<1, 1, 0, s>>>(delay_cycles);
    const Status st = op->run(a, b, c, s);
    if (st != Status::kOk) return st;
    poison<<<64, 256, 0, s>>>(a, m_loc * k);  // the caller may overwrite A once the stream passed the call
    reference<<<unsigned((m * n + 255) / 256), 256, 0, s>>>(c_ref, b, m, n, k, m_loc, seed);
    compare<<<64, 256, 0, s>>>(c, c_ref, m * n, bad);
    return cudaGetLastError() == cudaSuccess ? Status::kOk : Status::kCudaError;
  }
};

bool drain(cudaStream_t s, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (cudaStreamQuery(s) == cudaErrorNotReady) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return cudaStreamQuery(s) == cudaSuccess;
}

// GEMM+RS/AR: c_ref[i][j] = Σ_q Σ_x A_q[i][x] B_q[j][x], every rank's A_q and B_q regenerated from
// (seed, q); rows from `row0` on (ReduceScatter: this rank's block).
__global__ void reference_reduce(float* c_ref, int64_t rows, int64_t row0, int64_t n, int64_t k_loc, int ranks,
                                 uint64_t seed) {
  const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= rows * n) return;
  const int64_t i = row0 + idx / n, j = idx % n;
  float acc = 0;
  for (int q = 0; q < ranks; ++q)
    for (int64_t x = 0; x < k_loc; ++x)
      acc += bf16_to_float(hash_bf16(seed, q, i * k_loc + x)) * bf16_to_float(hash_bf16(seed, 1000 + q, j * k_loc + x));
  c_ref[idx] = acc;
}
// The partials are rounded to bf16 before they are summed: a looser absolute bound than one GEMM's.
__global__ void compare_loose(const uint16_t* c, const float* c_ref, int64_t n, unsigned long long* bad) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float got = bf16_to_float(c[i]), ref = c_ref[i];
    if (!(fabsf(got - ref) <= 0.02f * fabsf(ref) + 0.25f)) atomicAdd(bad, 1ull);
  }
}

// ---- GEMM+RS / GEMM+AR through the API ----

struct ReduceCase {
  const char* op;    // "gemm_rs" or "gemm_ar"
  const char* plan;  // the workload's plan: map ("" for the model's)
};

// One GEMM+RS/AR op through the API: a workload m = 256 W, n = 768, k = 64 W on the job's layout
// (`plan`: the workload's plan: map, "" for the model's), its buffers, and checked calls.
struct ReduceProblem {
  std::unique_ptr<weft::GemmReduce> op;
  int64_t m = 0, n = 0, kl = 0, rows = 0, row0 = 0;
  uint16_t *a = nullptr, *b = nullptr, *c = nullptr;
  float* c_ref = nullptr;
  unsigned long long* bad = nullptr;

  // m = m_per_rank x W rows, n columns, k = 64 W (a small problem by default: its kernels leave most
  // SMs free; tiles past the SMs make each persistent kernel hold every SM).
  void create(const char* op_name, const char* plan_map, const std::string& tag, int m_per_rank = 256,
              int n_cols = 768) {
    const int W = g_ctx->size(), rank = g_ctx->rank();
    const int nodes = g_ctx->get().boot().info().num_nodes;
    const std::string path = "/tmp/weft-api-" + std::to_string(getppid()) + "-" + op_name + "-" + tag + ".yaml";
    if (rank == 0) {
      FILE* f = fopen(path.c_str(), "w");
      REQUIRE(f != nullptr);
      fprintf(f,
              "name: api_%s\nop: %s\ndtype: bf16\nshape: {m: %d, n: %d, k: %d}\nlayout: {nodes: %d, gpus_per_node: "
              "%d}\n%s",
              op_name, op_name, m_per_rank * W, n_cols, 64 * W, nodes, W / nodes, plan_map);
      fclose(f);
    }
    weft::Plan plan;
    std::string err;
    REQUIRE_MESSAGE(g_ctx->plan(path, &plan, &err) == Status::kOk, err);
    REQUIRE_MESSAGE(plan.runnable(), plan.why_not());
    REQUIRE(weft::GemmReduce::create(*g_ctx, plan, &op) == Status::kOk);
    CHECK(op->all_reduce() == (std::string(op_name) == "gemm_ar"));
    CHECK((op->heap_c() != nullptr) == op->all_reduce());
    m = op->m(), n = op->n(), kl = op->k_local(), rows = op->c_rows();
    row0 = op->all_reduce() ? 0 : int64_t(rank) * (m / W);
    REQUIRE(cudaMalloc(&a, size_t(m * kl) * 2) == cudaSuccess);
    REQUIRE(cudaMalloc(&b, size_t(n * kl) * 2) == cudaSuccess);
    REQUIRE(cudaMalloc(&c, size_t(rows * n) * 2) == cudaSuccess);
    REQUIRE(cudaMalloc(&c_ref, size_t(rows * n) * 4) == cudaSuccess);
    REQUIRE(cudaMallocManaged(&bad, 8) == cudaSuccess);
    *bad = 0;
  }
  ReduceProblem() = default;
  ReduceProblem(const ReduceProblem&) = delete;
  ReduceProblem& operator=(const ReduceProblem&) = delete;
  ~ReduceProblem() {
    op.reset();
    for (void* p : {(void*)a, (void*)b, (void*)c, (void*)c_ref, (void*)bad}) cudaFree(p);
  }
  // One checked call on `s`: fresh A and B from (seed, rank), the output poisoned before, A poisoned
  // right after, the output compared with Σ_q A_q B_qᵀ. heap_out (AllReduce): C left in the heap.
  Status call(uint64_t seed, cudaStream_t s, int64_t delay_cycles = 0, bool heap_out = false) {
    const int W = g_ctx->size(), rank = g_ctx->rank();
    fill<<<64, 256, 0, s>>>(a, m * kl, seed, uint64_t(rank));
    fill<<<64, 256, 0, s>>>(b, n * kl, seed, uint64_t(1000 + rank));
    uint16_t* out = heap_out ? static_cast<uint16_t*>(op->heap_c()) : c;
    if (!out) return Status::kInvalidArgument;
    poison<<<64, 256, 0, s>>>(out, rows * n);
    if (delay_cycles > 0) delay<<<1, 1, 0, s>>>(delay_cycles);
    const Status st = op->run(a, b, out, s);
    if (st != Status::kOk) return st;
    poison<<<64, 256, 0, s>>>(a, m * kl);
    reference_reduce<<<unsigned((rows * n + 255) / 256), 256, 0, s>>>(c_ref, rows, row0, n, kl, W, seed);
    compare_loose<<<64, 256, 0, s>>>(out, c_ref, rows * n, bad);
    return cudaGetLastError() == cudaSuccess ? Status::kOk : Status::kCudaError;
  }
};

// Each case: a ReduceProblem, then `calls` checked calls (AllReduce: every other call leaves C in the
// heap, heap_c()); first, a call made during a stream capture must be refused. `delays`: a random
// delay (up to ~0.1 ms, each rank its own) before every call. `before`: run on the op first, with its
// buffers and stream (e.g. counting what 1000 calls do).
using ReduceHook = std::function<void(weft::GemmReduce&, const void* a, const void* b, void* c, cudaStream_t s)>;
void reduce_cases_through_api(const std::vector<ReduceCase>& cases, int calls, bool delays = false,
                              const ReduceHook& before = nullptr) {
  std::mt19937_64 rng(std::random_device{}() + uint64_t(g_ctx->rank()));
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  int index = 0;
  for (const ReduceCase& k : cases) {
    const char* op_name = k.op;
    CAPTURE(op_name);
    CAPTURE(k.plan);
    ReduceProblem p;
    p.create(op_name, k.plan, std::to_string(index++));
    {
      // No GEMM+RS/AR plan is capturable: run refuses during a capture, enqueues nothing, and the
      // calls below (direct) are still right.
      REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
      const Status captured = p.op->run(p.a, p.b, p.c, s);
      cudaGraph_t graph = nullptr;
      CHECK(cudaStreamEndCapture(s, &graph) == cudaSuccess);
      if (graph) cudaGraphDestroy(graph);
      CHECK(captured == Status::kUnsupported);
    }
    if (before) before(*p.op, p.a, p.b, p.c, s);
    for (int i = 0; i < calls; ++i) {
      const uint64_t seed = (uint64_t(getppid()) << 24) + uint64_t(i);
      REQUIRE(p.call(seed, s, delays ? int64_t(rng() % 200000) : 0, p.op->all_reduce() && i % 2) == Status::kOk);
    }
    REQUIRE(drain(s, 300));
    CHECK_MESSAGE(*p.bad == 0, *p.bad << " wrong or unwritten elements over " << calls << " calls");
  }
  cudaStreamDestroy(s);
}

}  // namespace
