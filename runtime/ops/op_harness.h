// What every fused-op runner shares: NCCL/cuBLAS baselines, event timing across ranks, stream flag
// writes, CUDA IPC peer buffers and the result table.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <functional>
#include <string>
#include <vector>

#include "base/status.h"
#include "bootstrap/bootstrap.h"
#include "kernels/gemm_types.h"
#include "runtime/exec/stream_ops.h"
#include "runtime/ops/runner_heap.h"
#include "runtime/plan.h"
#include "runtime/workload.h"

namespace weft::runtime::ops {

// NCCL communicator over all ranks of the job, its unique id exchanged through the bootstrap.
Status create_nccl_comm(bootstrap::Bootstrap& boot, ncclComm_t* out);

// C (m x n, row-major, ldc) = A (m x k, row-major) * B (n x k, row-major)^T with cuBLAS: the same
// "TN" problem as weft's GEMM (column-major view: C^T = B * A^T). bf16 in, fp32 compute, bf16 out.
Status cublas_gemm_tn(cublasHandle_t h, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda, const void* b,
                      int64_t ldb, void* c, int64_t ldc, cudaStream_t s);

// Stream memory operations and sync_bounded live in runtime/exec/stream_ops.h (the runtime uses them
// without NCCL); the runners name them from here.
using runtime::stream_mem_ops;
using runtime::stream_wait_u64_geq;
using runtime::stream_write_u64;
using runtime::StreamMemOp;
using runtime::sync_bounded;

// Times `enqueue` (which enqueues one run of the op on stream `s`) with CUDA events: `warmup` runs,
// then `iters` timed runs each preceded by an NCCL all-reduce of one word (a device-side barrier, so
// ranks start together). Returns this rank's median in ms.
Status time_op(ncclComm_t comm, cudaStream_t s, int warmup, int iters, const std::function<Status()>& enqueue,
               double* median_ms, const std::function<void()>& unstick = nullptr);

// Several candidates timed together, interleaved: iteration i runs every candidate once, starting
// at candidate i mod count, each run preceded by the one-word all-reduce of time_op. Under its power
// cap the GPU changes clock in discrete steps, a few percent apart and moving every few dozen
// launches (docs/results/2026-11-one-node-combined-runs.md): timed one after the other, candidates
// land on different steps and their ratio carries that luck; interleaved, every candidate sees the
// same mix. `add` returns the candidate's index; `run` times them all (collective: every rank adds
// the same candidates in the same order) and keeps, per candidate, the max over ranks of each
// rank's median.
class InterleavedTimer {
 public:
  size_t add(std::function<Status()> enqueue);
  Status run(bootstrap::Bootstrap& boot, ncclComm_t comm, cudaStream_t s, int warmup, int iters, const std::string& key,
             const std::function<void()>& unstick = nullptr);
  double ms(size_t i) const { return i < ms_.size() ? ms_[i] : 0; }
  size_t size() const { return enqueue_.size(); }

 private:
  std::vector<std::function<Status()>> enqueue_;
  std::vector<double> ms_;
};

// A seed drawn fresh on rank 0 and shared with every rank (collective): inputs differ on every run,
// unless set_bench_seed (ops.h: weftrun bench --seed, the same on every rank) fixed it, so two builds
// can be timed on the same inputs (an op's data, the MoE layer's routing).
Status shared_seed(bootstrap::Bootstrap& boot, const std::string& key, uint64_t* out);

// The largest of every rank's `mine` (collective).
Status max_over_ranks(bootstrap::Bootstrap& boot, const std::string& key, double mine, double* out);

// The tuner's plan for the workload on this machine, printed next to the measurement; an empty
// plan (makespan 0) when there is none, with the reason logged.
Plan plan_for(const Workload& wl, int rank);
// The same for a given NVLink mover (with the copy engines, intra_comm gets no SM).
Plan plan_for(const Workload& wl, int rank, IntraMover mover);

// The raster group height of the fused ops' GEMMs: WEFT_GEMM_GROUP 128-row tiles when set (> 0),
// else *group_m is left as it is (GemmArgs' default); kInvalidArgument, logged, outside [0, 1024].
Status gemm_group(int32_t* group_m);

// The GEMM core's launch choices for weftrun bench's rows: the defaults, with the experiment switches
// WEFT_GEMM_SPLIT_TAIL, WEFT_GEMM_CHUNKED_TAIL, WEFT_GEMM_DYNAMIC and WEFT_GEMM_TMA_STORE (0 turns one
// off, for comparisons) read once; a bad value keeps the default and is logged.
const kernels::GemmOptions& bench_gemm_options();

// One row of an op's result table.
struct ResultRow {
  std::string what;   // "weft fused", "nccl+cublas", ...
  double ms = 0;      // max over ranks of the per-rank median
  double tflops = 0;  // per rank
  std::string note;
};

// Prints the table (rank 0 only) and appends it as JSON lines to WEFT_REPORT if set.
void print_results(bootstrap::Bootstrap& boot, const std::string& title, const std::vector<ResultRow>& rows,
                   const std::string& json_extra);

}  // namespace weft::runtime::ops
