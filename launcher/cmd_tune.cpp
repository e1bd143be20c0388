// weftrun tune WORKLOAD.yaml: every candidate plan of the problem executed, validated and timed
// interleaved on this machine; the fastest stored in the tuning cache with the model plan's time from
// the same call, so that `plan` and `run` use it from then on. `run` itself never times candidates.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <ctime>

#include "launcher/commands.h"
#include "launcher/launch.h"
#include "launcher/rank.h"
#include "runtime/tune_cache.h"
#include "runtime/workload.h"
#if defined(WEFT_HAVE_EXEC)
#include "runtime/exec/machine.h"
#include "runtime/exec/plan_exchange.h"
#include "runtime/exec/tune.h"
#endif

namespace weft::launcher {
namespace {

constexpr int kExitBadInput = 2;
constexpr const char* kEndOfCandidates = "end of the candidates";

struct TuneOptions {
  std::string workload;
  int ranks = 0;
  bool oversubscribe = false;
};

[[maybe_unused]] bool shares(const TuneOptions& o, const runtime::Workload& wl) {
  const int ranks = o.ranks > 0 ? o.ranks : wl.world_size(), gpus = visible_gpu_count();
  return o.oversubscribe && gpus > 0 && ranks / std::max(1, wl.layout.nodes) > gpus;
}

#if defined(WEFT_HAVE_EXEC)
int tune_rank(const TuneOptions& o) {
  runtime::Workload wl;
  std::string err;
  if (runtime::load_workload(o.workload, &wl, &err) != Status::kOk) {
    fprintf(stderr, "weftrun tune: %s\n", err.c_str());
    return kExitBadInput;
  }
  RankContext ctx;
  std::unique_ptr<bootstrap::PmixBootstrap> boot;
  if (start_rank(&ctx, &boot) != Status::kOk) _exit(1);
  const int rank = ctx.info.rank;
  // Rank 0 lists the candidates (the model's plan first) and sends them one by one.
  std::vector<runtime::Plan> mine;
  std::string why;
  runtime::TuneMachine machine;
  if (rank == 0) {
    PlanOptions po;
    po.workload = o.workload;
    po.share_gpus = shares(o, wl);
    po.use_tune_cache = false;
    runtime::Plan model;
    int code = 0;
    if (decide_plan(po, wl, &model, &why, &code) == Status::kOk) {
      if (!model.exec.executable)
        why = model.exec.not_executable;
      else if (!runtime::this_machine(&machine))
        why = "no GPU to tune on";
      else
        mine = runtime::candidate_plans(wl, model, po.share_gpus);
    }
  }
  std::vector<runtime::Plan> cands;
  for (size_t i = 0;; ++i) {
    runtime::Plan p;
    const bool send = rank == 0 && why.empty() && i < mine.size();
    const Status s =
        runtime::share_plan(*boot, send ? &mine[i] : nullptr, why.empty() ? kEndOfCandidates : why, &p, &err);
    if (s == Status::kInvalidArgument && err == kEndOfCandidates) break;
    if (s != Status::kOk) {
      if (rank == 0) fprintf(stderr, "weftrun tune: %s\n", err.c_str());
      return kExitBadInput;
    }
    cands.push_back(p);
  }
  if (rank == 0) {
    printf("weftrun tune: %s: %zu candidate plans, %d warm-up + %d timed rounds, one call of each per round\n",
           wl.name.c_str(), cands.size(), wl.run.warmup, wl.run.iters);
    fflush(stdout);
  }
  runtime::TuneResult res;
  const Status st = runtime::tune_plans(
      *boot, cands, wl.run,
      [](int r, int of) {
        printf("weftrun tune: round %d of %d\n", r, of);
        fflush(stdout);
      },
      &res);
  if (st != Status::kOk) {
    fprintf(stderr, "weftrun tune: rank %d: %s\n", rank, to_string(st));
    return 1;
  }
  if (rank != 0) return 0;
  // How each candidate moves its bytes: AllGather+GEMM's SM mover; the overlap variant's pieces,
  // sends and (AllReduce) gather.
  auto how = [](const runtime::Plan& p) {
    if (!p.exec.sm_mover.empty()) return p.exec.sm_mover;
    if (p.exec.variant != "overlap") return std::string("-");
    return std::to_string(p.exec.pieces) + "p " + p.exec.send + (p.exec.gather.empty() ? "" : "/" + p.exec.gather);
  };
  printf("  %-3s %-12s %-13s %8s %8s  %s\n", "#", "variant", "how", "compute", "intra", "ms (median, max over ranks)");
  for (size_t i = 0; i < cands.size(); ++i)
    printf("  %-3zu %-12s %-13s %8d %8d  %s%s%s\n", i, cands[i].exec.variant.c_str(), how(cands[i]).c_str(),
           cands[i].roles.compute, cands[i].roles.intra_comm,
           res.valid[i] ? std::to_string(res.ms[i]).c_str() : "FAILED validation", i == 0 ? "  (the model's plan)" : "",
           int(i) == res.best ? "  <- fastest" : "");
  if (res.best < 0) {
    fprintf(stderr, "weftrun tune: no candidate validated: nothing stored\n");
    return 1;
  }
  runtime::TuneEntry e;
  e.key = runtime::tune_key(machine, cands[0]);
  e.plan_json = runtime::executed_json(cands[size_t(res.best)]);
  e.measured_ms = res.ms[size_t(res.best)];
  e.model_ms = res.valid[0] ? res.ms[0] : 0;
  e.candidates = int(cands.size());
  char when[32];
  const time_t now = time(nullptr);
  strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
  e.tuned_at = when;
  const std::string path = runtime::tune_cache_path();
  if (runtime::store_tune_entry(path, e, &err) != Status::kOk) {
    fprintf(stderr, "weftrun tune: cannot store the result: %s\n", err.c_str());
    return 1;
  }
  printf("weftrun tune: stored candidate %d (%.3f ms; the model's plan %.3f ms) in %s: plan and run use it here\n",
         res.best, e.measured_ms, e.model_ms, path.c_str());
  return 0;
}
#endif

int tune_launcher(const TuneOptions& o) {
  runtime::Workload wl;
  std::string err;
  if (runtime::load_workload(o.workload, &wl, &err) != Status::kOk) {
    fprintf(stderr, "weftrun tune: %s\n", err.c_str());
    return kExitBadInput;
  }
  // What tune stores is used for every workload of the problem: it must not be a choice one file made.
  if (!wl.plan.empty()) {
    fprintf(stderr, "weftrun tune: %s\n",
            wl.error_at("plan",
                        "this map fixes the execution, so there is nothing to tune; expected a workload "
                        "without plan: (tune measures the candidates and stores the fastest for plan and run)")
                .c_str());
    return kExitBadInput;
  }
  LaunchOptions lo;
  lo.gpus = visible_gpu_count();
  if (lo.gpus == 0) {
    fprintf(stderr, "weftrun tune: no GPU on this machine: tuning measures on the GPUs it will run on\n");
    return 1;
  }
  lo.nodes = wl.layout.nodes;
  lo.ranks = o.ranks > 0 ? o.ranks : wl.world_size();
  if (check_launch(lo, !o.oversubscribe, &err) != Status::kOk) {
    fprintf(stderr, "weftrun tune: %s: %s (--oversubscribe lets ranks share GPUs)\n", o.workload.c_str(), err.c_str());
    return kExitBadInput;
  }
  lo.rank_args = own_args();
  return launch_ranks(lo);
}

}  // namespace

void add_tune_command(CLI::App& app, int* exit_code) {
  auto opts = std::make_shared<TuneOptions>();
  auto* sub = app.add_subcommand("tune",
                                 "time every candidate plan of a workload on this machine, interleaved, and store the "
                                 "fastest in the tuning cache (WEFT_TUNE_CACHE) for plan and run");
  sub->add_option("workload", opts->workload, "workload YAML file")->required();
  sub->add_option("-n,--ranks", opts->ranks, "ranks (default: the workload's layout)")->check(CLI::Range(1, kMaxRanks));
  sub->add_flag("--oversubscribe", opts->oversubscribe, "allow more ranks per node than GPUs (testing)");
  sub->callback([opts, exit_code] {
    *exit_code = dispatch_role(
        "tune",
        [&] {
#if defined(WEFT_HAVE_EXEC)
          return tune_rank(*opts);
#else
          fprintf(stderr, "weftrun tune: this build has no CUDA\n");
          return 1;
#endif
        },
        [&] { return tune_launcher(*opts); });
  });
}

}  // namespace weft::launcher
