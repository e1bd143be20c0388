// Runs of an op on the simulator: per-rank streams and the boundaries between runs, shared by the
// op models (ag_nodes_model.h, rs_nodes_model.h).
//
//   run e, rank r:  main: begin (waits: every stream of r done with run e-1; with the harness
//                   barrier, every rank joined run e-1) ─► ... ─► join (every stream done with e)
//                   other streams: their first action of run e waits for r's begin
//
// The barrier is what the benchmark harness does before each timed run (a one-word all-reduce);
// without it a fast rank's run e+1 may reach a slow rank still in run e, which the simulator
// then checks as well.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tests/sim/dataflow_sim.h"

namespace weft::sim {

class RunModel {
 public:
  RunModel(Sim* sim, int world, bool barrier);
  Sim& sim() { return *sim_; }
  // The stream `name` of `rank` ("main" is made first, for every rank).
  int stream(int rank, const std::string& name);
  int main_stream(int rank) const { return main_[size_t(rank)]; }
  // Adds the begin action of run e on every rank's main stream.
  void begin_run(uint64_t e);
  // Adds an action of the current run (its stream's first action of the run also waits for begin).
  void add(Action a);
  // The stream has nothing more in this run: it raises its done flag (at most once per run).
  void finish(int stream);
  // What an action waits on to follow everything `stream` does in this run.
  Wait finished(int stream) const;
  // Finishes every stream and adds each rank's join action.
  void end_run();

 private:
  Sim* sim_;
  int world_;
  bool barrier_;
  uint64_t run_ = 0;
  int k_begun_, k_done_, k_joined_;
  std::vector<int> main_;
  std::vector<uint64_t> last_run_;      // per stream: the run of its last action
  std::vector<uint64_t> finished_run_;  // per stream: the last run it finished
};

}  // namespace weft::sim
