// The measured 4x H200 rows (tests/runtime/data/h200_measured.csv) and their replay through the tuner's predict().
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/tuner.h"
#include "runtime/workload.h"

namespace weft::testing {

// One row of tests/runtime/data/h200_measured.csv (the header there says what each column is).
struct Measured {
  std::string row, commit, op, path, mover, part, unit, note;
  int64_t m = 0, n = 0, k = 0;
  int nodes = 1, gpus = 1, split_tail = 0, channels = 0;
  RoleCounts roles{};
  double measured = 0;
};

inline std::vector<Measured> measured_rows() {
  std::ifstream f(std::string(WEFT_SOURCE_DIR) + "/tests/runtime/data/h200_measured.csv");
  REQUIRE(f.good());
  std::vector<Measured> out;
  std::string line;
  bool header = false;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> c;
    std::stringstream ss(line);
    for (std::string cell; std::getline(ss, cell, ',');) c.push_back(cell);
    if (!header) {
      REQUIRE(c.size() == 20);
      CHECK(c[0] == "row");
      CHECK(c[17] == "measured");
      header = true;
      continue;
    }
    REQUIRE_MESSAGE(c.size() >= 20, line);  // the note may hold commas
    Measured r;
    r.row = c[0], r.commit = c[1], r.op = c[2];
    r.m = std::stoll(c[3]), r.n = std::stoll(c[4]), r.k = std::stoll(c[5]);
    r.nodes = std::stoi(c[6]), r.gpus = std::stoi(c[7]);
    r.path = c[8], r.mover = c[9];
    r.roles = RoleCounts{std::stoi(c[10]), std::stoi(c[11]), std::stoi(c[12]), std::stoi(c[13])};
    r.split_tail = std::stoi(c[14]), r.channels = std::stoi(c[15]);
    r.part = c[16], r.measured = std::stod(c[17]), r.unit = c[18], r.note = c[19];
    out.push_back(r);
  }
  return out;
}

// The workload the row ran (its op, shape and layout), parsed once so that a fit can replay the row
// under many models without parsing it again.
inline runtime::Workload measured_workload(const Measured& r) {
  const bool gemm_only = r.op == "gemm";
  std::string text = "op: " + (gemm_only ? std::string("ag_gemm") : r.op) + "\nshape: {m: " + std::to_string(r.m) +
                     ", n: " + std::to_string(r.n) + ", k: " + std::to_string(r.k) +
                     "}\nlayout: {nodes: " + std::to_string(r.nodes) + ", gpus_per_node: " + std::to_string(r.gpus) +
                     "}\n";
  if (r.nodes > 1) text += "transport: {inter_node: socket}\n";  // emulated nodes: no RDMA NIC
  runtime::Workload w;
  std::string err;
  REQUIRE_MESSAGE(runtime::parse_workload(text, "t.yaml", &w, &err) == Status::kOk, err);
  return w;
}

// The row's op through compute_demand, link_rates and predict() with the roles, mover, path and
// channels it ran with; the prediction in the row's unit. `w` is measured_workload(r).
inline double replay(const Measured& r, const runtime::Workload& w, const runtime::MachineModel& base) {
  using namespace weft::runtime;
  MachineModel model = base;
  if (r.channels > 0) model.net_channels = r.channels;
  LinkRates rates;
  std::string err;
  REQUIRE_MESSAGE(link_rates(w, w.layout, {}, {}, model, &rates, &err) == Status::kOk, err);
  Plan tiles;
  Demand d = compute_demand(w, w.layout, model, tiles);
  const double flops = d.flops, nvlink_in = d.nvlink_in;
  d.split_tail = r.split_tail != 0;
  d.intra_mover = r.mover == "copy_engine" ? IntraMover::kCopyEngine : IntraMover::kSm;
  if (r.op == "gemm_rs" || r.op == "gemm_ar") {
    d.sequential = r.path == "peer";
    d.tile_counts = !d.sequential;
  }
  if (r.part == "gemm" || (r.part == "transfer" && r.mover == "none")) {
    // The GEMM alone (no signals, nothing to fold), or the proxy exchange with no NVLink move.
    d.nvlink_out = d.nvlink_in = 0;
    if (r.part == "gemm") d.nic_out = d.nic_in = d.reduce_bytes = d.fold_bytes = 0, d.tile_counts = false;
  }
  if (r.part == "transfer") d.groups.clear(), d.flops = d.hbm_bytes = 0;
  Plan p;
  predict(d, rates, model, r.roles, &p);
  if (r.unit == "tflops") return flops / p.makespan_s / 1e12;
  if (r.unit == "gbps") return nvlink_in / p.makespan_s / 1e9;
  REQUIRE(r.unit == "ms");
  return p.makespan_s * 1e3;
}

inline double replay(const Measured& r, const runtime::MachineModel& base) {
  return replay(r, measured_workload(r), base);
}

}  // namespace weft::testing
