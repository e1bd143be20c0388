// GEMM+ReduceScatter / GEMM+AllReduce on one node, the overlap path as a runtime op's engine: one
// persistent GEMM per rank whose partial pieces move to their owners while it runs, and whose own
// rows are reduced in its epilogue. No NCCL, no allocation per call; the buffers are views into the
// op's symmetric-heap arena (runtime/exec/gemm_reduce.h owns them).
//
//   rank r: A_r (m x k/W), B_r (n x k/W)  ->  partial P_r = A_r . B_r^T (m x n)
//   tile order: piece-major over the W owners' row blocks, each cut in S pieces (M-shards); own
//     piece j after round j + lag (kernels/tile_scheduler.h); after each tile: tiles[o S + j] += 1
//   other owners' pieces: stored into `partial`; one stream per owner o (copy engines, no SM) waits
//     freed[o] >= e-1 (o read last call's slots) and tiles[o S + j] complete, copies the piece into
//     o's staging slot r over NVLink, then writes arrived[r S + j] = e in o's memory.
//     send "sm": the epilogue stores the tile into o's slot itself (TMA) and adds 1 to
//     landed[o S + j] in o's memory (every sender adds to the owner's word for its piece j); movers (copy sends, 3 or
//     more ranks): `movers` blocks beside the GEMM push each round's last owner's pieces (kernels/piece_push.h),
//     moved[r S + j] += 1 per block on o.
//   own piece j: its tiles wait (producer, bounded) on gate[r S + j] >= e, which the gate stream
//     raises once every peer's piece j is in its slot (or, send "sm", on landed[r S + j] reaching
//     calls x (W-1) x tiles per piece);
//     the epilogue adds the W-1 slots in slot order (same bits every run) and stores the sum:
//     RS: the caller's output; AR: this rank's rows of the heap's C, which then reach every peer:
//       gather "push": one stream per peer copies each reduced piece -> gathered[r] = e on the peer;
//       gather "sm": the epilogue stores each reduced tile into every peer's C too (TMA) and adds 1
//       to bcast[r] in the peer's memory.
//   after the GEMM: freed[r] = e on every peer; the call ends (on the caller's stream) once every
//   side stream has joined and, AR, every peer's rows are here.
//
// Every flag only grows, so a call's waits need no reset. A failed GEMM leaves stream waits that
// nothing satisfies: unstick() raises every local word (the streams drain; the op is then broken).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "kernels/frame.h"
#include "kernels/gemm.h"
#include "kernels/gemm_types.h"
#include "kernels/reduce_overlap_plan.h"

namespace weft::runtime {

// One symmetric buffer as this rank sees it: its own copy and every node-mate's, as mapped here.
struct SymView {
  void* local = nullptr;
  std::vector<void*> peers;  // [rank]; peers[own rank] == local
  template <typename T>
  T* mine() const {
    return static_cast<T*>(local);
  }
  template <typename T>
  T* of(int rank) const {
    return static_cast<T*>(peers[static_cast<size_t>(rank)]);
  }
};

struct OverlapConfig {
  bool all_reduce = false;
  int rank = 0, world = 1;
  int64_t m = 0, n = 0, k_loc = 0;
  int pieces = 1;          // S: pieces of each owner's row block (m / W a multiple of 128 S)
  int lag = 1;             // own piece j after round j + lag (1 to S)
  bool sm_send = false;    // partial tiles sent by the epilogue, else by the copy engines
  bool sm_gather = false;  // AR: reduced tiles stored into the peers' C by the epilogue, else pushed by copy engines
  int movers = 0;          // copy sends, 3 or more ranks: mover blocks beside the GEMM (0: none)
  int cluster = 1, group_m = 16;
  kernels::GemmOptions gemm;
};

// The words and buffers, all in the op's arena (views of every rank's where peers touch them).
struct OverlapBuffers {
  SymView partial;            // m x n bf16: this rank's partial C
  SymView staging;            // W slots of m/W x n: slot p = peer p's partial of this rank's rows
  SymView c_full;             // AR: m x n, the reduced C on every rank
  SymView arrived;            // W S: arrived[p S + j] = e once peer p's piece j is in slot p (copy sends)
  SymView freed;              // W: freed[o] = e once owner o has read its slots of call e
  SymView gathered;           // AR push: W: gathered[o] = e once owner o's reduced rows are here
  SymView bcast;              // AR sm gather: W: += 1 per tile of owner o's rows stored here
  SymView landed;             // sm sends: W S: landed[r S + j] += 1 per tile of own piece j a peer stored here
  SymView moved;              // movers: W S: += 1 per block of peer p's movers once its rows of piece j are here
  uint64_t* tiles = nullptr;  // W S, local: finished tiles per piece
  uint64_t* gate = nullptr;   // W S, local: the own pieces' gates (others' set to never wait)
};

// The words create() expects zero except the gate's: gate[o S + j] is kGateNever for o != rank.
constexpr uint64_t kGateNever = ~0ull >> 1;

class ReduceOverlap {
 public:
  ReduceOverlap() = default;
  ReduceOverlap(const ReduceOverlap&) = delete;
  ReduceOverlap& operator=(const ReduceOverlap&) = delete;
  ~ReduceOverlap();

  // Checks the configuration (every rank reaches the same verdict), creates the side streams and
  // writes the gate's initial words (on `s`). `gemm_frame`: the GEMM's (roles: compute blocks only);
  // `mover_frame`: the movers' (roles: intra_comm = c.movers), each with its own launch record.
  Status create(const OverlapConfig& c, const OverlapBuffers& b, const kernels::FrameParams& gemm_frame,
                const kernels::FrameParams& mover_frame, cudaStream_t s);
  // One call: C = sum_r A_r B_r^T, RS rows of this rank into `out` (m/W x n), AR the whole of C into
  // the heap's C (c_full; the caller copies it out). a, b: m x k/W and n x k/W, row-major. The
  // tensor maps are encoded again only when a, b or out change.
  Status enqueue(const __nv_bfloat16* a, const __nv_bfloat16* b, __nv_bfloat16* out, cudaStream_t main);
  // Raises every local word a stream or a kernel of this op waits on (on `s`).
  void unstick(cudaStream_t s) const;
  // The configuration in words, for errors and logs.
  std::string text() const;
  // Why `c` cannot run ("" if it can); pure, for the plan's checks too.
  static std::string misfit(const OverlapConfig& c, int sm_count);

 private:
  Status prepare(const __nv_bfloat16* a, const __nv_bfloat16* b, __nv_bfloat16* out);
  Status launch_movers(const kernels::OverlapCall& call);
  Status run_steps(cudaStream_t s, const std::vector<kernels::OverlapStep>& steps);
  uint64_t* word(const kernels::OverlapWord& w) const;  // the word's address (a peer's as mapped here)
  kernels::OverlapShape shape() const;
  int64_t m_loc() const { return c_.m / c_.world; }
  int64_t m_piece() const { return m_loc() / c_.pieces; }
  int64_t piece_row(int owner, int j) const { return int64_t(owner) * m_loc() + int64_t(j) * m_piece(); }
  bool movers_on() const { return shape().movers_on(); }

  OverlapConfig c_;
  OverlapBuffers b_;
  kernels::FrameParams frame_{}, mover_frame_{};
  kernels::GemmParams gemm_{};
  kernels::EpiReduceSlots epi_{};
  const __nv_bfloat16 *a_ = nullptr, *b_in_ = nullptr;
  __nv_bfloat16* out_ = nullptr;
  bool prepared_ = false;
  uint64_t epoch_ = 0, landed_runs_ = 0, bcast_runs_ = 0, mover_runs_ = 0;
  uint64_t tiles_per_piece_ = 0;
  std::vector<int> order_;  // the GEMM's shard order (shard = owner * S + piece)
  std::vector<cudaStream_t> sends_, push_;
  std::vector<cudaEvent_t> sent_, pushed_;
  cudaStream_t gates_ = nullptr, movers_ = nullptr;
  cudaEvent_t fork_ = nullptr, gates_done_ = nullptr, movers_done_ = nullptr;
};

}  // namespace weft::runtime
