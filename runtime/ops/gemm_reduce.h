// GEMM+ReduceScatter / GEMM+AllReduce on one node: the op's state, shared by its setup and
// harness (gemm_reduce_op.cpp), the overlap path (gemm_reduce_overlap.cpp) and the small-M peer
// path (gemm_reduce_peer.cpp). The design is described at the top of gemm_reduce_op.cpp.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "base/roles.h"
#include "base/status.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/rank_context.h"
#include "kernels/gemm.h"
#include "runtime/ops/op_harness.h"
#include "runtime/workload.h"

namespace weft::runtime::ops {

constexpr uint64_t kNeverFlag = ~0ull >> 1;  // a flag value no wait ever exceeds

// GEMM+AllReduce, overlap path: how the reduced rows reach the other ranks (WEFT_GEMM_AR_GATHER).
enum class ArGather {
  kPush,  // the owner's copy engines push each reduced piece to every peer (one stream per peer)
  kPull,  // every peer's copy engines pull it, once the owner's stream write says it is reduced
  kSm,    // the owner's epilogue stores each reduced tile into every peer's C (TMA, NVLink)
};
const char* ar_gather_name(ArGather g);

struct GemmReduce {
  using bf16 = __nv_bfloat16;
  bool all_reduce = false;
  bool overlap = true;  // overlap path, else peer path
  int rank = 0, world = 1;
  int pieces = 1;  // S: pieces per owner's row block (overlap path)
  int64_t m = 0, n = 0, k_loc = 0, m_loc = 0, m_piece = 0;
  uint64_t tiles_per_piece = 0;
  bf16 *a = nullptr, *b = nullptr, *out = nullptr, *ref = nullptr;
  RunnerHeap heap;        // every buffer below that peers read or write
  HeapBuffer partial;     // m × n: this rank's partial C (peers read it on the peer path)
  HeapBuffer staging;     // overlap: W slots of m_loc × n, slot p = peer p's partial of this rank's rows
  HeapBuffer c_full;      // AllReduce: m × n on every rank
  HeapBuffer arrived;     // W·S: arrived[p·S + j] = e once peer p's piece j is in slot p
  HeapBuffer freed;       // W: freed[o] = e once owner o has read its slots of epoch e
  HeapBuffer gathered;    // W: gathered[o] = e once owner o's reduced rows are in this rank's C
  HeapBuffer peer_flags;  // 3 W: the peer kernel's ready, reduced and done flags
  HeapBuffer ready;       // AR pull: W·S: ready[o·S + j] = e once owner o's piece j is reduced
  HeapBuffer bcast;       // AR sm: W: bcast[o] += 1 per tile of owner o's rows stored here
  HeapBuffer landed;      // SM sends: W·S: landed[r·S + j] += 1 per tile of piece j a peer stored here
  HeapBuffer moved;       // mover SMs: W·S: moved[p·S + j] += 1 per block of peer p's movers once its
                          //   rows of piece j are here
  bool sm_send = false;   // partial tiles sent by the GEMM's epilogue (TMA into the owner's slot)
  // Mover SMs beside the GEMM (copy-engine sends only): WEFT_GEMM_REDUCE_MOVERS blocks push the last
  // WEFT_GEMM_REDUCE_MOVER_ROWS rows of every piece, the copy engines the rest (kernels/piece_push.h).
  int mover_blocks = 0;
  int64_t mover_rows = 0;
  int sms = 0;              // the GPU's; the GEMM gets them all but the movers' (set_roles)
  uint64_t mover_runs = 0;  // fused runs with movers so far (moved[j] reaches runs x blocks)
  cudaStream_t movers = nullptr;
  cudaEvent_t movers_done = nullptr;
  bool mover_last = false;  // WEFT_GEMM_REDUCE_MOVER_LAST: the movers take the round's last owner's pieces whole
  bool use_movers() const { return overlap && !sm_send && mover_blocks > 0 && (mover_rows > 0 || mover_last); }
  // Rows of each of `sender`'s pieces for `owner` that the mover SMs push (the piece's last rows);
  // the copy engines move the others.
  int64_t mover_rows_of(int sender, int owner) const {
    if (!use_movers()) return 0;
    return mover_last && owner == (sender + world - 1) % world ? m_piece : mover_rows;
  }
  uint64_t send_runs = 0;  // fused runs with sm_send so far (landed[j] reaches runs x (W-1) x tiles)
  ArGather gather = ArGather::kPush;
  uint64_t bcast_runs = 0;            // fused runs with ArGather::kSm so far (bcast[o] reaches runs x tiles)
  bool own_tma = true;                // WEFT_GEMM_REDUCE_OWN_TMA: own tiles through shared memory + TMA
  bool slot_tma = true;               // WEFT_GEMM_REDUCE_SLOT_TMA: staged partials through the GEMM's TMA ring
  kernels::EpiReduceSlots epi_fused;  // make_epilogues(): the fused op's epilogue (own tensor maps)
  kernels::EpiReduceSlots epi_diag;   //   the diagnostic GEMM's, own rows reduced locally only
  uint64_t* tiles = nullptr;          // W·S local: finished tiles per piece (TileSignal)
  uint64_t* gate = nullptr;           // W·S local: the GEMM's gate (others' pieces never wait)
  uint64_t* diag_tiles = nullptr;     // W·S local: signal target of the diagnostic GEMM timings
  uint64_t* arrive = nullptr;         // 2 local: the peer kernel's block counts
  bool sys_signal = false;            // WEFT_GEMM_REDUCE_SYS_SIGNAL: tile counts at system scope
  bool serial_push = false;           // WEFT_GEMM_AR_SERIAL_PUSH: AR pushes on the comm stream
  bool piece_major = false;           // overlap: piece-major tile order (WEFT_GEMM_REDUCE_ORDER)
  int lag = 1;                        //   own piece j after round j + lag (WEFT_GEMM_REDUCE_LAG)
  std::vector<cudaStream_t> sends;    // overlap: one stream per other owner, copying its pieces as they finish
  std::vector<cudaEvent_t> sent;      // their joins
  cudaStream_t gates = nullptr;       // overlap: raises the own pieces' gates as the peers' pieces arrive
  cudaEvent_t gates_done = nullptr;
  // The fused GEMM's tile signals with copy-engine sends (kernels::kSignal*): from inside the next
  // tile's main loop (WEFT_GEMM_REDUCE_LOOP_SIGNAL, default), or immediate; not deferred to the next
  // tile's stores, since a piece's last tiles then count late and its copy starts late (measured
  // slower for RS and AR: docs/results/2026-11-gemm-reduce.md). probe() times the other one.
  int signal_variant = kernels::kSignalInLoop;
  // With SM sends the counts of a tile stored into peers' memory move before the block's next
  // tile's stores instead (kSignalDeferred): counted right after its own stores, a tile waits for
  // them to complete and holds the consumers; by the next tile's stores they have completed
  // (measured faster for RS and AR: docs/results/2026-11-gemm-reduce.md).
  int sm_send_signal = kernels::kSignalDeferred;
  int run_signal() const { return sm_send ? sm_send_signal : signal_variant; }
  std::vector<std::pair<std::string, cudaEvent_t>> marks;  // probe(): one run's timeline, if recording
  bool recording = false;
  uint64_t epoch = 0;
  int peer_blocks = 0;
  cudaStream_t main = nullptr, comm = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  std::vector<cudaStream_t> push;   // AllReduce: one stream per peer for the pushes of reduced pieces
  std::vector<cudaEvent_t> pushed;  // their joins
  kernels::GemmParams gemm;
  kernels::FrameHost frame;
  kernels::FrameParams frame_params;
  RoleCounts roles;
  double host_us = 0;  // host time spent enqueueing fused runs
  int64_t host_runs = 0;

  size_t piece_bytes() const { return size_t(m_piece * n) * sizeof(bf16); }
  // The GEMM's compute blocks for the current variant (every SM, less the movers' when they run,
  // an even count) and frame_params to match; between launches only.
  Status set_roles();
  // Launches the mover SMs for this epoch's pieces on `movers` (enqueue_overlap).
  Status launch_movers(uint64_t piece_done);
  int64_t piece_row(int owner, int j) const { return int64_t(owner) * m_loc + int64_t(j) * m_piece; }
  bf16* result() const { return all_reduce ? c_full.local<bf16>() : out; }
  int64_t result_elems() const { return all_reduce ? m * n : m_loc * n; }

  // One fused run: the overlap or the peer path (enqueued on `main`, host time accounted).
  Status enqueue_fused();
  // The GEMM's params and tile order (both paths), and the overlap path's streams
  // (gemm_reduce_overlap.cpp).
  Status make_gemm();
  Status setup_overlap();
  std::string overlap_text() const;  // the overlap path's choices, for the results table
  // WEFT_GEMM_REDUCE_PROBE=1: what the tile signals cost (kernels::kSignal* variants of the
  // diagnostic GEMM), the fused op with immediate signals, and one fused run's timeline per rank
  // (GEMM, each copy, each gate, each push) printed; rows appended to *rows.
  Status probe(ncclComm_t nccl, int warm, int iters, bootstrap::Bootstrap& boot, const std::string& key,
               std::vector<ResultRow>* rows);
  void mark(cudaStream_t s, std::string what);
  // Overlap path (gemm_reduce_overlap.cpp).
  Status enqueue_overlap();
  kernels::EpiReduceSlots reduce_epilogue(bool own_rows = true) const;
  // epi_fused and epi_diag for the current gather and own_tma (after make_gemm, and again when
  // either changes): tensor maps encoded once, not per launch.
  Status make_epilogues();
  uint64_t tiles_per_owner() const { return tiles_per_piece * uint64_t(pieces); }
  // The fused op's GEMM without gate or copies (the staged slots hold stale data), to see what its
  // parts cost: partial stores only; with the per-tile signals; with the own rows' reduction too.
  // variant: kernels::kSignal*, -1 = the fused op's (signal_variant).
  Status enqueue_diag(bool own_rows, bool signalled, int variant = -1);
  // Peer path (gemm_reduce_peer.cpp).
  Status enqueue_peer();
  // Small-shape kernel of the peer path (kernels/small_reduce_plan.h): variant, the partial in two
  // copies (epoch parity), flag words; every variant validated and timed apart (peer_rows).
  int peer_variant = 0, peer_sms = 0;
  int peer_max_blocks = 0;  // WEFT_GEMM_REDUCE_PEER_BLOCKS, at most peer_sms
  uint64_t peer_tiles = 0;  // tiles the GEMM has counted in its flag word so far (pull_tiles)
  bool peer_sweep = false;
  uint64_t peer_epoch = 0, peer_gathered = 0;  // launches so far; their two-shot blocks (gathered counts)
  HeapBuffer peer_partials, peer_words;
  // Reads the peer path's parameters and takes its buffers from `heap` (the caller creates it).
  Status setup_peer(bootstrap::Bootstrap& boot, const std::string& key);
  const char* peer_variant_name() const;
  Status peer_rows(ncclComm_t comm, bootstrap::Bootstrap& boot, const std::string& key, int warm, int iters,
                   const std::function<Status(const char*)>& validate, std::vector<ResultRow>* rows);
  // A failed GEMM never completes its tile counts, and a failed peer never raises its flags: raise
  // every local flag a stream waits on so the streams drain and the error can be reported.
  void unstick();
  Status sync(const char* what);

  GemmReduce() = default;
  GemmReduce(const GemmReduce&) = delete;
  GemmReduce& operator=(const GemmReduce&) = delete;
  ~GemmReduce();
};

// GEMM+RS / GEMM+AR when the job spans several nodes (gemm_reduce_nodes_op.cpp).
Status run_gemm_reduce_nodes(const bootstrap::RankContext& ctx, const Workload& wl, bootstrap::Bootstrap& boot,
                             bool all_reduce);

}  // namespace weft::runtime::ops
