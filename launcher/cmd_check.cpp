// weftrun check: every rank publishes (rank, node, nonce), fences, and verifies every peer's entry;
// rank 0 prints one line per rank and `check passed: N ranks, K nodes` (or one JSON document).
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "base/log.h"
#include "base/params.h"
#include "bootstrap/blob.h"
#include "bootstrap/group_bootstrap.h"
#include "bootstrap/placement.h"
#include "launcher/check_hooks.h"
#include "launcher/commands.h"
#include "launcher/launch.h"
#include "launcher/rank.h"
#include "runtime/workload.h"
#include "transport/nic_placement.h"
#include "transport/transport_bandwidth.h"

namespace weft::launcher {
namespace {

using bootstrap::Blob;
using bootstrap::BlobReader;
using bootstrap::BlobWriter;
using Clock = std::chrono::steady_clock;

constexpr uint16_t kEntryKind = 16, kReportKind = 17, kCheckVersion = 3;
constexpr size_t kMaxProblems = 20;
constexpr int kMaxIters = 1000000000;  // tests run "forever" as 1e8 iterations; 0 and negatives are the errors

struct CheckOptions {
  int ranks = 0;
  int nodes = 1;
  std::string transport;
  int iters = 1;
  bool json = false;
  bool bandwidth = false;  // with --transport: the bandwidth table per signal mode
  std::string group;       // --group: "G" or "NxG"; "": the whole job
  int group_nodes = 0, group_gpus = 0;
};

// "4" (1 node x 4) or "2x4"; false for anything else.
bool parse_group(const std::string& text, int* nodes, int* gpus) {
  const size_t x = text.find('x');
  const std::string a = x == std::string::npos ? "1" : text.substr(0, x),
                    b = x == std::string::npos ? text : text.substr(x + 1);
  auto number = [](const std::string& t, int* out) {
    if (t.empty() || t.size() > 6 || t.find_first_not_of("0123456789") != std::string::npos) return false;
    *out = std::stoi(t);
    return *out >= 1;
  };
  return number(a, nodes) && number(b, gpus);
}

// "" when --group tiles a job of nodes x per_node ranks, else why not.
std::string group_misfit(const CheckOptions& o, int nodes, int per_node) {
  if (bootstrap::GroupShape{nodes, per_node, o.group_nodes, o.group_gpus}.valid()) return "";
  return "--group " + o.group + " does not tile the job's " + std::to_string(nodes) + " node(s) x " +
         std::to_string(per_node) + " ranks; expected N dividing the nodes and G dividing the ranks per node";
}

// What each rank tells rank 0 at the end.
struct Report {
  uint32_t rank = 0, node = 0, local_rank = 0, local_size = 0, pid = 0, gpu_count = 0;
  uint32_t group = 0, group_rank = 0;  // --group: this rank's group and rank in it (else 0 and the rank)
  int32_t gpu = -1;
  std::string hostname, bus_id, launched_by, transport_summary, transport_json;
  std::string placement;  // GPU, NIC, port, proxy CPUs (the transport's when --transport ran one)
  std::vector<std::string> problems;
  std::vector<double> modex_us, barrier_us;
};

Blob encode(const Report& r) {
  BlobWriter w;
  for (uint32_t v : {r.rank, r.node, r.local_rank, r.local_size, r.pid, r.gpu_count, static_cast<uint32_t>(r.gpu),
                     r.group, r.group_rank})
    w.u32(v);
  for (const auto* s : {&r.hostname, &r.bus_id, &r.launched_by, &r.transport_summary, &r.transport_json, &r.placement})
    w.str(*s);
  w.u32(static_cast<uint32_t>(r.problems.size()));
  for (const auto& p : r.problems) w.str(p);
  for (const auto* v : {&r.modex_us, &r.barrier_us}) {
    w.u32(static_cast<uint32_t>(v->size()));
    for (double d : *v) w.f64(d);
  }
  return bootstrap::seal_blob(kReportKind, kCheckVersion, w.blob());
}

Status decode(const Blob& sealed, int peer, Report* r) {
  Blob payload;
  WEFT_CHECK(bootstrap::open_blob(sealed, kReportKind, kCheckVersion, peer, "check report", &payload));
  BlobReader rd(payload);
  uint32_t gpu = 0, n = 0;
  bool ok = rd.u32(&r->rank) && rd.u32(&r->node) && rd.u32(&r->local_rank) && rd.u32(&r->local_size) &&
            rd.u32(&r->pid) && rd.u32(&r->gpu_count) && rd.u32(&gpu) && rd.u32(&r->group) && rd.u32(&r->group_rank);
  r->gpu = static_cast<int32_t>(gpu);
  for (auto* s : {&r->hostname, &r->bus_id, &r->launched_by, &r->transport_summary, &r->transport_json, &r->placement})
    ok = ok && rd.str(s);
  ok = ok && rd.u32(&n) && n <= payload.size();
  for (uint32_t i = 0; ok && i < n; ++i) {
    std::string p;
    ok = rd.str(&p);
    r->problems.push_back(p);
  }
  for (auto* v : {&r->modex_us, &r->barrier_us}) {
    ok = ok && rd.u32(&n) && n <= payload.size();
    for (uint32_t i = 0; ok && i < n; ++i) {
      double d = 0;
      ok = rd.f64(&d);
      v->push_back(d);
    }
  }
  if (!ok || !rd.done()) {
    WEFT_WARN(kLaunch, "check: malformed report from rank %d", peer);
    return Status::kProtocolError;
  }
  return Status::kOk;
}

// WEFT_TEST_FAULT=RANK:MODE: lets tests make one rank misbehave the way real ranks do.
void inject_fault(int rank, bootstrap::Bootstrap& boot) {
  std::string spec;
  if (get_param("WEFT_TEST_FAULT", &spec) != Status::kOk || spec.empty()) return;
  size_t colon = spec.find(':');
  if (colon == std::string::npos || atoi(spec.substr(0, colon).c_str()) != rank) return;
  std::string mode = spec.substr(colon + 1);
  fprintf(stderr, "weftrun check: rank %d: injecting fault '%s' (WEFT_TEST_FAULT)\n", rank, mode.c_str());
  fflush(stderr);
  if (mode == "stall") {
    for (;;) pause();  // never arrives at the fence; ends with the launcher's SIGTERM
  } else if (mode == "exit") {
    _exit(0);  // early exit without PMIx_Finalize
  } else if (mode == "crash") {
    signal(SIGSEGV, SIG_DFL);
    raise(SIGSEGV);
  } else if (mode == "abort") {
    boot.abort("injected fault");
    _exit(1);
  }
}

struct Stats {
  double median = 0, min = 0, max = 0;
};
// Per iteration the slowest rank's time (the collective is as slow as its last rank), then
// median / min / max over iterations.
Stats slowest_per_iter(const std::vector<Report>& reports, std::vector<double> Report::*field) {
  size_t iters = (reports[0].*field).size();
  std::vector<double> worst(iters, 0);
  for (const auto& r : reports)
    for (size_t i = 0; i < iters && i < (r.*field).size(); ++i) worst[i] = std::max(worst[i], (r.*field)[i]);
  if (worst.empty()) return {};
  std::sort(worst.begin(), worst.end());
  return {worst[worst.size() / 2], worst.front(), worst.back()};
}

// Job-wide structure rank 0 can check from everyone's report: dense node ids, local ranks forming
// 0..local_size-1 on each node, one hostname per node and distinct hostnames across nodes.
void check_structure(const std::vector<Report>& reports, int num_nodes, std::vector<std::string>* problems) {
  std::map<uint32_t, std::set<uint32_t>> local_ranks;
  std::map<uint32_t, std::string> host_of_node;
  std::map<std::string, uint32_t> node_of_host;
  for (size_t r = 0; r < reports.size(); ++r) {
    const Report& x = reports[r];
    if (x.rank != r) problems->push_back("report " + std::to_string(r) + " claims rank " + std::to_string(x.rank));
    if (x.node >= static_cast<uint32_t>(num_nodes))
      problems->push_back("rank " + std::to_string(r) + " on node " + std::to_string(x.node) + " of " +
                          std::to_string(num_nodes));
    if (!local_ranks[x.node].insert(x.local_rank).second)
      problems->push_back("two ranks on node " + std::to_string(x.node) + " have local rank " +
                          std::to_string(x.local_rank));
    auto h = host_of_node.emplace(x.node, x.hostname);
    if (h.first->second != x.hostname)
      problems->push_back("node " + std::to_string(x.node) + " is both " + h.first->second + " and " + x.hostname);
    auto n = node_of_host.emplace(x.hostname, x.node);
    if (n.first->second != x.node)
      problems->push_back("hostname " + x.hostname + " is on nodes " + std::to_string(n.first->second) + " and " +
                          std::to_string(x.node));
  }
  if (static_cast<int>(local_ranks.size()) != num_nodes)
    problems->push_back("ranks are on " + std::to_string(local_ranks.size()) + " nodes, PMIx says " +
                        std::to_string(num_nodes));
  for (const auto& [node, set] : local_ranks) {
    if (set.empty() || *set.rbegin() + 1 != set.size())
      problems->push_back("node " + std::to_string(node) + ": local ranks are not 0.." +
                          std::to_string(set.size() - 1));
    for (const auto& x : reports)
      if (x.node == node && x.local_size != set.size())
        problems->push_back("rank " + std::to_string(x.rank) + " says its node has " + std::to_string(x.local_size) +
                            " ranks, " + std::to_string(set.size()) + " reported");
  }
}

void print_results(const CheckOptions& o, const RankContext& ctx, const std::vector<Report>& reports,
                   const std::vector<std::string>& problems, const std::vector<transport::BandwidthRow>& bw) {
  bool passed = problems.empty();
  Stats modex = slowest_per_iter(reports, &Report::modex_us);
  Stats barrier = slowest_per_iter(reports, &Report::barrier_us);
  int n = ctx.info.size, k = ctx.info.num_nodes;
  if (o.json) {
    nlohmann::json doc;
    doc["passed"] = passed;
    doc["ranks"] = n;
    doc["nodes"] = k;
    doc["iters"] = o.iters;
    doc["launched_by"] = ctx.launched_by;
    if (!o.group.empty())
      doc["groups"] = {
          {"nodes", o.group_nodes}, {"gpus_per_node", o.group_gpus}, {"count", n / (o.group_nodes * o.group_gpus)}};
    doc["modex_us"] = {{"median", modex.median}, {"min", modex.min}, {"max", modex.max}};
    doc["barrier_us"] = {{"median", barrier.median}, {"min", barrier.min}, {"max", barrier.max}};
    auto& per = doc["per_rank"] = nlohmann::json::array();
    nlohmann::json transport = nlohmann::json::array();
    for (const auto& r : reports) {
      nlohmann::json e = {{"rank", r.rank},         {"node", r.node}, {"local_rank", r.local_rank},
                          {"hostname", r.hostname}, {"pid", r.pid},   {"gpu_count", r.gpu_count}};
      e["gpu"] = r.gpu >= 0 ? nlohmann::json(r.gpu) : nlohmann::json(nullptr);
      e["pci_bus_id"] = r.gpu >= 0 ? nlohmann::json(r.bus_id) : nlohmann::json(nullptr);
      e["placement"] = r.placement;
      if (!o.group.empty()) e["group"] = r.group, e["group_rank"] = r.group_rank;
      per.push_back(e);
      if (!o.transport.empty()) {
        auto t = nlohmann::json::parse(r.transport_json, nullptr, false);
        transport.push_back(t.is_discarded() ? nlohmann::json(r.transport_json) : t);
      }
    }
    if (!o.transport.empty()) {
      // Each rank's object already holds the job's counters summed over ranks: rank 0's is the
      // job's ({"backend", "signal_mode", "puts", "signals", "fences", "batches", "stalls"}).
      nlohmann::json t = (!transport.empty() && transport[0].is_object()) ? transport[0] : nlohmann::json::object();
      t.erase("placement");  // per rank, under per_rank
      t["name"] = o.transport;
      t["per_rank"] = transport;
      doc["transport"] = t;
    }
    if (o.bandwidth) {
      auto& rows = doc["bandwidth"] = nlohmann::json::array();
      for (const auto& r : bw)
        rows.push_back({{"backend", r.backend},
                        {"signal_mode", r.signal_mode},
                        {"bytes", r.bytes},
                        {"count", r.count},
                        {"gbps", r.gbps},
                        {"signal_us", r.signal_us},
                        {"fences", r.counters.fences},
                        {"batches", r.counters.batches},
                        {"stalls", r.counters.stalls}});
    }
    doc["problems"] = problems;
    printf("%s\n", doc.dump(2).c_str());
  } else {
    for (const auto& r : reports) {
      char gpu[96];
      if (r.gpu >= 0)
        snprintf(gpu, sizeof gpu, "GPU %d %s", r.gpu, r.bus_id.c_str());
      else
        snprintf(gpu, sizeof gpu, "no GPU");
      std::vector<double> sorted = r.modex_us;
      std::sort(sorted.begin(), sorted.end());
      double med = sorted.empty() ? 0 : sorted[sorted.size() / 2];
      // The transport's summary ends with what it used ("; used GPU ..., NIC ..., proxy CPUs ..."); without
      // a transport, the placement the mapping gives this rank.
      const std::string tail =
          !r.transport_summary.empty() ? ", " + r.transport_summary : "; placement: " + r.placement;
      const std::string in_group = o.group.empty()
                                       ? std::string()
                                       : ", group " + std::to_string(r.group) + " rank " + std::to_string(r.group_rank);
      printf("rank %u/%d: node %u/%d (%s), local rank %u/%u%s, pid %u, %s, %d iters %s, modex %.0f us%s\n", r.rank, n,
             r.node, k, r.hostname.c_str(), r.local_rank, r.local_size, in_group.c_str(), r.pid, gpu, o.iters,
             r.problems.empty() ? "ok" : "FAILED", med, tail.c_str());
    }
    if (!bw.empty()) {
      std::vector<int> node_of;
      for (const auto& r : reports) node_of.push_back(static_cast<int>(r.node));
      printf("%s", transport::format_bandwidth_table(bw, 0, transport::bandwidth_partner(ctx.info, node_of)).c_str());
    }
    printf("fence+modex (slowest rank): median %.0f us, min %.0f, max %.0f; barrier: median %.0f us (%s, %d iters)\n",
           modex.median, modex.min, modex.max, barrier.median, ctx.launched_by.c_str(), o.iters);
    const std::string groups = o.group.empty()
                                   ? std::string()
                                   : ", " + std::to_string(n / (o.group_nodes * o.group_gpus)) + " groups of " +
                                         std::to_string(o.group_nodes) + " x " + std::to_string(o.group_gpus);
    if (passed) {
      printf("check passed: %d ranks, %d nodes%s\n", n, k, groups.c_str());
    } else {
      for (size_t i = 0; i < problems.size() && i < kMaxProblems; ++i) printf("problem: %s\n", problems[i].c_str());
      printf("check FAILED: %d ranks, %d nodes%s, %zu problems\n", n, k, groups.c_str(), problems.size());
    }
  }
  fflush(stdout);
}

int check_rank(const CheckOptions& o) {
  RankContext ctx;
  std::unique_ptr<bootstrap::PmixBootstrap> boot;
  Status s = start_rank(&ctx, &boot);
  if (s != Status::kOk) {
    fprintf(stderr, "weftrun check: could not start this rank: %s\n", to_string(s));
    fflush(stderr);
    _exit(1);  // a PMIx call may still be stuck on another thread: do not run exit handlers
  }
  const int me = ctx.info.rank, n = ctx.info.size;
  if (o.ranks > 0 && o.ranks != n && me == 0)
    fprintf(stderr, "weftrun check: -n %d ignored: the job has %d ranks\n", o.ranks, n);
  if (o.nodes > 1 && o.nodes != ctx.info.num_nodes && me == 0)
    fprintf(stderr, "weftrun check: --emulate-nodes %d ignored: the launcher placed ranks on %d nodes\n", o.nodes,
            ctx.info.num_nodes);
  inject_fault(me, *boot);

  // --group: the exchanges and the transport check run in each rank group, all groups at once, over
  // a bootstrap that presents the group as a job; the final report is the job's.
  std::unique_ptr<bootstrap::GroupBootstrap> group;
  if (!o.group.empty()) {
    std::string why;
    s = bootstrap::require_block_placement(*boot, 0, "weftrun check --group", &why);
    bootstrap::GroupShape shape;
    if (s == Status::kOk) {
      shape = {ctx.info.num_nodes, n / std::max(1, ctx.info.num_nodes), o.group_nodes, o.group_gpus};
      why = group_misfit(o, shape.nodes, shape.gpus_per_node);
      if (!why.empty()) s = Status::kInvalidArgument;
    }
    if (s == Status::kOk) s = bootstrap::GroupBootstrap::create(boot.get(), shape, &group, &why);
    if (s != Status::kOk) {
      // Every rank reaches the same verdict (the placement and the shape are the job's): one says it.
      if (me == 0) fprintf(stderr, "weftrun check: %s\n", why.c_str());
      return 2;
    }
  }
  bootstrap::Bootstrap& ex = group ? static_cast<bootstrap::Bootstrap&>(*group) : *boot;
  const int ex_me = ex.info().rank, ex_n = ex.info().size;
  const int my_group = group ? group->group() : 0;
  auto job_rank_of = [&](int r) { return group ? group->members()[static_cast<size_t>(r)] : r; };

  Report mine;
  mine.group = static_cast<uint32_t>(my_group);
  mine.group_rank = static_cast<uint32_t>(ex_me);
  mine.rank = me;
  mine.node = ctx.info.node;
  mine.local_rank = ctx.info.local_rank;
  mine.local_size = ctx.info.local_size;
  mine.pid = ctx.pid;
  mine.gpu = ctx.gpu;
  mine.gpu_count = ctx.gpu_count;
  mine.bus_id = ctx.gpu_pci_bus_id;
  mine.hostname = ctx.info.hostname;
  mine.launched_by = ctx.launched_by;
  {
    // What the transport would use (the transport check reports what it did use).
    topology::RankPlacement p = transport::rank_placement(ctx.info, ctx.gpu_pci_bus_id, 1);
    std::vector<transport::ChannelUse> use(p.channels.size());
    for (size_t c = 0; c < p.channels.size(); ++c)
      use[c] = {p.channels[c].nic_name,
                p.channels[c].port,
                p.channels[c].port_state,
                p.channels[c].cpuset,
                transport::usable_cpus(p.channels[c].cpuset),
                false};
    mine.placement = transport::describe_placement(p, use, "");
  }
  std::random_device rd;
  uint64_t nonce = (static_cast<uint64_t>(rd()) << 32 | rd()) ^ (static_cast<uint64_t>(getpid()) << 17) ^
                   static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  nonce |= 1;  // never zero
  std::vector<uint64_t> nonce_of(ex_n, 0);
  std::vector<int64_t> node_of(ex_n, -1);
  auto problem = [&](const std::string& p) {
    if (mine.problems.size() < kMaxProblems) mine.problems.push_back("rank " + std::to_string(me) + ": " + p);
  };

  for (int it = 0; it < o.iters; ++it) {
    BlobWriter w;
    w.u32(ex_me);
    w.u32(ex.info().node);
    w.u32(it);
    w.u64(nonce);
    w.str(ctx.info.hostname);
    w.u32(static_cast<uint32_t>(my_group));  // the source's group and job rank: nothing may cross groups
    w.u32(static_cast<uint32_t>(me));
    std::vector<Blob> all;
    auto t0 = Clock::now();
    s = ex.allgather("check." + std::to_string(it), bootstrap::seal_blob(kEntryKind, kCheckVersion, w.blob()), &all);
    auto t1 = Clock::now();
    if (s != Status::kOk) {
      fprintf(stderr, "weftrun check: rank %d: exchange %d failed: %s\n", me, it, to_string(s));
      return 1;
    }
    for (int r = 0; r < ex_n; ++r) {
      Blob payload;
      if (bootstrap::open_blob(all[r], kEntryKind, kCheckVersion, r, "check entry", &payload) != Status::kOk) {
        problem("iteration " + std::to_string(it) + ": unreadable entry from rank " + std::to_string(r));
        continue;
      }
      BlobReader rdr(payload);
      uint32_t rank = 0, node = 0, iter = 0, from_group = 0, from_job_rank = 0;
      uint64_t nc = 0;
      std::string host;
      if (!(rdr.u32(&rank) && rdr.u32(&node) && rdr.u32(&iter) && rdr.u64(&nc) && rdr.str(&host) &&
            rdr.u32(&from_group) && rdr.u32(&from_job_rank) && rdr.done())) {
        problem("iteration " + std::to_string(it) + ": truncated entry from rank " + std::to_string(r));
        continue;
      }
      std::string from = "iteration " + std::to_string(it) + ", entry of rank " + std::to_string(r) + ": ";
      if (static_cast<int>(rank) != r) problem(from + "says rank " + std::to_string(rank));
      if (static_cast<int>(from_group) != my_group || static_cast<int>(from_job_rank) != job_rank_of(r))
        problem(from + "came from group " + std::to_string(from_group) + ", job rank " + std::to_string(from_job_rank) +
                " (expected group " + std::to_string(my_group) + ", job rank " + std::to_string(job_rank_of(r)) + ")");
      if (static_cast<int>(iter) != it) problem(from + "is from iteration " + std::to_string(iter));
      if (nc == 0 || (nonce_of[r] && nonce_of[r] != nc)) problem(from + "nonce changed (stale or foreign data)");
      if (node_of[r] >= 0 && node_of[r] != node) problem(from + "node changed");
      if (r == ex_me && nc != nonce) problem(from + "my own entry came back altered");
      nonce_of[r] = nc;
      node_of[r] = node;
    }
    auto t2 = Clock::now();
    s = ex.barrier("check." + std::to_string(it));
    auto t3 = Clock::now();
    if (s != Status::kOk) {
      fprintf(stderr, "weftrun check: rank %d: barrier %d failed: %s\n", me, it, to_string(s));
      return 1;
    }
    mine.modex_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    mine.barrier_us.push_back(std::chrono::duration<double, std::micro>(t3 - t2).count());
  }

  if (!o.transport.empty()) {
    register_builtin_check_transports();
    CheckTransportFn fn = find_check_transport(o.transport);
    if (!fn) {
      std::string names;
      for (const auto& t : check_transport_names()) names += " " + t;
      problem("--transport " + o.transport + ": this build has no such transport check (available:" +
              (names.empty() ? std::string(" none") : names) + ")");
    } else {
      CheckTransportReport tr;
      RankContext ex_ctx = ctx;  // the group's identity: its transport connects the group's members
      ex_ctx.info = ex.info();
      Status ts = fn(ex_ctx, ex, o.iters, &tr);
      if (ts != Status::kOk) problem("transport " + o.transport + ": " + to_string(ts));
      mine.transport_summary = tr.summary;
      mine.transport_json = tr.json;
    }
  }

  // --bandwidth: only where every rank's transport check passed (agreed, so no rank waits alone).
  std::vector<transport::BandwidthRow> bw;
  if (o.bandwidth && !o.transport.empty()) {
    std::vector<Blob> oks;
    s = boot->allgather("check.bandwidth.ready", Blob(1, mine.problems.empty() ? 1 : 0), &oks);
    bool all_ok = s == Status::kOk && oks.size() == static_cast<size_t>(n);
    for (const auto& b : oks) all_ok = all_ok && b.size() == 1 && b[0] == 1;
    if (!all_ok) {
      problem("--bandwidth not run: the transport check failed on some rank");
    } else {
      transport::BandwidthOptions bo;
      bo.backend = o.transport;
      Status bs = transport::run_transport_bandwidth(*boot, bo, &bw);
      if (bs != Status::kOk) problem("transport " + o.transport + " bandwidth: " + to_string(bs));
    }
  }

  std::vector<Blob> all;
  s = boot->allgather("check.report", encode(mine), &all);
  if (s != Status::kOk) {
    fprintf(stderr, "weftrun check: rank %d: final report exchange failed: %s\n", me, to_string(s));
    return 1;
  }
  std::vector<Report> reports(n);
  std::vector<std::string> problems;
  for (int r = 0; r < n; ++r) {
    if (decode(all[r], r, &reports[r]) != Status::kOk)
      problems.push_back("unreadable report from rank " + std::to_string(r));
    for (const auto& p : reports[r].problems) problems.push_back(p);
  }
  check_structure(reports, ctx.info.num_nodes, &problems);
  if (me == 0) print_results(o, ctx, reports, problems, bw);
  return problems.empty() ? 0 : 1;
}

// --transport NAME must name a transport check of this build: refused on the command line, before
// any rank starts, rather than by every rank after the bootstrap.
CLI::Validator known_transport() {
  return CLI::Validator(
      [](std::string& name) -> std::string {
        register_builtin_check_transports();
        if (find_check_transport(name)) return "";
        std::string names, near;
        int best = 0;
        for (const auto& t : check_transport_names()) {
          names += (names.empty() ? "" : ", ") + t;
          const int d = runtime::edit_distance(name, t);
          if (near.empty() || d < best) near = t, best = d;
        }
        return "no transport '" + name + "' in this build" +
               (!near.empty() && best <= 2 ? "; did you mean " + near + "?" : "") +
               " (expected one of: " + (names.empty() ? "none" : names) + ")";
      },
      "NAME");
}

}  // namespace

void add_check_command(CLI::App& app, int* exit_code) {
  auto opts = std::make_shared<CheckOptions>();
  auto* sub = app.add_subcommand("check", "start ranks (or join them under srun/mpirun) and verify the bootstrap");
  sub->add_option("-n,--ranks", opts->ranks, "ranks to start (default: one per visible GPU, at least 1)")
      ->check(CLI::Range(1, kMaxRanks));
  sub->add_option("--emulate-nodes", opts->nodes, "split the ranks into K emulated nodes")
      ->check(CLI::Range(1, kMaxRanks));
  sub->add_option("--transport", opts->transport, "also move buffers through this transport (e.g. socket)")
      ->check(known_transport());
  sub->add_option("--iters", opts->iters, "exchanges to run and verify")->check(CLI::Range(1, kMaxIters));
  sub->add_flag("--json", opts->json, "print one JSON document instead of lines");
  sub->add_option("--group", opts->group,
                  "run the exchanges and the transport check in rank groups of G ranks per node (\"4\") or N nodes x "
                  "G (\"2x4\"), all groups at once");
  sub->add_flag("--bandwidth", opts->bandwidth,
                "with --transport: put bandwidth, signal latency, fences and stalls per message size and signal mode "
                "(rank 0 to a rank on another node)");
  sub->callback([opts, exit_code] {
    if (!opts->group.empty() && !parse_group(opts->group, &opts->group_nodes, &opts->group_gpus)) {
      fprintf(stderr, "weftrun check: --group %s: expected G or NxG (ranks per node, or nodes x ranks per node)\n",
              opts->group.c_str());
      *exit_code = 2;
      return;
    }
    if (opts->bandwidth && !opts->group.empty()) {
      fprintf(stderr, "weftrun check: --bandwidth measures the whole job; leave out --group\n");
      *exit_code = 2;
      return;
    }
    if (opts->bandwidth && opts->transport.empty()) {
      fprintf(stderr, "weftrun check: --bandwidth needs --transport NAME (the backend to measure)\n");
      *exit_code = 2;
      return;
    }
    std::string why;
    switch (detect_role(&why)) {
      case Role::kMisLaunched:
        fprintf(stderr, "weftrun check: %s\n", why.c_str());
        *exit_code = 2;
        return;
      case Role::kRank:
        *exit_code = check_rank(*opts);
        return;
      case Role::kLauncher:
        break;
    }
    LaunchOptions lo;
    lo.gpus = visible_gpu_count();
    lo.nodes = opts->nodes;
    lo.ranks = opts->ranks > 0 ? opts->ranks : default_rank_count(lo.gpus, opts->nodes);
    lo.rank_args = own_args();
    // Refused before any rank starts where the launcher knows the shape (every rank checks it again).
    if (!opts->group.empty() && lo.nodes >= 1 && lo.ranks % lo.nodes == 0) {
      const std::string why = group_misfit(*opts, lo.nodes, lo.ranks / lo.nodes);
      if (!why.empty()) {
        fprintf(stderr, "weftrun check: %s\n", why.c_str());
        *exit_code = 2;
        return;
      }
    }
    *exit_code = launch_ranks(lo);
  });
}

}  // namespace weft::launcher
