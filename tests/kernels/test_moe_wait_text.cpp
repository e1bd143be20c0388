// What a timed-out MoE wait says (kernels::describe_moe_wait), host only: the exchange's dispatch and
// combine flags, the rail waits across nodes, the ffn_combine launch's comb_done counters (owner and token tile from
// the record's tile fields), the capacity record, and records that are not the op's waits (left to the generic report,
// e.g. the expert FFN's per-row-tile wait, which names its tile and no flag index).
#include <doctest/doctest.h>

#include "kernels/device_error.h"
#include "kernels/moe_exchange.h"
#include "kernels/moe_ffn_combine.h"
#include "kernels/moe_nodes.h"

using weft::kernels::describe_moe_wait;
using weft::kernels::DeviceError;
using weft::kernels::DeviceErrorKind;

namespace {

DeviceError timeout_at(int32_t flag_index, int32_t tile_m = -1, int32_t tile_n = -1) {
  DeviceError e{};
  e.status = 1;
  e.committed = 1;
  e.kind = int32_t(DeviceErrorKind::kFlagTimeout);
  e.rank = 2;
  e.flag_index = flag_index;
  e.tile_m = tile_m;
  e.tile_n = tile_n;
  e.expected = 64;
  e.seen = 32;
  e.waited_ns = 3000000000ull;
  return e;
}

}  // namespace

TEST_CASE("moe waits: dispatch and combine flags name the peer") {
  CHECK(describe_moe_wait(timeout_at(weft::kernels::moe_dispatch_flag(1)), 4) ==
        "rank 2 waited 3.0 s for rank 1's dispatched tokens (flag 1: saw 32, expected 64)");
  CHECK(describe_moe_wait(timeout_at(weft::kernels::moe_combine_flag(4, 3)), 4) ==
        "rank 2 waited 3.0 s for rank 3's combine rows (flag 7: saw 32, expected 64)");
}

TEST_CASE("moe waits across nodes: the rail waits name the peer and what crosses the network") {
  // kernels/moe_nodes.cu: flag index kMoeRailFlag + the rail word, tile_m the phase, tile_n the peer.
  const int32_t rail = weft::kernels::kMoeRailFlag;
  CHECK(describe_moe_wait(timeout_at(rail + 5, 0, 3), 4) ==
        "rank 2 waited 3.0 s for rank 3's tokens for this node over the network (saw 32, expected 64)");
  CHECK(describe_moe_wait(timeout_at(rail + 13, 1, 0), 4) ==
        "rank 2 waited 3.0 s for rank 0's summed combine rows of its node over the network (saw 32, expected 64)");
}

TEST_CASE("moe waits: ffn_combine's comb_done names the owner and the token tile") {
  const int32_t chunks = weft::kernels::moe_ffn_combine_chunks(1000);  // 8 token tiles
  CHECK(chunks == 8);
  const int32_t index = weft::kernels::moe_comb_done_flag(4, chunks, 3, 5);
  CHECK(index == 8 + 3 * 8 + 5);
  // The reduce unit's wait records the tile as tile_m and the owner as tile_n.
  CHECK(describe_moe_wait(timeout_at(index, 5, 3), 4) ==
        "rank 2 waited 3.0 s for rank 3's combine rows of its token tile 5 (comb_done: saw 32, expected 64)");
}

TEST_CASE("moe waits: the capacity record, and records that are not the op's waits") {
  DeviceError cap{};
  cap.status = 1;
  cap.kind = int32_t(DeviceErrorKind::kCapacity);
  cap.rank = 1;
  cap.expected = 1024;
  cap.seen = 896;
  CHECK(describe_moe_wait(cap, 2) ==
        "rank 1: the routed tokens need 1024 grouped rows and 896 are reserved (counts first: raise WEFT_HEAP_BYTES); "
        "the call is refused");
  CHECK(describe_moe_wait(timeout_at(-1, 9, 0), 4).empty());  // the FFN's row-tile wait: the generic report
  DeviceError none{};
  CHECK(describe_moe_wait(none, 4).empty());
  DeviceError barrier = timeout_at(3);
  barrier.kind = int32_t(DeviceErrorKind::kBarrierTimeout);
  CHECK(describe_moe_wait(barrier, 4).empty());
}
