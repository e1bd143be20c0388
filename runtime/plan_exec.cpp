// Plan::exec and Plan::heap: which variant the op runs, with what, and where its buffers sit in the heap.
#include <algorithm>
#include <string>

#include "base/params.h"
#include "kernels/ag_gemm_nodes_plan.h"
#include "kernels/frame.cuh"
#include "kernels/gemm_reduce_nodes_plan.h"
#include "kernels/moe_nodes_plan.h"
#include "kernels/moe_plan.h"
#include "kernels/reduce_overlap_plan.h"
#include "kernels/small_reduce_plan.h"
#include "kernels/tile_scheduler.h"
#include "runtime/plan.h"

namespace weft::runtime {
namespace {

// The op runs on one group: a refusal about its nodes or GPUs points at `group:` when the file has one.
const char* nodes_key(const Workload& w) { return w.group ? "group.nodes" : "layout.nodes"; }
const char* gpus_key(const Workload& w) { return w.group ? "group.gpus_per_node" : "layout.gpus_per_node"; }

constexpr int64_t kTileRows = 128;      // the GEMM core's tile (kernels/gemm_types.h, GemmConfig)
constexpr int64_t kTileCols = 256;      //
constexpr uint64_t kRegionAlign = 256;  // every region: TMA needs 128-byte aligned bases; flags 8
constexpr uint64_t kHeapAlign = 4096;   // the op's whole share

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

void add_region(Plan* p, const std::string& name, uint64_t bytes) {
  const uint64_t offset = align_up(p->heap_bytes, kRegionAlign);
  p->heap.push_back({name, offset, bytes});
  p->heap_bytes = offset + bytes;
}

void refuse(Plan* p, const std::string& why) {
  p->exec.executable = false;
  p->exec.not_executable = why;
}

// The workload's `plan:` choices over the op's defaults (the tuner checked that each applies to the op).
void apply_plan_spec(const PlanSpec& s, Execution* e) {
  if (s.variant) e->variant = *s.variant;
  if (s.sm_mover) e->sm_mover = *s.sm_mover;
  if (s.copy_chunks) e->copy_chunks = *s.copy_chunks;
  if (s.cluster) e->cluster = *s.cluster;
  if (s.group_m) e->group_m = *s.group_m;
  if (s.reduce_blocks) e->reduce_blocks = *s.reduce_blocks;
  if (s.split_tail) e->gemm.split_tail = *s.split_tail;
  if (s.chunked_tail) e->gemm.chunked_tail = *s.chunked_tail;
  if (s.dynamic_tiles) e->gemm.dynamic_tiles = *s.dynamic_tiles;
  if (s.tma_store) e->gemm.tma_store = *s.tma_store;
  // 2-CTA clusters walk their tiles statically (kernels/gemm.h, enable_dynamic_tiles).
  if (e->cluster == 2 && !s.dynamic_tiles) e->gemm.dynamic_tiles = false;
}

// AllGather+GEMM on one node (runtime/exec/ag_gemm.h). Per call, rank r: the copy engines push its
//   shard into every peer's gathered A (each once that peer's previous GEMM is done with it: consumed
//   token) and open the peer's gate for it, while the GEMM runs shard by shard behind the gates; the
//   SM movers pull the peers' shards once each peer's ready token is up.
//   The copy engines' GEMM may run 2-CTA clusters sharing B's tiles (TMA multicast; plan.cluster: 2,
//   and a `weftrun tune` candidate): the benchmark runner's pulling variant measured faster with them
//   at 7168 columns per rank, but the op itself, pushing, measured faster in 1-CTA clusters at m 2048
//   (0.357 against 0.364 ms back to back, 4 x H200, docs/results/2026-11-27-runtime-op-harness.md),
//   so the model plans 1-CTA clusters.
void plan_ag_gemm(const Workload& w, Plan* p) {
  const int64_t W = p->world_size, m = p->gemm.m, k = p->gemm.k, n_loc = p->gemm.n / W, m_loc = m / W;
  Execution& e = p->exec;
  if (e.variant == "sm_movers") e.sm_mover = "pull_vec";
  const bool pairs = m_loc % (2 * kTileRows) == 0 && p->roles.compute % 2 == 0 && p->roles.total() % 2 == 0;
  e.cluster = 1;
  e.group_m = 16;
  apply_plan_spec(w.plan, &e);
  // The copy engines' words are tokens with constant values: a captured call replays. The SM movers'
  // per-tile flags count launches through a kernel argument.
  e.capturable = e.variant == "copy_engine";
  e.executable = true;
  if (e.variant == "sm_movers" && p->roles.intra_comm < 1)
    return refuse(p, w.error_at(w.plan.variant ? "plan.variant" : "roles.intra_comm",
                                "the SM movers need intra_comm SMs; the plan's roles give them none"));
  if (e.cluster == 2 && e.variant != "copy_engine")
    return refuse(p, w.error_at("plan.cluster", "2: the SM movers' kernel runs 1-CTA clusters; expected 1"));
  if (e.cluster == 2 && !pairs)
    return refuse(p, w.error_at("plan.cluster", "2: 2-CTA clusters need m / ranks (" + std::to_string(m_loc) +
                                                    ") to be a multiple of " + std::to_string(2 * kTileRows) +
                                                    " rows and an even number of compute SMs and of SMs in all "
                                                    "(the plan has " +
                                                    std::to_string(p->roles.compute) + " and " +
                                                    std::to_string(p->roles.total()) + ")"));
  if (e.copy_chunks != 1)
    return refuse(p, w.error_at("plan.copy_chunks", std::to_string(e.copy_chunks) +
                                                        ": this build's ag_gemm op makes one copy per shard (weftrun "
                                                        "bench measures more); expected 1"));
  if (m_loc % kTileRows != 0)
    return refuse(p, w.error_at("shape.m", "m / ranks = " + std::to_string(m_loc) + " rows: expected a multiple of " +
                                               std::to_string(kTileRows) + " (a tile must not span two shards)"));
  if (k % 8 != 0)
    return refuse(p, w.error_at("shape.k", std::to_string(k) + ": expected a multiple of 8 (16-byte rows for TMA)"));
  if (e.variant == "sm_movers" && W > 8)
    return refuse(p, w.error_at("roles.intra_comm", "SM movers handle at most 8 GPUs of a node; the layout has " +
                                                        std::to_string(W) + " (use intra_comm: 0, the copy engines)"));
  add_region(p, "ag_gemm.a", uint64_t(m * k) * 2);  // the gathered A, bf16
  if (e.variant == "copy_engine") {
    add_region(p, "ag_gemm.gate", uint64_t(W * e.copy_chunks) * 8);  // [q]: 1 once q pushed its shard here
  } else {
    // kernels/ag_gemm_fused.h: one word per (128-row block, GEMM column block), then W clear-to-send.
    const int64_t words = (m / kTileRows) * ((n_loc + kTileCols - 1) / kTileCols) + W;
    add_region(p, "ag_gemm.flags", uint64_t(words) * 8);
  }
  if (e.variant != "copy_engine")
    add_region(p, "ag_gemm.ready", uint64_t(W) * 8);   // [q]: 1 once rank q's shard is in place (the movers pull)
  add_region(p, "ag_gemm.consumed", uint64_t(W) * 8);  // [q]: 1 once rank q is done with this rank's shard
  p->heap_bytes = align_up(p->heap_bytes, kHeapAlign);
}

// AllGather+GEMM across nodes (runtime/exec/ag_gemm_nodes.h): every rank's shard crosses the NIC once
// per other node (a put+signal per chunk, through the proxy) to its rail peer, which forwards it to its
// node-mates over NVLink; node-mates' own shards are pulled by the copy engines; the GEMM runs over the
// rank's order of positions (kernels/ag_gemm_nodes_plan.h), each chunk behind its flag. Chunks: the
// most (at most 8) that divide a shard's 128-row tiles; channels: WEFT_NET_CHANNELS (4).
constexpr int kMaxNodesRanks = 32;  // the scatter epilogue's owners (kernels/gemm_epilogues.h)

void plan_ag_gemm_nodes(const Workload& w, Plan* p) {
  const int64_t W = p->world_size, m = p->gemm.m, k = p->gemm.k, m_loc = m / W;
  Execution& e = p->exec;
  e.variant = "hierarchical";
  e.cluster = 1;
  e.group_m = 16;
  e.copy_chunks = kernels::ag_nodes_chunks(m_loc, int(kTileRows), 8);
  // Its GEMM walks the tiles statically, whole, storing C from registers (the kernel as measured by
  // `weftrun bench`): none of the GEMM core's launch choices.
  e.gemm = GemmChoices{false, false, false, false};
  e.signal_mode = to_string(w.transport.signal_mode);
  int64_t channels = 4;
  if (get_param("WEFT_NET_CHANNELS", &channels) != Status::kOk || channels < 1 || channels > 8) {
    e.channels = 4;
    return refuse(p, "WEFT_NET_CHANNELS: expected 1 to 8 proxy channels");
  }
  e.channels = int(channels);
  // (Across nodes a workload's plan: map is refused: the tuner's check_plan_spec.)
  // A call's stream waits and writes carry its epoch: a captured call would replay the first epoch.
  e.capturable = false;
  e.executable = true;
  if (W > kMaxNodesRanks)
    return refuse(p, w.error_at(nodes_key(w), std::to_string(W) + " ranks: ag_gemm across nodes runs at most " +
                                                  std::to_string(kMaxNodesRanks) + " in this build"));
  std::vector<int> node_of, local_of;
  for (int r = 0; r < W; ++r) node_of.push_back(r / p->gpus_per_node), local_of.push_back(r % p->gpus_per_node);
  kernels::AgNodesPlan moves;
  std::string why;
  if (!kernels::make_ag_nodes_plan(node_of, local_of, 0, &moves, &why)) return refuse(p, why);
  if (moves.sends.size() > 8 || moves.forwards.size() > 8 || p->gpus_per_node > 9)
    return refuse(
        p, w.error_at(nodes_key(w),
                      "ag_gemm across nodes moves at most 8 sends and 8 forwards per rank "
                      "in this build (this layout needs " +
                          std::to_string(moves.sends.size()) + " and " + std::to_string(moves.forwards.size()) + ")"));
  if (m_loc % kTileRows != 0)
    return refuse(p, w.error_at("shape.m", "m / ranks = " + std::to_string(m_loc) + " rows: expected a multiple of " +
                                               std::to_string(kTileRows) + " (a tile must not span two shards)"));
  if (k % 8 != 0)
    return refuse(p, w.error_at("shape.k", std::to_string(k) + ": expected a multiple of 8 (16-byte rows for TMA)"));
  if ((m_loc / kTileRows) % e.copy_chunks != 0)
    return refuse(p, w.error_at("plan.copy_chunks", std::to_string(e.copy_chunks) + ": a shard's " +
                                                        std::to_string(m_loc / kTileRows) +
                                                        " tiles of 128 rows must split evenly into the chunks"));
  if (e.cluster != 1)
    return refuse(p,
                  w.error_at("plan.cluster", std::to_string(e.cluster) + ": ag_gemm across nodes runs 1-CTA clusters"));
  if (!moves.sends.empty() && p->roles.inter_send < 1)
    return refuse(p, w.error_at("roles.inter_send",
                                "the shard's puts to the rail peers need an inter_send SM; the "
                                "plan's roles give none"));
  if (!moves.forwards.empty() && p->roles.intra_comm < 1)
    return refuse(p, w.error_at("roles.intra_comm",
                                "the forwards to the node-mates need intra_comm SMs; the "
                                "plan's roles give none"));
  if (p->roles.compute < 1) return refuse(p, w.error_at("roles.compute", "the GEMM needs compute SMs"));
  add_region(p, "ag_nodes.a", uint64_t(m * k) * 2);                  // positions, in this rank's order
  add_region(p, "ag_nodes.flags", uint64_t(W * e.copy_chunks) * 8);  // [position][chunk]: epoch once there
  add_region(p, "ag_nodes.freed", uint64_t(2 * W) * 8);              // [rail q], [W + mate q]: q's last run over
  add_region(p, "ag_nodes.ready", uint64_t(W) * 8);                  // [mate q]: q's new shard in position 0
  p->heap_bytes = align_up(p->heap_bytes, kHeapAlign);
}

// GEMM+RS and GEMM+AR across nodes (runtime/exec/gemm_reduce_nodes_op.h, the data flow drawn in
// kernels/gemm_reduce_nodes_plan.h): the GEMM's epilogue stages partials; node-mates' partials move
// by the copy engines; node sums cross the NIC through the proxy (one inter_send SM); AllReduce's
// reduced rows come back the same ways. Pieces: the most (at most 8) of whole tiles and at least
// 2 MiB each; channels: WEFT_NET_CHANNELS (4). Roles: every other SM computes.
void plan_gemm_reduce_nodes(const Workload& w, Plan* p) {
  const int64_t W = p->world_size, m = p->gemm.m, n = p->gemm.n, k = p->gemm.k, m_loc = m / W;
  const bool ar = p->op == Op::kGemmAr;
  Execution& e = p->exec;
  e.variant = "hierarchical";
  e.cluster = 1;
  e.group_m = 16;
  // The staged partials of positions below the reduce range leave through TMA stores; the GEMM walks
  // its tiles statically and whole (the kernel as `weftrun bench` measures it).
  e.gemm = GemmChoices{false, false, false, true};
  e.pieces = kernels::rs_nodes_pieces(m_loc, n * 2, int(kTileRows), 0);
  e.signal_mode = to_string(w.transport.signal_mode);
  int64_t channels = 4;
  if (get_param("WEFT_NET_CHANNELS", &channels) != Status::kOk || channels < 1 || channels > 8) {
    e.channels = 4;
    return refuse(p, "WEFT_NET_CHANNELS: expected 1 to 8 proxy channels");
  }
  e.channels = int(channels);
  e.capturable = false;  // the flags carry the call's number (kernel arguments, stream waits)
  e.executable = true;
  if (m % (W * kTileRows) != 0)
    return refuse(p, w.error_at("shape.m", "m / ranks = " + std::to_string(m / W) + " rows: expected a multiple of " +
                                               std::to_string(kTileRows)));
  if (k % W != 0 || (k / W) % 8 != 0)
    return refuse(p, w.error_at("shape.k", std::to_string(k) + ": expected k / ranks to be a multiple of 8 (16-byte "
                                                               "rows for TMA)"));
  if (e.pieces < 1) return refuse(p, w.error_at("shape.m", "a rank's rows do not cut into whole 128-row pieces"));
  std::vector<int> node_of, local_of;
  for (int r = 0; r < W; ++r) node_of.push_back(r / p->gpus_per_node), local_of.push_back(r % p->gpus_per_node);
  kernels::RsNodesPlan moves;
  std::string why;
  if (!kernels::make_rs_nodes_plan(node_of, local_of, 0, 10, &moves, &why))  // EpiReduceSlots::kMaxSlots
    return refuse(p, w.error_at(nodes_key(w), why));
  if (moves.rails.size() > 8)
    return refuse(p, w.error_at(nodes_key(w), std::to_string(p->nodes) + " nodes: at most 9 in this build"));
  if (p->roles_explicit && (p->roles.intra_comm > 0 || p->roles.inter_reduce > 0 || p->roles.inter_send < 1))
    return refuse(p, w.error_at("roles",
                                "across nodes this op runs compute SMs and one inter_send SM (the copy "
                                "engines move the NVLink bytes; the epilogue sums); expected intra_comm: 0, "
                                "inter_reduce: 0, inter_send: 1"));
  // The model's split stays in the predictions (plan.cpp's notes say so); the op runs this one.
  if (!p->roles_explicit) p->roles = RoleCounts{p->sm_count - 1, 0, 1, 0};
  // The runner's layout (runtime/exec/gemm_reduce_nodes.cpp, RsNodes::size), in its order and alignment.
  const uint64_t R = uint64_t(moves.reduce_rows()), slots = moves.slots.size(), S = uint64_t(e.pieces);
  const uint64_t block = uint64_t(m_loc * n) * 2, mn = uint64_t(m * n) * 2;
  auto region = [&](const char* name, uint64_t bytes, uint64_t align) {
    const uint64_t offset = align_up(p->heap_bytes, align);
    p->heap.push_back({std::string("gemm_reduce_nodes.") + name, offset, bytes});
    p->heap_bytes = offset + bytes;
  };
  region("partial", mn, 1024);
  region("out", R * block, 1024);
  region("slots", slots * R * block, 1024);
  if (ar) region("c", mn, 1024);
  region("arrived", 8 * slots * uint64_t(W) * S, 256);
  region("mate_freed", 8 * uint64_t(W), 256);
  region("rail_freed", 8 * uint64_t(W), 256);
  region("c_arrived", 8 * uint64_t(W) * S, 256);
  p->heap_bytes = align_up(p->heap_bytes, kHeapAlign);
}

// The overlap variant's choices and heap. Pieces: as many as asked, else the most (at most 4) of
// whole tiles and at least 2 MiB each (more pieces cost host calls per copy; measured in
// docs/results/2026-11-gemm-reduce.md). RS: own rows last (lag = pieces); copy-engine sends where a
// rank's block of rows is at least 16 MiB (below that a copy's fixed latency is not hidden behind the
// GEMM), with 3 or more ranks 4 mover SMs for each round's last owner's pieces, else the epilogue
// sends; AR: the epilogue sends and gathers, own piece j one round late (lag 1) — the fastest rows of
// that document, and the rule `weftrun bench` picks its runner's path by.
constexpr int64_t kOverlapCopyBlockBytes = int64_t(16) << 20;

void plan_gemm_reduce_overlap(const Workload& w, Plan* p) {
  const int64_t W = p->world_size, m = p->gemm.m, n = p->gemm.n, m_loc = m / W;
  const bool ar = p->op == Op::kGemmAr;
  Execution& e = p->exec;
  e.reduce_blocks = 0;
  if (W < 2) return refuse(p, w.error_at(gpus_key(w), "1 rank: the overlap variant needs 2 to 8 GPUs of one node"));
  if (e.cluster != 1)
    return refuse(p,
                  w.error_at("plan.cluster", std::to_string(e.cluster) + ": the overlap variant runs 1-CTA clusters"));
  if (m_loc % kTileRows != 0)
    return refuse(p, w.error_at("shape.m", std::to_string(m) +
                                               ": the overlap variant needs m / ranks to be a multiple "
                                               "of " +
                                               std::to_string(kTileRows) + " rows"));
  if (n % 8 != 0) return refuse(p, w.error_at("shape.n", std::to_string(n) + ": expected a multiple of 8"));
  // The GEMM with the reducing epilogue walks its tiles statically and splits its tail into K-slices
  // only (kernels/gemm_sm90.cuh: kClaimsTiles, kChunkedTail).
  if (w.plan.dynamic_tiles == std::optional<bool>(true) || w.plan.chunked_tail == std::optional<bool>(true))
    return refuse(p, w.error_at(w.plan.dynamic_tiles == std::optional<bool>(true) ? "plan.gemm.dynamic_tiles"
                                                                                  : "plan.gemm.chunked_tail",
                                "true: the overlap variant's GEMM walks its tiles statically and splits its tail "
                                "into K-slices only; expected false"));
  e.gemm.dynamic_tiles = false;
  e.gemm.chunked_tail = false;
  const int64_t block_bytes = m_loc * n * 2;
  if (w.plan.pieces) {
    e.pieces = *w.plan.pieces;
    if (m_loc % (kTileRows * e.pieces) != 0)
      return refuse(p, w.error_at("plan.pieces", std::to_string(e.pieces) + ": each rank's " + std::to_string(m_loc) +
                                                     " rows must split into pieces of a multiple of " +
                                                     std::to_string(kTileRows) + " rows"));
  } else {
    e.pieces = 1;
    while (e.pieces < 4 && m_loc % (kTileRows * e.pieces * 2) == 0 && block_bytes / (e.pieces * 2) >= (2 << 20))
      e.pieces *= 2;
  }
  e.send = w.plan.send ? *w.plan.send : ar || block_bytes < kOverlapCopyBlockBytes ? "sm" : "copy";
  e.gather = !ar ? "" : w.plan.gather ? *w.plan.gather : e.send == "sm" ? "sm" : "push";
  e.lag = w.plan.lag ? *w.plan.lag : ar ? 1 : e.pieces;
  if (e.lag > e.pieces)
    return refuse(p, w.error_at("plan.lag",
                                std::to_string(e.lag) + ": expected 1 to the " + std::to_string(e.pieces) + " pieces"));
  // Mover SMs are roles.intra_comm: as written, or 4 where they help (copy sends, 3 or more ranks).
  if (!p->roles_explicit) {
    const int movers = e.send == "copy" && W >= 3 ? 4 : 0;
    p->roles.intra_comm = movers;
    p->roles.compute = (p->sm_count - movers) / 2 * 2;
    p->roles.inter_send = p->roles.inter_reduce = 0;
  }
  const int movers = p->roles.intra_comm;
  if (movers > 0 && (e.send != "copy" || W < 3))
    return refuse(p, w.error_at("roles.intra_comm",
                                std::to_string(movers) +
                                    " mover SMs: they push each round's last owner's pieces when the copy engines "
                                    "send and there are 3 or more ranks; expected 0"));
  if (movers > p->sm_count / 2 || (movers > 0 && e.pieces > kernels::kOverlapMaxMoverPieces))
    return refuse(p, w.error_at(movers > p->sm_count / 2 ? "roles.intra_comm" : "plan.pieces",
                                "the mover SMs take at most half the GPU and " +
                                    std::to_string(kernels::kOverlapMaxMoverPieces) + " pieces"));
  if (p->roles.compute < 2 || p->roles.total() > p->sm_count)
    return refuse(p, w.error_at("roles", "the GEMM and the movers must fit the GPU's " + std::to_string(p->sm_count) +
                                             " SMs together"));
  const uint64_t flags = uint64_t(W * e.pieces) * 8;
  add_region(p, "gemm_reduce.partial", uint64_t(m * n) * 2);
  add_region(p, "gemm_reduce.staging", uint64_t(m * n) * 2);  // W slots of m / W rows
  if (ar) add_region(p, "gemm_reduce.c", uint64_t(m * n) * 2);
  add_region(p, "gemm_reduce.arrived", flags);
  add_region(p, "gemm_reduce.landed", flags);
  add_region(p, "gemm_reduce.moved", flags);
  add_region(p, "gemm_reduce.tiles", flags);
  add_region(p, "gemm_reduce.gate", flags);
  add_region(p, "gemm_reduce.freed", uint64_t(W) * 8);
  add_region(p, "gemm_reduce.gathered", uint64_t(W) * 8);
  add_region(p, "gemm_reduce.bcast", uint64_t(W) * 8);
  p->heap_bytes = align_up(p->heap_bytes, kHeapAlign);
}

// GEMM+RS / GEMM+AR on one node (runtime/exec/gemm_reduce.cpp), two variants:
//   peer: the GEMM into this rank's partial in the heap, then the reduction kernel pulls every rank's
//     partial rows of its block over NVLink;
//   overlap (runtime/exec/reduce_overlap.h): the partial pieces move to their owners while the GEMM
//     runs, and the own rows are reduced in its epilogue.
// Unless the workload names one, the overlap variant wherever it can run as planned (a rank's rows
// whole tiles, no choice of the peer variant's such as plan.reduce_blocks or plan.cluster: 2), else
// peer (plan_decide.cpp also falls back to peer for ranks that share a GPU). Measured on 4 GPUs:
// docs/results/2026-11-26-gemm-reduce-op.md.
void plan_gemm_reduce(const Workload& w, Plan* p) {
  const int64_t W = p->world_size, m = p->gemm.m, n = p->gemm.n, k = p->gemm.k;
  const bool ar = p->op == Op::kGemmAr;
  Execution& e = p->exec;
  e.variant = "peer";
  e.cluster = 1;
  e.group_m = 16;
  apply_plan_spec(w.plan, &e);
  e.capturable = false;  // the flags count calls through kernel arguments and stream waits
  e.executable = true;
  if (W > 8) return refuse(p, w.error_at(gpus_key(w), std::to_string(W) + " ranks: the reduction handles at most 8"));
  if (m % W != 0)
    return refuse(p, w.error_at("shape.m", std::to_string(m) + ": expected a multiple of the " + std::to_string(W) +
                                               " ranks (each gets m / ranks rows)"));
  if (k % W != 0 || (k / W) % 8 != 0)
    return refuse(p, w.error_at("shape.k", std::to_string(k) + ": expected k / ranks to be a multiple of 8 (16-byte "
                                                               "rows for TMA)"));
  if (e.variant == "overlap") return plan_gemm_reduce_overlap(w, p);
  if (!w.plan.variant && !w.plan.reduce_blocks && e.cluster == 1) {
    Plan overlap = *p;
    overlap.exec.variant = "overlap";
    plan_gemm_reduce_overlap(w, &overlap);
    if (overlap.exec.executable) {
      *p = std::move(overlap);
      return;
    }
  }
  // The peer variant: the GEMM on every SM, then the reduction kernel (also where a plan of the
  // overlap variant, with its mover SMs, is replanned as peer). The kernel moves 16-byte vectors of a
  // rank's row block: (m / ranks) x n must be a multiple of 8 elements.
  if ((m / W) * n % 8 != 0)
    return refuse(p, w.error_at("shape.n", std::to_string(n) + ": the peer variant reduces 16-byte vectors, so (m / " +
                                               "ranks) x n must be a multiple of 8 elements (here " +
                                               std::to_string(m / W) + " x " + std::to_string(n) + ")"));
  if (!p->roles_explicit) p->roles = RoleCounts{p->sm_count, 0, 0, 0};
  // At most this many blocks of 512 threads reduce (fewer where there is less than a vector per
  // thread): 16 moved a small shape's bytes faster than one per SM on 4 H200s (the runner's peer
  // rows, docs/results/2026-11-26-four-gpus-before-after.md).
  if (e.reduce_blocks == 0) e.reduce_blocks = std::min(16, p->sm_count);
  if (e.reduce_blocks > p->sm_count)
    return refuse(p,
                  w.error_at("plan.reduce_blocks", std::to_string(e.reduce_blocks) +
                                                       ": the reduction's blocks wait for their peers' flag words, "
                                                       "so all must be resident at once; expected at most 1 per SM (" +
                                                       std::to_string(p->sm_count) + ")"));
  if (e.cluster == 2 && (p->roles.compute % 2 != 0 || p->roles.total() % 2 != 0))
    return refuse(p, w.error_at("plan.cluster",
                                "2: the GEMM's grid and its compute blocks must be even; the roles "
                                "give " +
                                    std::to_string(p->roles.compute) + " compute of " +
                                    std::to_string(p->roles.total()) + " blocks"));
  add_region(p, "gemm_reduce.partial", 2 * uint64_t(m * n) * 2);  // two copies: a call's parity
  if (ar) add_region(p, "gemm_reduce.c", uint64_t(m * n) * 2);
  add_region(p, "gemm_reduce.flags", uint64_t(kernels::SmallReducePlan::words(int32_t(W))) * 8);
  p->heap_bytes = align_up(p->heap_bytes, kHeapAlign);
}

// The MoE layer on one node (runtime/exec/moe.h), "staged": routing, dispatch, arrange, the grouped
// GEMMs and the combine as kernels in sequence, each on every SM the plan gives; "ffn_combine" (only
// as the workload writes it): the grouped GEMMs, combine and home reduction in one launch. The launch
// with SM roles for movers is not built yet. The heap holds the receive slots, combine rows and flags.
void plan_moe(const Workload& w, Plan* p) {
  Execution& e = p->exec;
  e.variant = w.plan.variant ? *w.plan.variant : "staged";  // "ffn_combine" only as the workload asks
  e.cluster = 1;        // the router GEMM's launch (its record is what `run` reads back)
  e.capturable = true;  // the flags carry the call's epoch from a device word the call raises
  e.executable = true;
  // The down projection's K split where its parts fit one wave (decode counts), unless the workload
  // caps it (split_k: 1 keeps every row's bits independent of the other rows' counts).
  e.split_k = w.plan.split_k ? *w.plan.split_k : kernels::kMoeMaxSplit;
  const int64_t W = p->world_size;
  const bool across = p->nodes > 1;
  if (across) {  // the staged phases with dispatch and combine across nodes (kernels/moe_nodes.h)
    if (w.plan.variant && *w.plan.variant != "hierarchical")
      return refuse(p, w.error_at("plan.variant",
                                  "'" + *w.plan.variant + "': across nodes the MoE op runs the hierarchical variant"));
    e.variant = "hierarchical";
    e.signal_mode = to_string(w.transport.signal_mode);
    int64_t channels = 4;  // a block moves in one piece per channel
    if (get_param("WEFT_NET_CHANNELS", &channels) != Status::kOk || channels < 1 || channels > 8)
      return refuse(p, "WEFT_NET_CHANNELS: expected 1 to 8 proxy channels");
    e.channels = int(channels);
  } else if (e.variant == "hierarchical") {
    return refuse(p, w.error_at("plan.variant", "'hierarchical' is the MoE op across nodes; this layout is one node"));
  }
  if (W > 8)
    return refuse(p, w.error_at(across ? nodes_key(w) : gpus_key(w),
                                std::to_string(W) + " ranks: the op handles at most 8 in this build"));
  if (p->moe.tokens % W != 0)
    return refuse(p, w.error_at("shape.tokens", std::to_string(p->moe.tokens) + ": expected a multiple of the " +
                                                    std::to_string(W) + " ranks"));
  kernels::MoeShape s;
  s.tokens = int32_t(std::min<int64_t>(p->moe.tokens / W, int64_t(1) << 30));
  s.hidden = int32_t(std::min<int64_t>(p->moe.hidden, 1 << 20));
  s.ffn = int32_t(std::min<int64_t>(p->moe.ffn, 1 << 20));
  s.experts = int32_t(std::min<int64_t>(p->moe.experts, 1 << 20));
  s.topk = int32_t(std::min<int64_t>(p->moe.topk, 1 << 20));
  s.world = int32_t(W);
  if (const char* why = s.invalid()) return refuse(p, w.error_at("shape", why));
  if (p->moe.hidden > 65536 || p->moe.ffn > 65536)
    return refuse(p, w.error_at("shape", "hidden and ffn above 65536 are not supported"));
  if (p->roles_explicit && (p->roles.intra_comm > 0 || p->roles.inter_send > 0 || p->roles.inter_reduce > 0))
    return refuse(p, w.error_at("roles",
                                "the MoE op runs its phases one after another on compute SMs; roles for "
                                "movers are for the fused launch, which is not built yet (give compute only)"));
  if (!p->roles_explicit) {  // every SM the model had, all computing
    const int total = p->roles.total();
    p->roles = RoleCounts{};
    p->roles.compute = total;
  }
  // Planned again (a tune candidate, a cached variant): the notes this function gives are not repeated.
  auto mine = [](const std::string& n) {
    return n.rfind("runs the staged MoE op", 0) == 0 || n.rfind("runs the MoE op with", 0) == 0 ||
           n.rfind("counts first:", 0) == 0;
  };
  p->notes.erase(std::remove_if(p->notes.begin(), p->notes.end(), mine), p->notes.end());
  p->notes.push_back(
      across ? "runs the staged MoE op across nodes: each token crosses the NIC once per destination node to the "
               "home's rail peer there, which forwards it over NVLink and sums its node's combine rows before "
               "they go back (router, dispatch, arrange, grouped GEMMs, combine in sequence); the makespan is "
               "the sum of the phases (docs/tuner.md, MoE)"
      : e.variant == "ffn_combine"
          ? "runs the MoE op with its expert FFN, combine and home reduction in one persistent launch (router, "
            "dispatch and arrange before it); the makespan is the staged op's model (docs/tuner.md, MoE)"
          : "runs the staged MoE op (router, dispatch, arrange, grouped GEMMs, combine in sequence); the "
            "makespan is the sum of the phases (docs/tuner.md, MoE)");
  // The heap budget a user states (WEFT_HEAP_BYTES); unset, the workload sizes it: the worst case.
  int64_t budget = 0;
  if (get_param("WEFT_HEAP_BYTES", &budget) != Status::kOk || budget < 0) budget = 0;
  kernels::MoeHeapLayout h;
  kernels::MoeNodesHeap nh;
  const char* why = nullptr;
  if (across) {  // the cross-node regions come out of the same budget (MoeOp::create does the same)
    const int G = p->gpus_per_node;
    if (!kernels::moe_nodes_heap(s, p->nodes, G, e.channels, 0, &nh, &why)) return refuse(p, w.error_at("shape", why));
    if (budget > 0 && budget <= nh.total_bytes)
      return refuse(p, "WEFT_HEAP_BYTES " + std::to_string(budget) + " does not hold the cross-node regions (" +
                           std::to_string(nh.total_bytes) + " bytes)");
    if (budget > 0) budget -= nh.total_bytes;
  }
  if (!kernels::moe_heap_layout(s, budget, &h, &why)) return refuse(p, w.error_at("shape", why));
  if (h.mode == kernels::MoeSlotMode::kCountsFirst)
    p->notes.push_back("counts first: WEFT_HEAP_BYTES leaves " + std::to_string(h.grouped_rows) +
                       " grouped rows of the " + std::to_string(h.worst_rows) +
                       " the worst case needs; a call whose routed rows need more fails with an error naming them");
  p->heap.push_back({"moe.recv", uint64_t(h.recv_offset), uint64_t(h.recv_bytes)});
  p->heap.push_back({"moe.combine", uint64_t(h.combine_offset), uint64_t(h.combine_bytes)});
  p->heap.push_back({"moe.flags", uint64_t(h.flags_offset), uint64_t(h.flags_bytes)});
  p->heap.push_back({"moe.x", uint64_t(h.x_offset), uint64_t(h.h_offset - h.x_offset)});
  p->heap.push_back({"moe.h", uint64_t(h.h_offset), uint64_t(h.y_offset - h.h_offset)});
  p->heap.push_back({"moe.y", uint64_t(h.y_offset), uint64_t(h.grouped_rows * s.hidden * 2)});
  p->heap_bytes = uint64_t(h.total_bytes);
  if (across) {
    kernels::moe_nodes_heap(s, p->nodes, p->gpus_per_node, e.channels, h.total_bytes, &nh, &why);
    for (const auto& r : nh.regions()) p->heap.push_back({r.name, uint64_t(r.offset), uint64_t(r.bytes)});
    p->heap_bytes = uint64_t(nh.total_bytes);
  }
}

}  // namespace

void plan_execution(const Workload& w, IntraMover mover, Plan* p) {
  p->exec = Execution{};
  p->heap.clear();
  p->heap_bytes = 0;
  p->exec.executable = true;
  // The variant first, so that a plan this build cannot run still says how it would move the bytes:
  // for AllGather+GEMM the mover the tuner planned with (the workload's plan.variant, else its roles:
  // tuner.cpp, plan_mover); GEMM+RS/AR the workload's, else peer until plan_gemm_reduce finds that
  // the overlap variant can run. Other ops and layouts have none.
  if (p->nodes == 1 && p->op == Op::kAgGemm) p->exec.variant = mover == IntraMover::kSm ? "sm_movers" : "copy_engine";
  if (p->nodes == 1 && (p->op == Op::kGemmRs || p->op == Op::kGemmAr))
    p->exec.variant = w.plan.variant ? *w.plan.variant : "peer";
  if (p->dtype != DType::kBf16)
    return refuse(p, w.error_at("dtype", std::string(to_string(p->dtype)) +
                                             ": this build's kernels take bf16 only (expected bf16)"));
  switch (p->op) {
    case Op::kAgGemm:
      if (p->nodes > 1) return plan_ag_gemm_nodes(w, p);
      return plan_ag_gemm(w, p);
    case Op::kGemmRs:
    case Op::kGemmAr:
      if (p->nodes > 1) return plan_gemm_reduce_nodes(w, p);
      return plan_gemm_reduce(w, p);
    case Op::kMoe:
      return plan_moe(w, p);
    case Op::kRingAttention:
      return refuse(p, w.error_at("op", "ring_attention is not built yet (planned only)"));
  }
}

bool apply_launch_record(const kernels::LaunchRecord& rec, Plan* p, std::string* why) {
  if (rec.launches < 1) {
    *why = "no launch recorded since the record was cleared";
    return false;
  }
  RoleCounts r;
  r.compute = rec.blocks[int(Role::kCompute)] / rec.launches;
  r.intra_comm = rec.blocks[int(Role::kIntraComm)] / rec.launches;
  r.inter_send = rec.blocks[int(Role::kInterSend)] / rec.launches;
  r.inter_reduce = rec.blocks[int(Role::kInterReduce)] / rec.launches;
  if (r.total() != rec.grid) {
    *why = "the grid had " + std::to_string(rec.grid) + " blocks, " + std::to_string(r.total()) + " ran per launch";
    return false;
  }
  p->roles = r;
  p->exec.cluster = rec.cluster;
  return true;
}

bool check_moe_split(const kernels::LaunchRecord& rec, const Plan& p, std::string* why) {
  const int cap = std::max(1, p.exec.split_k);
  if (rec.parts >= 1 && rec.parts <= cap) return true;
  *why = rec.parts < 1 ? "no expert FFN launch recorded its K parts"
                       : "the expert FFN's last launch ran a projection in " + std::to_string(rec.parts) +
                             " K parts; the plan's split_k allows 1 to " + std::to_string(cap);
  return false;
}

bool apply_reduce_schedule(const kernels::LaunchRecord& rec, Plan* p, std::string* why) {
  const int W = p->world_size;
  const bool ar = p->op == Op::kGemmAr;
  if (rec.launches < 1 || rec.kernel != int32_t(kernels::KernelKind::kGemmReduceSlots)) {
    *why = "no launch of the GEMM with the reducing epilogue recorded";
    return false;
  }
  if (W < 1 || rec.shards < W || rec.shards % W != 0) {
    *why = "the GEMM walked " + std::to_string(rec.shards) + " shards, not a multiple of the " + std::to_string(W) +
           " ranks";
    return false;
  }
  if (rec.lag < 1 || rec.lag > rec.shards / W) {
    *why = "the GEMM's own pieces ran with lag " + std::to_string(rec.lag) + " (expected 1 to the " +
           std::to_string(rec.shards / W) + " pieces: piece-major order)";
    return false;
  }
  const bool broadcast = (rec.epilogue & kernels::kEpilogueBroadcast) != 0;
  if (broadcast && !ar) {
    *why = "the GEMM+RS epilogue stored reduced tiles into peers' C";
    return false;
  }
  p->exec.pieces = rec.shards / W;
  p->exec.lag = rec.lag;
  p->exec.send = (rec.epilogue & kernels::kEpilogueRemotePartials) ? "sm" : "copy";
  p->exec.gather = !ar ? "" : broadcast ? "sm" : "push";
  return true;
}

std::vector<Plan> candidate_plans(const Workload& w, const Plan& model, bool share_gpus) {
  std::vector<Plan> out;
  // The workload's `plan:` map fixes the execution: nothing is left to measure against it.
  if (!w.plan.empty()) {
    if (model.exec.executable) out.push_back(model);
    return out;
  }
  auto add = [&](const Plan& p) {
    if (!p.exec.executable) return;
    // plan_decide.cpp: their launches wait for each other's
    if (share_gpus && (p.exec.variant == "overlap" || p.exec.variant == "ffn_combine")) return;
    for (const auto& q : out)
      if (plan_hash(q) == plan_hash(p)) return;
    out.push_back(p);
  };
  add(model);
  // With ranks sharing a GPU the overlap variant cannot run (plan_decide.cpp): the peer variant only
  // (planned here too where the model's plan is an overlap plan decided for unshared GPUs).
  if (share_gpus && model.exec.variant == "overlap" && (model.op == Op::kGemmRs || model.op == Op::kGemmAr)) {
    Workload v = w;
    v.plan.variant = "peer";
    Plan p = model;
    plan_execution(v, IntraMover::kCopyEngine, &p);
    add(p);
  }
  if (model.op == Op::kMoe && model.nodes == 1 && !share_gpus) {
    // The other way to run the FFN and the combine (ffn_combine needs a GPU per rank).
    Workload v = w;
    v.plan.variant = model.exec.variant == "ffn_combine" ? "staged" : "ffn_combine";
    Plan p = model;
    plan_execution(v, IntraMover::kSm, &p);
    add(p);
    // The model's variant with the down projection never split over K (where the split is slower on
    // this machine for the problem's counts, tune keeps this one).
    Workload unsplit = w;
    unsplit.plan.split_k = 1;
    Plan q = model;
    plan_execution(unsplit, IntraMover::kSm, &q);
    add(q);
    for (auto& q : out) q.chosen_by = "model";
    return out;
  }
  if ((model.op == Op::kGemmRs || model.op == Op::kGemmAr) && model.nodes == 1 && !share_gpus) {
    // The peer variant and the overlap variant's ways of moving pieces and rows (each as the workload
    // would ask for it, so the plan is the one `plan: {variant: overlap, ...}` gives).
    const bool ar = model.op == Op::kGemmAr;
    struct Way {
      const char* variant;
      const char* send;
      const char* gather;
    };
    const std::vector<Way> ways =
        ar ? std::vector<Way>{{"peer", nullptr, nullptr},
                              {"overlap", "sm", "sm"},
                              {"overlap", "copy", "push"},
                              {"overlap", "copy", "sm"},
                              {"overlap", "sm", "push"}}
           : std::vector<Way>{{"peer", nullptr, nullptr}, {"overlap", "copy", nullptr}, {"overlap", "sm", nullptr}};
    for (const Way& way : ways) {
      Workload v = w;
      v.plan.variant = way.variant;
      if (way.send) v.plan.send = way.send;
      if (way.gather) v.plan.gather = way.gather;
      Plan p = model;
      plan_execution(v, IntraMover::kCopyEngine, &p);
      add(p);
    }
    for (auto& p : out) p.chosen_by = "model";
    return out;
  }
  if (model.op != Op::kAgGemm || model.nodes != 1) return out;
  const int S = model.sm_count, cap = share_gpus ? S - 8 : S;
  const int64_t W = model.world_size, n_loc = model.gemm.n / W;
  const int64_t tiles = (model.gemm.m / kTileRows) * ((n_loc + kTileCols - 1) / kTileCols);
  const int64_t waves = (tiles + S - 1) / S;
  std::vector<int> counts = {cap, int((tiles + waves - 1) / waves)};
  kernels::TileSchedule ts;
  const char* why = nullptr;
  if (kernels::TileSchedule::make(model.gemm.m, n_loc, int32_t(kTileRows), int32_t(kTileCols), 16, int32_t(W), 0, &ts,
                                  &why)) {
    ts.k_iters = int32_t((model.gemm.k + 63) / 64);
    counts.push_back(ts.full_round_blocks(S, S - 16, 8));
  }
  for (int c : counts) {
    if (c < 1 || c > cap) continue;
    for (int cluster : {1, 2}) {  // refused (left out) where 2-CTA clusters do not fit
      Workload v = w;
      v.plan.cluster = cluster;
      Plan p = model;
      p.roles = RoleCounts{c, 0, 0, 0};
      p.roles_explicit = true;
      plan_execution(v, IntraMover::kCopyEngine, &p);
      add(p);
    }
  }
  for (int intra : {8, 16}) {
    Plan p = model;
    p.roles = RoleCounts{S - intra, intra, 0, 0};
    p.roles_explicit = true;
    plan_execution(w, IntraMover::kSm, &p);
    add(p);
  }
  for (auto& p : out) p.chosen_by = "model";
  return out;
}

}  // namespace weft::runtime
