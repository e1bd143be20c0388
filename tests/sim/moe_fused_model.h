// The fused MoE launch on one node (kernels/moe_fused_plan.h) as simulator actions: every rank's
// tickets taken in order by `blocks` blocks (block b takes tickets b, b + blocks, ...: one of the
// orders the kernel's counter allows), for `calls` calls back to back with no barrier between them
// (the next launch of a rank starts once its previous one has ended, every block of it).
//
//   route     tile's top-k                                  → routed += 1
//   dispatch  per destination q (r + 1 first): wait routed == R, freed[q] >= call - 1 → rows into q's
//             receive slots, tile 0 first the count table    → counts_in, sent += 1 at q
//   arrange   wait sent[s] == R, counts_in == W → slot headers kept, rows into X in (expert, source,
//             slot) order                                   → rows[g] += n, arranged += 1
//   release   wait counts_in == W, arranged == the rank's chunks → the next set zeroed, freed = call
//             at every source
//   up, down  wait rows[g] / up_done[g] → H, Y rows          → up_done, down_done += 1
//   combine   wait arranged == the chunks, read the slot headers; wait down_done of the chunk's
//             tiles → one row per (token, rank) into the home's combine rows → combined[r] += 1 there
//   reduce    wait combined[q] == q's chunks of my slots, every q → out[t]
//
// No wait guards the home's combine rows across calls: an owner's combine for home h in call e + 1
// waits for tiles holding h's rows, so for h's dispatch of call e + 1, which h's launch makes only
// after its call e, reduce included, has ended. freed is needed for the count tables: every arrange
// of an owner reads every source's, and a source need not send that owner anything to go on.
//
// Checked: every token's row reaches each destination once, each (token, local expert) pair is one
// row of X in the tile of its expert, every home sums each destination's row once (the expert set
// of the token, each once), no deadlock, and (races on) no read or overwrite unordered across the
// calls. `drop` removes one wait to show the checks can fail. The counters come in two sets zeroed by
// the release unit and the count tables in two slots, as the kernel's (kernels/moe_fused_plan.h);
// the data each unit computes from (X rows' places, a tile's expert and rows) comes from the count
// tables it read, through the plan's functions, and is checked against the routing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/moe_fused_plan.h"
#include "tests/sim/dataflow_sim.h"

namespace weft::sim {

// experts[h * tokens + t]: the distinct experts token t of home h chose (any order).
using MoeChoices = std::vector<std::vector<int>>;

// uniform: topk distinct experts at random; skewed: expert e drawn with weight 1 / (e + 1); one:
// every token chooses experts 0 .. topk - 1; by home: every token of home h chooses experts
// L + h topk .. L + h topk + topk - 1 (mod E): each home's rows have experts of their own.
enum class MoeRouting { kUniform, kSkewed, kOne, kByHome };
MoeChoices moe_choices(int world, int tokens, int experts, int topk, MoeRouting how, uint64_t seed);

// A wait left out: dispatch's routed, arrange's sent or counts_in, up's rows, down's up_done,
// combine's arranged or down_done, reduce's combined, dispatch's freed, the release's counts_in.
enum class MoeFusedDrop {
  kNone,
  kRouted,
  kSent,
  kCountsIn,
  kRows,
  kUpDone,
  kArrangedCombine,
  kDownDone,
  kCombined,
  kFreed,
  kReleaseCounts
};

struct MoeFusedRun {
  kernels::MoeFusedShape shape;   // world, tokens, experts, topk, column blocks, chunk (rank unused)
  int blocks = 4;                 // per rank
  std::vector<MoeChoices> calls;  // one routing per call
  MoeFusedDrop drop = MoeFusedDrop::kNone;
  bool races = true;
  uint64_t schedule = 0;  // the simulator's interleaving (Sim::schedule)
};

Result simulate_moe_fused(const MoeFusedRun& run);

}  // namespace weft::sim
