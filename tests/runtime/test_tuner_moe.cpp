// The tuner's MoE model (runtime/tuner_moe.h) against the measured MoE rows of docs/moe.md
// (tests/runtime/moe_measured_rows.h). The grouped GEMM's constants were fitted on the one-GPU
// bench_moe_single rows (S01-S09); the other phases' on the per-phase times of the 2 x H100 layer rows
// of Mixtral-8x7B and Qwen3-30B-A3B (L01, L02, L04, L05). The layer totals are the check: no constant saw
// any of them, and the DeepSeek-V3 layer rows (L03, L06) no figure of theirs at all.
// WEFT_TUNER_FIT_TABLE=1 prints every row's error.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "runtime/tuner.h"
#include "runtime/tuner_moe.h"
#include "runtime/workload.h"
#include "tests/runtime/moe_measured_rows.h"

using weft::Status;
using weft::testing::moe_measured_rows;
using weft::testing::MoeMeasured;
using namespace weft::runtime;

namespace {

std::string fmt(const char* f, double a) {
  char b[64];
  snprintf(b, sizeof b, f, a);
  return b;
}

std::string err_pct(double predicted, double measured) { return fmt("%+.1f%%", (predicted / measured - 1) * 100); }

// The row's layer as a workload on one node of `world` GPUs, planned by tune() with the model `m`.
Plan plan_of(const MoeMeasured& r, const MachineModel& m = machine_model_h100()) {
  std::ostringstream text;
  text << "op: moe\nshape: {tokens: " << r.tokens * r.world << ", hidden: " << r.hidden << ", ffn: " << r.ffn
       << ", experts: " << r.experts << ", topk: " << r.topk << "}\nlayout: {nodes: 1, gpus_per_node: " << r.world
       << "}\n";
  Workload w;
  std::string err;
  REQUIRE_MESSAGE(parse_workload(text.str(), "t.yaml", &w, &err) == Status::kOk, err);
  Plan p;
  REQUIRE_MESSAGE(tune(w, w.layout, {}, {}, m, &p, &err) == Status::kOk, err);
  return p;
}

MoeShape shape_of(const MoeMeasured& r) {
  MoeShape s;
  s.tokens = r.tokens * r.world, s.hidden = r.hidden, s.ffn = r.ffn, s.experts = r.experts, s.topk = r.topk;
  return s;
}

// A layer row's phases as predicted, each with its error against the measured phase.
std::string phases_text(const MoeStagedTime& st, const MoeMeasured& r) {
  char text[256];
  snprintf(text, sizeof text, "%.3f %s / %.3f %s / %.3f %s / %.3f %s / %.3f %s", st.route_s * 1e3,
           err_pct(st.route_s * 1e3, r.route_ms).c_str(), st.dispatch_s * 1e3,
           err_pct(st.dispatch_s * 1e3, r.dispatch_ms).c_str(), st.arrange_s * 1e3,
           err_pct(st.arrange_s * 1e3, r.arrange_ms).c_str(), st.ffn_s() * 1e3,
           err_pct(st.ffn_s() * 1e3, r.ffn_ms).c_str(), st.combine_s * 1e3,
           err_pct(st.combine_s * 1e3, r.combine_ms).c_str());
  return text;
}

void print(const std::string& table) {
  if (getenv("WEFT_TUNER_FIT_TABLE")) printf("%s", table.c_str());
}

}  // namespace

TEST_CASE("moe: the expected padded rows match the rows the bench recorded (no constant)") {
  std::ostringstream table;
  int checked = 0;
  for (const auto& r : moe_measured_rows()) {
    if (r.padded_rows <= 0) continue;
    const double local = double(r.experts) / r.world;
    const double predicted = local * moe_expected_tiles(double(r.tokens) * r.world, r.experts, r.topk) * 128;
    table << r.id << " " << r.shape << " T " << r.tokens << " W " << r.world << ": padded rows " << r.padded_rows
          << ", expected " << fmt("%.0f", predicted) << " (" << err_pct(predicted, double(r.padded_rows)) << ")\n";
    INFO(r.id);
    CHECK(predicted == doctest::Approx(double(r.padded_rows)).epsilon(0.05));
    ++checked;
  }
  INFO(table.str());
  print(table.str());
  CHECK(checked >= 7);
}

TEST_CASE("moe: the grouped FFN against the one-GPU bench rows it was fitted on") {
  // In sample: S01-S09 fitted gemm_tflops, gemm_tile_us, gemm_hbm_gbps and gemm_overlap_miss (mean
  // squared log error plus 0.1 x the largest, over the up and down passes of S01-S06 and the FFN of
  // S07-S09). S10 and S11 ran other raster groups, which the model does not have: printed, not bounded.
  const MachineModel m = machine_model_h100();
  const MoeStagedConstants c = moe_staged_constants(m);
  std::ostringstream table;
  table << "row  shape          T/rank  W  group  measured ms (up / down / FFN)   predicted             error\n";
  double worst = 0;
  int checked = 0;
  for (const auto& r : moe_measured_rows()) {
    if (std::string(r.part) != "ffn") continue;
    const double tiles = moe_expected_tiles(double(r.tokens) * r.world, r.experts, r.topk);
    double up = 0, down = 0;
    moe_grouped_ffn_time(r.hidden, r.ffn, double(r.experts) / r.world, tiles, m, c, &up, &down);
    up *= 1e3, down *= 1e3;
    const double ffn = up + down;
    char line[512];
    snprintf(line, sizeof line,
             "%-4s %-14s %6lld %2d %6d  %6.3f / %6.3f / %6.3f   %6.3f / %6.3f / %6.3f  %s / %s / %s%s\n", r.id, r.shape,
             (long long)r.tokens, r.world, r.raster_group, r.up_ms, r.down_ms, r.ms, up, down, ffn,
             r.up_ms > 0 ? err_pct(up, r.up_ms).c_str() : "-", r.down_ms > 0 ? err_pct(down, r.down_ms).c_str() : "-",
             err_pct(ffn, r.ms).c_str(), r.raster_group != 16 ? "  (raster group not modelled)" : "");
    table << line;
    if (r.raster_group != 16) continue;
    for (const auto& [p, meas] : {std::pair{up, r.up_ms}, std::pair{down, r.down_ms}, std::pair{ffn, r.ms}})
      if (meas > 0) worst = std::max(worst, std::fabs(p / meas - 1));
    ++checked;
  }
  table << "in-sample max error " << fmt("%.1f", worst * 100) << "%\n";
  INFO(table.str());
  print(table.str());
  CHECK(checked == 9);
  CHECK(worst <= 0.20);
}

TEST_CASE("moe: the tuner's plan predicts the staged layer within the stated error on rows it was not fitted to") {
  // The plan's makespan for a one-node moe workload is the staged op's sum of phases (tuner_moe.h),
  // compared with the layer measured on 2 H100s (run B, whose phases docs/moe.md gives, and run A of
  // the same call). See docs/tuner.md, "MoE", for what is held out from what.
  constexpr double kGoal = 0.20;
  // The rows the model does not bring within 20%, with the bound it reaches (docs/tuner.md says why).
  // L03's run A is 15% slower than its run B, which is within 20%. Run A of L05 is the outlier
  // docs/moe.md names (1.697 ms against 0.410 in run B): not bounded.
  const std::map<std::string, double> kMissesB = {{"L04", 0.25}};
  const std::map<std::string, double> kMissesA = {{"L03", 0.35}, {"L04", 0.25}};
  const MachineModel m = machine_model_h100();
  const MoeStagedConstants c = moe_staged_constants(m);
  std::ostringstream table;
  table << "row  shape          T/rank  measured B (A) ms   predicted  error B (A)     "
           "phases B: route / dispatch / arrange / FFN / combine, predicted (error)\n";
  std::vector<double> errors;
  for (const auto& r : moe_measured_rows()) {
    if (std::string(r.part) != "layer") continue;
    const Plan p = plan_of(r);
    const MoeStagedTime st = moe_staged_time(shape_of(r), r.world, m, c);
    REQUIRE(p.exec.variant == "staged");
    CHECK(p.makespan_s == doctest::Approx(st.total_s()));
    const double pred = p.makespan_s * 1e3;
    const double eb = pred / r.ms - 1, ea = pred / r.ms_a - 1;
    char line[512];
    snprintf(line, sizeof line, "%-4s %-14s %6lld  %7.3f (%7.3f)   %8.3f  %+6.1f%% (%+6.1f%%)  %s\n", r.id, r.shape,
             (long long)r.tokens, r.ms, r.ms_a, pred, eb * 100, ea * 100, phases_text(st, r).c_str());
    table << line;
    INFO(line);
    const auto b = kMissesB.find(r.id), a = kMissesA.find(r.id);
    CHECK(std::fabs(eb) <= (b == kMissesB.end() ? kGoal : b->second));
    if (std::string(r.id) != "L05") CHECK(std::fabs(ea) <= (a == kMissesA.end() ? kGoal : a->second));
    // A row listed as a miss must still miss: once the model reaches 20% there, the list shrinks.
    if (b != kMissesB.end()) CHECK(std::fabs(eb) > kGoal);
    errors.push_back(std::fabs(eb));
  }
  std::sort(errors.begin(), errors.end());
  REQUIRE(errors.size() == 6);
  table << "run B: max error " << fmt("%.1f", errors.back() * 100) << "%, median "
        << fmt("%.1f", errors[errors.size() / 2] * 100) << "%\n";
  INFO(table.str());
  print(table.str());
  CHECK(errors[errors.size() / 2] <= kGoal);
}

TEST_CASE("moe: the tuner's plan against the 4 x H200 layer rows (held out: another GPU and world size)") {
  // The H200 model scales the H100-fitted constants by the part's rates (moe_staged_constants); no
  // figure of these rows was used. WEFT_TUNER_FIT_TABLE=1 prints the table.
  const MachineModel m = machine_model_h200();
  const MoeStagedConstants c = moe_staged_constants(m);
  std::ostringstream table;
  table << "row  shape          T/rank  measured ms  predicted  error    "
           "phases: route / dispatch / arrange / FFN / combine, predicted (error)\n";
  std::vector<double> errors;
  for (const auto& r : weft::testing::moe_measured_rows_4xh200()) {
    const Plan p = plan_of(r, m);
    const MoeStagedTime st = moe_staged_time(shape_of(r), r.world, m, c);
    REQUIRE(p.exec.variant == "staged");
    CHECK(p.makespan_s == doctest::Approx(st.total_s()));
    const double pred = p.makespan_s * 1e3, e = pred / r.ms - 1;
    char line[512];
    snprintf(line, sizeof line, "%-4s %-14s %6lld  %9.3f  %9.3f  %+6.1f%%  %s\n", r.id, r.shape, (long long)r.tokens,
             r.ms, pred, e * 100, phases_text(st, r).c_str());
    table << line;
    errors.push_back(std::fabs(e));
  }
  std::sort(errors.begin(), errors.end());
  REQUIRE(errors.size() == 12);
  table << "max error " << fmt("%.1f", errors.back() * 100) << "%, median "
        << fmt("%.1f", errors[errors.size() / 2] * 100) << "%\n";
  INFO(table.str());
  print(table.str());
  // Every row within the 20%. The six rows of 18fa772 gave max 11.4%, median 4.1%; single
  // phases miss by up to 51%, the combine and arrange waits most, and partly cancel. The six of
  // a4847b4 (faster row kernels, nothing refitted) add the largest miss, Qwen3-30B-A3B at 4096 tokens
  // per rank +18.7%: the model's exchange is now too slow.
  CHECK(errors.back() <= 0.20);
}

TEST_CASE("moe: the tuner's plan against the 2 x H200 layer rows (held out: another world size on H200)") {
  const MachineModel m = machine_model_h200();
  const MoeStagedConstants c = moe_staged_constants(m);
  std::ostringstream table;
  for (const auto& r : weft::testing::moe_measured_rows_2xh200()) {
    const Plan p = plan_of(r, m);
    const MoeStagedTime st = moe_staged_time(shape_of(r), r.world, m, c);
    REQUIRE(p.exec.variant == "staged");
    const double pred = p.makespan_s * 1e3, e = pred / r.ms - 1;
    char line[512];
    snprintf(line, sizeof line, "%-4s %-14s %6lld  %9.3f  %9.3f  %+6.1f%%  %s\n", r.id, r.shape, (long long)r.tokens,
             r.ms, pred, e * 100, phases_text(st, r).c_str());
    table << line;
    CAPTURE(r.id);
    CAPTURE(e);
    // Within the 20% but H14 (Qwen3-30B-A3B: +20.7%, the model's exchange too slow as on 4 GPUs),
    // which stays within 25% and must still miss (once the model reaches 20% there, this shrinks).
    const bool listed_miss = std::string(r.id) == "H14";
    CHECK(std::fabs(e) <= (listed_miss ? 0.25 : 0.20));
    if (listed_miss) CHECK(std::fabs(e) > 0.20);
  }
  INFO(table.str());
  print(table.str());
}

TEST_CASE("moe: a one-node plan carries the staged prediction, its bound the FFN or the link alone") {
  Workload w;
  std::string err;
  REQUIRE(parse_workload("op: moe\nshape: {tokens: 8192, hidden: 2048, ffn: 768, experts: 128, topk: 8}\n"
                         "layout: {nodes: 1, gpus_per_node: 2}\n",
                         "t.yaml", &w, &err) == Status::kOk);
  for (const MachineModel& m : {machine_model_h100(), machine_model_h200()}) {
    Plan p;
    REQUIRE(tune(w, w.layout, {}, {}, m, &p, &err) == Status::kOk);
    const MoeStagedTime st = moe_staged_time(w.moe, 2, m, moe_staged_constants(m));
    INFO(m.gpu);
    CHECK(p.exec.variant == "staged");
    CHECK(p.makespan_s == doctest::Approx(st.total_s()));
    CHECK(p.limited_by == "compute");
    CHECK(p.roles.compute == m.sm_count);
    CHECK(p.compute_alone_s == doctest::Approx(st.ffn_s()));
    CHECK(p.bound_s <= p.makespan_s);
    CHECK(st.route_s > 0);
    CHECK(st.dispatch_s > 0);
    CHECK(st.arrange_s > 0);
    CHECK(st.combine_s > 0);
  }
  // The faster part is faster: H200's rates scale the fitted H100 ones.
  const MoeStagedTime h100 =
      moe_staged_time(w.moe, 2, machine_model_h100(), moe_staged_constants(machine_model_h100()));
  const MoeStagedTime h200 =
      moe_staged_time(w.moe, 2, machine_model_h200(), moe_staged_constants(machine_model_h200()));
  CHECK(h200.ffn_s() < h100.ffn_s());
}

namespace {

// The fit of docs/tuner.md ("MoE") as code: its two losses, each over its stated rows only.
struct Knob {
  const char* key;
  double MoeStagedConstants::*field;
};
const Knob kGemmKnobs[] = {{"gemm_tflops", &MoeStagedConstants::gemm_tflops},
                           {"gemm_tile_us", &MoeStagedConstants::gemm_tile_us},
                           {"gemm_hbm_gbps", &MoeStagedConstants::gemm_hbm_gbps},
                           {"gemm_overlap_miss", &MoeStagedConstants::gemm_overlap_miss}};
const Knob kPhaseKnobs[] = {
    {"route_us", &MoeStagedConstants::route_us},       {"route_token_ns", &MoeStagedConstants::route_token_ns},
    {"dispatch_us", &MoeStagedConstants::dispatch_us}, {"exchange_gbps", &MoeStagedConstants::exchange_gbps},
    {"arrange_us", &MoeStagedConstants::arrange_us},   {"copy_gbps", &MoeStagedConstants::copy_gbps},
    {"combine_us", &MoeStagedConstants::combine_us}};

double mean_plus_max(const std::vector<double>& sq) {
  double sum = 0, worst = 0;
  for (double e : sq) sum += e, worst = std::max(worst, e);
  return sum / sq.size() + 0.1 * worst;
}

double sq_log(double predicted, double measured) {
  const double e = std::log(predicted / measured);
  return e * e;
}

// The grouped GEMM's rows: S01-S09 (one GPU, raster group 16); up and down where given, else the FFN.
double gemm_loss(const MoeStagedConstants& c) {
  const MachineModel m = machine_model_h100();
  std::vector<double> sq;
  for (const auto& r : moe_measured_rows()) {
    if (std::string(r.part) != "ffn" || r.raster_group != 16) continue;
    double up = 0, down = 0;
    moe_grouped_ffn_time(r.hidden, r.ffn, double(r.experts) / r.world,
                         moe_expected_tiles(double(r.tokens) * r.world, r.experts, r.topk), m, c, &up, &down);
    if (r.up_ms > 0) {
      sq.push_back(sq_log(up * 1e3, r.up_ms));
      sq.push_back(sq_log(down * 1e3, r.down_ms));
    } else {
      sq.push_back(sq_log((up + down) * 1e3, r.ms));
    }
  }
  REQUIRE(sq.size() == 15);
  return mean_plus_max(sq);
}

// The other phases: route, dispatch, arrange and combine of L01, L02, L04 and L05 (run B).
bool phase_fit_row(const MoeMeasured& r) {
  const std::string id = r.id;
  return id == "L01" || id == "L02" || id == "L04" || id == "L05";
}

double phase_loss(const MoeStagedConstants& c) {
  const MachineModel m = machine_model_h100();
  std::vector<double> sq;
  for (const auto& r : moe_measured_rows()) {
    if (std::string(r.part) != "layer" || !phase_fit_row(r)) continue;
    const MoeStagedTime t = moe_staged_time(shape_of(r), r.world, m, c);
    sq.push_back(sq_log(t.route_s * 1e3, r.route_ms));
    sq.push_back(sq_log(t.dispatch_s * 1e3, r.dispatch_ms));
    sq.push_back(sq_log(t.arrange_s * 1e3, r.arrange_ms));
    sq.push_back(sq_log(t.combine_s * 1e3, r.combine_ms));
  }
  REQUIRE(sq.size() == 16);
  return mean_plus_max(sq);
}

// Coordinate descent in log space from `start` over `knobs`, steps x2 down to x1.002.
template <size_t N, typename Loss>
MoeStagedConstants refit(MoeStagedConstants c, const Knob (&knobs)[N], Loss loss) {
  double best = loss(c);
  for (double step = std::log(2.0); step >= 0.002; step /= 2) {
    for (bool moved = true; moved;) {
      moved = false;
      for (const auto& k : knobs) {
        for (double dir : {1.0, -1.0}) {
          while (true) {
            MoeStagedConstants t = c;
            t.*k.field *= std::exp(dir * step);
            const double l = loss(t);
            if (!(l < best - 1e-12)) break;
            c = t, best = l, moved = true;
          }
        }
      }
    }
  }
  return c;
}

template <size_t N, typename Loss>
void check_is_fit(const Knob (&knobs)[N], Loss loss, const char* what) {
  // The defaults are rounded fits: refitting their own rows from them moves no constant by more than
  // 5% and lowers the loss by less than 2%.
  const MoeStagedConstants def = moe_staged_constants(machine_model_h100());
  const MoeStagedConstants fit = refit(def, knobs, loss);
  std::ostringstream out;
  out << what << ": loss at the defaults " << loss(def) << ", refit " << loss(fit) << "\n";
  for (const auto& k : knobs) {
    const double d = def.*k.field, v = fit.*k.field;
    out << "  " << k.key << ": default " << d << ", refit " << fmt("%.4g", v) << " (x" << fmt("%.3f", v / d) << ")\n";
    INFO(k.key, " default ", d, " refit ", v);
    CHECK(v / d <= 1.05);
    CHECK(d / v <= 1.05);
  }
  INFO(out.str());
  print(out.str());
  CHECK(loss(fit) <= loss(def));
  CHECK(loss(fit) >= 0.98 * loss(def));
}

}  // namespace

TEST_CASE("moe: the constants are a fit to their stated rows only (the layer totals fit nothing)") {
  check_is_fit(kGemmKnobs, gemm_loss, "grouped GEMM on S01-S09");
  check_is_fit(kPhaseKnobs, phase_loss, "phases of L01, L02, L04, L05");
}

// Rows outside 20%, with the bound each stays within (docs/tuner.md, "MoE across nodes").
// Qwen3-30B-A3B at 4 channels: 2 x 1 -25.7%, 2 x 2 -27.5%.
const std::map<std::string, double> kNodesMisses = {{"N05", 0.30}, {"N11", 0.30}};

TEST_CASE(
    "moe across nodes: the tuner's hierarchical model against the 2 x 1 and 2 x 2 H200 rows (held out: none fitted)") {
  // The socket backend's rates are the ones fitted on AllGather rows (docs/tuner.md); the staged
  // constants the H100 ones, scaled. WEFT_TUNER_FIT_TABLE=1 prints the table.
  std::ostringstream table;
  table << "row  shape          channels  measured ms  predicted  error    dispatch / combine predicted (error)\n";
  std::vector<double> errors;
  for (const auto& r : weft::testing::moe_measured_rows_nodes_h200()) {
    MachineModel m = machine_model_h200();
    m.net_channels = r.channels;
    std::ostringstream text;
    text << "op: moe\nshape: {tokens: " << r.tokens * r.nodes * r.per_node << ", hidden: " << r.hidden
         << ", ffn: " << r.ffn << ", experts: " << r.experts << ", topk: " << r.topk << "}\nlayout: {nodes: " << r.nodes
         << ", gpus_per_node: " << r.per_node << "}\ntransport: {inter_node: socket}\n";
    Workload w;
    std::string err;
    REQUIRE_MESSAGE(parse_workload(text.str(), "t.yaml", &w, &err) == Status::kOk, err);
    Plan p;
    REQUIRE_MESSAGE(tune(w, w.layout, {}, {}, m, &p, &err) == Status::kOk, err);
    REQUIRE(p.exec.variant == "hierarchical");
    MoeShape s;
    s.tokens = w.moe.tokens, s.hidden = r.hidden, s.ffn = r.ffn, s.experts = r.experts, s.topk = r.topk;
    const double net = std::min(m.socket_gbps / r.per_node, r.channels * m.socket_channel_gbps);
    const MoeStagedTime st = moe_hierarchical_time(s, r.nodes, r.per_node, net, m, moe_staged_constants(m));
    CHECK(p.makespan_s == doctest::Approx(st.total_s()));
    const double pred = p.makespan_s * 1e3, e = pred / r.ms - 1;
    char line[512];
    snprintf(line, sizeof line, "%-4s %-14s %8d  %11.3f  %9.3f  %+6.1f%%  %.3f %s / %.3f %s\n", r.id, r.shape,
             r.channels, r.ms, pred, e * 100, st.dispatch_s * 1e3, err_pct(st.dispatch_s * 1e3, r.dispatch_ms).c_str(),
             st.combine_s * 1e3, err_pct(st.combine_s * 1e3, r.combine_ms).c_str());
    table << line;
    INFO(line);
    // The 20% on every row but the listed misses, each within its stated bound and still a
    // miss (once the model reaches 20% there, the list shrinks).
    const auto miss = kNodesMisses.find(r.id);
    CHECK(std::fabs(e) <= (miss == kNodesMisses.end() ? 0.20 : miss->second));
    if (miss != kNodesMisses.end()) CHECK(std::fabs(e) > 0.20);
    errors.push_back(std::fabs(e));
  }
  std::sort(errors.begin(), errors.end());
  REQUIRE(errors.size() == 12);
  table << "max error " << fmt("%.1f", errors.back() * 100) << "%, median "
        << fmt("%.1f", errors[errors.size() / 2] * 100) << "%\n";
  INFO(table.str());
  print(table.str());
  // 2 x 2 rows (N10-N12) at this commit: -16.8%, -27.5%, -7.3%; each node's two ranks moved about
  // 7 GB/s together, where the model gives each 6.5. The 2 x 1 rows: 8 of 9 within 20% (max 18.6%),
  // median 12.0%; the exchange phases alone miss
  // by up to 49% at 4 and 8 channels: one rank per node moved 5.8 and 7.2 GB/s each way, below the
  // socket model's min(socket_gbps / G, channels x socket_channel_gbps) = 9.8 and 13 (fitted on rows
  // with 2 ranks per node), while the totals' other phases are over-predicted.
}

TEST_CASE("moe: the plan's split_k reaches the model: parts where they fit one wave, else unsplit") {
  const MachineModel m = machine_model_h200();
  const MoeStagedConstants c = moe_staged_constants(m);
  MoeShape s;  // Mixtral-8x7B's sizes on 4 ranks
  s.hidden = 4096, s.ffn = 14336, s.experts = 8, s.topk = 2;
  // About 4 row tiles per rank: down's 4 x 16 pairs in 2 parts fit one wave, and so do gate/up's
  // 4 x 112 units' last 52.
  s.tokens = 4 * 192;
  const MoeStagedTime split = moe_staged_time(s, 4, m, c, 4), unsplit = moe_staged_time(s, 4, m, c, 1);
  CHECK(split.down_s < unsplit.down_s);
  CHECK(split.up_s < unsplit.up_s);
  s.tokens = 4 * 4096;  // 64 row tiles a rank: a full wave of down already, gate/up in 4 raster groups
  const MoeStagedTime big = moe_staged_time(s, 4, m, c, 4), big1 = moe_staged_time(s, 4, m, c, 1);
  CHECK(big.down_s == big1.down_s);
  CHECK(big.up_s == big1.up_s);
}
