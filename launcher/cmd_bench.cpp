// weftrun bench WORKLOAD.yaml: start the ranks (or join them under srun/mpirun) and measure the workload's
// op on each through the op registry; without a GPU, print the plan instead.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "bootstrap/group_bootstrap.h"
#include "launcher/commands.h"
#include "launcher/launch.h"
#include "launcher/op_registry.h"
#include "launcher/rank.h"
#include "runtime/workload.h"

namespace weft::launcher {
namespace {

struct RunOptions {
  std::string workload;
  std::string topology;
  int ranks = 0;
  int nodes = 0;
  std::string json;   // --json FILE: every table's rows as JSON lines, appended
  int64_t seed = -1;  // --seed N: the inputs' seed (default: fresh on every run)
};

// A workload split into rank groups: every group runs the op at once, each through its own
// bootstrap, so its exchanges, NCCL communicator and buffers are the group's (as weftrun run does).
// The runner sees the group as its job: the workload's layout becomes the group's. Nothing to do
// (false, *group null) for a workload without groups; true after saying why it cannot.
bool enter_group(bootstrap::Bootstrap* boot, RankContext* ctx, runtime::Workload* wl,
                 std::unique_ptr<bootstrap::GroupBootstrap>* group) {
  if (wl->num_groups() <= 1) return false;
  bootstrap::GroupShape shape;
  shape.nodes = wl->layout.nodes;
  shape.gpus_per_node = wl->layout.gpus_per_node;
  shape.group_nodes = wl->group->nodes;
  shape.group_gpus = wl->group->gpus_per_node;
  std::string why;
  if (bootstrap::GroupBootstrap::create(boot, shape, group, &why) != Status::kOk) {
    fprintf(stderr, "weftrun bench: %s\n", wl->error_at("group", why).c_str());
    return true;
  }
  ctx->info = (*group)->info();
  wl->layout = *wl->group;
  wl->group.reset();
  return false;
}

int run_rank(const RunOptions& o) {
  runtime::Workload wl;
  std::string err;
  if (runtime::load_workload(o.workload, &wl, &err) != Status::kOk) {
    fprintf(stderr, "weftrun bench: %s\n", err.c_str());
    return 2;  // every rank reads the same file and fails the same way
  }
  // The runners' tables go to --json's file too (rank 0 of each group appends, one write per table);
  // set before the bootstrap starts threads that read the environment.
  if (!o.json.empty()) setenv("WEFT_REPORT", o.json.c_str(), 1);
  if (o.seed >= 0) set_bench_seed(uint64_t(o.seed));
  RankContext ctx;
  std::unique_ptr<bootstrap::PmixBootstrap> boot;
  Status s = start_rank(&ctx, &boot);
  if (s != Status::kOk) {
    fprintf(stderr, "weftrun bench: could not start this rank: %s\n", to_string(s));
    fflush(stderr);
    _exit(1);
  }
  std::unique_ptr<bootstrap::GroupBootstrap> group;  // destroyed before the job's bootstrap
  if (enter_group(boot.get(), &ctx, &wl, &group)) return 2;
  bootstrap::Bootstrap& op_boot = group ? static_cast<bootstrap::Bootstrap&>(*group) : *boot;
  register_builtin_ops();
  const char* op = runtime::to_string(wl.op);
  OpRunner runner = find_op(op);
  if (!runner) {
    std::string names;
    for (const auto& name : registered_ops()) names += " " + name;
    fprintf(stderr, "weftrun bench: rank %d: no runner for op '%s' in this build (registered:%s)\n", ctx.info.rank, op,
            names.empty() ? " none" : names.c_str());
    return 3;
  }
  s = runner(ctx, wl, op_boot);
  if (s != Status::kOk) {
    fprintf(stderr, "weftrun bench: rank %d%s: op '%s' failed: %s\n", boot->info().rank,
            group ? (" (rank " + std::to_string(ctx.info.rank) + " of its group)").c_str() : "", op, to_string(s));
    return 1;
  }
  return 0;
}

int run_launcher(const RunOptions& o) {
  runtime::Workload wl;
  std::string err;
  if (runtime::load_workload(o.workload, &wl, &err) != Status::kOk) {
    fprintf(stderr, "weftrun bench: %s\n", err.c_str());
    return 2;
  }
  // The benchmark runners are bf16 only: another dtype is refused, never measured as bf16.
  if (wl.dtype != runtime::DType::kBf16) {
    fprintf(stderr, "weftrun bench: %s\n",
            wl.error_at("dtype", std::string(runtime::to_string(wl.dtype)) +
                                     ": the benchmark runners take bf16 only (expected bf16)")
                .c_str());
    return 2;
  }
  if (!o.json.empty()) {  // made empty once, before any rank starts; the ranks append
    FILE* f = fopen(o.json.c_str(), "w");
    if (!f) {
      fprintf(stderr, "weftrun bench: --json %s: cannot write it: %s\n", o.json.c_str(), strerror(errno));
      return 2;
    }
    fclose(f);
  }
  LaunchOptions lo;
  lo.gpus = visible_gpu_count();
  if (lo.gpus == 0) {
    printf("weftrun bench: no GPU found on this machine: printing the plan for %s instead of running it\n",
           o.workload.c_str());
    fflush(stdout);
    PlanOptions po;
    po.workload = o.workload;
    po.topology = o.topology;
    po.nodes = o.nodes;
    return run_plan(po);
  }
  lo.nodes = o.nodes > 0 ? o.nodes : wl.layout.nodes;
  lo.ranks = o.ranks > 0 ? o.ranks : wl.world_size();
  lo.rank_args = own_args();
  return launch_ranks(lo);
}

}  // namespace

void add_bench_command(CLI::App& app, int* exit_code) {
  auto opts = std::make_shared<RunOptions>();
  auto* sub = app.add_subcommand("bench",
                                 "measure a workload on every rank: weft's variants validated and timed interleaved "
                                 "with NCCL + cuBLAS and the bound (prints the plan where no GPU is found)");
  add_job_options(sub, &opts->workload, &opts->ranks, &opts->nodes, &opts->topology);
  sub->add_option("--json", opts->json,
                  "also write every table's rows to FILE as JSON lines (title, variant, ms, TFLOP/s, note, shape); "
                  "emptied first by weftrun's own launcher, appended to under srun/mpirun")
      ->check(
          [](const std::string& v) { return v.empty() || v.size() > 4096 ? std::string("1 to 4096 characters") : ""; });
  sub->add_option("--seed", opts->seed,
                  "draw the inputs (and so the MoE layer's routing) from seed N instead of fresh ones, to time two "
                  "builds on the same data")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 62));
  sub->callback([opts, exit_code] {
    *exit_code = dispatch_role(
        "bench", [&] { return run_rank(*opts); }, [&] { return run_launcher(*opts); });
  });
}

}  // namespace weft::launcher
