// The tuner's fit checked out of sample: the fitted MachineModel constants (docs/tuner.md) are refitted
// without each group of measured rows in turn (leave one group out, 14 folds) and every row is
// predicted by constants that never saw it.
//
// The fit is the one docs/tuner.md describes, written as code: the mean squared log error over the
// rows plus a penalty on the largest, minimised over the fitted constants by coordinate descent in
// log space with halving steps, from the model's defaults. Deterministic; no randomness anywhere.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/machine_model.h"
#include "tests/runtime/measured_rows.h"

using weft::testing::Measured;
using namespace weft::runtime;

namespace {

// The constants docs/tuner.md lists as fitted (net_channels is WEFT_NET_CHANNELS' default, not a fit).
struct Constant {
  const char* key;
  double MachineModel::*field;
  double ceiling;                   // sm_mover_busy is a share of a rate: never above 1
  double MachineModel::*cap_field;  // the copy engines never move more than the link (nvlink_gbps, not fitted)
};
const Constant kFitted[] = {
    {"tensor_tflops", &MachineModel::tensor_tflops, 1e9, nullptr},
    {"tile_overhead_us", &MachineModel::tile_overhead_us, 1e9, nullptr},
    {"ce_pull_gbps", &MachineModel::ce_pull_gbps, 1e9, &MachineModel::nvlink_gbps},
    {"ce_push_gbps", &MachineModel::ce_push_gbps, 1e9, &MachineModel::nvlink_gbps},
    {"nvlink_sm_gbps", &MachineModel::nvlink_sm_gbps, 1e9, nullptr},
    {"nvlink_sm_max_gbps", &MachineModel::nvlink_sm_max_gbps, 1e9, nullptr},
    {"sm_mover_busy", &MachineModel::sm_mover_busy, 1.0, nullptr},
    {"reduce_sm_gbps", &MachineModel::reduce_sm_gbps, 1e9, nullptr},
    {"tile_signal_us", &MachineModel::tile_signal_us, 1e9, nullptr},
    {"latency_us", &MachineModel::latency_us, 1e9, nullptr},
    {"socket_channel_gbps", &MachineModel::socket_channel_gbps, 1e9, nullptr},
    {"socket_gbps", &MachineModel::socket_gbps, 1e9, nullptr},
};
constexpr int kConstants = sizeof(kFitted) / sizeof(kFitted[0]);

// Weight of the largest squared log error beside the mean of them all: enough that one row cannot be
// given up for a slightly better median, small enough that the mean still decides.
constexpr double kMaxWeight = 0.1;
// The search: each constant stays within 16x of its default; steps from x2 down to x1.002.
constexpr double kRange = 16;
constexpr double kFirstStep = 0.6931471805599453;  // log 2
constexpr double kLastStep = 0.002;

// A measured row with its workload parsed once.
struct Case {
  Measured row;
  Workload w;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const auto& r : weft::testing::measured_rows()) out.push_back({r, weft::testing::measured_workload(r)});
  return out;
}

double log_error(const Case& c, const MachineModel& m) {
  return std::log(weft::testing::replay(c.row, c.w, m) / c.row.measured);
}

double loss(const std::vector<Case>& all, const std::vector<int>& rows, const MachineModel& m) {
  double sum = 0, worst = 0;
  for (int i : rows) {
    const double e = log_error(all[i], m);
    sum += e * e;
    worst = std::max(worst, e * e);
  }
  return sum / rows.size() + kMaxWeight * worst;
}

double ceiling(const MachineModel& m, int c) {
  return kFitted[c].cap_field ? std::min(kFitted[c].ceiling, m.*kFitted[c].cap_field) : kFitted[c].ceiling;
}

MachineModel with(const MachineModel& base, const std::vector<double>& logs) {
  MachineModel m = base;
  for (int c = 0; c < kConstants; ++c) m.*kFitted[c].field = std::exp(logs[c]);
  return m;
}

// Coordinate descent in log space from `start`: at each step size, move any constant up or down by
// the step while that lowers the loss; halve the step when a full sweep finds nothing.
MachineModel fit(const std::vector<Case>& all, const std::vector<int>& rows, const MachineModel& start) {
  std::vector<double> x(kConstants), lo(kConstants), hi(kConstants);
  for (int c = 0; c < kConstants; ++c) {
    const double v = start.*kFitted[c].field;
    x[c] = std::log(v);
    lo[c] = std::log(v / kRange);
    hi[c] = std::log(std::min(v * kRange, ceiling(start, c)));
  }
  double best = loss(all, rows, with(start, x));
  for (double step = kFirstStep; step >= kLastStep; step /= 2) {
    for (bool moved = true; moved;) {
      moved = false;
      for (int c = 0; c < kConstants; ++c) {
        for (double dir : {1.0, -1.0}) {
          while (true) {
            std::vector<double> y = x;
            y[c] = std::clamp(x[c] + dir * step, lo[c], hi[c]);
            if (y[c] == x[c]) break;
            const double l = loss(all, rows, with(start, y));
            if (!(l < best - 1e-12)) break;
            x = y, best = l, moved = true;
          }
        }
      }
    }
  }
  return with(start, x);
}

// Whether any row of `rows` depends on constant c at m: moving it by 1% either way (within its
// ceiling) changes a prediction. Where none does, the rows leave it wherever the fit started.
bool pinned(const std::vector<Case>& all, const std::vector<int>& rows, const MachineModel& m, int c) {
  for (double f : {0.99, 1.01}) {
    MachineModel t = m;
    t.*kFitted[c].field = std::min(m.*kFitted[c].field * f, ceiling(m, c));
    for (int i : rows)
      if (std::fabs(log_error(all[i], t) - log_error(all[i], m)) > 1e-9) return true;
  }
  return false;
}

// A constant the fit left free: no row pins it, or the search ran it to the end of its range (the
// rows then only bound it from one side).
bool left_free(const std::vector<Case>& all, const std::vector<int>& rows, const MachineModel& m,
               const MachineModel& start, int c) {
  const double moved = std::fabs(std::log(m.*kFitted[c].field / (start.*kFitted[c].field)));
  return !pinned(all, rows, m, c) || moved >= std::log(kRange) - 1e-9;
}

// The group a row is held out with: its family (the row id's letter: g GEMM core alone, a
// AllGather+GEMM one node, r GEMM+RS/AR one node, n 2 x 2 emulated nodes) and its shape. All rows of
// one shape in one family go out together, whatever run, role counts, channels or part (fused, GEMM
// alone, transfer alone) they are: two runs of a shape (g01 and g19), or a fused row and its own
// GEMM-alone and transfer-alone rows (a01, a12, a17), share most of their prediction, so holding out
// one while fitting to the other would test little. RS and AR of one shape share their GEMM and path
// (n26 and n33 are the same GEMM measured twice), so they go out together. What stays in is another
// shape or another family: the held-out check asks whether the constants carry to a workload the fit
// never saw. Across families the same per-GPU GEMM does recur (g01's 8192 x 7168 x 8192 is a12's and
// n15's per-rank GEMM), measured in another run, harness and unit; that is the transfer the model
// claims, so it is not hidden.
std::string group_of(const Measured& r) {
  return r.row.substr(0, 1) + " " + std::to_string(r.m) + "x" + std::to_string(r.n) + "x" + std::to_string(r.k);
}

std::string fmt(const char* f, double a) {
  char b[64];
  snprintf(b, sizeof b, f, a);
  return b;
}

// "max 14.0%, median 3.3%" of |predicted / measured - 1| over `rows`.
std::string summary(const std::vector<Case>& all, const std::vector<int>& rows, const MachineModel& m) {
  std::vector<double> e;
  for (int i : rows) e.push_back(std::fabs(std::exp(log_error(all[i], m)) - 1));
  std::sort(e.begin(), e.end());
  return "max " + fmt("%.1f", e.back() * 100) + "%, median " + fmt("%.1f", e[e.size() / 2] * 100) + "%";
}

}  // namespace

TEST_CASE("the documented defaults are a fit: refitting every row from them moves no constant far") {
  // Refitting in sample from the defaults finds what the rounding of the defaults left on the table.
  // A constant that moves by more than kDefaultsFactor would mean the defaults are not the fit
  // docs/tuner.md says they are. reduce_sm_gbps and tile_signal_us are the exception, bounded by
  // kRidgeFactor: both only add to the compute of the GEMM+RS/AR overlap path (the folded partials
  // and the per-tile counts), so the rows fix mainly their combined cost, not each one; the refit
  // lowers both (about x0.66: slower folding, cheaper counts) for a loss 8% lower.
  constexpr double kDefaultsFactor = 1.25;
  constexpr double kRidgeFactor = 1.6;
  const std::vector<Case> all = cases();
  REQUIRE(all.size() >= 100);
  std::vector<int> rows(all.size());
  for (size_t i = 0; i < all.size(); ++i) rows[i] = static_cast<int>(i);
  const MachineModel def = machine_model_h200();
  const MachineModel refit = fit(all, rows, def);
  std::ostringstream out;
  out << "in-sample loss: defaults " << loss(all, rows, def) << " (" << summary(all, rows, def) << "), refit "
      << loss(all, rows, refit) << " (" << summary(all, rows, refit) << ")\n";
  for (int c = 0; c < kConstants; ++c) {
    const double d = def.*kFitted[c].field, v = refit.*kFitted[c].field;
    out << kFitted[c].key << ": default " << d << ", refit " << fmt("%.4g", v) << " (x" << fmt("%.3f", v / d) << ")"
        << (left_free(all, rows, refit, def, c) ? "  left free by the rows" : "") << "\n";
    const std::string key = kFitted[c].key;
    const double bound = key == "reduce_sm_gbps" || key == "tile_signal_us" ? kRidgeFactor : kDefaultsFactor;
    INFO(key, " default ", d, " refit ", v, " bound x", bound);
    CHECK(v / d <= bound);
    CHECK(d / v <= bound);
  }
  INFO(out.str());
  CHECK(loss(all, rows, refit) <= loss(all, rows, def));
  if (getenv("WEFT_TUNER_FIT_TABLE")) printf("%s", out.str().c_str());
}

TEST_CASE("every measured row is predicted by constants fitted without its shape family (docs/tuner.md)") {
  const std::vector<Case> all = cases();
  REQUIRE(all.size() >= 100);
  std::map<std::string, std::vector<int>> groups;
  for (size_t i = 0; i < all.size(); ++i) groups[group_of(all[i].row)].push_back(static_cast<int>(i));
  REQUIRE(groups.size() >= 10);

  const MachineModel def = machine_model_h200();
  std::vector<double> held(all.size());
  std::vector<std::string> leans(all.size());
  // One line per fold: the constants it fitted, in kFitted's order.
  std::ostringstream values;
  values << "fold (held out)       ";
  for (const auto& k : kFitted) values << " " << k.key;
  values << "\ndefaults              ";
  for (const auto& k : kFitted) values << " " << fmt("%.4g", def.*k.field);
  values << "\n";
  for (const auto& [name, out_rows] : groups) {
    std::vector<int> in_rows;
    for (const auto& [other, rows] : groups)
      if (other != name) in_rows.insert(in_rows.end(), rows.begin(), rows.end());
    const MachineModel m = fit(all, in_rows, def);
    std::string free_keys;
    for (int c = 0; c < kConstants; ++c) {
      if (!left_free(all, in_rows, m, def, c)) continue;
      free_keys += std::string(free_keys.empty() ? "" : ",") + kFitted[c].key;
      // A held-out row that depends on a constant its training rows leave free is predicted with
      // the default (fitted with it) or the end of the search's range: it tests nothing of that
      // constant. Noted beside its error.
      for (int i : out_rows)
        if (pinned(all, {i}, m, c)) leans[i] += std::string(leans[i].empty() ? "" : ",") + kFitted[c].key;
    }
    for (int i : out_rows) held[i] = log_error(all[i], m);
    char head[64];
    snprintf(head, sizeof head, "%-22s", name.c_str());
    values << head;
    for (const auto& k : kFitted) values << " " << fmt("%.4g", m.*k.field);
    if (!free_keys.empty()) values << "  (left free: " << free_keys << ")";
    values << "\n";
  }

  // Errors as the in-sample test reports them: predicted / measured - 1.
  //
  // What is asserted, and why not simply 15% on every row. The held-out errors do not all meet the
  // in-sample test's 15% (docs/tuner.md, "Held-out check", has the numbers):
  // - A held-out row whose prediction depends on a constant its fold's training rows leave free (no
  //   training row moves when it moves by 1%, or the search ran it to the end of its range) tests
  //   nothing of that constant: it is predicted with the default, fitted with that row, or with
  //   the end of the range. Such rows are listed in kUntestable, printed, and not bounded. The
  //   largest are the one-node GEMM+RS/AR 8192 rows (r01-r06, +58% to +212%): they are the only rows
  //   that pin the per-tile count cost, and without them tile_signal_us runs to 16x its default
  //   (the 2 x 2 rows hide it behind the socket exchange). The others (a10: sm_mover_busy; n02,
  //   n05, n09, n12: socket_channel_gbps with fewer than 4 channels) stay within 6.2% only because
  //   the default they lean on was fitted with them. The list is checked, so it fails when rows are
  //   added that pin those constants, and then their rows must meet kTestableBound like the rest.
  // - Every other row is bounded by kTestableBound, 20%: the largest held-out error among them is
  //   18.2% (r11: latency_us fitted without the 256-row shapes comes out at 5.8 us, not 10), and
  //   at most kOutsideAllowed of them may exceed 15% (g12, g30: tile_overhead_us fitted without the
  //   K = 1792 GEMM shape comes out at 1.7 us, not 3; r11).
  // - The median over every row stays within kMedianBound, the in-sample test's bound.
  constexpr double kTolerance = 0.15;
  constexpr double kTestableBound = 0.20;
  constexpr int kOutsideAllowed = 3;
  constexpr double kMedianBound = 0.06;
  const std::set<std::string> kUntestable = {"a10", "r01", "r02", "r03", "r04", "r05",
                                             "r06", "n02", "n05", "n09", "n12"};
  std::ostringstream table;
  table << "row  fold                   measured         held-out in-sample\n";
  std::vector<double> errors;
  std::set<std::string> untestable;  // rows that depend on a constant their fold leaves free
  int outside = 0, outside_testable = 0;
  double worst_testable = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const double e = std::exp(held[i]) - 1, e_in = std::exp(log_error(all[i], def)) - 1;
    const bool testable = leans[i].empty();
    if (!testable) untestable.insert(all[i].row.row);
    errors.push_back(std::fabs(e));
    if (std::fabs(e) > kTolerance) ++outside, outside_testable += testable;
    if (testable) worst_testable = std::max(worst_testable, std::fabs(e));
    char line[256];
    snprintf(line, sizeof line, "%-4s %-22s %8.3f %-6s %+7.1f%% %+7.1f%%%s%s%s\n", all[i].row.row.c_str(),
             group_of(all[i].row).c_str(), all[i].row.measured, all[i].row.unit.c_str(), e * 100, e_in * 100,
             std::fabs(e) > kTolerance ? "  <-- outside" : "",
             testable ? "" : "  (its fold leaves free: ", testable ? "" : (leans[i] + ")").c_str());
    table << line;
  }
  std::vector<double> sorted = errors;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2], worst = sorted.back();
  table << "held-out max error " << fmt("%.1f", worst * 100) << "%, median " << fmt("%.1f", median * 100) << "%, "
        << outside << " of " << all.size() << " rows outside " << kTolerance * 100 << "%; without the rows that "
        << "lean on a constant their fold leaves free: max " << fmt("%.1f", worst_testable * 100) << "%, "
        << outside_testable << " outside\n";
  table << "\nfitted constants per fold (each fold fitted without the rows of its group)\n" << values.str();
  INFO(table.str());
  if (getenv("WEFT_TUNER_FIT_TABLE")) printf("%s", table.str().c_str());
  CHECK(untestable == kUntestable);
  CHECK(median <= kMedianBound);
  CHECK(worst_testable <= kTestableBound);
  CHECK(outside_testable <= kOutsideAllowed);
}
