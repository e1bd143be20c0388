// Implementation of op_harness.h.
#include "runtime/ops/op_harness.h"

#include <cuda.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/log.h"
#include "base/params.h"
#include "runtime/ops/cuda_check.h"
#include "runtime/ops/ops.h"
#include "runtime/tuner.h"
#include "topology/topology.h"

namespace weft::runtime::ops {

Status create_nccl_comm(bootstrap::Bootstrap& boot, ncclComm_t* out) {
  const auto& info = boot.info();
  ncclUniqueId id{};
  if (info.rank == 0) WEFT_NCCL_CHECK(ncclGetUniqueId(&id));
  bootstrap::Blob mine(reinterpret_cast<uint8_t*>(&id), reinterpret_cast<uint8_t*>(&id) + sizeof id);
  std::vector<bootstrap::Blob> all;
  WEFT_CHECK(boot.allgather("weft.ops.nccl_id", mine, &all));
  if (all.empty() || all[0].size() != sizeof id) {
    WEFT_WARN(kKernel, "rank %d: NCCL unique id from rank 0 has %zu bytes, expected %zu", info.rank,
              all.empty() ? size_t(0) : all[0].size(), sizeof id);
    return Status::kProtocolError;
  }
  memcpy(&id, all[0].data(), sizeof id);
  WEFT_NCCL_CHECK(ncclCommInitRank(out, info.size, id, info.rank));
  return Status::kOk;
}

Status cublas_gemm_tn(cublasHandle_t h, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda, const void* b,
                      int64_t ldb, void* c, int64_t ldc, cudaStream_t s) {
  const float alpha = 1.f, beta = 0.f;
  WEFT_CUBLAS_CHECK(cublasSetStream(h, s));
  WEFT_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(m), int(k), &alpha, b, CUDA_R_16BF, int(ldb),
                                 a, CUDA_R_16BF, int(lda), &beta, c, CUDA_R_16BF, int(ldc), CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
  return Status::kOk;
}

namespace {

// The rounds both time_op and InterleavedTimer run: `warmup` rounds, then `iters` timed rounds, each
// running every candidate once (round i starts at candidate i mod n) after the one-word all-reduce
// that lines the ranks up; every run between two events. This rank's median per candidate, in ms.
Status timed_rounds(ncclComm_t comm, cudaStream_t s, int warmup, int iters,
                    const std::vector<const std::function<Status()>*>& enqueue, const char* what,
                    const std::function<void()>& unstick, std::vector<double>* medians) {
  const size_t n = enqueue.size();
  medians->assign(n, 0);
  if (n == 0 || iters < 1) return Status::kOk;
  int* word = nullptr;
  WEFT_CUDA_CHECK(cudaMallocAsync(&word, sizeof(int), s));
  WEFT_CUDA_CHECK(cudaMemsetAsync(word, 0, sizeof(int), s));
  for (int i = 0; i < warmup; ++i)
    for (size_t c = 0; c < n; ++c) WEFT_CHECK((*enqueue[c])());
  std::vector<cudaEvent_t> ev(2 * n * size_t(iters));
  for (auto& e : ev) WEFT_CUDA_CHECK(cudaEventCreate(&e));
  auto at = [&](size_t c, int i, int end) -> cudaEvent_t& { return ev[(c * size_t(iters) + size_t(i)) * 2 + end]; };
  for (int i = 0; i < iters; ++i) {
    for (size_t j = 0; j < n; ++j) {
      const size_t c = (size_t(i) + j) % n;
      WEFT_NCCL_CHECK(ncclAllReduce(word, word, 1, ncclInt32, ncclSum, comm, s));
      WEFT_CUDA_CHECK(cudaEventRecord(at(c, i, 0), s));
      WEFT_CHECK((*enqueue[c])());
      WEFT_CUDA_CHECK(cudaEventRecord(at(c, i, 1), s));
    }
  }
  const double bound_s = 2 * param_double_or_default("WEFT_DEVICE_TIMEOUT") + 0.01 * double(n) * double(warmup + iters);
  WEFT_CHECK(sync_bounded(s, bound_s, what, unstick));
  std::vector<float> t(static_cast<size_t>(iters));
  for (size_t c = 0; c < n; ++c) {
    for (int i = 0; i < iters; ++i) WEFT_CUDA_CHECK(cudaEventElapsedTime(&t[size_t(i)], at(c, i, 0), at(c, i, 1)));
    std::sort(t.begin(), t.end());
    (*medians)[c] = iters % 2 ? t[size_t(iters / 2)] : 0.5 * (t[size_t(iters / 2 - 1)] + t[size_t(iters / 2)]);
  }
  for (auto& e : ev) cudaEventDestroy(e);
  WEFT_CUDA_CHECK(cudaFreeAsync(word, s));
  return Status::kOk;
}

}  // namespace

Status time_op(ncclComm_t comm, cudaStream_t s, int warmup, int iters, const std::function<Status()>& enqueue,
               double* median_ms, const std::function<void()>& unstick) {
  std::vector<double> m;
  WEFT_CHECK(timed_rounds(comm, s, warmup, iters, {&enqueue}, "timed runs", unstick, &m));
  *median_ms = m.empty() ? 0 : m[0];
  return Status::kOk;
}

size_t InterleavedTimer::add(std::function<Status()> enqueue) {
  enqueue_.push_back(std::move(enqueue));
  return enqueue_.size() - 1;
}

Status InterleavedTimer::run(bootstrap::Bootstrap& boot, ncclComm_t comm, cudaStream_t s, int warmup, int iters,
                             const std::string& key, const std::function<void()>& unstick) {
  const size_t n = enqueue_.size();
  std::vector<const std::function<Status()>*> fns;
  for (const auto& f : enqueue_) fns.push_back(&f);
  std::vector<double> mine;
  WEFT_CHECK(timed_rounds(comm, s, warmup, iters, fns, "interleaved timed runs", unstick, &mine));
  // Every rank's medians in one exchange; the max over ranks per candidate.
  const auto* bytes = reinterpret_cast<const uint8_t*>(mine.data());
  std::vector<bootstrap::Blob> all;
  WEFT_CHECK(boot.allgather(key, bootstrap::Blob(bytes, bytes + n * sizeof(double)), &all));
  ms_ = mine;
  for (const auto& x : all) {
    if (x.size() != n * sizeof(double)) return Status::kProtocolError;
    for (size_t c = 0; c < n; ++c) {
      double v = 0;
      memcpy(&v, x.data() + c * sizeof(double), sizeof v);
      ms_[c] = std::max(ms_[c], v);
    }
  }
  return Status::kOk;
}

namespace {
bool g_seed_fixed = false;
uint64_t g_seed = 0;
}  // namespace

void set_bench_seed(uint64_t seed) {
  g_seed_fixed = true;
  g_seed = seed;
}

Status shared_seed(bootstrap::Bootstrap& boot, const std::string& key, uint64_t* out) {
  uint64_t mine = g_seed_fixed ? g_seed : uint64_t(time(nullptr)) * 2654435761ull ^ (uint64_t(getpid()) << 20);
  std::vector<bootstrap::Blob> all;
  WEFT_CHECK(boot.allgather(
      key, bootstrap::Blob(reinterpret_cast<uint8_t*>(&mine), reinterpret_cast<uint8_t*>(&mine) + 8), &all));
  if (all.empty() || all[0].size() != sizeof mine) return Status::kProtocolError;
  memcpy(out, all[0].data(), sizeof mine);
  return Status::kOk;
}

Status max_over_ranks(bootstrap::Bootstrap& boot, const std::string& key, double mine, double* out) {
  bootstrap::Blob b(reinterpret_cast<uint8_t*>(&mine), reinterpret_cast<uint8_t*>(&mine) + sizeof mine);
  std::vector<bootstrap::Blob> all;
  WEFT_CHECK(boot.allgather(key, b, &all));
  double m = mine;
  for (const auto& x : all) {
    double v = 0;
    if (x.size() != sizeof v) return Status::kProtocolError;
    memcpy(&v, x.data(), sizeof v);
    m = std::max(m, v);
  }
  *out = m;
  return Status::kOk;
}

Status gemm_group(int32_t* group_m) {
  int64_t g = 0;
  WEFT_CHECK(get_param("WEFT_GEMM_GROUP", &g));
  if (g < 0 || g > 1024) {
    WEFT_WARN(kKernel, "WEFT_GEMM_GROUP=%lld is not in [0, 1024] (0: the default)", static_cast<long long>(g));
    return Status::kInvalidArgument;
  }
  if (g > 0) *group_m = int32_t(g);
  return Status::kOk;
}

const kernels::GemmOptions& bench_gemm_options() {
  static const kernels::GemmOptions opt = [] {
    kernels::GemmOptions o;
    o.split_tail = param_bool_or_default("WEFT_GEMM_SPLIT_TAIL");
    o.chunked_tail = param_bool_or_default("WEFT_GEMM_CHUNKED_TAIL");
    o.dynamic_tiles = param_bool_or_default("WEFT_GEMM_DYNAMIC");
    o.tma_store = param_bool_or_default("WEFT_GEMM_TMA_STORE");
    return o;
  }();
  return opt;
}

// The mover the op's runner uses by default (GEMM+RS/AR: copy engines), so the printed prediction is for it.
Plan plan_for(const Workload& wl, int rank) { return plan_for(wl, rank, default_mover(wl.op)); }

Plan plan_for(const Workload& wl, int rank, IntraMover mover) {
  topology::Topology topo;
  Plan plan;
  std::string err;
  if (topology::load("", &topo) != Status::kOk) {
    WEFT_WARN(kTune, "rank %d: no topology, so no plan to compare with", rank);
  } else if (make_plan(wl, wl.layout, topo, topology::map_gpus_to_nics(topo), mover, &plan, &err) != Status::kOk) {
    WEFT_WARN(kTune, "rank %d: no plan (%s)", rank, err.c_str());
    plan = Plan();
  }
  return plan;
}

void print_results(bootstrap::Bootstrap& boot, const std::string& title, const std::vector<ResultRow>& rows,
                   const std::string& json_extra) {
  if (boot.info().rank != 0) return;
  printf("\n%s\n", title.c_str());
  printf("  %-34s %10s %10s  %s\n", "variant", "ms", "TFLOP/s", "note");
  for (const auto& r : rows) printf("  %-34s %10.3f %10.1f  %s\n", r.what.c_str(), r.ms, r.tflops, r.note.c_str());
  fflush(stdout);
  const char* path = getenv("WEFT_REPORT");
  if (!path || !*path) return;
  // One write per table on an append-only descriptor: rank 0 of each rank group may report into the
  // same file at once, and its lines must not interleave.
  nlohmann::json extra = nlohmann::json::object();
  if (!json_extra.empty()) extra = nlohmann::json::parse("{" + json_extra + "}", nullptr, false);
  if (!extra.is_object()) {
    WEFT_WARN(kKernel, "WEFT_REPORT: the report's extra fields are not JSON (%s); left out", json_extra.c_str());
    extra = nlohmann::json::object();
  }
  std::string text;
  for (const auto& r : rows) {
    nlohmann::json line = {{"title", title}, {"variant", r.what}, {"ms", r.ms}, {"tflops", r.tflops}, {"note", r.note}};
    line.update(extra);
    text += line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  }
  const int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    WEFT_WARN(kKernel, "WEFT_REPORT: cannot open %s: %s", path, strerror(errno));
    return;
  }
  const ssize_t wrote = write(fd, text.data(), text.size());
  if (wrote != ssize_t(text.size()))
    WEFT_WARN(kKernel, "WEFT_REPORT: wrote %zd of %zu bytes to %s", wrote, text.size(), path);
  close(fd);
}

}  // namespace weft::runtime::ops
