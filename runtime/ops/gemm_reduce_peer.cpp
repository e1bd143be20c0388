// GEMM+RS / GEMM+AR, peer path (small M, latency-bound): the GEMM stores the partial in a buffer
// every rank maps, then one kernel sums this rank's rows of all partials over NVLink (and, for
// AllReduce, gets every rank's reduced rows). Variants (WEFT_GEMM_REDUCE_PEER):
//   pull        kernels/small_reduce_plan.h: a flag round, then every 16-byte vector of the own rows
//               loaded from all W partials at once and summed; AllReduce pushes the sum into every
//               peer's C from registers (two-shot) and ends with one counted flag round. Launched as
//               a programmatic dependent of the GEMM (it starts while the GEMM drains).
//   pull_nopdl  the same, launched after the GEMM has completed
//   oneshot     AllReduce: every rank pulls all m rows of all partials and sums them itself (one
//               flag round, W times the NVLink bytes of the reduction)
//   previous    the first peer kernel (launch_peer_reduce): three flag rounds, gather by pulls
//   pull_tiles  pull, but the GEMM counts its finished tiles (system scope) in a word its peers read
//               over NVLink instead of the ready round after it (single-shard GEMM schedules only)
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/params.h"
#include "kernels/gemm.h"
#include "kernels/reduce_slots.h"
#include "runtime/ops/cuda_check.h"
#include "runtime/ops/gemm_reduce.h"

namespace weft::runtime::ops {

using bf16 = __nv_bfloat16;

namespace {

enum PeerVariant { kPull = 0, kPullNoPdl = 1, kOneShot = 2, kPrevious = 3, kPullTiles = 4, kNumVariants = 5 };
const char* const kVariantNames[kNumVariants] = {"pull", "pull_nopdl", "oneshot", "previous", "pull_tiles"};

kernels::SmallReduceMode mode_of(const GemmReduce& op, int variant) {
  if (!op.all_reduce) return kernels::SmallReduceMode::kReduceScatter;
  return variant == kOneShot ? kernels::SmallReduceMode::kAllReduceOneShot
                             : kernels::SmallReduceMode::kAllReduceTwoShot;
}

// max_blocks 0: WEFT_GEMM_REDUCE_PEER_BLOCKS.
Status make_plan(const GemmReduce& op, kernels::SmallReduceMode mode, kernels::SmallReducePlan* plan,
                 int max_blocks = 0) {
  const char* why = nullptr;
  if (!kernels::SmallReducePlan::make(mode, op.world, op.rank, op.m_loc * op.n,
                                      max_blocks ? max_blocks : op.peer_max_blocks, plan, &why)) {
    WEFT_WARN(kKernel, "rank %d: peer path: no plan for %lld x %lld over %d ranks: %s", op.rank,
              static_cast<long long>(op.m), static_cast<long long>(op.n), op.world, why);
    return Status::kInvalidArgument;
  }
  return Status::kOk;
}

// One launch of the small-shape kernel on the partial copy of the next epoch.
Status launch_small(GemmReduce& op, kernels::SmallReduceMode mode, uint32_t skip, bool after_gemm, int max_blocks = 0,
                    bool from_tiles = false) {
  kernels::SmallReduceArgs args;
  WEFT_CHECK(make_plan(op, mode, &args.plan, max_blocks));
  args.epoch = op.peer_epoch;
  const int64_t copy = kernels::SmallReducePlan::parity(op.peer_epoch) * op.m * op.n;
  for (int q = 0; q < op.world; ++q) {
    args.src[q] = op.peer_partials.peer<bf16>(q) + copy;
    args.words_out[q] = op.peer_words.peer<uint64_t>(q);
    if (op.all_reduce) args.push[q] = op.c_full.peer<bf16>(q) + args.plan.region;
  }
  args.words_in = op.peer_words.local<uint64_t>();
  op.peer_gathered = args.plan.gathered_after(op.peer_gathered);
  args.gathered = op.peer_gathered;
  args.out = op.all_reduce ? op.c_full.local<bf16>() + args.plan.region : op.out;
  args.skip = skip;
  if (from_tiles) {
    for (int q = 0; q < op.world; ++q) args.tiles[q] = op.peer_words.peer<uint64_t>(q) + args.plan.tiles_word();
    args.tiles_target = op.peer_tiles;
  }
  return kernels::launch_small_reduce(args, op.frame_params, after_gemm, op.main);
}

Status enqueue_previous(GemmReduce& op) {
  // Its block counts expect `epoch` launches of this kernel; the other variants advance the epoch too.
  for (int i = 0; i < 2; ++i) WEFT_CHECK(stream_write_u64(op.main, op.arrive + i, (op.epoch - 1) * op.peer_blocks));
  kernels::EpiStoreBf16 epi{op.partial.local<bf16>(), op.n, op.n % 2 == 0};
  WEFT_CHECK(kernels::launch_gemm(op.gemm, op.frame_params, epi, kernels::FlagGate{}, kernels::TileSignal{}, op.main,
                                  bench_gemm_options()));
  kernels::PeerReduceArgs pr;
  pr.ranks = op.world;
  pr.rank = op.rank;
  pr.elems = op.m_loc * op.n;
  const int64_t own = int64_t(op.rank) * op.m_loc * op.n;
  pr.out = op.all_reduce ? op.c_full.local<bf16>() + own : op.out;
  pr.all_gather = op.all_reduce;
  for (int q = 0; q < op.world; ++q) {
    pr.src[q] = op.partial.peer<bf16>(q) + own;
    pr.flags_out[q] = op.peer_flags.peer<uint64_t>(q);
    if (op.all_reduce) {
      pr.gather_src[q] = op.c_full.peer<bf16>(q) + int64_t(q) * op.m_loc * op.n;
      pr.gather_dst[q] = op.c_full.local<bf16>() + int64_t(q) * op.m_loc * op.n;
    }
  }
  pr.flags_in = op.peer_flags.local<uint64_t>();
  pr.arrive = op.arrive;
  pr.epoch = op.epoch;
  return kernels::launch_peer_reduce(pr, op.frame_params, op.peer_blocks, op.main);
}

}  // namespace

Status GemmReduce::setup_peer(bootstrap::Bootstrap& boot, const std::string& key) {
  std::string want, sweep;
  WEFT_CHECK(get_param("WEFT_GEMM_REDUCE_PEER", &want));
  WEFT_CHECK(get_param("WEFT_GEMM_REDUCE_PEER_SWEEP", &sweep));
  if (sweep != "auto" && sweep != "0" && sweep != "1") {
    WEFT_WARN(kKernel, "rank %d: WEFT_GEMM_REDUCE_PEER_SWEEP='%s' is not auto, 0 or 1", rank, sweep.c_str());
    return Status::kInvalidArgument;
  }
  peer_sweep = sweep == "1" || (sweep == "auto" && !overlap);
  // auto: measured on 4x H200 (docs/ops.md, "Small shapes").
  peer_variant = kPull;
  if (want != "auto") {
    peer_variant = -1;
    for (int v = 0; v < kNumVariants; ++v)
      if (want == kVariantNames[v]) peer_variant = v;
    if (peer_variant < 0 || (peer_variant == kOneShot && !all_reduce) || (peer_variant == kPullTiles && overlap)) {
      WEFT_WARN(kKernel,
                "rank %d: WEFT_GEMM_REDUCE_PEER='%s' is not auto, pull, pull_nopdl, oneshot (AllReduce only), "
                "previous or pull_tiles (peer path only)",
                rank, want.c_str());
      return Status::kInvalidArgument;
    }
  }
  if (overlap && !peer_sweep) return Status::kOk;  // the same decision on every rank (same environment)
  int sms = 0;
  WEFT_CHECK(kernels::device_sm_count(&sms));
  double most = 0;  // every rank must run the same block count (the gathered counts): the smallest GPU's
  WEFT_CHECK(max_over_ranks(boot, key + "peer_sms", -double(sms), &most));
  peer_sms = int(-most);
  int64_t blocks = 0;
  WEFT_CHECK(get_param("WEFT_GEMM_REDUCE_PEER_BLOCKS", &blocks));
  peer_max_blocks = blocks > 0 && blocks < peer_sms ? int(blocks) : peer_sms;
  heap.take(2 * size_t(m * n) * sizeof(bf16), &peer_partials);  // bound (zero) when the runner creates its heap
  heap.take(sizeof(uint64_t) * size_t(kernels::SmallReducePlan::words(world)), &peer_words);
  kernels::SmallReducePlan plan;
  return make_plan(*this, mode_of(*this, peer_variant), &plan);
}

// Without setup_peer (a runner that never called it) only the previous kernel has its buffers.
const char* GemmReduce::peer_variant_name() const { return kVariantNames[peer_sms ? peer_variant : kPrevious]; }

Status GemmReduce::enqueue_peer() {
  if (peer_variant == kPrevious || peer_sms == 0) return enqueue_previous(*this);
  ++peer_epoch;
  const int64_t copy = kernels::SmallReducePlan::parity(peer_epoch) * m * n;
  kernels::EpiStoreBf16 epi{peer_partials.local<bf16>() + copy, n, n % 2 == 0};
  kernels::TileSignal signal;
  const bool from_tiles = peer_variant == kPullTiles;
  if (from_tiles) {  // one shard: every tile adds 1 to flags[0]
    signal.flags = peer_words.local<uint64_t>() + kernels::SmallReducePlan::words(world) - 1;
    signal.granularity = kernels::kFlagPerShard;
    signal.add = 1;
    peer_tiles += uint64_t(gemm.sched.num_tiles());
  }
  WEFT_CHECK(kernels::launch_gemm(gemm, frame_params, epi, kernels::FlagGate{}, signal, main, bench_gemm_options()));
  return launch_small(*this, mode_of(*this, peer_variant), 0, peer_variant != kPullNoPdl, 0, from_tiles);
}

Status GemmReduce::peer_rows(ncclComm_t comm, bootstrap::Bootstrap& boot, const std::string& key, int warm, int iters,
                             const std::function<Status(const char*)>& validate, std::vector<ResultRow>* rows) {
  if (!peer_sweep || peer_sms == 0) return Status::kOk;
  const bool was_overlap = overlap;
  const int chosen = peer_variant;
  overlap = false;
  const double flops = 2.0 * double(m) * double(n) * double(k_loc);
  auto tf = [&](double ms) { return flops / (ms * 1e-3) / 1e12; };
  auto check = [&](const char* what, const kernels::SmallReducePlan& plan) {
    kernels::describe_small_reduce_error(frame.record(), plan, what);
    return frame.check(what);
  };
  char what[128], note[192];
  // Every variant of the fused op: validated (and repeated bit for bit with WEFT_DETERMINISTIC), then timed.
  for (int v = 0; v < kNumVariants; ++v) {
    if ((v == kOneShot && !all_reduce) || v == kPullTiles) continue;  // pull_tiles: last, below
    if (v == chosen && !was_overlap) continue;                        // timed as "weft fused"
    peer_variant = v;
    kernels::SmallReducePlan plan;
    WEFT_CHECK(make_plan(*this, mode_of(*this, v), &plan));
    snprintf(what, sizeof what, "%s peer path, %s", all_reduce ? "gemm_ar" : "gemm_rs", kVariantNames[v]);
    Status st = validate(what);
    if (st != Status::kOk) {
      check(what, plan);
      return st;
    }
    host_us = 0;
    host_runs = 0;
    double t = 0, mx = 0, host = 0;
    WEFT_CHECK(time_op(
        comm, main, warm, iters, [&] { return enqueue_fused(); }, &t, [&] { unstick(); }));
    WEFT_CHECK(check(what, plan));
    WEFT_CHECK(max_over_ranks(boot, key + "peer_t_" + kVariantNames[v], t, &mx));
    WEFT_CHECK(
        max_over_ranks(boot, key + "peer_h_" + kVariantNames[v], host_us / double(host_runs ? host_runs : 1), &host));
    snprintf(note, sizeof note, "validated; %d blocks; host enqueue %.0f us",
             v == kPrevious ? peer_blocks : plan.blocks, host);
    rows->push_back({std::string("weft peer path: ") + kVariantNames[v], mx, tf(mx), note});
  }
  // The default variant with one block per SM (more SMs issuing NVLink traffic).
  if (peer_max_blocks != peer_sms) {
    const int saved = peer_max_blocks;
    peer_max_blocks = peer_sms;
    peer_variant = kPull;
    kernels::SmallReducePlan plan;
    WEFT_CHECK(make_plan(*this, mode_of(*this, kPull), &plan));
    snprintf(what, sizeof what, "%s peer path, pull, %d blocks", all_reduce ? "gemm_ar" : "gemm_rs", plan.blocks);
    Status st = validate(what);
    if (st != Status::kOk) {
      check(what, plan);
      return st;
    }
    double t = 0, mx = 0;
    WEFT_CHECK(time_op(
        comm, main, warm, iters, [&] { return enqueue_fused(); }, &t, [&] { unstick(); }));
    WEFT_CHECK(check(what, plan));
    WEFT_CHECK(max_over_ranks(boot, key + "peer_t_wide", t, &mx));
    snprintf(note, sizeof note, "validated; %d blocks (WEFT_GEMM_REDUCE_PEER_BLOCKS=0)", plan.blocks);
    rows->push_back({"weft peer path: pull, one block per SM", mx, tf(mx), note});
    peer_max_blocks = saved;
  }
  // The reduction kernel alone (no GEMM before it; the partials hold the last run's data), phase by phase.
  // Fewer blocks: how many SMs the NVLink traffic needs.
  struct Diag {
    kernels::SmallReduceMode mode;
    uint32_t skip;
    const char* what;
    int blocks;
  };
  const kernels::SmallReduceMode own = mode_of(*this, kPull);
  const char* full = all_reduce ? "pull + sum + push (two-shot)" : "pull + sum of own rows";
  std::vector<Diag> diags = {{own, kernels::kSmallReduceSkipData, "flag rounds only", 0}};
  if (all_reduce) diags.push_back({own, kernels::kSmallReduceSkipPush, "pull + sum of own rows, no push", 0});
  diags.push_back({own, 0, full, 0});
  for (int b : {8, 32, peer_sms}) diags.push_back({own, 0, full, b});
  if (all_reduce)
    for (int b : {0, peer_sms})
      diags.push_back({kernels::SmallReduceMode::kAllReduceOneShot, 0, "one-shot: pull + sum of all rows", b});
  for (size_t i = 0; i < diags.size(); ++i) {
    const Diag& d = diags[i];
    kernels::SmallReducePlan plan;
    WEFT_CHECK(make_plan(*this, d.mode, &plan, d.blocks));
    double t = 0, mx = 0;
    WEFT_CHECK(time_op(
        comm, main, warm, iters,
        [&] {
          ++peer_epoch;
          return launch_small(*this, d.mode, d.skip, false, d.blocks);
        },
        &t));
    WEFT_CHECK(check("peer reduce alone", plan));
    WEFT_CHECK(max_over_ranks(boot, key + "peer_d" + std::to_string(i), t, &mx));
    snprintf(note, sizeof note, "the reduction kernel alone, %d blocks x %d threads", plan.blocks,
             kernels::SmallReducePlan::kThreads);
    rows->push_back({std::string("peer reduce alone: ") + d.what, mx, 0, note});
  }
  // Last (a stall here leaves the counts of the others behind): the ready round replaced by the
  // GEMM's tile counts; only where the GEMM runs one shard (the peer path's own schedule).
  if (gemm.sched.num_shards == 1 && chosen != kPullTiles) {
    peer_variant = kPullTiles;
    kernels::SmallReducePlan plan;
    WEFT_CHECK(make_plan(*this, mode_of(*this, kPullTiles), &plan));
    snprintf(what, sizeof what, "%s peer path, pull_tiles", all_reduce ? "gemm_ar" : "gemm_rs");
    Status st = validate(what);
    double t = 0, mx = 0;
    if (st == Status::kOk) {
      host_us = 0;
      host_runs = 0;
      st = time_op(
          comm, main, warm, iters, [&] { return enqueue_fused(); }, &t, [&] { unstick(); });
    }
    if (st == Status::kOk) st = check(what, plan);
    WEFT_CHECK(max_over_ranks(boot, key + "peer_t_tiles", st == Status::kOk ? t : 1e9, &mx));
    if (mx < 1e9) {
      snprintf(note, sizeof note, "validated; %d blocks; GEMM tile counts read over NVLink", plan.blocks);
      rows->push_back({"weft peer path: pull_tiles", mx, tf(mx), note});
    } else {
      check(what, plan);
      WEFT_WARN(kKernel, "rank %d: %s failed on some rank (see above); the other rows stand", rank, what);
      rows->push_back({"weft peer path: pull_tiles FAILED", 0, 0, "see the warnings above"});
    }
  }
  overlap = was_overlap;
  peer_variant = chosen;
  return Status::kOk;
}

}  // namespace weft::runtime::ops
