// The tuning cache: keys, the file (round trip, replacement, corrupt and oversized files ignored with
// a warning), a planted entry that differs from the model's plan is what decide_plan returns, and
// the candidates tune measures.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/plan.h"
#include "runtime/tune_cache.h"
#include "runtime/tuner.h"
#include "runtime/workload.h"

using weft::Status;
using namespace weft::runtime;

namespace {

const char* kYaml =
    "name: t\nop: ag_gemm\ndtype: bf16\nshape: {m: 2048, n: 28672, k: 8192}\nlayout: {nodes: 1, gpus_per_node: 4}\n";

struct TempDir {
  std::string path;
  TempDir() {
    char buf[] = "/tmp/weft-tune-test-XXXXXX";
    path = mkdtemp(buf);
  }
  ~TempDir() { (void)!system(("rm -rf '" + path + "'").c_str()); }
};

std::string write_workload(const TempDir& d, const std::string& text) {
  const std::string p = d.path + "/w.yaml";
  std::ofstream(p) << text;
  return p;
}

Workload load(const std::string& path) {
  Workload w;
  std::string err;
  REQUIRE_MESSAGE(load_workload(path, &w, &err) == Status::kOk, err);
  return w;
}

TuneMachine machine() { return TuneMachine{"NVIDIA H100 80GB HBM3", "driver 13000, runtime 13000", "abc", "fp"}; }

Plan decide(const Workload& w, const TuneMachine* m, const std::string& cache) {
  DecideOptions o;
  o.topology = std::string(WEFT_SOURCE_DIR) + "/tests/data/hwloc-nvidiaDGX2.xml";
  o.machine = m;
  o.tune_cache = cache;
  Plan p;
  std::string err;
  bool bad = false;
  REQUIRE_MESSAGE(decide_plan(w, o, &p, &err, &bad) == Status::kOk, err);
  return p;
}

}  // namespace

TEST_CASE("keys name the machine and the problem") {
  TempDir d;
  const Workload w = load(write_workload(d, kYaml));
  const Plan p = decide(w, nullptr, "");
  const std::string k = tune_key(machine(), p);
  CHECK(k.find("gpu=NVIDIA H100 80GB HBM3") != std::string::npos);
  CHECK(k.find("op=ag_gemm; dtype=bf16; layout=1x4; m=2048 n=28672 k=8192") != std::string::npos);
  TuneMachine other = machine();
  other.kernels = "abd";
  CHECK(tune_key(other, p) != k);
  Plan bigger = p;
  bigger.gemm.m = 4096;
  CHECK(tune_key(machine(), bigger) != k);
}

TEST_CASE("the cache file: round trip, one entry per key, corrupt or oversized files ignored") {
  TempDir d;
  const std::string path = d.path + "/sub/dir/tune.json";
  std::vector<TuneEntry> entries;
  std::string warning, err;
  CHECK(load_tune_cache(path, &entries, &warning) == Status::kOk);  // missing: empty, no warning
  CHECK(entries.empty());
  CHECK(warning.empty());
  const Workload w = load(write_workload(d, kYaml));
  const Plan p = decide(w, nullptr, "");
  TuneEntry e{tune_key(machine(), p), executed_json(p), 0.35, 0.37, 5, "2026-11-25T12:00:00Z"};
  REQUIRE(store_tune_entry(path, e, &err) == Status::kOk);
  e.measured_ms = 0.33;
  REQUIRE(store_tune_entry(path, e, &err) == Status::kOk);  // the same key: replaced
  TuneEntry other = e;
  other.key += " (another)";
  REQUIRE(store_tune_entry(path, other, &err) == Status::kOk);
  REQUIRE(load_tune_cache(path, &entries, &warning) == Status::kOk);
  CHECK(warning.empty());
  REQUIRE(entries.size() == 2);
  CHECK(entries[0].measured_ms == doctest::Approx(0.33));
  CHECK(entries[0].plan_json == executed_json(p));

  std::ofstream(path) << "{\"version\": 1, \"entries\": [ {\"key\": 3} ]}";
  CHECK(load_tune_cache(path, &entries, &warning) == Status::kOk);
  CHECK(entries.empty());
  CHECK(warning.find("tuning cache ignored") != std::string::npos);
  warning.clear();
  std::ofstream(path) << std::string(5 << 20, ' ');
  CHECK(load_tune_cache(path, &entries, &warning) == Status::kOk);
  CHECK(entries.empty());
  CHECK(warning.find("at most 4 MiB") != std::string::npos);
  warning.clear();
  CHECK(load_tune_cache(d.path, &entries, &warning) == Status::kOk);  // a directory
  CHECK(warning.find("not a regular file") != std::string::npos);
}

TEST_CASE("a planted entry that differs from the model's plan is the plan; without the machine, the model's") {
  TempDir d;
  const Workload w = load(write_workload(d, kYaml));
  const std::string cache = d.path + "/tune.json";
  const Plan model = decide(w, nullptr, cache);
  CHECK(model.chosen_by == "model");
  // The measured winner: the SM movers with 12 intra_comm SMs.
  Workload sm = load(write_workload(d, std::string(kYaml) + "roles: {compute: 120, intra_comm: 12}\n"));
  const Plan planted = decide(sm, nullptr, cache);
  REQUIRE(planted.exec.variant == "sm_movers");
  std::string err;
  REQUIRE(store_tune_entry(cache, {tune_key(machine(), model), executed_json(planted), 0.3, 0.4, 3, "now"}, &err) ==
          Status::kOk);
  const TuneMachine m = machine();
  const Plan used = decide(w, &m, cache);
  CHECK(used.chosen_by == "tuning cache");
  CHECK(used.exec.variant == "sm_movers");
  CHECK(used.roles.intra_comm == 12);
  CHECK(plan_hash(used) == plan_hash(planted));
  CHECK(plan_hash(used) != plan_hash(model));
  bool noted = false;
  for (const auto& n : used.notes) noted |= n.find("from the tuning cache") != std::string::npos;
  CHECK(noted);
  // Explicit roles or a plan: map are used as written: the entry replaces neither, and a note says so.
  Workload roles = load(write_workload(d, std::string(kYaml) + "roles: {compute: 128, intra_comm: 0}\n"));
  const Plan as_written = decide(roles, &m, cache);
  CHECK(as_written.chosen_by == "model");
  CHECK(as_written.exec.variant == "copy_engine");
  CHECK(as_written.roles.compute == 128);
  bool said = false;
  for (const auto& n : as_written.notes) said |= n.find("roles are used as written") != std::string::npos;
  CHECK(said);
  Workload mapped = load(write_workload(d, std::string(kYaml) + "plan: {group_m: 8}\n"));
  const Plan fixed = decide(mapped, &m, cache);
  CHECK(fixed.chosen_by == "workload");
  CHECK(fixed.exec.variant == "copy_engine");
  CHECK(fixed.exec.group_m == 8);
  // Another machine: no match, the model's plan, said so.
  TuneMachine other = m;
  other.gpu = "NVIDIA H200";
  const Plan fallback = decide(w, &other, cache);
  CHECK(fallback.chosen_by == "model");
  CHECK(plan_hash(fallback) == plan_hash(model));
  // An entry whose plan is for another shape, under this key: ignored with a warning.
  Plan wrong = planted;
  wrong.gemm.m = 4096;
  REQUIRE(store_tune_entry(cache, {tune_key(machine(), model), executed_json(wrong), 0.3, 0.4, 3, "now"}, &err) ==
          Status::kOk);
  const Plan refused = decide(w, &m, cache);
  CHECK(refused.chosen_by == "model");
  bool warned = false;
  for (const auto& n : refused.notes) warned |= n.find("another problem") != std::string::npos;
  CHECK(warned);
}

TEST_CASE("tune's candidates: the model's plan first, all runnable and distinct, both variants") {
  TempDir d;
  const Workload w = load(write_workload(d, kYaml));
  const Plan model = decide(w, nullptr, "");
  const std::vector<Plan> c = candidate_plans(w, model, false);
  REQUIRE(c.size() >= 3);
  CHECK(plan_hash(c[0]) == plan_hash(model));
  bool sm = false;
  for (size_t i = 0; i < c.size(); ++i) {
    CHECK(c[i].exec.executable);
    sm |= c[i].exec.variant == "sm_movers";
    for (size_t j = 0; j < i; ++j) CHECK(plan_hash(c[i]) != plan_hash(c[j]));
  }
  CHECK(sm);
  for (const Plan& p : candidate_plans(w, model, true))
    if (p.exec.variant == "copy_engine" && &p != &c[0]) CHECK(p.roles.compute <= p.sm_count);
  for (size_t i = 1; i < candidate_plans(w, model, true).size(); ++i) {
    const Plan p = candidate_plans(w, model, true)[i];
    if (p.exec.variant == "copy_engine") CHECK(p.roles.compute <= p.sm_count - 8);
  }
}

TEST_CASE("tune's candidates for GEMM+RS and GEMM+AR: the peer variant and the overlap variant's ways") {
  TempDir d;
  for (const char* op : {"gemm_rs", "gemm_ar"}) {
    CAPTURE(op);
    const Workload w = load(write_workload(d, std::string("name: t\nop: ") + op +
                                                  "\ndtype: bf16\nshape: {m: 8192, n: 8192, k: 7168}\n"
                                                  "layout: {nodes: 1, gpus_per_node: 4}\n"));
    const Plan model = decide(w, nullptr, "");
    const std::vector<Plan> c = candidate_plans(w, model, false);
    const bool ar = std::string(op) == "gemm_ar";
    REQUIRE(c.size() == (ar ? 5u : 3u));
    CHECK(plan_hash(c[0]) == plan_hash(model));
    std::vector<std::string> ways;
    for (size_t i = 0; i < c.size(); ++i) {
      CHECK(c[i].exec.executable);
      CHECK(c[i].chosen_by == "model");
      for (size_t j = 0; j < i; ++j) CHECK(plan_hash(c[i]) != plan_hash(c[j]));
      ways.push_back(c[i].exec.variant + " " + c[i].exec.send + " " + c[i].exec.gather);
      // The executed form each would be stored as reads back to the same plan.
      Plan back;
      std::string err;
      REQUIRE(parse_executed_json(executed_json(c[i]), &back, &err) == Status::kOk);
      CHECK(plan_hash(back) == plan_hash(c[i]));
    }
    // The model's plan first (the overlap variant's default way), then the others.
    const std::vector<std::string> want = ar ? std::vector<std::string>{"overlap sm sm", "peer  ", "overlap copy push",
                                                                        "overlap copy sm", "overlap sm push"}
                                             : std::vector<std::string>{"overlap copy ", "peer  ", "overlap sm "};
    CHECK(ways == want);
    for (const Plan& p : c)  // copy sends on 4 ranks: the mover SMs beside the GEMM
      CHECK(p.roles.intra_comm == (p.exec.send == "copy" ? 4 : 0));
  }
}

TEST_CASE("ranks sharing GPUs: the overlap variant is not runnable and not a tune candidate") {
  TempDir d;
  const Workload w = load(write_workload(d,
                                         "name: t\nop: gemm_rs\ndtype: bf16\nshape: {m: 8192, n: 8192, k: 7168}\n"
                                         "layout: {nodes: 1, gpus_per_node: 4}\nplan: {variant: overlap}\n"));
  DecideOptions o;
  o.topology = std::string(WEFT_SOURCE_DIR) + "/tests/data/hwloc-nvidiaDGX2.xml";
  o.share_gpus = true;
  Plan p;
  std::string err;
  bool bad = false;
  REQUIRE(decide_plan(w, o, &p, &err, &bad) == Status::kOk);
  CHECK(!p.exec.executable);
  CHECK(p.exec.not_executable.find("sharing a GPU") != std::string::npos);
  o.share_gpus = false;
  REQUIRE(decide_plan(w, o, &p, &err, &bad) == Status::kOk);
  CHECK(p.exec.executable);
  // Tune's candidates with shared GPUs: the peer variant only.
  const Workload plain = load(write_workload(d,
                                             "name: t\nop: gemm_rs\ndtype: bf16\nshape: {m: 8192, n: 8192, k: 7168}\n"
                                             "layout: {nodes: 1, gpus_per_node: 4}\n"));
  const Plan model = decide(plain, nullptr, "");
  CHECK(model.exec.variant == "overlap");
  const std::vector<Plan> shared_candidates = candidate_plans(plain, model, true);
  REQUIRE(shared_candidates.size() == 1);  // the model's plan, replanned as peer
  CHECK(shared_candidates[0].exec.variant == "peer");
  CHECK(shared_candidates[0].exec.executable);
  CHECK(shared_candidates[0].roles.intra_comm == 0);
  // The model plans the peer variant for them where it would plan the overlap variant, and says why.
  Plan shared;
  o.share_gpus = true;
  REQUIRE(decide_plan(plain, o, &shared, &err, &bad) == Status::kOk);
  CHECK(shared.exec.executable);
  CHECK(shared.exec.variant == "peer");
  CHECK(shared.chosen_by == "model");
  bool said = false;
  for (const auto& n : shared.notes) said = said || n.find("ranks share GPUs (--oversubscribe): the peer variant") == 0;
  CHECK(said);
  o.share_gpus = false;
  REQUIRE(decide_plan(plain, o, &shared, &err, &bad) == Status::kOk);
  CHECK(shared.exec.variant == "overlap");
}

TEST_CASE("moe's variants: ffn_combine not runnable with ranks sharing a GPU, staged is; tune's candidates") {
  TempDir d;
  const std::string moe =
      "name: t\nop: moe\ndtype: bf16\nshape: {tokens: 4096, hidden: 1024, ffn: 512, experts: 8, "
      "topk: 2}\nlayout: {nodes: 1, gpus_per_node: 4}\n";
  const Workload fused = load(write_workload(d, moe + "plan: {variant: ffn_combine}\n"));
  DecideOptions o;
  o.topology = std::string(WEFT_SOURCE_DIR) + "/tests/data/hwloc-nvidiaDGX2.xml";
  o.share_gpus = true;
  Plan p;
  std::string err;
  bool bad = false;
  REQUIRE(decide_plan(fused, o, &p, &err, &bad) == Status::kOk);
  CHECK(p.exec.variant == "ffn_combine");
  CHECK(!p.exec.executable);
  CHECK(p.exec.not_executable.find("ffn_combine: with ranks sharing a GPU") != std::string::npos);
  o.share_gpus = false;
  REQUIRE(decide_plan(fused, o, &p, &err, &bad) == Status::kOk);
  CHECK(p.exec.executable);
  const Workload staged = load(write_workload(d, moe));
  o.share_gpus = true;
  REQUIRE(decide_plan(staged, o, &p, &err, &bad) == Status::kOk);
  CHECK(p.exec.variant == "staged");
  CHECK(p.exec.executable);
  // What weftrun tune measures: both variants with a GPU per rank and the model's with the down
  // projection never split over K, staged alone with shared GPUs, and only the workload's where its
  // plan: map fixes it.
  o.share_gpus = false;
  REQUIRE(decide_plan(staged, o, &p, &err, &bad) == Status::kOk);
  const std::vector<Plan> both = candidate_plans(staged, p, false);
  REQUIRE(both.size() == 3);
  CHECK(both[0].exec.variant == "staged");
  CHECK(both[0].exec.split_k == 4);
  CHECK(both[1].exec.variant == "ffn_combine");
  CHECK(both[1].exec.executable);
  CHECK(both[1].heap_bytes == both[0].heap_bytes);
  CHECK(both[1].roles.compute == both[0].roles.compute);
  CHECK(both[2].exec.variant == "staged");
  CHECK(both[2].exec.split_k == 1);
  CHECK(both[2].exec.executable);
  const std::vector<Plan> shared = candidate_plans(staged, p, true);
  REQUIRE(shared.size() == 1);
  CHECK(shared[0].exec.variant == "staged");
  REQUIRE(decide_plan(fused, o, &p, &err, &bad) == Status::kOk);
  const std::vector<Plan> fixed = candidate_plans(fused, p, false);
  REQUIRE(fixed.size() == 1);
  CHECK(fixed[0].exec.variant == "ffn_combine");
}

TEST_CASE("moe from the tuning cache: the stored variant, the heap this run's WEFT_HEAP_BYTES gives") {
  TempDir d;
  const std::string moe =
      "name: t\nop: moe\ndtype: bf16\nshape: {tokens: 4096, hidden: 512, ffn: 256, experts: 16, "
      "topk: 2}\nlayout: {nodes: 1, gpus_per_node: 4}\n";
  const Workload w = load(write_workload(d, moe));
  const std::string cache = d.path + "/tune.json";
  const Plan model = decide(w, nullptr, cache);
  REQUIRE(model.exec.variant == "staged");
  const Plan fused = decide(load(write_workload(d, moe + "plan: {variant: ffn_combine}\n")), nullptr, cache);
  std::string err;
  REQUIRE(store_tune_entry(cache, {tune_key(machine(), model), executed_json(fused), 0.3, 0.4, 3, "now"}, &err) ==
          Status::kOk);
  const TuneMachine m = machine();
  const Plan used = decide(w, &m, cache);
  CHECK(used.chosen_by == "tuning cache");
  CHECK(used.exec.variant == "ffn_combine");
  CHECK(plan_hash(used) == plan_hash(fused));
  int runs_notes = 0;
  for (const auto& n : used.notes) runs_notes += n.rfind("runs the", 0) == 0;
  CHECK(runs_notes == 1);  // the cached variant's note only, not the model's beside it
  // A heap budget below the worst case: counts first, as without the cache (the entry was tuned
  // without one), not the cached worst-case layout.
  setenv("WEFT_HEAP_BYTES", std::to_string(model.heap_bytes / 2).c_str(), 1);
  const Plan budget_model = decide(w, nullptr, cache);
  const Plan budget_used = decide(w, &m, cache);
  unsetenv("WEFT_HEAP_BYTES");
  REQUIRE(budget_model.exec.executable);
  CHECK(budget_model.heap_bytes < model.heap_bytes);
  CHECK(budget_used.chosen_by == "tuning cache");
  CHECK(budget_used.exec.variant == "ffn_combine");
  CHECK(budget_used.heap_bytes == budget_model.heap_bytes);
  bool counts_first = false;
  for (const auto& n : budget_used.notes) counts_first |= n.rfind("counts first:", 0) == 0;
  CHECK(counts_first);
}

TEST_CASE("GEMM+RS's overlap plan where the heap is too small, or from the cache for shared GPUs: peer instead") {
  TempDir d;
  const Workload w = load(write_workload(d,
                                         "name: t\nop: gemm_rs\ndtype: bf16\nshape: {m: 8192, n: 8192, k: 7168}\n"
                                         "layout: {nodes: 1, gpus_per_node: 4}\n"));
  DecideOptions o;
  o.topology = std::string(WEFT_SOURCE_DIR) + "/tests/data/hwloc-nvidiaDGX2.xml";
  Plan overlap, p;
  std::string err;
  bool bad = false;
  REQUIRE(decide_plan(w, o, &overlap, &err, &bad) == Status::kOk);
  REQUIRE(overlap.exec.variant == "overlap");
  // A heap that holds the overlap plan keeps it. One byte less: the peer variant (two copies of the
  // partials) needs as much, so no plan runs there, and the plan says what each variant needs.
  o.heap_budget = overlap.heap_bytes;
  REQUIRE(decide_plan(w, o, &p, &err, &bad) == Status::kOk);
  CHECK(p.exec.variant == "overlap");
  CHECK(p.exec.executable);
  o.heap_budget = overlap.heap_bytes - 1;
  REQUIRE(decide_plan(w, o, &p, &err, &bad) == Status::kOk);
  CHECK(!p.exec.executable);
  CAPTURE(p.exec.not_executable);
  CHECK(p.exec.not_executable.find("the symmetric heap is too small: the overlap variant needs") == 0);
  CHECK(p.exec.not_executable.find("and the peer variant") != std::string::npos);
  CHECK(p.exec.not_executable.find("raise WEFT_HEAP_BYTES") != std::string::npos);
  // A workload that asks for overlap gets it, heap or not (run and the API say what is missing).
  const Workload asked = load(write_workload(d,
                                             "name: t\nop: gemm_rs\ndtype: bf16\nshape: {m: 8192, n: 8192, k: 7168}\n"
                                             "layout: {nodes: 1, gpus_per_node: 4}\nplan: {variant: overlap}\n"));
  REQUIRE(decide_plan(asked, o, &p, &err, &bad) == Status::kOk);
  CHECK(p.exec.variant == "overlap");
  // A cached overlap plan is not used for ranks that share a GPU: the model's peer plan runs.
  const std::string cache = d.path + "/tune.json";
  REQUIRE(store_tune_entry(cache, {tune_key(machine(), overlap), executed_json(overlap), 0.4, 0.7, 3, "now"}, &err) ==
          Status::kOk);
  const TuneMachine m = machine();
  DecideOptions c;
  c.topology = o.topology;
  c.machine = &m;
  c.tune_cache = cache;
  REQUIRE(decide_plan(w, c, &p, &err, &bad) == Status::kOk);
  CHECK(p.chosen_by == "tuning cache");
  CHECK(p.exec.variant == "overlap");
  c.share_gpus = true;
  REQUIRE(decide_plan(w, c, &p, &err, &bad) == Status::kOk);
  CHECK(p.exec.variant == "peer");
  CHECK(p.exec.executable);
  CHECK(p.chosen_by == "model");
  bool said = false;
  for (const auto& n : p.notes) said = said || n.find("the tuning cache's overlap plan") != std::string::npos;
  CHECK(said);
}
