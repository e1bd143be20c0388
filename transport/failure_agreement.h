// Agreeing on a failure across the job: every rank learns the lowest failing rank and why, reading
// O(ranks on its node + nodes) exchange entries instead of one per rank.
//
//   round 1 (node):  every rank publishes its failure ("" = none) and reads its node-mates' only
//                    (PMIx: same-host entries come through the node exchange's files);
//                    each node now knows its lowest failing rank.
//   round 2 (job):   node leaders (local index 0) publish that (rank, why); every rank reads the
//                    other nodes' leaders' entries only.
//
//   N nodes x G ranks: each rank reads G - 1 + N - 1 entries (128 x 8: 134), not N x G - 1 (1,023).
//   One node: round 1 alone decides. One rank per node: round 2 alone.
//
// Still job-wide: each round is one bootstrap exchange, and a PMIx fence spans the whole job (every
// node's server collects every entry, empty ones included); what a rank reads is O(G + N).
#pragma once

#include <string>

#include "base/status.h"
#include "bootstrap/bootstrap.h"
#include "transport/peer_set.h"

namespace weft::transport {

// Collective. `layout` is the job's (well formed, as Transport::create normalises it); `failure`
// this rank's ("" if none). *first = "rank R: why" for the lowest failing rank R ("" if none; a
// `why` that already begins with "rank R " is kept as it is). Every rank gets the same answer.
// Bounded by the bootstrap's timeout; kProtocolError on an entry that does not decode.
Status agree_on_failure(bootstrap::Bootstrap& boot, const RankLayout& layout, const std::string& key,
                        const std::string& failure, std::string* first);

// Entries this rank reads in agree_on_failure() (for the report and the budget test).
int failure_agreement_reads(const RankLayout& layout, int rank);

}  // namespace weft::transport
