// weftrun bench for the MoE layer (op: moe), on one node or across nodes (the hierarchical variant):
// weft's runtime op (runtime/exec/moe.h, MoeOp, what `weftrun run` and weft::Moe execute) against
// the sequential layer with NCCL and cuBLAS on the same routing (moe_baseline.h), and the bound of
// docs/moe.md (bench/moe/moe_bound.py):
//   bound = max(compute, communication), compute = the faster of weft's grouped FFN phase and the
//   per-expert cuBLAS FFN, communication = the faster of the NCCL all-to-all-v of the rows alone (out
//   and back, once per (token, destination rank)) and weft's dispatch + arrange + combine phases.
// Each rank's tokens, the router and every expert's weights are fresh random data (shared_seed). First
// one call of each, validated: weft's output on sampled tokens against weft's fp32 reference with its
// own routing (as `weftrun run`), the sequential layer's on every token against weft's; no row dropped.
// Then every row timed interleaved (InterleavedTimer), the max over ranks of each rank's median.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/params.h"
#include "runtime/exec/context.h"
#include "runtime/exec/device_data.h"
#include "runtime/exec/moe.h"
#include "runtime/exec/reference_moe.h"
#include "runtime/ops/cuda_check.h"
#include "runtime/ops/moe_baseline.h"
#include "runtime/ops/op_harness.h"
#include "runtime/ops/ops.h"
#include "runtime/workload.h"
#include "transport/transport.h"

namespace weft::runtime::ops {
namespace {

using bf16 = __nv_bfloat16;
constexpr double kTolerance = 1e-2;  // norm-wise relative error, bf16 outputs (as the other runners)
constexpr int32_t kSamples = 64;     // tokens per rank checked against weft's reference

Status refuse(int rank, const std::string& what) {
  WEFT_WARN(kBench, "rank %d: moe: %s", rank, what.c_str());
  return Status::kInvalidArgument;
}

// The tuner's plan; where it has none (no topology here), the op's defaults: every SM computing, the
// heap as the workload sizes it.
Status moe_plan(const Workload& wl, int rank, int world, Plan* plan) {
  *plan = plan_for(wl, rank);
  if (plan->op != Op::kMoe) {
    int dev = 0, sms = 0;
    WEFT_CUDA_CHECK(cudaGetDevice(&dev));
    WEFT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    *plan = Plan();
    plan->workload = wl.name, plan->source = wl.source, plan->op = Op::kMoe, plan->dtype = wl.dtype;
    plan->nodes = 1, plan->gpus_per_node = world, plan->world_size = world, plan->moe = wl.moe;
    plan->roles.compute = sms;
    plan_execution(wl, IntraMover::kSm, plan);
  }
  if (!plan->exec.executable) return refuse(rank, "this build cannot run the plan: " + plan->exec.not_executable);
  return Status::kOk;
}

// The phases of one call from its MoeOp::record_phases events: route, dispatch, arrange, FFN, combine.
Status phase_ms(const std::vector<cudaEvent_t>& ev, int calls, std::vector<double>* median) {
  constexpr int P = MoeOp::kPhases;
  median->assign(P, 0);
  std::vector<float> t(static_cast<size_t>(calls));
  for (int p = 0; p < P && calls > 0; ++p) {
    for (int c = 0; c < calls; ++c)
      WEFT_CUDA_CHECK(
          cudaEventElapsedTime(&t[size_t(c)], ev[size_t(c * (P + 1) + p)], ev[size_t(c * (P + 1) + p + 1)]));
    std::sort(t.begin(), t.end());
    (*median)[size_t(p)] = calls % 2 ? t[size_t(calls / 2)] : 0.5 * (t[size_t(calls / 2 - 1)] + t[size_t(calls / 2)]);
  }
  return Status::kOk;
}

}  // namespace

Status run_moe(const bootstrap::RankContext& ctx, const Workload& wl, bootstrap::Bootstrap& boot) {
  const auto& info = boot.info();
  const int rank = info.rank, W = info.size;
  if (ctx.gpu < 0) {
    WEFT_WARN(kBench, "rank %d: moe needs a GPU and this rank has none", rank);
    return Status::kUnsupported;
  }
  if (info.num_nodes != wl.layout.nodes)
    return refuse(rank, wl.source + " is laid out on " + std::to_string(wl.layout.nodes) + " node(s), the job has " +
                            std::to_string(info.num_nodes) + " (weftrun bench --emulate-nodes)");
  if (wl.world_size() != W)
    return refuse(rank, wl.source + " needs " + std::to_string(wl.world_size()) + " ranks (layout " +
                            std::to_string(wl.layout.nodes) + " x " + std::to_string(wl.layout.gpus_per_node) +
                            ") but the job has " + std::to_string(W));
  // Across (emulated) nodes NCCL's baseline crosses them through its network transport, as weft does:
  // one host id per node (the launcher names emulated nodes differently). A user's value is kept.
  if (info.num_nodes > 1) setenv("NCCL_HOSTID", info.hostname.c_str(), 0);
  Plan plan;
  WEFT_CHECK(moe_plan(wl, rank, W, &plan));
  const int64_t T = wl.moe.tokens / W, H = wl.moe.hidden, F = wl.moe.ffn, E = wl.moe.experts, K = wl.moe.topk;
  const int64_t L = E / W;
  const double timeout = param_double_or_default("WEFT_DEVICE_TIMEOUT");

  // The op's context over this runner's bootstrap: the plan's heap (WEFT_HEAP_BYTES where larger).
  int64_t heap_param = 0;
  WEFT_CHECK(get_param("WEFT_HEAP_BYTES", &heap_param));
  // Room for two ops: the plan's and the other variant's (staged or ffn_combine), timed beside it.
  const uint64_t heap =
      (std::max<uint64_t>(2 * plan.heap_bytes, uint64_t(std::max<int64_t>(heap_param, 0))) + 4095) / 4096 * 4096;
  std::unique_ptr<Context> rt;
  WEFT_CHECK(Context::create(boot, heap, &rt));
  cudaStream_t s = nullptr;
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::unique_ptr<CUstream_st, void (*)(cudaStream_t)> stream_guard(s, [](cudaStream_t v) { cudaStreamDestroy(v); });
  DeviceBuffers buf;
  bf16 *y = nullptr, *y_seq = nullptr;
  WEFT_CHECK(buf.alloc(T * H, &y));
  WEFT_CHECK(buf.alloc(T * H, &y_seq));
  uint64_t seed = 0;
  WEFT_CHECK(shared_seed(boot, "weft.moe.seed", &seed));
  MoeInputs in;
  WEFT_CHECK(make_moe_inputs(&buf, seed, rank, T, H, F, E, L, s, &in));
  bf16 *const router = in.router, *const gate = in.gate, *const up = in.up, *const down = in.down, *const x = in.x;
  WEFT_CHECK(sync_bounded(s, timeout, "moe: the inputs", nullptr));

  std::unique_ptr<MoeOp> op;
  WEFT_CHECK(MoeOp::create(*rt, plan, MoeWeights{router, gate, up, down}, &op));
  // The other variant on the same weights and tokens, where every rank has a GPU of its own (ffn_combine
  // needs one); the staged one of the two gives the phase rows.
  Plan other_plan = plan;
  other_plan.exec.variant = plan.exec.variant == "ffn_combine" ? "staged" : "ffn_combine";
  double shared = 0;
  WEFT_CHECK(max_over_ranks(boot, "weft.moe.shared", rt->shares_gpu() ? 1 : 0, &shared));
  std::unique_ptr<MoeOp> other;
  if (shared == 0 && plan.nodes == 1)
    WEFT_CHECK(MoeOp::create(*rt, other_plan, MoeWeights{router, gate, up, down}, &other));
  MoeOp* staged = plan.exec.variant == "ffn_combine" ? other.get() : op.get();
  auto unstick = [&] {
    op->unstick();
    if (other) other->unstick();
  };
  ncclComm_t comm = nullptr;  // destroyed on success only (as the other runners): a failed peer may hold it
  WEFT_CHECK(create_nccl_comm(boot, &comm));
  cublasHandle_t blas = nullptr;
  WEFT_CUBLAS_CHECK(cublasCreate(&blas));
  MoeSequential seq;
  MoeSequentialShape ss;
  ss.rank = rank, ss.world = W, ss.tokens = T, ss.hidden = H, ss.ffn = F, ss.experts = E, ss.topk = K;
  WEFT_CHECK(seq.create(ss, x, gate, up, down, comm, blas, 2 * timeout));
  {  // NCCL's all-reduce (the timed rounds' line-up) loaded now, while no kernel waits on a peer
    int* word = nullptr;
    WEFT_CUDA_CHECK(cudaMalloc(&word, sizeof(int)));
    WEFT_CUDA_CHECK(cudaMemsetAsync(word, 0, sizeof(int), s));
    WEFT_NCCL_CHECK(ncclAllReduce(word, word, 1, ncclInt32, ncclSum, comm, s));
    const Status synced = sync_bounded(s, 2 * timeout, "moe: NCCL's first all-reduce", nullptr);
    cudaFree(word);
    WEFT_CHECK(synced);
  }

  // One call of each, validated. The sequential layer takes weft's routing of that call as its input.
  // A failed call: said with the context's first failure, and the peers told (they may wait on this rank).
  auto failed = [&](const std::string& what) {
    const std::string why = rt->poisoned() ? what + " (" + rt->poison_reason() + ")" : what;
    WEFT_WARN(kBench, "rank %d: moe: %s", rank, why.c_str());
    rt->abort("moe: " + why);
    return Status::kInternal;
  };
  WEFT_CHECK(poison_bf16(y, T * H, s));
  WEFT_CHECK(poison_bf16(y_seq, T * H, s));
  WEFT_CHECK(sync_bounded(s, timeout, "moe: poisoning the outputs", nullptr));
  WEFT_CHECK(boot.barrier("weft.moe.poisoned"));
  if (op->run(x, y, s) != Status::kOk || sync_bounded(s, 2 * timeout, "moe: the first call", unstick) != Status::kOk)
    return failed("weft's first call failed");
  int64_t dropped = 0;
  WEFT_CHECK(op->dropped(&dropped));
  WEFT_CHECK(seq.set_routing(op->topk_ids(), op->topk_weights(), s));
  if (seq.run(y_seq, s) != Status::kOk ||
      sync_bounded(s, 2 * timeout, "moe: the sequential layer", nullptr) != Status::kOk)
    return failed("the sequential layer's first run failed");
  const int32_t samples = int32_t(std::min<int64_t>(T, kSamples));
  Comparison ref_cmp, seq_cmp, weft_cmp;
  if (wl.run.validate) {
    WEFT_CHECK(check_moe_sampled(op->topk_ids(), op->topk_weights(), seed, x, y, T, H, F, E, K, samples, s, &ref_cmp));
    WEFT_CHECK(compare_bf16(y_seq, y, T * H, s, &seq_cmp));   // rel err of the baseline against weft
    WEFT_CHECK(compare_bf16(y, y_seq, T * H, s, &weft_cmp));  // weft's unwritten rows, on every token
  }
  const bool bad = dropped != 0 || ref_cmp.non_finite || !(ref_cmp.rel_err < kTolerance) || seq_cmp.non_finite ||
                   weft_cmp.non_finite || !(seq_cmp.rel_err < kTolerance);
  if (bad)
    WEFT_WARN(
        kBench,
        "rank %d: moe: not validated: %lld rows dropped; weft against its reference on %d sampled tokens: rel err "
        "%.3g, %lld not finite; the sequential layer against weft on all %lld tokens: rel err %.3g, %lld / %lld "
        "elements not finite (baseline / weft) (tolerance %.0e)",
        rank, (long long)dropped, samples, ref_cmp.rel_err, (long long)ref_cmp.non_finite, (long long)T,
        seq_cmp.rel_err, (long long)seq_cmp.non_finite, (long long)weft_cmp.non_finite, kTolerance);
  else if (wl.run.validate)
    printf(
        "rank %d: moe validated: weft against its fp32 reference on %d of %lld tokens, rel err %.2e; the sequential "
        "layer against weft on all %lld tokens, rel err %.2e; 0 rows dropped\n",
        rank, samples, (long long)T, ref_cmp.rel_err, (long long)T, seq_cmp.rel_err);
  double any_bad = 0, ref_err = 0, seq_err = 0;
  WEFT_CHECK(max_over_ranks(boot, "weft.moe.bad", bad ? 1 : 0, &any_bad));
  if (any_bad > 0) return Status::kInternal;  // every rank alike, the failing ones having said why
  // The other variant: the same bits as the plan's on the same call's input (the sums run in the same
  // orders), checked on every element.
  bool other_same = true;
  if (other) {
    bf16* y_other = nullptr;
    WEFT_CHECK(buf.alloc(T * H, &y_other));
    WEFT_CHECK(poison_bf16(y_other, T * H, s));
    if (other->run(x, y_other, s) != Status::kOk ||
        sync_bounded(s, 2 * timeout, "moe: the other variant's first call", unstick) != Status::kOk)
      return failed("the " + other_plan.exec.variant + " variant's first call failed");
    std::vector<uint16_t> a(size_t(T * H)), b(size_t(T * H));
    WEFT_CUDA_CHECK(cudaMemcpy(a.data(), y, a.size() * 2, cudaMemcpyDeviceToHost));
    WEFT_CUDA_CHECK(cudaMemcpy(b.data(), y_other, b.size() * 2, cudaMemcpyDeviceToHost));
    other_same = a == b;
  }
  double other_off = 0;
  WEFT_CHECK(max_over_ranks(boot, "weft.moe.other", other_same ? 0 : 1, &other_off));
  if (other_off > 0) {
    WEFT_WARN(kBench, "rank %d: moe: the %s and %s variants gave different bits on the same input", rank,
              plan.exec.variant.c_str(), other_plan.exec.variant.c_str());
    return Status::kInternal;
  }
  WEFT_CHECK(max_over_ranks(boot, "weft.moe.ref_err", ref_cmp.rel_err, &ref_err));
  WEFT_CHECK(max_over_ranks(boot, "weft.moe.seq_err", seq_cmp.rel_err, &seq_err));

  // Every row interleaved; weft's phases from a separate candidate with events between its kernels.
  const int warm = wl.run.warmup, iters = wl.run.iters;
  std::vector<cudaEvent_t> ev(size_t(std::max(iters, 1) * (MoeOp::kPhases + 1)), nullptr);
  std::unique_ptr<std::vector<cudaEvent_t>, void (*)(std::vector<cudaEvent_t>*)> ev_guard(
      &ev, [](std::vector<cudaEvent_t>* v) {
        for (cudaEvent_t e : *v)
          if (e) cudaEventDestroy(e);
      });
  for (auto& e : ev) WEFT_CUDA_CHECK(cudaEventCreate(&e));
  int phase_calls = 0;
  // Across nodes: the proxies' counters over the timed rounds, where only weft's op moves anything
  // through the context's transport (rows 0 and 4 run it once a round each).
  transport::Transport* tp = nullptr;
  transport::TransportCounters net0;
  if (plan.nodes > 1) {
    WEFT_CHECK(rt->transport(plan.exec.channels, plan.inter_backend, plan.exec.signal_mode, &tp));
    WEFT_CHECK(tp->flush());
    net0 = tp->counters();
  }
  InterleavedTimer timer;
  timer.add([&] { return op->run(x, y, s); });    // 0
  timer.add([&] { return seq.run(y_seq, s); });   // 1
  timer.add([&] { return seq.run_a2a(s); });      // 2
  timer.add([&] { return seq.run_experts(s); });  // 3
  timer.add([&] {                                 // 4: the staged op (or the plan's, where it is the only one)
    MoeOp* phased = staged ? staged : op.get();
    const int c = std::max(0, phase_calls++ - warm);
    phased->record_phases(&ev[size_t(std::min(c, std::max(iters, 1) - 1) * (MoeOp::kPhases + 1))]);
    const Status st = phased->run(x, y, s);
    phased->record_phases(nullptr);
    return st;
  });
  if (other) timer.add([&] { return other->run(x, y, s); });  // 5
  if (timer.run(boot, comm, s, warm, iters, "weft.moe.interleaved", unstick) != Status::kOk)
    return failed("the timed rounds failed");
  char network[320] = "";
  if (tp) {
    WEFT_CHECK(tp->flush());
    const transport::TransportCounters net1 = tp->counters();
    const double calls = 2.0 * (warm + iters);
    double per[5] = {double(net1.puts - net0.puts) / calls, double(net1.signals - net0.signals) / calls,
                     double(net1.fences - net0.fences) / calls, double(net1.batches - net0.batches) / calls,
                     double(net1.stalls - net0.stalls) / calls};
    const char* keys[5] = {"puts", "signals", "fences", "batches", "stalls"};
    for (int i = 0; i < 5; ++i)
      WEFT_CHECK(max_over_ranks(boot, std::string("weft.moe.net.") + keys[i], per[i], &per[i]));
    snprintf(network, sizeof network,
             "network: %s backend, %s signals, %d channel(s); per call, max over ranks: puts %.1f signals %.1f "
             "fences %.1f batches %.1f stalls %.1f",
             tp->backend_name().c_str(), transport::to_string(tp->signal_mode()), plan.exec.channels, per[0], per[1],
             per[2], per[3], per[4]);
  }
  WEFT_CHECK(op->dropped(&dropped));
  int64_t other_dropped = 0;
  if (other) WEFT_CHECK(other->dropped(&other_dropped));
  dropped += other_dropped;
  if (dropped != 0) return failed(std::to_string(dropped) + " rows dropped in the timed calls");
  std::vector<double> mine, ph(MoeOp::kPhases, 0);
  WEFT_CHECK(phase_ms(ev, std::min(iters, std::max(0, phase_calls - warm)), &mine));
  for (int p = 0; p < MoeOp::kPhases; ++p)
    WEFT_CHECK(max_over_ranks(boot, "weft.moe.phase." + std::to_string(p), mine[size_t(p)], &ph[size_t(p)]));
  double out_rows = 0, in_rows = 0;
  WEFT_CHECK(max_over_ranks(boot, "weft.moe.rows_out", double(seq.rows_out()), &out_rows));
  WEFT_CHECK(max_over_ranks(boot, "weft.moe.rows_in", double(seq.rows_in()), &in_rows));

  // The table: bound as bench/moe/moe_bound.py defines it.
  const double layer = timer.ms(0), sequential = timer.ms(1), a2a = timer.ms(2), cublas_ffn = timer.ms(3);
  const double weft_ffn = ph[3], weft_exchange = ph[1] + ph[2] + ph[4];
  const bool compute_weft = weft_ffn > 0 && weft_ffn <= cublas_ffn;
  const double compute = compute_weft ? weft_ffn : cublas_ffn;
  const bool comm_nccl = a2a > 0 && (a2a <= weft_exchange || weft_exchange <= 0);
  const double communication = comm_nccl ? a2a : weft_exchange;
  const double bound = std::max(compute, communication);
  const double flops = 2.0 * 3.0 * double(T) * double(K) * double(H) * double(F);  // per rank, the average routing
  auto tf = [&](double ms) { return ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0; };
  char note[320];
  std::vector<ResultRow> rows;
  snprintf(note, sizeof note,
           "the plan (%s); %.2fx bound, %.2fx faster than the sequential layer; %d compute SMs; dropped %lld",
           plan.exec.variant.c_str(), bound > 0 ? layer / bound : 0, layer > 0 ? sequential / layer : 0,
           plan.roles.compute, (long long)dropped);
  rows.push_back({"weft moe", layer, tf(layer), note});
  if (other) {
    const double t = timer.ms(5);
    snprintf(note, sizeof note, "%.2fx bound, %.2fx the plan's time; the same bits as the plan's",
             bound > 0 ? t / bound : 0, layer > 0 ? t / layer : 0);
    rows.push_back({"weft moe, " + other_plan.exec.variant + " variant", t, tf(t), note});
  } else if (rank == 0) {
    if (plan.nodes > 1)
      printf("(across nodes the op has one variant, hierarchical)\n");
    else
      printf("(no %s row: ranks share a GPU)\n", other_plan.exec.variant.c_str());
  }
  snprintf(note, sizeof note, "sequential baseline on weft's routing; counts to the host twice; rel err vs weft %.1e",
           seq_err);
  rows.push_back({"nccl a2a-v + cublas + nccl a2a-v (sequential)", sequential, tf(sequential), note});
  snprintf(note, sizeof note, "rows out and back alone: up to %.0f out, %.0f in per rank (%.1f MB each way)", out_rows,
           in_rows, std::max(out_rows, in_rows) * double(H) * 2 / 1e6);
  rows.push_back({"nccl a2a-v alone", a2a, 0, note});
  rows.push_back(
      {"expert FFN alone (cublas per expert)", cublas_ffn, tf(cublas_ffn), "gate, up, SiLU*up, down per local expert"});
  rows.push_back({"expert FFN alone (weft grouped)", weft_ffn, tf(weft_ffn), "weft moe's FFN phase (events)"});
  snprintf(note, sizeof note, "dispatch %.3f + arrange %.3f + combine %.3f (events; waits included)", ph[1], ph[2],
           ph[4]);
  rows.push_back({"weft exchange phases", weft_exchange, 0, note});
  snprintf(note, sizeof note, "max(compute: %s FFN, communication: %s); docs/moe.md",
           compute_weft ? "weft's" : "cublas", comm_nccl ? "nccl a2a-v" : "weft's exchange");
  rows.push_back({"bound", bound, tf(bound), note});
  double phased = 0;
  for (double p : ph) phased += p;
  snprintf(note, sizeof note, "diagnostic (the staged op): route %.3f, phase sum %.3f", ph[0], phased);
  rows.push_back({"weft moe, events between phases", timer.ms(4), tf(timer.ms(4)), note});
  if (plan.makespan_s > 0) {
    snprintf(note, sizeof note, "tuner: compute %d, limited by %s", plan.roles.compute, plan.limited_by.c_str());
    rows.push_back({"tuner prediction", plan.makespan_s * 1e3, tf(plan.makespan_s * 1e3), note});
  }
  char title[320];
  snprintf(title, sizeof title,
           "moe %s: %lld tokens (%lld per rank) x hidden %lld, ffn %lld, %lld experts (%lld per rank), top-%lld, %d "
           "ranks, median of %d, max over ranks; the op and its baselines interleaved",
           wl.name.c_str(), (long long)wl.moe.tokens, (long long)T, (long long)H, (long long)F, (long long)E,
           (long long)L, (long long)K, W, iters);
  char validated[400];
  if (wl.run.validate)
    snprintf(validated, sizeof validated,
             "weft moe on %d of %lld tokens per rank (token i*%lld/%d, every rank) against weft's fp32 reference "
             "with its own routing (rel err %.1e); the sequential layer on all %lld tokens of every rank against "
             "weft's output (rel err %.1e); tolerance %.0e, max over ranks; 0 rows dropped",
             samples, (long long)T, (long long)T, samples, ref_err, (long long)T, seq_err, kTolerance);
  else
    snprintf(validated, sizeof validated, "nothing (run.validate is false); 0 rows dropped");
  char extra[1024];
  snprintf(extra, sizeof extra,
           "\"op\": \"moe\", \"tokens\": %lld, \"hidden\": %lld, \"ffn\": %lld, \"experts\": %lld, \"topk\": %lld, "
           "\"world\": %d, \"validated\": \"%s\"%s%s%s",
           (long long)wl.moe.tokens, (long long)H, (long long)F, (long long)E, (long long)K, W, validated,
           network[0] ? ", \"network\": \"" : "", network, network[0] ? "\"" : "");
  print_results(boot, title, rows, extra);
  if (rank == 0) {
    printf("  validated: %s\n", validated);
    if (network[0]) printf("  %s\n", network);
    fflush(stdout);
  }

  WEFT_CHECK(sync_bounded(s, 2 * timeout, "moe: the last calls", unstick));
  other.reset();  // both ops before their context (rt.reset() below)
  op.reset();
  WEFT_CHECK(boot.barrier("weft.moe.done"));  // nobody frees a heap a peer still reads
  rt.reset();
  cublasDestroy(blas);
  ncclCommDestroy(comm);
  return Status::kOk;
}

}  // namespace weft::runtime::ops
