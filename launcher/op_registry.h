// Which function runs a workload's op on each rank: fused kernels register their runner by op name.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "launcher/rank.h"

namespace weft::runtime {
struct Workload;
}

namespace weft::launcher {

// Runs one workload on one rank (collective over the job): set up transport and buffers through
// `boot`, run the fused kernel `wl.run.warmup + wl.run.iters` times, validate if wl.run.validate,
// print its rank's results (rank 0 prints the job's table). ctx.gpu is already the bound device.
using OpRunner = Status (*)(const RankContext& ctx, const runtime::Workload& wl, bootstrap::Bootstrap& boot);

// `op` is the YAML spelling (runtime::to_string(Op)): "ag_gemm", "gemm_rs", "gemm_ar", "moe", ...
void register_op(const std::string& op, OpRunner runner);
OpRunner find_op(const std::string& op);  // nullptr if no runner is registered
std::vector<std::string> registered_ops();

// Registers every op runner linked into weftrun (launcher/registrations.cpp: add one line there).
void register_builtin_ops();
// weftrun bench --seed: the runners draw their inputs from `seed` (runtime/ops/op_harness.h).
void set_bench_seed(uint64_t seed);

}  // namespace weft::launcher
