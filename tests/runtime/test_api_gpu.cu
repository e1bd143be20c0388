// The public API's promises, on a GPU, through runtime/weft.h alone (run under `weftrun exec`, see
// api_gpu.sh): no allocation and no host synchronisation per call (counted by CUPTI); 1000
// back-to-back calls with random per-rank delays, inputs and outputs poisoned around every call,
// every output checked; capture refused for a plan that is not capturable; a kernel holding half the
// SMs beside the op; ops destroyed, recreated and sharing one heap.
#define DOCTEST_CONFIG_IMPLEMENT
#include <cuda_runtime.h>
#include <cupti.h>
#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>

#include "runtime/exec/context.h"  // poison(): the test makes one rank drop out
#include "runtime/weft.h"
#include "tests/runtime/api_testing.cuh"

namespace {

// ---- kernels of this test beyond api_testing.cuh ----

// Holds its SM until *release is set (or ~2 s pass): blocks that fill SMs beside the op.
__global__ void hold(volatile int* release, int64_t max_cycles) {
  extern __shared__ char smem[];
  smem[threadIdx.x] = 0;
  const int64_t start = clock64();
  while (!*release && clock64() - start < max_cycles) {
  }
}

// ---- CUPTI: every CUDA runtime and driver call while subscribed ----

struct ApiCounts {
  std::atomic<int> allocs{0}, syncs{0}, calls{0};
  std::string first_bad;
};
void CUPTIAPI on_api(void* user, CUpti_CallbackDomain, CUpti_CallbackId, const void* data) {
  const auto* info = static_cast<const CUpti_CallbackData*>(data);
  if (info->callbackSite != CUPTI_API_ENTER) return;
  auto* c = static_cast<ApiCounts*>(user);
  c->calls++;
  const std::string name = info->functionName ? info->functionName : "";
  const bool alloc = name.find("Malloc") != std::string::npos || name.find("MemAlloc") != std::string::npos ||
                     name.find("HostAlloc") != std::string::npos;
  const bool sync = name.find("Synchronize") != std::string::npos || name == "cudaMemcpy" || name == "cudaMemset" ||
                    name.rfind("cuMemcpy", 0) == 0 && name.find("Async") == std::string::npos;
  if (alloc) c->allocs++;
  if (sync) c->syncs++;
  if ((alloc || sync) && c->first_bad.empty()) c->first_bad = name;
}

}  // namespace

TEST_CASE("1000 direct calls make no allocation and no host synchronisation") {
  Problem p;
  p.create("api_counts", 128 * g_ctx->size(), 256 * g_ctx->size(), 256);
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  for (int i = 0; i < 3; ++i) REQUIRE(p.op->run(p.a, p.b, p.c, s) == Status::kOk);  // first-use setup
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  ApiCounts counts;
  CUpti_SubscriberHandle sub;
  REQUIRE(cuptiSubscribe(&sub, (CUpti_CallbackFunc)on_api, &counts) == CUPTI_SUCCESS);
  REQUIRE(cuptiEnableDomain(1, sub, CUPTI_CB_DOMAIN_RUNTIME_API) == CUPTI_SUCCESS);
  REQUIRE(cuptiEnableDomain(1, sub, CUPTI_CB_DOMAIN_DRIVER_API) == CUPTI_SUCCESS);
  Status st = Status::kOk;
  for (int i = 0; i < 1000 && st == Status::kOk; ++i) st = p.op->run(p.a, p.b, p.c, s);
  cuptiUnsubscribe(sub);
  CHECK(st == Status::kOk);
  CHECK_MESSAGE(counts.allocs == 0, "first: " << counts.first_bad);
  CHECK_MESSAGE(counts.syncs == 0, "first: " << counts.first_bad);
  CHECK(counts.calls > 1000);  // the counter saw the calls' stream operations
  MESSAGE("rank " << g_ctx->rank() << ": 1000 calls made " << counts.calls.load() << " CUDA API calls, "
                  << counts.allocs.load() << " allocations, " << counts.syncs.load() << " synchronisations");
  CHECK(drain(s, 60));
  cudaStreamDestroy(s);
}

TEST_CASE("1000 back-to-back calls, random per-rank delays, inputs poisoned after each call: every output right") {
  Problem p;
  p.create("api_loop", 128 * g_ctx->size(), 256 * g_ctx->size(), 512);
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  std::mt19937_64 rng(std::random_device{}() + uint64_t(g_ctx->rank()));  // the delays: each rank its own
  const uint64_t base = uint64_t(getppid()) << 20;  // the data: the same seeds on every rank (one launcher)
  Status st = Status::kOk;
  for (int i = 0; i < 1000 && st == Status::kOk; ++i)
    st = p.call(base + uint64_t(i), s, int64_t(rng() % 200000));  // up to ~0.1 ms, different on every rank
  CHECK(st == Status::kOk);
  REQUIRE(drain(s, 300));
  CHECK_MESSAGE(*p.bad == 0, *p.bad << " wrong or unwritten elements over 1000 calls");
  CHECK(!g_ctx->failed());
  cudaStreamDestroy(s);
}

TEST_CASE("the copy-engine plan is captured in a CUDA graph and replayed 1000 times on fresh inputs") {
  Problem p;
  p.create("api_graph", 128 * g_ctx->size(), 256 * g_ctx->size(), 256);
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  // The first call on this stream is the captured one: the GEMM's workspaces for it are made during
  // the capture and must outlive the graph's capture (kernels/gemm.cu, alloc_zeroed).
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  const Status st = p.op->run(p.a, p.b, p.c, s);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);
  REQUIRE(st == Status::kOk);
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  const uint64_t base = (uint64_t(getppid()) << 20) + 777777;
  const int rank = g_ctx->rank();
  for (int i = 0; i < 1000; ++i) {
    const uint64_t seed = base + uint64_t(i);
    fill<<<64, 256, 0, s>>>(p.a, p.m_loc * p.k, seed, uint64_t(rank));
    fill<<<64, 256, 0, s>>>(p.b, p.n * p.k, seed, uint64_t(1000 + rank));
    poison<<<64, 256, 0, s>>>(p.c, p.m * p.n);
    REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
    poison<<<64, 256, 0, s>>>(p.a, p.m_loc * p.k);
    reference<<<unsigned((p.m * p.n + 255) / 256), 256, 0, s>>>(p.c_ref, p.b, p.m, p.n, p.k, p.m_loc, seed);
    compare<<<64, 256, 0, s>>>(p.c, p.c_ref, p.m * p.n, p.bad);
  }
  REQUIRE(drain(s, 300));
  CHECK_MESSAGE(*p.bad == 0, *p.bad << " wrong or unwritten elements over 1000 replays");
  // The same op, called directly on the same stream afterwards, still right.
  for (int i = 0; i < 10; ++i) REQUIRE(p.call(base + 5000 + uint64_t(i), s) == Status::kOk);
  REQUIRE(drain(s, 60));
  CHECK(*p.bad == 0);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  CHECK(!g_ctx->failed());
  cudaStreamDestroy(s);
}

TEST_CASE("a plan that is not capturable (SM movers): run refuses during capture, and the context stays usable") {
  Problem p;
  p.create("api_capture", 128 * g_ctx->size(), 256 * g_ctx->size(), 256, "roles: {compute: 96, intra_comm: 8}\n");
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  CHECK(p.op->run(p.a, p.b, p.c, s) == Status::kUnsupported);
  cudaGraph_t graph = nullptr;
  CHECK(cudaStreamEndCapture(s, &graph) == cudaSuccess);
  if (graph) cudaGraphDestroy(graph);
  CHECK(!g_ctx->failed());
  CHECK(p.call(7, s) == Status::kOk);
  REQUIRE(drain(s, 60));
  CHECK(*p.bad == 0);
  cudaStreamDestroy(s);
}

TEST_CASE("a user kernel holds half the SMs on another stream: the op still completes correctly") {
  Problem p;
  p.create("api_half", 128 * g_ctx->size(), 256 * g_ctx->size(), 1024);
  int dev = 0, sms = 0, smem = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  REQUIRE(cudaFuncSetAttribute(hold, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) == cudaSuccess);
  int* release = nullptr;
  REQUIRE(cudaMallocManaged(&release, sizeof(int)) == cudaSuccess);
  *release = 0;
  cudaStream_t s, other;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking) == cudaSuccess);
  hold<<<sms / 2, 128, smem, other>>>(release, int64_t(4e9));  // ~2 s at most
  REQUIRE(cudaGetLastError() == cudaSuccess);
  CHECK(p.call(11, s) == Status::kOk);
  const bool done = drain(s, 60);
  *release = 1;
  CHECK_MESSAGE(done, "the op did not complete beside the kernel holding " << sms / 2 << " SMs");
  drain(other, 30);
  CHECK(*p.bad == 0);
  cudaFree(release);
  cudaStreamDestroy(s);
  cudaStreamDestroy(other);
}

TEST_CASE("two ops share one heap; an op destroyed and recreated takes its arena again") {
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  auto first = std::make_unique<Problem>();
  first->create("api_first", 128 * g_ctx->size(), 256 * g_ctx->size(), 256);
  Problem second;
  second.create("api_second", 256 * g_ctx->size(), 512 * g_ctx->size(), 384);
  for (int i = 0; i < 10; ++i) {
    REQUIRE(first->call(100 + i, s) == Status::kOk);
    REQUIRE(second.call(200 + i, s) == Status::kOk);
  }
  REQUIRE(drain(s, 60));
  CHECK(*first->bad == 0);
  CHECK(*second.bad == 0);
  first.reset();
  Problem third;
  third.create("api_third", 128 * g_ctx->size(), 256 * g_ctx->size(), 256);
  for (int i = 0; i < 10; ++i) {
    REQUIRE(third.call(300 + i, s) == Status::kOk);
    REQUIRE(second.call(400 + i, s) == Status::kOk);
  }
  REQUIRE(drain(s, 60));
  CHECK(*third.bad == 0);
  CHECK(*second.bad == 0);
  cudaStreamDestroy(s);
}

TEST_CASE("GEMM+ReduceScatter and GEMM+AllReduce through the API: 100 calls each, fresh inputs, every C right") {
  const int W = g_ctx->size();
  // The peer variant, then the overlap variant's ways of moving partials and reduced rows (2 or more
  // ranks): the defaults, the model's plan at this size (RS and AR: the epilogue sends, AR's gathers
  // too; 1 piece), and the others with 2 pieces per rank's rows.
  // Ranks that share a GPU run the peer variant only (the model plans it for them).
  int gpus = 0;
  REQUIRE(cudaGetDeviceCount(&gpus) == cudaSuccess);
  std::vector<ReduceCase> cases = {
      {"gemm_rs", "plan: {variant: peer}\n"}, {"gemm_ar", "plan: {variant: peer}\n"}, {"gemm_rs", ""}, {"gemm_ar", ""}};
  if (W >= 2 && gpus >= W)
    cases.insert(cases.end(), {{"gemm_rs", "plan: {variant: overlap, send: copy}\n"},
                               {"gemm_rs", "plan: {variant: overlap, pieces: 2, send: copy}\n"},
                               {"gemm_rs", "plan: {variant: overlap, pieces: 2, send: sm}\n"},
                               {"gemm_ar", "plan: {variant: overlap, pieces: 2, lag: 2, send: copy, gather: push}\n"},
                               {"gemm_ar", "plan: {variant: overlap, pieces: 2, send: copy, gather: sm}\n"}});
  reduce_cases_through_api(cases, 100);
}

// Last: it leaves the context poisoned.
TEST_CASE(
    "a rank skips a call: the others' waits time out, their contexts are poisoned, streams drain, calls fail fast") {
  Problem p;
  p.create("api_timeout", 128 * g_ctx->size(), 256 * g_ctx->size(), 256);
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(p.call(1, s) == Status::kOk);
  REQUIRE(drain(s, 60));
  if (g_ctx->rank() == 1) {
    g_ctx->get().poison("test: rank 1 skips a call");  // and never calls again
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(p.call(2, s) == Status::kOk);  // enqueued; rank 1's shard never comes
  CHECK_MESSAGE(drain(s, 60), "the stream did not drain after the device wait timed out");
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(g_ctx->failed());
  MESSAGE("rank " << g_ctx->rank() << ": poisoned after " << waited << " s: " << g_ctx->failure());
  CHECK(g_ctx->failure().find("timed out") != std::string::npos);
  const auto t1 = std::chrono::steady_clock::now();
  CHECK(p.op->run(p.a, p.b, p.c, s) == Status::kPeerFailed);
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count() < 0.1);
  cudaStreamDestroy(s);
}

int main(int argc, char** argv) {
  if (weft::Context::create({}, &g_ctx) != Status::kOk) {
    fprintf(stderr, "test_api_gpu: no weft::Context (run it under `weftrun exec`, with a GPU)\n");
    return 1;
  }
  doctest::Context dt(argc, argv);
  const int rc = dt.run();
  g_ctx.reset();
  return rc;
}
