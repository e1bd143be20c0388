// A rank of `weftrun exec -n N` (tests/launcher/test_embedded.cpp) that connects to the job's PMIx
// server three times in a row, as a program making a second and third weft::Context does. Each
// connection exchanges under the same names as the last: its own exchange numbers start at 0, and
// every rank reads every peer's entry of this connection, never one an earlier connection put.
// Prints one line per rank and exits 0, or says what was wrong and exits 1.
#include <cstdio>
#include <memory>
#include <string>

#include "bootstrap/pmix_bootstrap.h"

using weft::Status;
using weft::bootstrap::Blob;
using weft::bootstrap::PmixBootstrap;

int main() {
  int rank = -1;
  for (int c = 0; c < 3; ++c) {
    std::unique_ptr<PmixBootstrap> boot;
    if (PmixBootstrap::connect(&boot) != Status::kOk) {
      fprintf(stderr, "reconnect: connection %d failed\n", c);
      return 1;
    }
    rank = boot->info().rank;
    const int size = boot->info().size;
    // A new bootstrap object numbers its exchanges from 0, wherever it lives.
    const int id = boot->next_exchange_id();
    if (id != 0) {
      fprintf(stderr, "reconnect: rank %d: connection %d's first exchange number is %d, not 0\n", rank, c, id);
      return 1;
    }
    std::vector<Blob> all;
    const Blob mine{static_cast<uint8_t>(c), static_cast<uint8_t>(rank)};
    if (boot->allgather("same." + std::to_string(id), mine, &all) != Status::kOk || all.size() != size_t(size)) {
      fprintf(stderr, "reconnect: rank %d: connection %d's exchange failed\n", rank, c);
      return 1;
    }
    for (int r = 0; r < size; ++r) {
      if (all[r] != Blob{static_cast<uint8_t>(c), static_cast<uint8_t>(r)}) {
        fprintf(stderr, "reconnect: rank %d: connection %d read rank %d's entry of connection %d\n", rank, c, r,
                all[r].size() == 2 ? all[r][0] : -1);
        return 1;
      }
    }
    if (c == 0) {
      // Put only by the first connection; a later one must not see it.
      if (boot->allgather("first-only", mine, &all) != Status::kOk) return 1;
    } else if (size > 1) {
      Blob stale;
      const int peer = (rank + 1) % size;
      if (boot->get(peer, "first-only", &stale) == Status::kOk) {
        fprintf(stderr, "reconnect: rank %d: connection %d read rank %d's 'first-only' of the first connection\n", rank,
                c, peer);
        return 1;
      }
    }
    if (boot->barrier("reconnect.done") != Status::kOk) return 1;
  }
  printf("reconnect: rank %d: 3 connections, every entry from its own connection\n", rank);
  return 0;
}
