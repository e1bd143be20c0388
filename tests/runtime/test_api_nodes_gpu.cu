// AllGather+GEMM across nodes through the public API (runtime/weft.h), on GPUs, under `weftrun exec -n 4
// --emulate-nodes 2` (api_gpu.sh): the hierarchical plan's calls back to back with random per-rank
// delays and the inputs poisoned right after each call (a copy into position 0 that raced a node-mate's
// pull or the proxy's put of the last call would show in C); two such ops in one context sharing its
// transport, one destroyed and made again; capture refused; GEMM+RS and GEMM+AR across nodes, every C
// checked.
#define DOCTEST_CONFIG_IMPLEMENT
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <random>

#include "tests/runtime/api_testing.cuh"

TEST_CASE("across nodes: 1000 back-to-back calls, random per-rank delays, inputs poisoned after each call") {
  Problem p;
  p.create("api_nodes_loop", 256 * g_ctx->size(), 256 * g_ctx->size(), 512);
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  std::mt19937_64 rng(std::random_device{}() + uint64_t(g_ctx->rank()));  // the delays: each rank its own
  const uint64_t base = uint64_t(getppid()) << 20;  // the data: the same seeds on every rank (one launcher)
  Status st = Status::kOk;
  for (int i = 0; i < 1000 && st == Status::kOk; ++i) st = p.call(base + uint64_t(i), s, int64_t(rng() % 200000));
  CHECK(st == Status::kOk);
  REQUIRE(drain(s, 300));
  CHECK_MESSAGE(*p.bad == 0, *p.bad << " wrong or unwritten elements over 1000 calls");
  CHECK(!g_ctx->failed());
  MESSAGE("rank " << g_ctx->rank() << ": 1000 calls across " << g_ctx->get().boot().info().num_nodes << " nodes, "
                  << *p.bad << " elements wrong");
  cudaStreamDestroy(s);
}

TEST_CASE("across nodes: two ops share the context's transport; one destroyed and made again") {
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  const uint64_t base = (uint64_t(getppid()) << 20) + 5000;
  auto first = std::make_unique<Problem>();
  first->create("api_nodes_first", 256 * g_ctx->size(), 256 * g_ctx->size(), 256);
  Problem second;
  second.create("api_nodes_second", 512 * g_ctx->size(), 512 * g_ctx->size(), 384);
  for (int i = 0; i < 20; ++i) {
    REQUIRE(first->call(base + uint64_t(i), s) == Status::kOk);
    REQUIRE(second.call(base + 100 + uint64_t(i), s) == Status::kOk);
  }
  REQUIRE(drain(s, 120));
  CHECK(*first->bad == 0);
  CHECK(*second.bad == 0);
  first.reset();
  Problem third;
  third.create("api_nodes_third", 256 * g_ctx->size(), 256 * g_ctx->size(), 256);
  for (int i = 0; i < 20; ++i) REQUIRE(third.call(base + 200 + uint64_t(i), s) == Status::kOk);
  REQUIRE(drain(s, 120));
  CHECK(*third.bad == 0);
  CHECK(*second.bad == 0);
  CHECK(!g_ctx->failed());
  cudaStreamDestroy(s);
}

TEST_CASE("across nodes: the plan is not capturable; run refuses during capture and the context stays usable") {
  Problem p;
  p.create("api_nodes_capture", 256 * g_ctx->size(), 256 * g_ctx->size(), 256);
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  CHECK(p.op->run(p.a, p.b, p.c, s) == Status::kUnsupported);
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(s, &graph);
  if (graph) cudaGraphDestroy(graph);
  CHECK(!g_ctx->failed());
  REQUIRE(p.call(7, s) == Status::kOk);  // every rank makes this call: each refused the captured one
  REQUIRE(drain(s, 60));
  CHECK(*p.bad == 0);
  cudaStreamDestroy(s);
}

TEST_CASE("across nodes: GEMM+ReduceScatter and GEMM+AllReduce through the API, 100 calls each, every C right") {
  reduce_cases_through_api({{"gemm_rs", ""}, {"gemm_ar", ""}}, 100);
}

int main(int argc, char** argv) {
  if (weft::Context::create({}, &g_ctx) != Status::kOk) {
    fprintf(stderr, "test_api_nodes_gpu: no weft::Context (run it under `weftrun exec --emulate-nodes 2`)\n");
    return 1;
  }
  if (g_ctx->get().boot().info().num_nodes < 2 || g_ctx->size() % g_ctx->get().boot().info().num_nodes != 0) {
    fprintf(stderr, "test_api_nodes_gpu: needs a job of 2 or more (emulated) nodes with equal ranks\n");
    return 1;
  }
  doctest::Context dt(argc, argv);
  const int rc = dt.run();
  g_ctx.reset();
  return rc;
}
