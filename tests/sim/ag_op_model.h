// The one-node AllGather+GEMM op's copy-engine protocol (runtime/exec/ag_gemm.cpp, push_and_join)
// on the simulator, calls back to back with no barrier between them, rank r:
//
//   caller's stream   copy its A into its shard ─► fork ─► GEMM shard r, r+1, ... (shard q waits
//                     gate[q] >= 1) ─► S: gate[q] = 0 for every peer q, consumed[r] = 1 in every
//                     peer q ─► join (the copy stream's pushes done)
//   copy stream       wait fork; per peer q (r-1 first): wait consumed[q] >= 1, consumed[q] = 0,
//                     push the shard into q's gathered A, gate[r] = 1 in q
//
// The words are tokens (stored, reset to 0), not counters. Checked over calls: every GEMM reads each
// shard of its own call (not the last call's, not missing), no push overwrites a shard a peer's GEMM
// may still read, no token is lost (a lost one is a wait that never comes: a deadlock). `variant`
// breaks the protocol to show each check can fail.
#pragma once

#include <cstdint>

#include "tests/sim/dataflow_sim.h"

namespace weft::sim {

enum class AgOpVariant {
  kAsBuilt,
  kUngated,         // the GEMM does not wait for the gates
  kNoConsumedWait,  // a push does not wait for the peer to be done with the last shard
  kResetLate,       // the token reset after the gate is opened (the peer's next "done" can be lost)
};

// `seed`: the simulator's schedule (0: each stream as far as it goes, in order).
Result simulate_ag_op(int world, int calls, AgOpVariant variant, uint64_t seed);

}  // namespace weft::sim
