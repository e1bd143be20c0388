// weftrun run WORKLOAD.yaml: the plan `weftrun plan` prints, executed as it is on every rank (rank 0
// decides, every rank checks the hash), validated against weft's own reference, and the plan as the
// launch really ran reported back. No NCCL, no cuBLAS, no candidates timed (that is `weftrun bench`).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>

#include "base/params.h"
#include "launcher/commands.h"
#include "launcher/launch.h"
#include "launcher/rank.h"
#include "runtime/workload.h"
#if defined(WEFT_HAVE_EXEC)
#include "runtime/exec/plan_exchange.h"
#include "runtime/exec/run_plan.h"
#endif

namespace weft::launcher {
namespace {

constexpr int kExitBadInput = 2;

struct RunOptions {
  std::string workload;
  std::string topology;
  std::string plan_file;
  int ranks = 0;
  int nodes = 0;
  bool json = false;
  bool oversubscribe = false;
};

[[maybe_unused]] std::string hex64(uint64_t v) {
  char buf[20];
  snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// --oversubscribe only matters where ranks really share a GPU.
bool shares_gpus(const RunOptions& o, const runtime::Workload& wl) {
  const int nodes = o.nodes > 0 ? o.nodes : wl.layout.nodes, ranks = o.ranks > 0 ? o.ranks : wl.world_size();
  const int gpus = visible_gpu_count();
  return o.oversubscribe && gpus > 0 && (ranks + nodes - 1) / nodes > gpus;
}

#if defined(WEFT_HAVE_EXEC)
// The plan every rank runs: rank 0's (from --plan, else decided here), checked by hash on every rank.
Status agree_on_plan(const RunOptions& o, const runtime::Workload& wl, bootstrap::Bootstrap& boot, runtime::Plan* plan,
                     std::string* error) {
  runtime::Plan decided;
  std::string why;
  bool have = false;
  if (boot.info().rank == 0) {
    if (!o.plan_file.empty()) {
      have = runtime::read_plan_file(o.plan_file, &decided, &why) == Status::kOk;
      if (have) {
        decided.workload = wl.name;
        decided.source = o.plan_file;
      }
    } else {
      PlanOptions po;
      po.workload = o.workload;
      po.topology = o.topology;
      po.nodes = o.nodes;
      po.share_gpus = shares_gpus(o, wl);
      int code = 0;
      have = decide_plan(po, wl, &decided, &why, &code) == Status::kOk;
    }
  }
  return runtime::share_plan(boot, have ? &decided : nullptr, why, plan, error);
}
#endif

int run_rank(const RunOptions& o) {
  runtime::Workload wl;
  std::string err;
  if (runtime::load_workload(o.workload, &wl, &err) != Status::kOk) {
    fprintf(stderr, "weftrun run: %s\n", err.c_str());
    return kExitBadInput;  // every rank reads the same file and fails the same way
  }
  RankContext ctx;
  std::unique_ptr<bootstrap::PmixBootstrap> boot;
  if (start_rank(&ctx, &boot) != Status::kOk) {
    fprintf(stderr, "weftrun run: could not start this rank\n");
    fflush(stderr);
    _exit(1);
  }
  const int rank = ctx.info.rank;
#if defined(WEFT_HAVE_EXEC)
  runtime::Plan plan;
  if (agree_on_plan(o, wl, *boot, &plan, &err) != Status::kOk) {
    if (rank == 0) fprintf(stderr, "weftrun run: %s\n", err.c_str());
    return kExitBadInput;
  }
  if (!plan.exec.executable) {
    if (rank == 0) fprintf(stderr, "weftrun run: %s\n", plan.exec.not_executable.c_str());
    return kExitBadInput;
  }
  // A job none of whose ranks has a GPU prints the plan it would run (rank 0) and exits 0, as
  // `weftrun run` does on a machine without a GPU; one where only some ranks have one fails, naming
  // the others.
  std::vector<bootstrap::Blob> gpus;
  if (boot->allgather("weft.run.gpus", bootstrap::Blob(1, uint8_t(ctx.gpu >= 0 ? 1 : 0)), &gpus) != Status::kOk)
    return 1;
  std::string without;
  int none = 0;
  for (size_t r = 0; r < gpus.size(); ++r)
    if (gpus[r].size() != 1 || gpus[r][0] != 1) without += " " + std::to_string(r), ++none;
  if (none == ctx.info.size) {
    if (plan.group_shape().world_size() != ctx.info.size) {  // refused on GPUs the same way (the op checks it)
      if (rank == 0)
        fprintf(stderr, "weftrun run: the plan is for %d ranks, the job has %d\n", plan.group_shape().world_size(),
                ctx.info.size);
      return kExitBadInput;
    }
    if (rank == 0) {
      printf("weftrun run: no rank of this job has a GPU: printing the plan for %s instead of running it\n",
             o.workload.c_str());
      const std::string text = o.json ? runtime::format_plan_json(plan) : runtime::format_plan_table(plan);
      fputs(text.c_str(), stdout);
      fputc('\n', stdout);
      fflush(stdout);
    }
    return 0;
  }
  if (ctx.gpu < 0 || none > 0) {
    fprintf(stderr, "weftrun run: rank %d: ranks without a GPU:%s (every rank of a run needs one)\n", rank,
            without.c_str());
    return 1;
  }
  int64_t heap = 0;
  if (get_param("WEFT_HEAP_BYTES", &heap) != Status::kOk || heap < 0) return kExitBadInput;
  runtime::RunReport rep;
  const Status st = runtime::run_plan(*boot, plan, wl.run, uint64_t(heap), &rep);
  if (st != Status::kOk) {
    fprintf(stderr, "weftrun run: rank %d: %s failed: %s\n", rank, wl.name.c_str(), to_string(st));
    return st == Status::kInvalidArgument ? kExitBadInput : 1;
  }
  // Every rank's verdict and time, gathered on rank 0.
  char line[512];
  const bool ok = (!rep.validated || (rep.gather_mismatch == 0 && rep.unwritten == 0 && rep.rel_err < 1e-2)) &&
                  rep.repeat_mismatch <= 0;
  const bool same = runtime::plan_hash(rep.executed) == runtime::plan_hash(plan);
  snprintf(line, sizeof line, "%d %.6f %d %d %.3e %lld %lld %lld %s", rank, rep.ms_median, ok ? 1 : 0, same ? 1 : 0,
           rep.rel_err, static_cast<long long>(rep.gather_mismatch), static_cast<long long>(rep.unwritten),
           static_cast<long long>(rep.repeat_mismatch), hex64(runtime::plan_hash(rep.executed)).c_str());
  bootstrap::Blob mine(line, line + strlen(line));
  std::vector<bootstrap::Blob> all;
  if (boot->allgather("weft.run.report", mine, &all) != Status::kOk) return 1;
  int failures = 0;
  double worst_ms = 0;
  if (rank == 0) {
    printf("weftrun run: %s (%s) on %d ranks, plan %s: %s%s\n", wl.name.c_str(), runtime::to_string(plan.op),
           plan.world_size, hex64(runtime::plan_hash(plan)).c_str(), plan.exec.variant.c_str(),
           plan.exec.sm_mover.empty() ? "" : (" " + plan.exec.sm_mover).c_str());
  }
  for (const auto& b : all) {
    int r = 0, v = 0, s = 0;
    double ms = 0, rel = 0;
    long long gm = 0, uw = 0, rm = -1;
    char h[32] = {0};
    const std::string t(b.begin(), b.end());
    if (sscanf(t.c_str(), "%d %lf %d %d %lf %lld %lld %lld %31s", &r, &ms, &v, &s, &rel, &gm, &uw, &rm, h) != 9) {
      ++failures;
      continue;
    }
    worst_ms = std::max(worst_ms, ms);
    if (!v || !s) ++failures;
    const std::string repeat =
        rm < 0    ? ""
        : rm == 0 ? "; a second call repeated bit for bit (WEFT_DETERMINISTIC=1)"
                  : "; a second call DIFFERED in " + std::to_string(rm) + " outputs (WEFT_DETERMINISTIC=1)";
    if (rank == 0)
      printf("  rank %d: %.3f ms per call (median of %d); %s%s; executed plan %s%s\n", r, ms, wl.run.iters,
             !rep.validated ? "not validated (run.validate: false)"
             : v ? (std::string(plan.op == runtime::Op::kAgGemm ? "validated: gathered A exact, " : "validated: ") +
                    "C rel err " + std::to_string(rel))
                       .c_str()
                 : ("WRONG: " + std::to_string(gm) + " gathered elements differ, " + std::to_string(uw) +
                    " outputs unwritten, C rel err " + std::to_string(rel))
                       .c_str(),
             repeat.c_str(), h, s ? " = the plan" : " DIFFERS from the plan");
  }
  if (rank == 0) {
    printf("weftrun run: %s: %.3f ms per call (max over ranks); %s\n", failures ? "FAILED" : "passed", worst_ms,
           failures ? "see the ranks above" : "every rank validated and ran the plan as planned");
    if (o.json) printf("%s\n", runtime::format_plan_json(rep.executed).c_str());
    fflush(stdout);
  }
  return failures ? 1 : 0;
#else
  (void)rank;
  fprintf(stderr, "weftrun run: this build has no CUDA: it can plan (weftrun plan) but not run\n");
  return 1;
#endif
}

int run_launcher(const RunOptions& o) {
  runtime::Workload wl;
  std::string err;
  if (runtime::load_workload(o.workload, &wl, &err) != Status::kOk) {
    fprintf(stderr, "weftrun run: %s\n", err.c_str());
    return kExitBadInput;
  }
  PlanOptions po;
  po.workload = o.workload;
  po.topology = o.topology;
  po.nodes = o.nodes;
  po.json = o.json;
  po.share_gpus = shares_gpus(o, wl);
  // Refused before any rank starts: a plan this build cannot run, more ranks per node than GPUs.
  runtime::Plan plan;
  int code = 0;
  if (o.plan_file.empty() && decide_plan(po, wl, &plan, &err, &code) != Status::kOk) {
    fprintf(stderr, "weftrun run: %s\n", err.c_str());
    return code;
  }
  if (o.plan_file.empty() && !plan.exec.executable) {
    fprintf(stderr, "weftrun run: %s\n", plan.exec.not_executable.c_str());
    return kExitBadInput;
  }
  if (o.plan_file.empty() && o.ranks > 0 &&
      o.ranks != plan.group_shape().world_size()) {  // as each rank would refuse it
    fprintf(stderr, "weftrun run: the plan is for %d ranks, the job has %d\n", plan.group_shape().world_size(),
            o.ranks);
    return kExitBadInput;
  }
  LaunchOptions lo;
  lo.gpus = visible_gpu_count();
  if (lo.gpus == 0) {
    printf("weftrun run: no GPU found on this machine: printing the plan for %s instead of running it\n",
           o.workload.c_str());
    fflush(stdout);
    return run_plan(po);
  }
  lo.nodes = o.nodes > 0 ? o.nodes : wl.layout.nodes;
  lo.ranks = o.ranks > 0 ? o.ranks : wl.world_size();
  // Every rank a GPU of its own (each emulated node has its slice of them), unless --oversubscribe.
  std::string why;
  if (check_launch(lo, !o.oversubscribe, &why) != Status::kOk) {
    fprintf(stderr,
            "weftrun run: %s: %s (--oversubscribe puts several ranks on one GPU: correct, but not the "
            "NVLink path and not the speed)\n",
            o.workload.c_str(), why.c_str());
    return kExitBadInput;
  }
  lo.rank_args = own_args();
  return launch_ranks(lo);
}

}  // namespace

void add_run_command(CLI::App& app, int* exit_code) {
  auto opts = std::make_shared<RunOptions>();
  auto* sub = app.add_subcommand("run",
                                 "run the workload's plan on every rank, validated, and report the plan as executed "
                                 "(prints the plan where no GPU is found)");
  add_job_options(sub, &opts->workload, &opts->ranks, &opts->nodes, &opts->topology);
  sub->add_option("--plan", opts->plan_file,
                  "run this plan (the form `weftrun plan --json` prints under its keys) instead of the tuner's");
  sub->add_flag("--json", opts->json, "also print the plan as executed, as JSON");
  sub->add_flag("--oversubscribe", opts->oversubscribe,
                "allow more ranks per node than GPUs (several ranks share a GPU: for testing)");
  sub->callback([opts, exit_code] {
    *exit_code = dispatch_role(
        "run", [&] { return run_rank(*opts); }, [&] { return run_launcher(*opts); });
  });
}

}  // namespace weft::launcher
