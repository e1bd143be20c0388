// The analytic model (work per rank, link rates, time per role) and the search over SM role counts.
#include "runtime/tuner.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "base/log.h"
#include "base/params.h"
#include "kernels/tile_scheduler.h"
#include "runtime/tuner_moe.h"

namespace weft::runtime {
namespace {

// MoE dispatch header bytes per (token, destination rank) (kernels/moe_plan.h, MoeDispatchMeta).
constexpr double kMoeHeaderBytes = 80;

// Probability that a group of g of the E experts holds at least one of a token's k distinct experts
// under uniform routing: 1 - C(E - g, k) / C(E, k), as a product (no large binomials).
double moe_group_hit(int64_t experts, int64_t k, int64_t g) {
  if (g >= experts) return 1;
  double miss = 1;
  for (int64_t i = 0; i < k; ++i) miss *= double(experts - g - i) / double(experts - i);
  return 1 - std::max(0.0, miss);
}

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kGB = 1e9;
constexpr int64_t kMinInterChunk = 1 << 20;  // NIC messages below ~1 MiB lose bandwidth to per-message cost
// GEMM+RS/AR runner defaults the model mirrors (runtime/ops/gemm_reduce*.cpp).
constexpr double kPeerPathBytes = 16.0 * (1 << 20);  // auto: the peer path below 16 MiB row blocks
constexpr double kPieceBytes = 4.0 * (1 << 20);      // pieces of at least 4 MiB, at most 4 per owner

double ceil_div(double a, double b) { return std::ceil(a / b); }

// The socket backend: one host network stack for all the node's GPUs; each rank's proxy channels
// (a thread and its TCP streams, through page-locked staging) move socket_channel_gbps each.
double socket_gbps_per_gpu(const MachineModel& model, int gpus_per_node) {
  return std::min(model.socket_gbps / gpus_per_node, model.net_channels * model.socket_channel_gbps);
}

// Time for `bytes` at `gbps`, with no SMs (`sms` == 0) meaning never when there is work.
double transfer_time(double bytes, double gbps) {
  if (bytes <= 0) return 0;
  if (gbps <= 0) return kInf;
  return bytes / (gbps * kGB);
}

}  // namespace

Demand compute_demand(const Workload& w, const Layout& layout, const MachineModel& model, const Plan& tiles) {
  Demand d;
  const double e = dtype_bytes(w.dtype);
  const double N = layout.nodes, G = layout.gpus_per_node, W = N * G;
  const double tm = tiles.tile_m, tn = tiles.tile_n;
  d.tflops = (w.op == Op::kRingAttention ? model.attention_tflops : model.tensor_tflops) *
             (w.dtype == DType::kFp8 ? 2.0 : 1.0);
  switch (w.op) {
    case Op::kAgGemm:
    case Op::kGemmRs:
    case Op::kGemmAr: {
      Workload at = w;
      at.layout = layout;
      const GemmShard s = at.gemm_shard();
      const double m = s.m, n = s.n, k = s.k;
      d.groups.push_back({ceil_div(m, tm) * ceil_div(n, tn), 2.0 * tm * tn * k, ceil_div(k, tiles.tile_k)});
      d.split_tail = w.plan.split_tail.value_or(true);  // the GEMM cuts a ragged last wave along K
      d.flops = 2.0 * m * n * k;
      d.hbm_bytes = (m * k + k * n + m * n) * e;
      const double full_c = double(w.gemm.m) * w.gemm.n * e;
      if (w.op == Op::kAgGemm) {
        // Hierarchical all-gather of A: shards cross the NIC between rail peers (same local rank),
        // then every shard a GPU holds (its own and its rail's) goes to its G-1 NVLink peers.
        const double shard = double(w.gemm.m) / W * w.gemm.k * e;
        d.nic_out = d.nic_in = (N - 1) * shard;
        d.nvlink_out = d.nvlink_in = (G - 1) * N * shard;
        d.intra_chunk = static_cast<int64_t>(tm * w.gemm.k * e);  // one tile row of A
        // Copy engines: one copy per shard on one stream. The GEMM walks shards in order, so the
        // last one to arrive (across nodes: the forwarded one, behind its rail peer's) is computed
        // after it: 1/W of the compute.
        d.intra_copies = (G - 1) * N;
        d.last_fraction = 1 / W;
        d.last_unit_bytes = shard;
      } else {
        // Reduce-scatter inside the node first (NVLink), so only 1/G of C crosses the NIC.
        const double passes = w.op == Op::kGemmAr ? 2 : 1;  // all-reduce = reduce-scatter + all-gather
        d.nvlink_out = d.nvlink_in = passes * (G - 1) / G * full_c;
        d.nic_out = d.nic_in = passes * (N - 1) / W * full_c;
        d.reduce_bytes = (N - 1) / W * full_c;
        d.intra_chunk = static_cast<int64_t>(tm * tn * e);  // one output tile
        // weft's GEMM+RS/AR (runtime/ops): the copy engines push partials into the owners, and the
        // owner's epilogue adds them (node-mates' partials of its rows and of the rail rows it sums
        // for other nodes); across nodes the rail peers' node sums are added there too.
        d.intra_push = true;
        d.epilogue_reduce = true;
        d.fold_bytes = (G - 1) * N / W * full_c;
        // WEFT_GEMM_REDUCE_PATH=auto on one node: row blocks under 16 MiB or not whole tiles take the
        // peer path, a reduction kernel after the GEMM (two flag rounds for AllReduce).
        const double block = double(w.gemm.m) / W * w.gemm.n * e;
        d.sequential = N == 1 && W > 1 && (w.gemm.m % (int64_t(W) * tiles.tile_m) != 0 || block < kPeerPathBytes);
        d.rounds = static_cast<int>(passes);
        d.tile_counts = !d.sequential;
        // Pieces per owner (WEFT_GEMM_REDUCE_PIECES=0: at most 4 of at least 4 MiB), one copy each
        // per pass and destination stream; the own rows' last piece is reduced after it arrives.
        const double pieces = std::max(1.0, std::min(4.0, std::floor(block / kPieceBytes)));
        d.intra_copies = passes * pieces;
        d.last_fraction = 1 / (W * pieces);
        d.last_unit_bytes = block / pieces;
      }
      break;
    }
    case Op::kMoe: {
      const auto& m = w.moe;
      const double tokens_local = double(m.tokens) / W, experts_local = double(m.experts) / W;
      const double copies = tokens_local * m.topk;                                      // token-expert pairs per rank
      const double rows_per_expert = std::ceil(double(m.tokens) * m.topk / m.experts);  // balanced routing
      const double h = m.hidden, f = m.ffn;
      // Gated FFN per expert: [rows, h] x [h, 2f] (gate and up), then [rows, f] x [f, h] (down).
      d.groups.push_back({experts_local * ceil_div(rows_per_expert, tm) * ceil_div(2 * f, tn), 2.0 * tm * tn * h});
      d.groups.push_back({experts_local * ceil_div(rows_per_expert, tm) * ceil_div(h, tn), 2.0 * tm * tn * f});
      d.flops = 2.0 * copies * 3 * h * f;
      d.hbm_bytes = (experts_local * 3 * h * f + 2 * copies * h + copies * 2 * f) * e;
      // Dispatch and combine travel once per (token, destination rank), not per (token, expert):
      // the owner scatters a token to its local experts and pre-sums their rows before sending one
      // back. Across nodes a token crosses the NIC once per destination node, to the rail peer,
      // which forwards it over NVLink to that node's other destination ranks (and gathers their
      // results back): each rank's NVLink carries its own tokens' node-local traffic and, as a relay,
      // that of its N - 1 rail peers' tokens, N times the one-node figure (kernels/moe_nodes_plan.h,
      // checked by the data-flow simulation). Uniform routing of k distinct experts of E: a group
      // holding g experts is hit with probability 1 - C(E - g, k) / C(E, k).
      const double row = h * e + kMoeHeaderBytes;
      const double hit_rank = moe_group_hit(m.experts, m.topk, m.experts / W);
      const double hit_node = moe_group_hit(m.experts, m.topk, m.experts / W * G);
      d.nvlink_out = d.nvlink_in = 2 * tokens_local * row * (G - 1) * hit_rank * N;
      d.nic_out = d.nic_in = 2 * tokens_local * row * (N - 1) * hit_node;
      d.intra_chunk = static_cast<int64_t>(tm * row);
      break;
    }
    case Op::kRingAttention: {
      const auto& a = w.attention;
      const double s_local = double(a.seq) / W, causal = a.causal ? 0.5 : 1.0;  // balanced (striped) causal ring
      d.groups.push_back({ceil_div(s_local, tm) * a.heads, 4.0 * tm * double(a.seq) * a.head_dim * causal});
      d.flops = 4.0 * s_local * double(a.seq) * a.heads * a.head_dim * causal;
      d.hbm_bytes = (2 * s_local + 2 * double(a.seq)) * a.heads * a.head_dim * e;
      // K and V of one shard go round the ring W-1 times. On the busiest rank all of them cross
      // NVLink (inside a node) or the NIC (the rank before a node boundary).
      const double kv = 2 * s_local * a.heads * a.head_dim * e;
      if (G > 1) d.nvlink_out = d.nvlink_in = (W - 1) * kv;
      if (N > 1) d.nic_out = d.nic_in = (W - 1) * kv;
      d.intra_chunk = static_cast<int64_t>(2 * std::min<double>(tn, s_local) * a.heads * a.head_dim * e);
      break;
    }
  }
  if (d.intra_chunk < 1) d.intra_chunk = 1;
  d.inter_chunk = d.intra_chunk * static_cast<int64_t>(std::ceil(double(kMinInterChunk) / d.intra_chunk));
  if (d.nic_out > 0 && d.inter_chunk > d.nic_out) d.inter_chunk = static_cast<int64_t>(d.nic_out);
  return d;
}

Status link_rates(const Workload& w, const Layout& layout, const topology::Topology& topo,
                  const topology::Mapping& mapping, const MachineModel& model, LinkRates* out, std::string* error) {
  LinkRates r;
  const int G = layout.gpus_per_node;
  r.nvlink_gbps = G > 1 ? model.nvlink_gbps : 0;
  if (!topo.gpus.empty() && static_cast<int>(topo.gpus.size()) < G) {
    std::ostringstream os;
    os << G << " GPUs per node, but the topology (" << topo.source << ") has " << topo.gpus.size()
       << "; expected at most " << topo.gpus.size();
    *error = w.error_at("layout.gpus_per_node", os.str());
    return Status::kInvalidArgument;
  }
  if (layout.nodes == 1) {
    r.inter_backend = "none";
  } else if (topo.gpus.empty()) {
    // No GPU to map: assume the usual GPU server, one NIC per GPU behind the same PCIe switch.
    r.nics_per_node = G;
    r.pcie_gbps = model.pcie_gbps;
    r.nic_gbps = std::min(model.nic_gbps, model.pcie_gbps);
    // ofi: planned at an RDMA-capable provider's rates (efa, verbs), as ibverbs.
    r.inter_backend = w.transport.inter_node == InterNode::kSocket ? "socket"
                      : w.transport.inter_node == InterNode::kOfi  ? "ofi"
                                                                   : "ibverbs";
    if (r.inter_backend == "socket") {
      r.nic_gbps = socket_gbps_per_gpu(model, G), r.pcie_gbps = 0;
    } else {
      r.nic_sharers = 1;
      r.nic_share_gbps = model.nic_gbps;
    }
  } else {
    // The node's ranks use GPUs 0..G-1 in bus id order and all send at once (every multi-node op
    // moves its inter-node bytes in the same phase on every rank), so each gets its primary NIC's
    // bandwidth divided by the ranks mapped to that NIC. The slowest GPU sets the pace.
    const std::vector<topology::NicShare> sharing = topology::nic_sharing(mapping, G);
    bool any_without = false;
    for (int g = 0; g < G; ++g)
      if (topology::nic_sharers(sharing, g) == 0) any_without = true;
    r.nics_per_node = static_cast<int>(sharing.size());
    const bool socket = any_without || w.transport.inter_node == InterNode::kSocket;
    if (socket && w.transport.inter_node == InterNode::kIbverbs) {
      *error = w.error_at("transport.inter_node",
                          "ibverbs, but the topology (" + topo.source +
                              ") has no RDMA NIC for every GPU; expected auto or socket on this machine");
      return Status::kInvalidArgument;
    }
    const bool ofi = w.transport.inter_node == InterNode::kOfi;
    if (socket) {
      // ofi without an RDMA NIC for every GPU: its tcp provider, at the socket backend's rates.
      r.inter_backend = ofi ? "ofi" : "socket";
      r.nic_gbps = socket_gbps_per_gpu(model, G);
      r.pcie_gbps = 0;
    } else {
      r.inter_backend = ofi ? "ofi" : "ibverbs";
      double worst = kInf, worst_pcie = kInf;
      for (int g = 0; g < G; ++g) {
        const auto& link = mapping.gpus[g];
        double pcie = link.proximity <= topology::Proximity::kSameHostBridge ? model.pcie_gbps : model.pcie_remote_gbps;
        const int sharers = topology::nic_sharers(sharing, g);
        double nic = model.nic_gbps / sharers;
        worst = std::min(worst, std::min(nic, pcie));
        worst_pcie = std::min(worst_pcie, pcie);
        r.nic_sharers = std::max(r.nic_sharers, sharers);
      }
      r.nic_gbps = worst;
      r.pcie_gbps = worst_pcie;
      r.nic_share_gbps = model.nic_gbps / r.nic_sharers;
    }
  }
  *out = r;
  return Status::kOk;
}

namespace {

// Tile waves of `tiles` on `blocks` SMs. With the split tail the ragged last wave costs what the
// GEMM core's planner (TileSchedule::plan_split) expects, as a share of a whole tile's time.
double tile_waves(double tiles, int blocks, double k_blocks, bool split) {
  const double full = std::floor(tiles / blocks), tail = tiles - full * blocks;
  if (tail <= 0) return full;
  if (!split || k_blocks < 1 || tiles >= double(int64_t(1) << 31)) return full + 1;
  kernels::TileSchedule s;
  s.m_blocks = int32_t(std::ceil(tiles));
  s.n_blocks = 1;
  s.k_iters = int32_t(std::lround(k_blocks));
  constexpr double kBoundaryKb = 4.0;
  // K-slices only: the kernels that claim their tiles (the 1-CTA GEMM, the fused AllGather+GEMM)
  // do not take chunks (kernels/gemm.h, enable_tail_split).
  const double cost = s.plan_split(blocks, 8, false, 4, 2.0, kBoundaryKb);
  return full + std::min(1.0, cost / (double(s.k_iters) + kBoundaryKb));
}

}  // namespace

IntraMover default_mover(Op op) {
  return op == Op::kGemmRs || op == Op::kGemmAr ? IntraMover::kCopyEngine : IntraMover::kSm;
}

IntraMover plan_mover(const Workload& w, const Layout& layout) {
  if (w.plan.variant == std::optional<std::string>("sm_movers")) return IntraMover::kSm;
  if (w.plan.variant == std::optional<std::string>("copy_engine")) return IntraMover::kCopyEngine;
  // AllGather+GEMM on one node: the copy engines were the fastest variant on every shape in the two
  // latest combined runs (docs/results/), unless the workload gives the SM movers SMs; weftrun tune
  // measures the others on the machine at hand.
  if (w.op == Op::kAgGemm && layout.nodes == 1 && (w.roles.automatic || w.roles.counts.intra_comm == 0))
    return IntraMover::kCopyEngine;
  return default_mover(w.op);
}

void predict(const Demand& d, const LinkRates& r, const MachineModel& model, const RoleCounts& c, Plan* plan) {
  const double per_sm_flops = d.tflops / model.sm_count * 1e12;
  const double lat = model.latency_us * 1e-6;
  double compute = 0;
  if (c.compute <= 0) {
    compute = d.flops > 0 ? kInf : 0;
  } else {
    for (const auto& g : d.groups) {
      const double waves = tile_waves(g.tiles, c.compute, g.k_blocks, d.split_tail);
      compute += waves * (g.tile_flops / per_sm_flops + model.tile_overhead_us * 1e-6);
      if (d.tile_counts) compute += std::ceil(g.tiles / c.compute) * model.tile_signal_us * 1e-6;
    }
    // Partials added in the epilogue hold the tensor cores (the fold is not overlapped).
    const double fold = d.fold_bytes + (c.inter_reduce == 0 && d.epilogue_reduce ? d.reduce_bytes : 0);
    compute += transfer_time(fold, c.compute * model.reduce_sm_gbps);
    compute = std::max(compute, transfer_time(d.hbm_bytes, model.hbm_gbps * c.compute / model.sm_count));
  }
  const double nv = std::max(d.nvlink_out, d.nvlink_in);
  const double nic = std::max(d.nic_out, d.nic_in);
  const bool engines = d.intra_mover == IntraMover::kCopyEngine || d.sequential;
  double intra = 0;
  if (nv > 0 && engines) {
    // Copy engines (or, after the GEMM, the peer kernel's pulls, which reach the same rate).
    const double ce = d.intra_push && !d.sequential ? model.ce_push_gbps : model.ce_pull_gbps;
    intra = transfer_time(nv, std::min(r.nvlink_gbps, ce)) + (d.sequential ? 0 : d.intra_copies * lat);
  } else if (nv > 0 && c.intra_comm > 0) {
    // SM movers: each moves nvlink_sm_gbps alone, together they approach nvlink_sm_max_gbps, and
    // beside a running GEMM (shared L2 and HBM) they keep sm_mover_busy of that.
    double movers = 1 / (1 / (c.intra_comm * model.nvlink_sm_gbps) + 1 / model.nvlink_sm_max_gbps);
    if (d.flops > 0 && c.compute > 0) movers *= model.sm_mover_busy;
    intra = transfer_time(nv, std::min(r.nvlink_gbps, movers));
  } else if (nv > 0) {
    intra = kInf;
  }
  const double send = transfer_time(nic, std::min(r.nic_gbps, c.inter_send * model.fifo_sm_gbps));
  double reduce = 0;
  if (c.inter_reduce > 0)
    reduce = transfer_time(d.reduce_bytes, c.inter_reduce * model.reduce_sm_gbps);
  else if (!d.epilogue_reduce)
    reduce = transfer_time(d.reduce_bytes, 0);
  plan->role_time_s = {compute, intra, send, reduce};

  if (d.sequential) {
    // The small-shape path: the exchange follows the GEMM; its flag rounds and the GEMM's fill add.
    plan->tail_s = std::min(compute, intra) + (d.rounds + 1) * lat;
    const bool link = intra > compute;
    plan->makespan_s = std::max(compute, intra) + plan->tail_s;
    plan->limited_by = to_string(link ? Role::kIntraComm : Role::kCompute);
    return;
  }
  // The compute that can start only after a link's last unit arrives follows that link's time.
  double last = d.last_fraction;
  // SM movers signal per tile row of A, not per shard: only that chunk's tiles wait.
  if (!engines && nic <= 0 && d.last_unit_bytes > 0) last *= std::min(1.0, double(d.intra_chunk) / d.last_unit_bytes);
  const double after = std::isfinite(compute) ? compute * last : 0;
  const std::array<double, kNumRoles> paced = {compute, intra > 0 ? intra + after : 0, send > 0 ? send + after : 0,
                                               reduce};
  int worst = 0;
  for (int i = 1; i < kNumRoles; ++i)
    if (paced[i] > paced[worst]) worst = i;
  // What cannot overlap: the GEMM's fill, and the first chunk on each link in use.
  double tail = lat;
  if (nv > 0) tail += transfer_time(std::min<double>(d.intra_chunk, nv), r.nvlink_gbps);
  if (nic > 0) tail += transfer_time(std::min<double>(d.inter_chunk, nic), r.nic_gbps) + lat;
  if (worst == static_cast<int>(Role::kIntraComm) || worst == static_cast<int>(Role::kInterSend)) tail += after;
  plan->tail_s = tail;
  plan->makespan_s = plan->role_time_s[worst] + tail;
  plan->limited_by = to_string(static_cast<Role>(worst));
}

RoleCounts best_roles(const Demand& d, const LinkRates& rates, const MachineModel& model) {
  // Exhaustive over the comm counts (a few hundred thousand cheap evaluations); ties go to the
  // fewest communication SMs, so adding bytes can only add communication SMs.
  const int S = model.sm_count;
  // Copy engines move the NVLink bytes without SMs: intra_comm then gets none.
  // So does the small-shape path's exchange after the GEMM; an epilogue fold needs no inter_reduce SM.
  const bool nv = std::max(d.nvlink_out, d.nvlink_in) > 0 && d.intra_mover == IntraMover::kSm && !d.sequential,
             nic = std::max(d.nic_out, d.nic_in) > 0, red = d.reduce_bytes > 0;
  const int min_red = red && !d.epilogue_reduce ? 1 : 0;
  const int max_send = std::max(1, std::min(S / 4, 32)), max_red = std::max(1, std::min(S / 2, 64));
  RoleCounts best{S, 0, 0, 0};
  double best_time = 0;
  bool have = false;
  Plan trial;
  for (int i = nv ? 1 : 0; i <= (nv ? S - 1 : 0); ++i)
    for (int s = nic ? 1 : 0; s <= (nic ? max_send : 0); ++s)
      for (int r = min_red; r <= (red ? max_red : 0); ++r) {
        const int c = S - i - s - r;
        if (c < 1) continue;
        const RoleCounts rc{c, i, s, r};
        predict(d, rates, model, rc, &trial);
        if (!have || trial.makespan_s < best_time ||
            (trial.makespan_s == best_time && i + s + r < best.total() - best.compute)) {
          best = rc;
          best_time = trial.makespan_s;
          have = true;
        }
      }
  return best;
}

namespace {

// Explicit counts: the kernel would wait forever on work no SM does, so refuse those.
Status check_explicit(const Workload& w, const Layout& layout, const Demand& d, const MachineModel& model, Plan* plan,
                      std::string* error) {
  const RoleCounts& c = w.roles.counts;
  auto fail = [&](const std::string& key, const std::string& what) {
    *error = w.error_at(key, what);
    return Status::kInvalidArgument;
  };
  if (c.total() > model.sm_count || c.compute < 1) {
    std::ostringstream os;
    os << "counts sum to " << c.total() << " with " << c.compute << " compute; expected at most " << model.sm_count
       << " SMs (" << model.gpu << ") with at least 1 compute SM";
    return fail("roles", os.str());
  }
  const std::string op = to_string(w.op);
  if (layout.nodes == 1 && c.inter_send > 0)
    return fail("roles.inter_send", "expected 0 on a single node (no inter-node traffic)");
  if (layout.nodes == 1 && c.inter_reduce > 0)
    return fail("roles.inter_reduce", "expected 0 on a single node (no inter-node traffic)");
  const bool copy_engines = d.intra_mover == IntraMover::kCopyEngine || d.sequential;
  // The MoE op runs its phases in sequence (across nodes too, its hierarchical variant): kernels on
  // the compute SMs move its rows, one-block kernels feed the proxy.
  const bool staged = w.op == Op::kMoe;
  if (std::max(d.nvlink_out, d.nvlink_in) > 0 && c.intra_comm == 0 && !copy_engines && !staged)
    return fail("roles.intra_comm", "0, but " + op + " moves data between the node's GPUs; expected at least 1");
  // GEMM+RS/AR's overlap variant puts mover SMs on intra_comm (plan_exec.cpp says so, or refuses them).
  const bool overlap_movers = w.plan.variant == std::optional<std::string>("overlap");
  if (copy_engines && c.intra_comm > 0 && !overlap_movers)
    plan->notes.push_back("roles.intra_comm: the copy engines move the NVLink bytes, the intra_comm SMs will idle");
  if (std::max(d.nic_out, d.nic_in) > 0 && c.inter_send == 0 && !staged)
    return fail("roles.inter_send", "0, but " + op + " sends data between nodes; expected at least 1");
  if (d.reduce_bytes > 0 && c.inter_reduce == 0 && !d.epilogue_reduce)
    return fail("roles.inter_reduce", "0, but " + op + " folds partial sums from other nodes; expected at least 1");
  if (d.reduce_bytes == 0 && c.inter_reduce > 0)
    return fail("roles.inter_reduce", op + " has nothing to reduce across nodes; expected 0");
  if (layout.gpus_per_node == 1 && c.intra_comm > 0)
    plan->notes.push_back("roles.intra_comm: one GPU per node, the intra_comm SMs will idle");
  if (c.total() < model.sm_count)
    plan->notes.push_back("explicit roles use " + std::to_string(c.total()) + " of " + std::to_string(model.sm_count) +
                          " SMs; the rest idle");
  return Status::kOk;
}

// The workload's `plan:` map against the op, the layout and the roles: a choice that does not apply
// is refused, never ignored. Whether this build's op runs a choice that applies is plan_execution's
// call (runtime/plan_exec.cpp), which marks the plan not runnable.
Status check_plan_spec(const Workload& w, const Layout& layout, std::string* error) {
  const PlanSpec& s = w.plan;
  if (s.empty()) return Status::kOk;
  auto fail = [&](const std::string& key, const std::string& what) {
    *error = w.error_at(key, what);
    return Status::kInvalidArgument;
  };
  const std::string op = to_string(w.op);
  if (w.op == Op::kMoe) {  // how the FFN and the combine run (across nodes: hierarchical only), and split_k
    const bool one = layout.nodes == 1;
    const char* allowed = one ? "staged or ffn_combine" : "hierarchical (across nodes)";
    if (s.variant && (one ? *s.variant != "staged" && *s.variant != "ffn_combine" : *s.variant != "hierarchical"))
      return fail("plan.variant", *s.variant + " is not a variant of moe on this layout; expected " + allowed);
    PlanSpec rest = s;
    rest.variant.reset();
    rest.split_k.reset();
    if (!rest.empty())
      return fail("plan", std::string("moe has two execution choices a workload sets, variant (") + allowed +
                              ") and split_k (1 to 4); expected no other key in the plan: map");
    return Status::kOk;
  }
  if (s.split_k) return fail("plan.split_k", "the split of the MoE expert FFN's down projection; " + op + " has none");
  if (s.variant && *s.variant == "hierarchical")  // gemm ops: chosen by the layout, never written
    return fail("plan.variant", "hierarchical is the variant the layout picks across nodes; " + op +
                                    " takes no plan: map there, and on one node it is not a variant of " + op);
  const bool moe_variant = s.variant && (*s.variant == "staged" || *s.variant == "ffn_combine");
  if (moe_variant && is_gemm_op(w.op))
    return fail("plan.variant", *s.variant + " is a variant of moe; expected " +
                                    (w.op == Op::kAgGemm ? "copy_engine or sm_movers" : "peer or overlap") + " for " +
                                    op);
  if (!is_gemm_op(w.op) || layout.nodes > 1)
    return fail("plan", op + (layout.nodes > 1 ? " across nodes" : "") +
                            " has no execution choices a workload sets in this build (weftrun bench measures its "
                            "variants); expected no plan: map");
  if (w.op == Op::kAgGemm) {
    if (s.variant && (*s.variant == "peer" || *s.variant == "overlap"))
      return fail("plan.variant",
                  *s.variant + " is a variant of gemm_rs and gemm_ar; expected copy_engine or sm_movers");
    if (s.reduce_blocks)
      return fail("plan.reduce_blocks", "ag_gemm has no reduction kernel; expected no reduce_blocks");
    if (s.pieces || s.lag || s.send || s.gather)
      return fail(s.pieces ? "plan.pieces"
                  : s.lag  ? "plan.lag"
                  : s.send ? "plan.send"
                           : "plan.gather",
                  "a choice of gemm_rs and gemm_ar's overlap variant; ag_gemm has none");
    const int intra = w.roles.automatic ? -1 : w.roles.counts.intra_comm;
    const std::string variant = s.variant ? *s.variant : intra > 0 ? "sm_movers" : "copy_engine";
    if (variant == "copy_engine" && intra > 0)
      return fail("plan.variant", "copy_engine moves the shards without SMs, but roles.intra_comm is " +
                                      std::to_string(intra) + "; expected roles.intra_comm: 0, or variant: sm_movers");
    if (variant == "sm_movers" && intra == 0)
      return fail("plan.variant",
                  "sm_movers moves the shards on intra_comm SMs, but roles.intra_comm is 0; expected at least 1 "
                  "intra_comm SM, or variant: copy_engine");
    if (s.sm_mover && variant != "sm_movers")
      return fail("plan.sm_mover",
                  "only the sm_movers variant has SM movers (this plan runs copy_engine); expected "
                  "no sm_mover, or variant: sm_movers");
    if (s.copy_chunks && variant != "copy_engine")
      return fail("plan.copy_chunks",
                  "only the copy_engine variant copies shards (this plan runs sm_movers); "
                  "expected no copy_chunks, or variant: copy_engine");
  } else {
    if (s.variant && *s.variant != "peer" && *s.variant != "overlap")
      return fail("plan.variant", *s.variant + " is a variant of ag_gemm; expected peer or overlap for " + op);
    if (s.sm_mover)
      return fail("plan.sm_mover", op + " has no SM movers of that kind (the overlap variant's mover SMs are "
                                        "roles.intra_comm); expected no sm_mover");
    if (s.copy_chunks) return fail("plan.copy_chunks", op + " has no copy_chunks; expected none");
    const bool overlap = s.variant && *s.variant == "overlap";
    if (!overlap && (s.pieces || s.lag || s.send || s.gather))
      return fail(s.pieces ? "plan.pieces"
                  : s.lag  ? "plan.lag"
                  : s.send ? "plan.send"
                           : "plan.gather",
                  "a choice of the overlap variant; expected variant: overlap with it");
    if (overlap && s.reduce_blocks)
      return fail("plan.reduce_blocks", "the peer variant's reduction kernel; the overlap variant has none");
    if (s.gather && w.op != Op::kGemmAr)
      return fail("plan.gather", op + " gathers nothing (AllReduce's choice); expected no gather");
    // Keys written together that contradict each other (what the file leaves out is the plan's to fit).
    if (s.lag && s.pieces && *s.lag > *s.pieces)
      return fail("plan.lag", std::to_string(*s.lag) + ", but plan.pieces is " + std::to_string(*s.pieces) +
                                  "; expected 1 to the pieces");
    const int movers = w.roles.automatic ? 0 : w.roles.counts.intra_comm;
    if (overlap && s.send == std::optional<std::string>("sm") && movers > 0)
      return fail("roles.intra_comm", std::to_string(movers) +
                                          " mover SMs, but plan.send is sm (the epilogue sends the pieces); expected "
                                          "roles.intra_comm: 0, or send: copy");
  }
  if (s.cluster == std::optional<int>(2) && s.dynamic_tiles == std::optional<bool>(true))
    return fail("plan.gemm.dynamic_tiles",
                "true, but 2-CTA clusters walk their tiles statically; expected false, or cluster: 1");
  return Status::kOk;
}

}  // namespace

Status tune(const Workload& w, const Layout& layout, const topology::Topology& topo, const topology::Mapping& mapping,
            const MachineModel& model, Plan* out, std::string* error) {
  return tune(w, layout, topo, mapping, model, plan_mover(w, layout), out, error);
}

Status tune(const Workload& w, const Layout& layout, const topology::Topology& topo, const topology::Mapping& mapping,
            const MachineModel& model, IntraMover mover, Plan* out, std::string* error) {
  WEFT_CHECK(check_plan_spec(w, layout, error));
  Plan p;
  p.workload = w.name;
  p.source = w.source;
  p.op = w.op;
  p.dtype = w.dtype;
  p.nodes = layout.nodes;
  p.gpus_per_node = layout.gpus_per_node;
  p.world_size = layout.nodes * layout.gpus_per_node;
  p.gemm = w.gemm;
  p.moe = w.moe;
  p.attention = w.attention;
  p.gpu = model.gpu;
  p.sm_count = model.sm_count;
  p.gpu_assumed = topo.gpus.empty();
  if (w.op == Op::kRingAttention) {
    p.tile_m = 128;
    p.tile_n = 128;
    p.tile_k = static_cast<int>(w.attention.head_dim);
  }
  WEFT_CHECK(validate_layout(w, layout, error));
  LinkRates rates;
  WEFT_CHECK(link_rates(w, layout, topo, mapping, model, &rates, error));
  p.inter_backend = rates.inter_backend;
  p.nics_per_node = rates.nics_per_node;
  p.nic_sharers = rates.nic_sharers;
  p.nic_share_gbps = rates.nic_share_gbps;
  Demand d = compute_demand(w, layout, model, p);
  d.intra_mover = mover;
  p.flops = d.flops;
  p.intra_chunk_bytes = std::max(d.nvlink_out, d.nvlink_in) > 0 ? d.intra_chunk : 0;  // 0: no NVLink traffic
  p.inter_chunk_bytes = d.nic_out > 0 ? d.inter_chunk : 0;

  const int S = model.sm_count;
  if (!w.roles.automatic) {
    WEFT_CHECK(check_explicit(w, layout, d, model, &p, error));
    p.roles = w.roles.counts;
    p.roles_explicit = true;
    predict(d, rates, model, p.roles, &p);
  } else {
    p.roles = best_roles(d, rates, model);
    predict(d, rates, model, p.roles, &p);
  }

  // Bounds: all SMs on compute; the busiest link alone at full speed.
  Plan alone;
  predict(d, rates, model, RoleCounts{S, 0, 0, 0}, &alone);
  p.compute_alone_s = alone.role_time_s[0];
  const double nvb = std::max(d.nvlink_out, d.nvlink_in), nicb = std::max(d.nic_out, d.nic_in);
  p.links = {
      {"nvlink", d.nvlink_out, d.nvlink_in, rates.nvlink_gbps, transfer_time(nvb, rates.nvlink_gbps)},
      {"nic", d.nic_out, d.nic_in, rates.nic_gbps, transfer_time(nicb, rates.nic_gbps)},
      {"pcie", d.nic_out, d.nic_in, rates.pcie_gbps, transfer_time(nicb, rates.pcie_gbps)},
  };
  p.comm_alone_s = 0;
  for (const auto& l : p.links) p.comm_alone_s = std::max(p.comm_alone_s, l.time_s);
  p.bound_s = std::max(p.compute_alone_s, p.comm_alone_s);
  if (p.gpu_assumed && layout.nodes > 1)
    p.notes.push_back("no GPU in the topology: assumed one " + std::to_string(int(model.nic_gbps * 8)) +
                      " Gb/s NIC per GPU");
  if (rates.inter_backend == "socket")
    p.notes.push_back("no RDMA NIC for every GPU: inter-node traffic would use the socket backend");
  if (rates.inter_backend == "ofi")
    p.notes.push_back(std::string("inter_node: ofi, planned at ") +
                      (rates.pcie_gbps > 0 ? "an RDMA provider's rates (one NIC per GPU mapped)"
                                           : "the tcp provider's rates (no RDMA NIC for every GPU)"));
  plan_execution(w, mover, &p);
  // What runs today for moe: the staged op, its phases one after another on every SM (tuner_moe.h);
  // across nodes its hierarchical variant, the rows to other nodes through the network; ffn_combine
  // (the FFN, combine and home reduction in one launch) has no model of its own yet. The bound is the
  // grouped FFN alone or the busiest link alone, whichever is longer.
  const bool one_node_moe = (p.exec.variant == "staged" || p.exec.variant == "ffn_combine") && layout.nodes == 1;
  const bool nodes_moe = p.exec.variant == "hierarchical" && w.op == Op::kMoe && p.exec.executable;
  if (one_node_moe || nodes_moe) {
    const MoeStagedConstants c = moe_staged_constants(model);
    const MoeStagedTime st = one_node_moe ? moe_staged_time(w.moe, p.world_size, model, c, p.exec.split_k)
                                          : moe_hierarchical_time(w.moe, layout.nodes, layout.gpus_per_node,
                                                                  rates.nic_gbps, model, c, p.exec.split_k);
    p.role_time_s = {st.total_s(), 0, 0, 0};
    p.tail_s = 0;
    p.makespan_s = st.total_s();
    p.limited_by = to_string(Role::kCompute);
    p.compute_alone_s = st.ffn_s();
    p.bound_s = std::max(p.compute_alone_s, p.comm_alone_s);
  }
  if (!w.plan.empty()) p.chosen_by = "workload";
  WEFT_INFO(kTune, "%s: roles %d/%d/%d/%d, makespan %.1f us (%s), bound %.1f us", w.name.c_str(), p.roles.compute,
            p.roles.intra_comm, p.roles.inter_send, p.roles.inter_reduce, p.makespan_s * 1e6, p.limited_by.c_str(),
            p.bound_s * 1e6);
  *out = std::move(p);
  return Status::kOk;
}

std::vector<std::string> gpu_model_names(const topology::Topology& topo) {
  std::vector<std::string> names;
  for (const auto& g : topo.gpus) {
    // Live topologies name GPUs "cuda0"; the PCI id says which part it is.
    std::string by_id = gpu_name_from_pci_id(g.pci_id);
    names.push_back(by_id.empty() ? g.name : by_id);
  }
  return names;
}

Status make_plan(const Workload& w, const Layout& layout, const topology::Topology& topo,
                 const topology::Mapping& mapping, Plan* out, std::string* error,
                 const std::vector<std::string>* gpu_names) {
  return make_plan(w, layout, topo, mapping, plan_mover(w, layout), out, error, gpu_names);
}

Status make_plan(const Workload& w, const Layout& layout, const topology::Topology& topo,
                 const topology::Mapping& mapping, IntraMover mover, Plan* out, std::string* error,
                 const std::vector<std::string>* gpu_names) {
  const std::vector<std::string> names = gpu_names ? *gpu_names : gpu_model_names(topo);
  MachineModel model;
  std::string why;
  if (choose_machine_model(w.gpu, names, &model, &why) != Status::kOk) {
    // Blame what chose the model: the workload's machine.gpu, or else the environment (a file
    // position would point at a line that does not mention the GPU at all).
    const char* arch = getenv("WEFT_GPU_ARCH");
    *error = !w.gpu.empty() ? w.error_at("machine.gpu", "expected h100 or h200")
                            : "WEFT_GPU_ARCH=" + std::string(arch ? arch : "") + ": expected one of auto, h100, h200";
    return Status::kInvalidArgument;
  }
  int64_t channels = 0;
  if (get_param("WEFT_NET_CHANNELS", &channels) == Status::kOk && channels >= 1)
    model.net_channels = static_cast<int>(channels);
  for (const auto& o : w.machine_overrides) {
    std::string err;
    if (set_machine_model_value(&model, o.first, o.second, &err) != Status::kOk) {
      *error = w.error_at("machine." + o.first, err);
      return Status::kInvalidArgument;
    }
  }
  WEFT_CHECK(tune(w, layout, topo, mapping, model, mover, out, error));
  out->gpu_reason = why;
  if (!w.machine_overrides.empty()) out->gpu_reason += " (with machine: overrides)";
  return Status::kOk;
}

}  // namespace weft::runtime
