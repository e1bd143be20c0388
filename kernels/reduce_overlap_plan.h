// GEMM+ReduceScatter / GEMM+AllReduce on one node, overlap path: what one call enqueues on each of a
// rank's streams, as data. CUDA-free: runtime/exec/reduce_overlap.cpp turns it into stream memory
// operations, copies and launches, and the host simulator (tests/sim/overlap_model.h) runs the same
// schedule on W ranks, call after call, checking that no wait deadlocks and that no slot or C rows
// are read before they are written or overwritten before they are read.
//
//   rank r, call e, S pieces per owner's rows, shards in the GEMM's order (shard = owner * S + piece):
//   main    before the GEMM (epilogue sends): wait freed[o] >= e-1 for every other owner o
//           the GEMM: own piece j's tiles wait gate (copy sends: gate[r S + j] >= e; epilogue sends:
//           landed[r S + j] >= calls x (W-1) x tiles per piece); every tile adds 1 to tiles[shard];
//           other owners' tiles go to `partial` (copy sends) or into owner o's staging slot r, adding
//           1 to landed[o S + j] in o's memory (epilogue sends); own tiles add the W-1 slots
//           AR, epilogue gather: own tiles also go into every peer's C, adding 1 to bcast[r] there
//           after: freed[r] = e in every peer; AR: wait gathered[p] >= e (push) or bcast[p] >= calls x
//           tiles per owner (epilogue) for every peer p
//   send[o] (copy sends) per piece j of owner o in the GEMM's order, except the movers' owner:
//           (first piece: wait freed[o] >= e-1), wait tiles[o S + j] >= e x tiles per piece,
//           copy partial rows (o, j) -> o's staging slot r, piece j; arrived[r S + j] = e in o
//   movers  (copy sends, 3+ ranks) the round's last owner o = r-1: the same copies by SM blocks,
//           moved[r S + j] += blocks in o
//   gates   (copy sends) per own piece j: wait arrived[p S + j] >= e (or moved[p S + j] for the
//           peer whose last owner r is), then gate[r S + j] = e
//   push[q] (AR, copy gather) per own piece j: wait tiles[r S + j], copy C rows (r, j) into q's C;
//           then gathered[r] = e in q
// Every word only grows; flags are never reset.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace weft::kernels {

// The most pieces the mover blocks take in one call (kernels/piece_push.h, PiecePushParams::kMaxSteps).
constexpr int kOverlapMaxMoverPieces = 28;

struct OverlapShape {
  int world = 2, rank = 0, pieces = 1, lag = 1;
  bool all_reduce = false, sm_send = false, sm_gather = false;
  int movers = 0;  // mover blocks (copy sends, 3 or more ranks); 0: none
  bool movers_on() const { return !sm_send && movers > 0 && world >= 3; }
  int last_owner() const { return (rank + world - 1) % world; }  // the movers' owner
  int moved_from() const { return (rank + 1) % world; }          // the peer whose movers send here
};

// A word of the op's heap: which array, in which rank's memory, at which index.
enum class OverlapWordKind : int { kArrived, kLanded, kMoved, kTiles, kGate, kFreed, kGathered, kBcast };
struct OverlapWord {
  OverlapWordKind kind = OverlapWordKind::kTiles;
  int rank = 0;
  int64_t index = 0;
};

struct OverlapStep {
  enum Kind : int {
    kWait,        // until word >= value
    kWrite,       // word = value (after everything earlier on the stream)
    kCopyPiece,   // this rank's partial rows of (owner, piece) -> owner's staging slot (this rank), piece
    kCopyReduced  // this rank's reduced C rows of piece -> `to`'s C, same rows
  } kind = kWait;
  OverlapWord word;
  uint64_t value = 0;
  int owner = 0, piece = 0, to = 0;
};

// The movers' copies: kCopyPiece steps with their two waits and the count they add (all blocks).
struct OverlapMove {
  int owner = 0, piece = 0;
  OverlapWord clear, ready, landed;
  uint64_t clear_at = 0, ready_at = 0;
};

struct OverlapCall {
  uint64_t epoch = 0;
  std::vector<OverlapStep> before;  // main, before the GEMM
  // The GEMM, as the kernel indexes its words: the gate array (own piece j's tiles wait at index +
  // r S + j, for gate_at) and the tile counts (shard's tile at index + shard); epilogue sends: per
  // owner o the word its piece 0 counts at (piece j: index + j; [rank] unused); epilogue gather:
  // each peer's bcast word for this rank.
  OverlapWord gate, tiles;
  uint64_t gate_at = 0;
  std::vector<OverlapWord> part_counts;
  std::vector<OverlapWord> bcast_counts;        // in the order the epilogue stores (r+1 first)
  std::vector<OverlapStep> after;               // main, after the GEMM
  std::vector<std::vector<OverlapStep>> sends;  // [owner]
  std::vector<OverlapStep> gates;
  std::vector<std::vector<OverlapStep>> push;  // [peer]
  std::vector<OverlapMove> moves;              // the movers' steps, in the GEMM's order
};

// Counts of the calls so far, including this one (what the growing words reach).
struct OverlapCounts {
  uint64_t epoch = 0;        // this call's (1, 2, ...)
  uint64_t landed_runs = 0;  // calls with epilogue sends
  uint64_t bcast_runs = 0;   // calls with the epilogue gather
  uint64_t mover_runs = 0;   // calls with mover blocks
};

// One call of rank s.rank. `order`: the GEMM's shard order (W x S shards); tiles_per_piece: tiles of
// one piece (its rows / 128 x the GEMM's column blocks).
inline OverlapCall overlap_call(const OverlapShape& s, const std::vector<int>& order, uint64_t tiles_per_piece,
                                const OverlapCounts& n) {
  using K = OverlapWordKind;
  const int W = s.world, r = s.rank, S = s.pieces;
  const uint64_t e = n.epoch, piece_done = e * tiles_per_piece;
  OverlapCall c;
  c.epoch = e;
  c.tiles = {K::kTiles, r, 0};
  c.sends.assign(size_t(W), {});
  c.push.assign(size_t(W), {});
  c.part_counts.assign(size_t(W), {});
  auto wait = [](K k, int rank, int64_t i, uint64_t v) {
    OverlapStep st;
    st.kind = OverlapStep::kWait;
    st.word = {k, rank, i};
    st.value = v;
    return st;
  };
  auto write = [](K k, int rank, int64_t i, uint64_t v) {
    OverlapStep st;
    st.kind = OverlapStep::kWrite;
    st.word = {k, rank, i};
    st.value = v;
    return st;
  };
  if (s.sm_send) {
    for (int o = 0; o < W; ++o)
      if (o != r) {
        c.before.push_back(wait(K::kFreed, r, o, e - 1));            // o has read last call's slots
        c.part_counts[size_t(o)] = {K::kLanded, o, int64_t(o) * S};  // o's own words: every sender adds there
      }
    c.gate = {K::kLanded, r, 0};
    c.gate_at = n.landed_runs * uint64_t(W - 1) * tiles_per_piece;
  } else {
    c.gate = {K::kGate, r, 0};
    c.gate_at = e;
  }
  if (s.sm_gather)
    for (int i = 1; i < W; ++i) c.bcast_counts.push_back({K::kBcast, (r + i) % W, r});
  // Copy sends and the movers, in the GEMM's order.
  for (int step = 0; step < W * S && !s.sm_send; ++step) {
    const int o = order[size_t(step)] / S, j = order[size_t(step)] % S;
    if (o == r) continue;
    if (s.movers_on() && o == s.last_owner()) {
      OverlapMove m;
      m.owner = o, m.piece = j;
      m.clear = {K::kFreed, r, o}, m.clear_at = e - 1;
      m.ready = {K::kTiles, r, int64_t(o) * S + j}, m.ready_at = piece_done;
      m.landed = {K::kMoved, o, int64_t(r) * S + j};
      c.moves.push_back(m);
      continue;
    }
    std::vector<OverlapStep>& q = c.sends[size_t(o)];
    if (q.empty()) q.push_back(wait(K::kFreed, r, o, e - 1));  // o has read last call's slots
    q.push_back(wait(K::kTiles, r, int64_t(o) * S + j, piece_done));
    OverlapStep copy;
    copy.kind = OverlapStep::kCopyPiece;
    copy.owner = o, copy.piece = j, copy.to = o;
    q.push_back(copy);
    q.push_back(write(K::kArrived, o, int64_t(r) * S + j, e));
  }
  // Gates: own piece j opens once every peer's piece j is in its slot.
  for (int j = 0; j < S && !s.sm_send; ++j) {
    for (int p = 0; p < W; ++p) {
      if (p == r) continue;
      if (s.movers_on() && p == s.moved_from())
        c.gates.push_back(wait(K::kMoved, r, int64_t(p) * S + j, n.mover_runs * uint64_t(s.movers)));
      else
        c.gates.push_back(wait(K::kArrived, r, int64_t(p) * S + j, e));
    }
    c.gates.push_back(write(K::kGate, r, int64_t(r) * S + j, e));
  }
  // AR, copy gather: each reduced piece to every peer, then the peer's word.
  if (s.all_reduce && !s.sm_gather)
    for (int i = 1; i < W; ++i) {
      const int q = (r + i) % W;
      for (int j = 0; j < S; ++j) {
        c.push[size_t(q)].push_back(wait(K::kTiles, r, int64_t(r) * S + j, piece_done));
        OverlapStep copy;
        copy.kind = OverlapStep::kCopyReduced;
        copy.owner = r, copy.piece = j, copy.to = q;
        c.push[size_t(q)].push_back(copy);
      }
      c.push[size_t(q)].push_back(write(K::kGathered, q, r, e));
    }
  for (int p = 0; p < W; ++p)
    if (p != r) c.after.push_back(write(K::kFreed, p, r, e));
  for (int p = 0; p < W && s.all_reduce; ++p) {
    if (p == r) continue;
    if (s.sm_gather)
      c.after.push_back(wait(K::kBcast, r, p, n.bcast_runs * tiles_per_piece * uint64_t(S)));
    else
      c.after.push_back(wait(K::kGathered, r, p, e));
  }
  return c;
}

inline const char* to_string(OverlapWordKind k) {
  switch (k) {
    case OverlapWordKind::kArrived:
      return "arrived";
    case OverlapWordKind::kLanded:
      return "landed";
    case OverlapWordKind::kMoved:
      return "moved";
    case OverlapWordKind::kTiles:
      return "tiles";
    case OverlapWordKind::kGate:
      return "gate";
    case OverlapWordKind::kFreed:
      return "freed";
    case OverlapWordKind::kGathered:
      return "gathered";
    case OverlapWordKind::kBcast:
      return "bcast";
  }
  return "?";
}

}  // namespace weft::kernels
