// Run boundaries of run_model.h.
#include "tests/sim/run_model.h"

namespace weft::sim {

RunModel::RunModel(Sim* sim, int world, bool barrier) : sim_(sim), world_(world), barrier_(barrier) {
  k_begun_ = sim_->kind("run begun");
  k_done_ = sim_->stream_kind("end of run");
  k_joined_ = sim_->kind("run joined");
  for (int r = 0; r < world_; ++r) main_.push_back(stream(r, "main"));
}

int RunModel::stream(int rank, const std::string& name) {
  const int s = sim_->stream(rank, name);
  if (size_t(s) >= last_run_.size()) {
    last_run_.resize(size_t(s) + 1, 0);
    finished_run_.resize(size_t(s) + 1, 0);
  }
  return s;
}

void RunModel::begin_run(uint64_t e) {
  run_ = e;
  for (int r = 0; r < world_; ++r) {
    Action a;
    a.stream = main_[size_t(r)];
    a.what = "begin run " + std::to_string(e);
    if (barrier_)
      for (int q = 0; q < world_; ++q) a.waits.push_back({Key{q, k_joined_}, e - 1});
    a.sets.push_back({Key{r, k_begun_}, e});
    last_run_[size_t(a.stream)] = e;
    sim_->add(std::move(a));
  }
}

void RunModel::add(Action a) {
  const int r = sim_->stream_rank(a.stream);
  if (last_run_[size_t(a.stream)] != run_) {
    a.waits.push_back({Key{r, k_begun_}, run_});
    last_run_[size_t(a.stream)] = run_;
  }
  sim_->add(std::move(a));
}

void RunModel::finish(int stream) {
  if (finished_run_[size_t(stream)] == run_) return;
  finished_run_[size_t(stream)] = run_;
  Action a;
  a.stream = stream;
  a.what = "end of run " + std::to_string(run_);
  a.sets.push_back({Key{sim_->stream_rank(stream), k_done_, stream}, run_});
  add(std::move(a));
}

Wait RunModel::finished(int stream) const { return {Key{sim_->stream_rank(stream), k_done_, stream}, run_}; }

void RunModel::end_run() {
  for (int s = 0; s < sim_->num_streams(); ++s)
    if (s != main_[size_t(sim_->stream_rank(s))]) finish(s);
  for (int r = 0; r < world_; ++r) {
    Action a;
    a.stream = main_[size_t(r)];
    a.what = "join run " + std::to_string(run_);
    for (int s = 0; s < sim_->num_streams(); ++s)
      if (sim_->stream_rank(s) == r && s != a.stream) a.waits.push_back(finished(s));
    a.sets.push_back({Key{r, k_joined_}, run_});
    add(std::move(a));
  }
}

}  // namespace weft::sim
