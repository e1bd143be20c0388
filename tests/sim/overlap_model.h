// GEMM+RS / GEMM+AR's one-node overlap path on the simulator: each rank's calls are the schedules
// kernels/reduce_overlap_plan.h gives (what runtime/exec/reduce_overlap.cpp enqueues), and the GEMM
// and the movers do what their kernels do with the words the schedule hands them:
//
//   main     before-steps ─► the GEMM, one action per shard in the GEMM's order (one block: the
//            strictest order for deadlocks): own piece j waits its gate words, reads the W-1 slots
//            and writes the sum (RS: the output; AR: its rows of C, and with the epilogue gather
//            every peer's too, counting bcast there); another owner's piece goes to `partial`, or
//            with epilogue sends into that owner's slot, counting at the schedule's landed word;
//            every piece sets its tile count ─► after-steps
//   send[o], gates, push[q]: the schedule's steps, one action each
//   movers   per move: wait clear and ready, copy the piece into the owner's slot, count
//
// A counting word several ranks add to (landed) is one flag per contributor here; each adds its
// tiles per piece per call, so "word >= calls x (W-1) x tiles" is every contributor's flag at
// calls x tiles. Calls follow each other with no barrier (as a program calls the op), and each
// call ends with a check that every owner's rows hold every rank's partial exactly once, of that
// call.
#pragma once

#include <functional>

#include "kernels/reduce_overlap_plan.h"
#include "tests/sim/dataflow_sim.h"

namespace weft::sim {

struct OverlapSimOptions {
  int world = 4, pieces = 2, lag = 1, movers = 0, runs = 3;
  bool all_reduce = false, sm_send = false, sm_gather = false;
  uint64_t tiles_per_piece = 3;
  int64_t piece_bytes = int64_t(1) << 20;
  // Applied to every call's schedule before it is modelled (tests break a schedule to see the
  // simulator catch it).
  std::function<void(int rank, kernels::OverlapCall*)> mutate;
};

// The shapes each rank gets (rank, then the options') and its GEMM's shard order.
kernels::OverlapShape overlap_shape(const OverlapSimOptions& o, int rank);
std::vector<int> overlap_order(const OverlapSimOptions& o, int rank);

Result simulate_overlap(const OverlapSimOptions& opt);

}  // namespace weft::sim
