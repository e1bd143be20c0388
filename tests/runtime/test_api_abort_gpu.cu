// ctx.abort() tells the peers (run under `weftrun exec -n 4`, see api_gpu.sh): rank 1 aborts the job
// once every other rank has a call in flight that waits for rank 1's shard (a barrier after they
// enqueued it). The others must learn of
// it from the launcher, not from their device timeout (set far longer than the bound here): their
// contexts are poisoned naming rank 1 and its reason, their streams drain, and a later call fails
// fast. Each of them prints one "abort-test: rank N: PASS|FAIL ..." line before the launcher, which
// stops the job after an abort, ends it; api_gpu.sh counts the lines (the job itself exits non-zero).
#define DOCTEST_CONFIG_IMPLEMENT
#include <cuda_runtime.h>
#include <doctest/doctest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "runtime/weft.h"
#include "tests/runtime/api_testing.cuh"

namespace {
constexpr const char* kReason = "test: rank 1 aborts the job";
constexpr double kBoundS = 3.0;  // the others' device timeout is 60 s (api_gpu.sh)
}  // namespace

TEST_CASE("rank 1 aborts while the others wait for its shard: they learn of it, drain and fail fast") {
  Problem p;
  p.create("api_abort", 128 * g_ctx->size(), 256 * g_ctx->size(), 256);
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(p.call(1, s) == Status::kOk);
  REQUIRE(drain(s, 60));
  REQUIRE(*p.bad == 0);
  // The others enqueue their call, then everyone meets: rank 1 aborts only once those calls wait.
  const auto t0 = std::chrono::steady_clock::now();
  const Status enqueued = g_ctx->rank() == 1 ? Status::kOk : p.call(2, s);
  REQUIRE(g_ctx->get().boot().barrier("api_abort_enqueued") == Status::kOk);
  REQUIRE(enqueued == Status::kOk);
  if (g_ctx->rank() == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the others are back in their waits
    g_ctx->abort(kReason);
    CHECK(g_ctx->failed());
    std::this_thread::sleep_for(std::chrono::seconds(30));  // the launcher ends the job before this
    return;
  }
  const bool drained = drain(s, 20);  // the call waits for rank 1's shard, which never comes
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string why = g_ctx->failure();
  const auto t1 = std::chrono::steady_clock::now();
  const Status later = p.op->run(p.a, p.b, p.c, s);
  const double refused = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  const bool ok = drained && g_ctx->failed() && why.find("peer rank 1") != std::string::npos &&
                  why.find(kReason) != std::string::npos && waited < kBoundS && later == Status::kPeerFailed &&
                  refused < 0.1;
  fprintf(stdout, "abort-test: rank %d: %s: drained %d after %.3f s (bound %.1f s), later call %s in %.4f s: %s\n",
          g_ctx->rank(), ok ? "PASS" : "FAIL", int(drained), waited, kBoundS,
          later == Status::kPeerFailed ? "refused" : "NOT refused", refused, why.c_str());
  fflush(stdout);
  CHECK(ok);
  cudaStreamDestroy(s);
}

int main(int argc, char** argv) {
  if (weft::Context::create({}, &g_ctx) != Status::kOk) {
    fprintf(stderr, "test_api_abort_gpu: no weft::Context (run it under `weftrun exec`, with a GPU)\n");
    return 1;
  }
  doctest::Context dt(argc, argv);
  const int rc = dt.run();
  g_ctx.reset();
  return rc;
}
