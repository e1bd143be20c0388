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
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>

#include "runtime/exec/context.h"  // poison(): the test makes one rank drop out
#include "runtime/weft.h"
#include "tests/runtime/api_testing.cuh"

namespace {

// ---- kernels of this test beyond api_testing.cuh ----

// Holds its SM until the host sets *release (host-mapped memory), or `max_ns` pass on the GPU's own
// clock (far beyond the test's bounds): blocks that fill SMs beside the op. Each block counts itself
// in *started once resident.
__global__ void hold(volatile int* release, int* started, uint64_t max_ns) {
  extern __shared__ char smem[];
  smem[threadIdx.x] = 0;
  if (threadIdx.x == 0) {
    atomicAdd_system(started, 1);
    __threadfence_system();
  }
  uint64_t start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (!*release && now - start < max_ns);
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

// 1000 calls of `call` (after 3 first-use calls and a synchronisation) counted by CUPTI: no allocation,
// no synchronisation, and the counter did see the calls.
void count_1000_calls(const char* what, const std::function<Status()>& call, cudaStream_t s) {
  for (int i = 0; i < 3; ++i) REQUIRE(call() == Status::kOk);  // first-use setup
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  ApiCounts counts;
  CUpti_SubscriberHandle sub;
  REQUIRE(cuptiSubscribe(&sub, (CUpti_CallbackFunc)on_api, &counts) == CUPTI_SUCCESS);
  REQUIRE(cuptiEnableDomain(1, sub, CUPTI_CB_DOMAIN_RUNTIME_API) == CUPTI_SUCCESS);
  REQUIRE(cuptiEnableDomain(1, sub, CUPTI_CB_DOMAIN_DRIVER_API) == CUPTI_SUCCESS);
  Status st = Status::kOk;
  for (int i = 0; i < 1000 && st == Status::kOk; ++i) st = call();
  cuptiUnsubscribe(sub);
  CHECK(st == Status::kOk);
  CHECK_MESSAGE(counts.allocs == 0, std::string(what) << ": first: " << counts.first_bad);
  CHECK_MESSAGE(counts.syncs == 0, std::string(what) << ": first: " << counts.first_bad);
  CHECK(counts.calls > 1000);  // the counter saw the calls' stream operations
  MESSAGE("rank " << g_ctx->rank() << ": " << std::string(what) << ": 1000 calls made " << counts.calls.load()
                  << " CUDA API calls, " << counts.allocs.load() << " allocations, " << counts.syncs.load()
                  << " synchronisations");
  CHECK(drain(s, 120));
}

TEST_CASE("1000 direct calls make no allocation and no host synchronisation") {
  Problem p;
  p.create("api_counts", 128 * g_ctx->size(), 256 * g_ctx->size(), 256);
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  count_1000_calls(
      "AgGemm", [&] { return p.op->run(p.a, p.b, p.c, s); }, s);
  cudaStreamDestroy(s);
}

TEST_CASE(
    "GEMM+RS and GEMM+AR: 1000 direct calls make no allocation and no host synchronisation, then 1000 "
    "back-to-back calls with random per-rank delays and inputs poisoned after each are all right") {
  for (const char* op : {"gemm_rs", "gemm_ar"})
    reduce_cases_through_api({{op, ""}}, 1000, true,
                             [op](weft::GemmReduce& r, const void* a, const void* b, void* c, cudaStream_t s) {
                               count_1000_calls(
                                   op, [&] { return r.run(a, b, c, s); }, s);
                             });
}

namespace {
__global__ void count_not_finite(const uint16_t* p, int64_t n, unsigned long long* bad) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    if (!isfinite(bf16_to_float(p[i]))) atomicAdd(bad, 1ull);
}
}  // namespace

TEST_CASE("the MoE layer: 1000 direct calls make no allocation and no host synchronisation") {
  const int W = g_ctx->size(), rank = g_ctx->rank();
  const std::string path = "/tmp/weft-api-" + std::to_string(getppid()) + "-moe.yaml";
  if (rank == 0) {
    FILE* f = fopen(path.c_str(), "w");
    REQUIRE(f != nullptr);
    fprintf(f,
            "name: api_moe\nop: moe\ndtype: bf16\nshape: {tokens: %d, hidden: 512, ffn: 256, experts: %d, topk: 2}\n"
            "layout: {nodes: 1, gpus_per_node: %d}\n",
            256 * W, 4 * W, W);
    fclose(f);
  }
  weft::Plan plan;
  std::string err;
  REQUIRE_MESSAGE(g_ctx->plan(path, &plan, &err) == Status::kOk, err);
  REQUIRE_MESSAGE(plan.runnable(), plan.why_not());
  const int64_t T = 256, H = 512, F = 256, L = 4;
  uint16_t *router = nullptr, *gate = nullptr, *up = nullptr, *down = nullptr, *x = nullptr, *y = nullptr;
  REQUIRE(cudaMalloc(&router, size_t(H * L * W) * 2) == cudaSuccess);
  REQUIRE(cudaMalloc(&gate, size_t(L * F * H) * 2) == cudaSuccess);
  REQUIRE(cudaMalloc(&up, size_t(L * F * H) * 2) == cudaSuccess);
  REQUIRE(cudaMalloc(&down, size_t(L * H * F) * 2) == cudaSuccess);
  REQUIRE(cudaMalloc(&x, size_t(T * H) * 2) == cudaSuccess);
  REQUIRE(cudaMalloc(&y, size_t(T * H) * 2) == cudaSuccess);
  fill<<<64, 256>>>(router, H * L * W, 11, 0);  // the same router on every rank
  fill<<<64, 256>>>(gate, L * F * H, 12, uint64_t(rank));
  fill<<<64, 256>>>(up, L * F * H, 13, uint64_t(rank));
  fill<<<64, 256>>>(down, L * H * F, 14, uint64_t(rank));
  fill<<<64, 256>>>(x, T * H, 15, uint64_t(rank));
  poison<<<64, 256>>>(y, T * H);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  std::unique_ptr<weft::Moe> op;
  REQUIRE(weft::Moe::create(*g_ctx, plan, {router, gate, up, down}, &op) == Status::kOk);
  REQUIRE(op->tokens_local() == T);
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  count_1000_calls(
      "Moe", [&] { return op->run(x, y, s); }, s);
  // One more call on a poisoned output: every row written.
  poison<<<64, 256, 0, s>>>(y, T * H);
  REQUIRE(op->run(x, y, s) == Status::kOk);
  unsigned long long* bad = nullptr;
  REQUIRE(cudaMallocManaged(&bad, 8) == cudaSuccess);
  *bad = 0;
  count_not_finite<<<64, 256, 0, s>>>(y, T * H, bad);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK_MESSAGE(*bad == 0, *bad << " output elements not written (or not finite) by the call after the 1000");
  op.reset();
  cudaStreamDestroy(s);
  for (void* p : {static_cast<void*>(router), static_cast<void*>(gate), static_cast<void*>(up),
                  static_cast<void*>(down), static_cast<void*>(x), static_cast<void*>(y), static_cast<void*>(bad)})
    cudaFree(p);
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

// Half the SMs held by a user kernel that is resident (counted) before the op is called and is let
// go only after the op's stream drained or the bound passed: the op must complete correctly beside
// it, or fail fast with a clear error. `extra`: the workload's plan choices.
void call_beside_half_held(const char* name, const std::string& extra, bool may_fail) {
  Problem p;
  p.create(name, 128 * g_ctx->size(), 256 * g_ctx->size(), 1024, extra);
  int dev = 0, sms = 0, smem = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  REQUIRE(cudaFuncSetAttribute(hold, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) == cudaSuccess);
  // Host-mapped words: the host writes `release` while the holding blocks spin on it.
  int *release = nullptr, *started = nullptr, *release_dev = nullptr, *started_dev = nullptr;
  REQUIRE(cudaHostAlloc(&release, sizeof(int), cudaHostAllocMapped) == cudaSuccess);
  REQUIRE(cudaHostAlloc(&started, sizeof(int), cudaHostAllocMapped) == cudaSuccess);
  *reinterpret_cast<volatile int*>(release) = 0;
  *reinterpret_cast<volatile int*>(started) = 0;
  REQUIRE(cudaHostGetDevicePointer(reinterpret_cast<void**>(&release_dev), release, 0) == cudaSuccess);
  REQUIRE(cudaHostGetDevicePointer(reinterpret_cast<void**>(&started_dev), started, 0) == cudaSuccess);
  cudaStream_t s, other;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking) == cudaSuccess);
  // One checked call first: this test's own kernels (fill, poison, reference, compare) are then
  // loaded. CUDA loads a kernel at its first launch, and that load would wait behind the holding
  // kernel: the caller's stream would stall before it ever reached the op.
  REQUIRE(p.call(10, s) == Status::kOk);
  REQUIRE(drain(s, 60));
  REQUIRE(*p.bad == 0);
  const int held = sms / 2;  // one block per SM: each asks for all of an SM's shared memory
  hold<<<held, 128, smem, other>>>(release_dev, started_dev, uint64_t(120) * 1000000000ull);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (*reinterpret_cast<volatile int*>(started) < held && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  REQUIRE_MESSAGE(*reinterpret_cast<volatile int*>(started) == held, "the holding kernel did not start");
  fprintf(stderr, "rank %d: %s: %d blocks hold %d of %d SMs; calling the op\n", g_ctx->rank(), name, held, held, sms);
  const auto t0 = std::chrono::steady_clock::now();
  const Status st = p.call(11, s);
  const auto since = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  fprintf(stderr, "rank %d: %s: the call returned %s after %.3f s\n", g_ctx->rank(), name, weft::to_string(st),
          since());
  // Until the op's stream drains (completed) or the context fails (the op gave up), 60 s at most.
  bool done = false, failed = false;
  while (since() < 60) {
    if ((done = cudaStreamQuery(s) == cudaSuccess)) break;
    if ((failed = g_ctx->failed())) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const double waited = since();
  const bool still_held = cudaStreamQuery(other) == cudaErrorNotReady;  // the op ran beside the holder
  fprintf(stderr, "rank %d: %s: %s after %.3f s; releasing the holding blocks\n", g_ctx->rank(), name,
          done     ? "the op's stream drained"
          : failed ? "the context failed"
                   : "neither drained nor failed",
          waited);
  *reinterpret_cast<volatile int*>(release) = 1;
  CHECK(drain(other, 30));
  const bool drained_after = done || drain(s, 30);
  if (!drained_after) {  // still stuck with the SMs free again: say so, and leave without freeing
    fprintf(stderr, "rank %d: %s: the op's stream is still busy 30 s after the SMs were released\n", g_ctx->rank(),
            name);
    fflush(stderr);
    _exit(3);
  }
  CHECK(still_held);
  MESSAGE("rank " << g_ctx->rank() << ": " << std::string(name) << " beside " << held << " of " << sms
                  << " SMs held: " << (failed ? "failed: " + g_ctx->failure() : std::string("completed")) << " after "
                  << waited << " s");
  CHECK(st == Status::kOk);
  CHECK_MESSAGE((done || failed),
                "the op neither completed nor failed within 60 s beside the kernel holding " << held << " SMs");
  CHECK_MESSAGE((may_fail || !failed), g_ctx->failure());
  if (failed) {  // failing is allowed, if fast and clear: it names the co-residency it lacked
    CHECK(waited < 30);
    CHECK_MESSAGE(g_ctx->failure().find("resident") != std::string::npos, g_ctx->failure());
  } else {
    CHECK(*p.bad == 0);
  }
  cudaFreeHost(release);
  cudaFreeHost(started);
  cudaStreamDestroy(s);
  cudaStreamDestroy(other);
}

// The two half-SM cases run each in a job of its own with one rank per GPU (api_gpu.sh, --no-skip): a
// failure, which is allowed, leaves the context poisoned; ranks that share a GPU time-slice it, and one
// rank's holding kernel is then another rank's problem.
TEST_CASE("a user kernel holds half the SMs: the copy-engine plan completes correctly" * doctest::skip()) {
  call_beside_half_held("api_half", "", false);  // its kernel needs no block of its own resident
}

TEST_CASE("a user kernel holds half the SMs: the SM-mover plan completes correctly or fails fast, clearly" *
          doctest::skip()) {
  call_beside_half_held("api_half_movers", "roles: {compute: 96, intra_comm: 8}\n", true);
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

TEST_CASE("one call in flight per context: two ops called on two streams with no synchronisation between them") {
  // Each op on a stream of its own, calls alternating, random per-rank delays before each, nothing
  // between the streams but what the context inserts: every output right, no timeout. These two
  // AllGather+GEMM ops cannot deadlock each other without the order: neither kernel waits for a
  // peer's kernel (the copy engines push without SMs; the SM movers' stream waits for the peers'
  // ready words before the launch). test_api_order_gpu has two ops that can, and shows the order is
  // needed.
  cudaStream_t s1, s2;
  REQUIRE(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking) == cudaSuccess);
  Problem one, two;
  one.create("api_order_1", 128 * g_ctx->size(), 256 * g_ctx->size(), 256);
  two.create("api_order_2", 256 * g_ctx->size(), 256 * g_ctx->size(), 512, "roles: {compute: 96, intra_comm: 8}\n");
  std::mt19937_64 rng(std::random_device{}() + uint64_t(g_ctx->rank()));
  const uint64_t base = (uint64_t(getppid()) << 20) + 424242;
  Status st = Status::kOk;
  for (int i = 0; i < 200 && st == Status::kOk; ++i) {
    st = one.call(base + uint64_t(2 * i), s1, int64_t(rng() % 100000));
    if (st == Status::kOk) st = two.call(base + uint64_t(2 * i + 1), s2, int64_t(rng() % 100000));
  }
  CHECK(st == Status::kOk);
  REQUIRE(drain(s1, 300));
  REQUIRE(drain(s2, 300));
  CHECK_MESSAGE(*one.bad == 0, *one.bad << " wrong or unwritten elements (op 1, stream 1)");
  CHECK_MESSAGE(*two.bad == 0, *two.bad << " wrong or unwritten elements (op 2, stream 2)");
  CHECK_MESSAGE(!g_ctx->failed(), g_ctx->failure());
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
}

namespace {
__global__ void stamp(uint32_t* p, int64_t n, uint32_t rank) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = rank << 24 | uint32_t(i & 0xFFFFFF);
}
// Counts the elements of peer q's allocation (read over NVLink through its mapping here) that are not
// q's stamp.
__global__ void check_stamp(const uint32_t* p, int64_t n, uint32_t q, unsigned long long* bad) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    if (p[i] != (q << 24 | uint32_t(i & 0xFFFFFF))) atomicAdd(bad, 1ull);
}
}  // namespace

TEST_CASE("tensors on the symmetric heap: alloc, a peer's copy read through peer(), free; an op runs on them") {
  const int W = g_ctx->size(), rank = g_ctx->rank();
  const int64_t n = 1 << 20;
  void* x = nullptr;
  std::string err;
  REQUIRE_MESSAGE(g_ctx->alloc(uint64_t(n) * 4, &x, &err) == Status::kOk, err);
  REQUIRE(x != nullptr);
  CHECK(g_ctx->peer(rank, x) != nullptr);
  stamp<<<128, 256>>>(static_cast<uint32_t*>(x), n, uint32_t(rank));
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  REQUIRE(g_ctx->get().boot().barrier("api_alloc_stamped") == Status::kOk);
  unsigned long long* bad = nullptr;
  REQUIRE(cudaMallocManaged(&bad, 8) == cudaSuccess);
  *bad = 0;
  const int nodes = g_ctx->get().boot().info().num_nodes;
  int read = 0;
  for (int q = 0; q < W; ++q) {
    const void* there = g_ctx->peer(q, x);
    if (nodes > 1 && !there) continue;  // another node's
    REQUIRE_MESSAGE(there != nullptr, "rank " << q << "'s allocation is not mapped here");
    check_stamp<<<128, 256>>>(static_cast<const uint32_t*>(there), n, uint32_t(q), bad);
    ++read;
  }
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK_MESSAGE(*bad == 0, *bad << " elements of peers' allocations were not theirs");
  CHECK(read >= 1);
  REQUIRE(g_ctx->get().boot().barrier("api_alloc_read") == Status::kOk);
  // An op's buffers from the heap: A, B and C all allocated here.
  {
    Problem p;
    p.create("api_heap_tensors", 128 * W, 256 * W, 256);
    void *a = nullptr, *b = nullptr, *c = nullptr;
    REQUIRE(g_ctx->alloc(uint64_t(p.m_loc * p.k) * 2, &a, &err) == Status::kOk);
    REQUIRE(g_ctx->alloc(uint64_t(p.n * p.k) * 2, &b, &err) == Status::kOk);
    REQUIRE(g_ctx->alloc(uint64_t(p.m * p.n) * 2, &c, &err) == Status::kOk);
    cudaFree(p.a);
    cudaFree(p.b);
    cudaFree(p.c);
    p.a = static_cast<uint16_t*>(a), p.b = static_cast<uint16_t*>(b), p.c = static_cast<uint16_t*>(c);
    cudaStream_t s;
    REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    for (int i = 0; i < 20; ++i) REQUIRE(p.call(9000 + uint64_t(i), s) == Status::kOk);
    REQUIRE(drain(s, 60));
    CHECK(*p.bad == 0);
    cudaStreamDestroy(s);
    p.a = p.b = p.c = nullptr;  // not Problem's to cudaFree
    p.op.reset();
    for (void* q : {c, b, a}) CHECK(g_ctx->free(q) == Status::kOk);
  }
  CHECK(g_ctx->free(x) == Status::kOk);
  CHECK(g_ctx->free(x) == Status::kInvalidArgument);  // not an allocation any more
  // Freed in reverse order: the next allocation of the same size lands where the first did.
  void* again = nullptr;
  REQUIRE(g_ctx->alloc(uint64_t(n) * 4, &again, &err) == Status::kOk);
  CHECK(again == x);
  CHECK(g_ctx->free(again) == Status::kOk);
  CHECK(g_ctx->alloc(g_ctx->get().heap_bytes() + 1, &again, &err) == Status::kInvalidArgument);
  CHECK(!err.empty());
  cudaFree(bad);
  CHECK(!g_ctx->failed());
}

TEST_CASE("external buffers: device memory registered; host memory and short buffers refused before any work") {
  std::string err;
  void* dev = nullptr;
  REQUIRE(cudaMalloc(&dev, 1 << 20) == cudaSuccess);
  CHECK_MESSAGE(g_ctx->register_buffer(dev, 1 << 20, &err) == Status::kOk, err);
  g_ctx->unregister_buffer(dev);
  std::vector<char> pageable(1 << 20);
  CHECK(g_ctx->register_buffer(pageable.data(), pageable.size(), &err) == Status::kInvalidArgument);
  CHECK_MESSAGE(err.find("host memory") != std::string::npos, err);
  void* pinned = nullptr;
  REQUIRE(cudaMallocHost(&pinned, 4096) == cudaSuccess);
  CHECK(g_ctx->register_buffer(pinned, 4096, &err) == Status::kInvalidArgument);
  CHECK_MESSAGE(err.find("pinned") != std::string::npos, err);
  // run() refuses the same way, on every rank alike, before it enqueues anything: the context stays
  // usable and the next good call is right.
  Problem p;
  p.create("api_external", 128 * g_ctx->size(), 256 * g_ctx->size(), 256);
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  CHECK(p.op->run(pageable.data(), p.b, p.c, s) == Status::kInvalidArgument);
  CHECK(p.op->run(p.a, pinned, p.c, s) == Status::kInvalidArgument);
  void* small = nullptr;
  REQUIRE(cudaMalloc(&small, size_t(p.m * p.n)) == cudaSuccess);  // half of C
  CHECK(p.op->run(p.a, p.b, small, s) == Status::kInvalidArgument);
  CHECK(p.op->run(p.a, nullptr, p.c, s) == Status::kInvalidArgument);
  CHECK(cudaStreamQuery(s) == cudaSuccess);  // nothing was enqueued
  CHECK(!g_ctx->failed());
  REQUIRE(p.call(31, s) == Status::kOk);
  REQUIRE(drain(s, 60));
  CHECK(*p.bad == 0);
  cudaFree(small);
  cudaFreeHost(pinned);
  cudaFree(dev);
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
