// One call in flight per context (runtime::Context::order_call), with ops that need it: two
// GEMM+RS/AR ops whose persistent kernels each wait for their peers' kernels (partials made by the
// peers' GEMMs), called on two streams with no synchronisation between them and random per-rank
// delays. Without the order one rank's GPU can run op 2's kernel on every SM while a peer's runs op
// 1's, each waiting for the other's; with it every rank runs the calls in the order it made them.
//   test_api_order_gpu              the order on: every output right, no timeout
//   test_api_order_gpu --no-order   the order off (a test-only switch): expected to fail, by a device
//                                   wait's timeout or a wrong output; api_gpu.sh reports what it did
// Run under `weftrun exec -n W` with a GPU per rank (W >= 2).
#define DOCTEST_CONFIG_IMPLEMENT
#include "tests/runtime/api_testing.cuh"

namespace {
bool g_no_order = false;
}

TEST_CASE("one call in flight per context: two GEMM+RS/AR overlap ops on two streams, no synchronisation between") {
  if (g_no_order) g_ctx->get().set_call_order_for_testing(false);
  ReduceProblem one, two;
  // 2048 W x 1536: at least 192 output tiles, so each op's persistent kernel holds every SM of its GPU
  // while it runs and the two kernels cannot both be resident (with fewer tiles they fit side by side
  // and the missing order could never show).
  one.create("gemm_rs", "plan: {variant: overlap, send: sm}\n", "order1", 2048, 1536);
  two.create("gemm_ar", "plan: {variant: overlap, send: sm, gather: sm}\n", "order2", 2048, 1536);
  cudaStream_t s1, s2;
  REQUIRE(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking) == cudaSuccess);
  std::mt19937_64 rng(std::random_device{}() + uint64_t(g_ctx->rank()));
  const uint64_t base = (uint64_t(getppid()) << 24) + 777;
  Status st = Status::kOk;
  int made = 0;
  for (int i = 0; i < 300 && st == Status::kOk; ++i) {
    st = one.call(base + uint64_t(2 * i), s1, int64_t(rng() % 200000));
    if (st == Status::kOk) st = two.call(base + uint64_t(2 * i + 1), s2, int64_t(rng() % 200000));
    if (st == Status::kOk) ++made;
  }
  const bool drained1 = drain(s1, 120), drained2 = drain(s2, 120);  // both waited for, whatever the first gives
  const bool drained = drained1 && drained2;
  MESSAGE("rank " << g_ctx->rank() << (g_no_order ? " (order off)" : " (order on)") << ": " << made
                  << " call pairs made; op 1 " << *one.bad << " wrong elements, op 2 " << *two.bad
                  << (g_ctx->failed() ? "; context failed: " + g_ctx->failure() : std::string()));
  CHECK(st == Status::kOk);
  CHECK(drained);
  CHECK_MESSAGE(*one.bad == 0, *one.bad << " wrong or unwritten elements (op 1, stream 1)");
  CHECK_MESSAGE(*two.bad == 0, *two.bad << " wrong or unwritten elements (op 2, stream 2)");
  CHECK_MESSAGE(!g_ctx->failed(), g_ctx->failure());
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
}

int main(int argc, char** argv) {
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--no-order"))
      g_no_order = true;
    else
      args.push_back(argv[i]);
  }
  if (weft::Context::create({}, &g_ctx) != Status::kOk) {
    fprintf(stderr, "test_api_order_gpu: no weft::Context (run it under `weftrun exec`, with a GPU)\n");
    return 1;
  }
  // The overlap variant needs a GPU per rank and 2 or more ranks: otherwise the test did not run,
  // and says so (exit 77: skipped), on every rank alike.
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess) gpus = 0;
  if (g_ctx->size() < 2 || gpus < g_ctx->size()) {
    if (g_ctx->rank() == 0)
      printf("SKIPPED: test_api_order_gpu needs 2 or more ranks and a GPU per rank (%d ranks, %d GPUs)\n",
             g_ctx->size(), gpus);
    g_ctx.reset();
    return 77;
  }
  doctest::Context dt(int(args.size()), args.data());
  const int rc = dt.run();
  g_ctx.reset();
  return rc;
}
