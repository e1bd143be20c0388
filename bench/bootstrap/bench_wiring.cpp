// One rank of the bootstrap + wiring benchmark: PMIx init, fence+modex, and transport wiring
// (Transport::create: backends listen, one endpoint allgather, every connection opened), timed.
//
//   weftrun exec -n N [--emulate-nodes K] -- bench_wiring [--iters 20] [--reps 5] [--peers all|rails]
//   srun -N 2 --ntasks-per-node=T --mpi=pmix bench_wiring ...
//
// Rank 0 prints one JSON document. Per iteration (repetition) the slowest rank counts, as a job
// waits for its slowest rank; median/min/max over iterations. "init" is PmixBootstrap::connect (PMIx_Init
// and the identity queries), slowest rank, once. "modex" is an allgather of a 40-byte blob after a
// barrier. "wire" is Transport::create with the socket backend and a 1 MiB host heap after a barrier,
// then Transport::stop and destroy (not timed) before the next repetition: `--peers all` connects
// every other rank (`weftrun check --transport`), `--peers rails` only the rail peers on other nodes
// (what the fused ops open; transport/peer_set.h). The topology lookup is left out (use_topology
// off), so the figures are the exchange and the connects.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/log.h"
#include "bootstrap/pmix_bootstrap.h"
#include "transport/heap.h"
#include "transport/transport.h"

using namespace weft;

namespace {

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Every rank's vector of `n` times -> per index the slowest rank's (on every rank).
Status slowest(bootstrap::Bootstrap& boot, const std::string& key, const std::vector<double>& mine,
               std::vector<double>* out) {
  bootstrap::Blob blob(mine.size() * sizeof(double));
  if (!mine.empty()) memcpy(blob.data(), mine.data(), blob.size());
  std::vector<bootstrap::Blob> all;
  WEFT_CHECK(boot.allgather(key, blob, &all));
  out->assign(mine.size(), 0);
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].size() != blob.size()) {
      WEFT_WARN(kBoot, "rank %d: bench_wiring: rank %zu sent %zu bytes of times for '%s', expected %zu",
                boot.info().rank, r, all[r].size(), key.c_str(), blob.size());
      return Status::kProtocolError;
    }
    for (size_t i = 0; i < mine.size(); ++i) {
      double v;
      memcpy(&v, all[r].data() + i * sizeof v, sizeof v);
      (*out)[i] = std::max((*out)[i], v);
    }
  }
  return Status::kOk;
}

nlohmann::json stats(std::vector<double> v) {
  if (v.empty()) return nullptr;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  const double med = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  return {{"median", med}, {"min", v.front()}, {"max", v.back()}, {"samples", n}};
}

Status run(bootstrap::PmixBootstrap& boot, double init_us, int iters, int reps, bool all_peers) {
  const bootstrap::RankInfo& me = boot.info();
  const bootstrap::Blob blob(40, static_cast<uint8_t>(me.rank));
  std::vector<double> modex, wire;
  for (int it = 0; it < iters; ++it) {
    WEFT_CHECK(boot.barrier("bench_wiring.modex." + std::to_string(it)));
    std::vector<bootstrap::Blob> got;
    const double t0 = now_us();
    WEFT_CHECK(boot.allgather("bench_wiring.blob." + std::to_string(it), blob, &got));
    modex.push_back(now_us() - t0);
  }
  std::unique_ptr<transport::HostHeap> heap;
  WEFT_CHECK(transport::HostHeap::create(1 << 20, &heap));
  int peers = 0;
  for (int r = 0; r < reps; ++r) {
    transport::TransportOptions to;
    to.backend = "socket";
    to.peers = all_peers ? transport::PeerNeed::kEveryRank : transport::PeerNeed::kRails;
    to.use_topology = false;
    std::unique_ptr<transport::Transport> t;
    WEFT_CHECK(boot.barrier("bench_wiring.wire." + std::to_string(r)));
    const double t0 = now_us();
    WEFT_CHECK(transport::Transport::create(boot, heap->region(), to, &t));
    wire.push_back(now_us() - t0);
    // Nothing was sent; every rank has connected once all are past this barrier.
    WEFT_CHECK(boot.barrier("bench_wiring.wired." + std::to_string(r)));
    peers = t->connections_opened();  // what this rank's transport opened (one channel)
    WEFT_CHECK(t->stop());
  }

  std::vector<double> init_max, modex_max, wire_max;
  WEFT_CHECK(slowest(boot, "bench_wiring.t.init", {init_us}, &init_max));
  WEFT_CHECK(slowest(boot, "bench_wiring.t.modex", modex, &modex_max));
  WEFT_CHECK(slowest(boot, "bench_wiring.t.wire", wire, &wire_max));
  if (me.rank == 0) {
    nlohmann::json doc = {{"ranks", me.size},
                          {"nodes", me.num_nodes},
                          {"peers", all_peers ? "all" : "rails"},
                          {"connections_per_rank", peers},
                          {"init_us", init_max[0]},
                          {"modex_us", stats(modex_max)},
                          {"wire_us", stats(wire_max)}};
    printf("%s\n", doc.dump().c_str());
  }
  return Status::kOk;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_wiring: one rank of the bootstrap + wiring benchmark (start it under weftrun exec or srun)"};
  int iters = 20, reps = 5;
  std::string peers = "all";
  app.add_option("--iters", iters, "fence+modex rounds")->check(CLI::Range(1, 10000));
  app.add_option("--reps", reps, "wirings (Transport::create) in a row")->check(CLI::Range(1, 1000));
  app.add_option("--peers", peers, "all: every other rank; rails: the rail peers on other nodes (the fused ops')")
      ->check(CLI::IsMember({"all", "rails"}));
  CLI11_PARSE(app, argc, argv);

  const double t0 = now_us();
  std::unique_ptr<bootstrap::PmixBootstrap> boot;
  if (bootstrap::PmixBootstrap::connect(&boot) != Status::kOk) return 2;  // connect said why
  const double init_us = now_us() - t0;
  Status s = run(*boot, init_us, iters, reps, peers == "all");
  if (s != Status::kOk) {
    boot->abort(std::string("bench_wiring failed: ") + to_string(s));
    return 1;
  }
  return 0;
}
