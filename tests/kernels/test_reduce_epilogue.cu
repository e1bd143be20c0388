// GPU tests of the GEMM+RS/AR reductions on one GPU: the EpiReduceSlots epilogue (own rows summed
// with staged partials in the epilogue, other rows stored as partials, bit-identical reruns) and
// the peer reduce kernel with several ranks simulated by concurrent launches sharing flag arrays.
// Exits 77 (skipped) where no Hopper GPU is visible.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "kernels/gemm.h"
#include "kernels/reduce_slots.h"
#include "tests/kernels/gemm_testing.cuh"

using namespace weft::kernels;
using namespace weft::kernels::testing;
using weft::RoleCounts;
using weft::Status;

namespace {

// want[x][c] = ref[lo + x][c] + sum_i slot_i[x][c] (fp32), the exact sum the epilogue approximates.
__global__ void own_reference(const float* ref, const __nv_bfloat16* slots, int nslots, int64_t slot_elems, int lo,
                              int rows, int n, float* want) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < int64_t(rows) * n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float v = ref[int64_t(lo) * n + i];
    for (int s = 0; s < nslots; ++s) v += __bfloat162float(slots[s * slot_elems + i]);
    want[i] = v;
  }
}

struct Case {
  int n, own_path;
  bool ring;
  int owners, k;
};

// One configuration of the reduce epilogue (see the test case below), launched three times.
void check_reduce_case(const Case& cs, int sms) {
  const int pieces = 2, rpo = 256;
  const int n = cs.n, own_path = cs.own_path, owners = cs.owners, k = cs.k, m = owners * rpo, own = owners / 2;
  CAPTURE(n);
  CAPTURE(own_path);
  CAPTURE(cs.ring);
  CAPTURE(owners);
  CAPTURE(k);
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  DevBuf<__nv_bfloat16> a(int64_t(m) * k), b(int64_t(n) * k), partial(int64_t(m) * n), out(int64_t(rpo) * n);
  DevBuf<__nv_bfloat16> slots(int64_t(owners - 1) * rpo * n);
  DevBuf<float> ref(int64_t(m) * n), want(int64_t(rpo) * n);
  random_bf16(a.p, int64_t(m) * k, seed);
  random_bf16(b.p, int64_t(n) * k, seed + 1);
  random_bf16(slots.p, int64_t(owners - 1) * rpo * n, seed + 2, 8.0f);  // partials of a similar size
  reference(a.p, b.p, nullptr, ref.p, m, n, k);
  own_reference<<<256, 256>>>(ref.p, slots.p, owners - 1, int64_t(rpo) * n, own * rpo, rpo, n, want.p);
  WEFT_CUDA_OK(cudaGetLastError());

  GemmArgs args;
  args.m = m, args.n = n, args.k = k, args.a = a.p, args.b = b.p;
  args.num_shards = owners * pieces;
  args.first_shard = ((own + 1) % owners) * pieces;  // as the op: others' pieces first, own last
  GemmParams g;
  REQUIRE(make_gemm_params(args, &g) == Status::kOk);
  if (k > 1024) {  // the split tail, planned here so the test knows it is on
    REQUIRE(enable_tail_split(sms, nullptr, &g, /*chunked=*/false) == Status::kOk);
    REQUIRE(g.sched.split > 1);
  }
  const int nflags = owners * pieces;
  DevBuf<uint64_t> gate(nflags), counts(nflags);
  std::vector<uint64_t> gate_h(nflags, 5);  // every piece may go (expected 5 below)
  WEFT_CUDA_OK(cudaMemcpy(gate.p, gate_h.data(), nflags * 8, cudaMemcpyHostToDevice));
  FrameHost frame;
  REQUIRE(frame.create(own) == Status::kOk);
  FrameParams fp;
  RoleCounts roles;
  roles.compute = sms;
  REQUIRE(frame.params(roles, &fp) == Status::kOk);

  EpiReduceSlots epi;
  epi.partial = partial.p;
  epi.out = out.p;
  for (int s = 0; s < owners - 1; ++s) epi.slots[epi.nslots++] = slots.p + int64_t(s) * rpo * n;
  epi.lo = own * rpo, epi.hi = (own + 1) * rpo, epi.ldc = n, epi.paired = n % 2 == 0;
  const int copies = own_path == 2 ? 2 : 0;
  DevBuf<__nv_bfloat16> copy(int64_t(2) * rpo * n);
  DevBuf<uint64_t> copied(2);
  WEFT_CUDA_OK(cudaMemset(copied.p, 0, 2 * 8));
  __nv_bfloat16* peers[2] = {copy.p, copy.p + int64_t(rpo) * n};
  if (own_path > 0) {
    for (int i = 0; i < copies; ++i) epi.bcast_flags[epi.nbcast++] = copied.p + i;
    REQUIRE(enable_own_tma_store(g, peers, copies, &epi) == Status::kOk);
    REQUIRE(epi.own_maps == 1 + copies);
  }
  // Remote partials: owner o's slot at sent + o * rpo * n, its counts at landed + o * pieces.
  const bool remote = own_path == 3;
  DevBuf<__nv_bfloat16> sent(int64_t(owners) * rpo * n);
  DevBuf<uint64_t> landed(owners * pieces);
  WEFT_CUDA_OK(cudaMemset(landed.p, 0, owners * pieces * 8));
  std::vector<__nv_bfloat16*> slot_of(size_t(owners), nullptr);
  std::vector<uint64_t*> landed_of(size_t(owners), nullptr);
  for (int o = 0; o < owners; ++o) {
    slot_of[size_t(o)] = o == own ? nullptr : sent.p + int64_t(o) * rpo * n;
    landed_of[size_t(o)] = o == own ? nullptr : landed.p + o * pieces;
  }
  if (remote) {
    REQUIRE(enable_remote_partials(g, slot_of.data(), landed_of.data(), owners, rpo / pieces, &epi) == Status::kOk);
    REQUIRE(epi.part_owners == owners);
  }
  if (n % 2) {  // the broadcast needs TMA stores, which odd N does not allow: refused, not dropped
    EpiReduceSlots refused = epi;
    CHECK(enable_remote_partials(g, slot_of.data(), landed_of.data(), owners, rpo / pieces, &refused) ==
          Status::kInvalidArgument);
    CHECK(enable_own_tma_store(g, peers, 2, &refused) == Status::kInvalidArgument);
    CHECK(enable_own_tma_store(g, nullptr, 0, &refused) == Status::kOk);
    CHECK(refused.own_maps == 0);
  }
  if (cs.ring) {  // only with own tiles through TMA (not for odd N)
    REQUIRE(enable_slot_loads(g, &epi) == Status::kOk);
    const bool fits = owners - 1 <= EpiReduceSlots::kMaxRingSlots;  // more: the consumers load them
    CHECK(epi.slot_maps == (epi.own_maps > 0 && fits ? owners - 1 : 0));
  }
  const uint64_t own_tiles = uint64_t(rpo / 128) * uint64_t((n + 255) / 256);

  std::vector<__nv_bfloat16> first;
  for (int run = 0; run < 3; ++run) {
    CAPTURE(run);
    poison_bf16(partial.p, int64_t(m) * n);
    poison_bf16(out.p, int64_t(rpo) * n);
    poison_bf16(copy.p, int64_t(2) * rpo * n);
    poison_bf16(sent.p, int64_t(owners) * rpo * n);
    WEFT_CUDA_OK(cudaMemset(counts.p, 0, nflags * 8));
    const int32_t variant = run == 0 ? kSignalDeferred : run == 1 ? kSignalImmediate : kSignalInLoop;
    REQUIRE(launch_gemm(g, fp, epi, FlagGate{gate.p, kFlagPerShard, 5}, TileSignal{counts.p, kFlagPerShard, 1, variant},
                        nullptr) == Status::kOk);
    WEFT_CUDA_OK(cudaDeviceSynchronize());
    REQUIRE(frame.check("reduce epilogue test") == Status::kOk);
    // Own rows: the sum, rounded once (bf16 output rounding alone is ~1.7e-3).
    Compared own_err = compare(out.p, want.p, int64_t(rpo) * n);
    CHECK(own_err.bad == 0);
    CHECK(own_err.rel_err < 4e-3);
    // Other owners' rows: this rank's plain partial, in `partial` or (remote) in the owner's slot;
    // the own rows of `partial` stay untouched, and with remote partials all of it does.
    const std::vector<uint64_t> landed_h = to_host(landed.p, owners * pieces);
    const uint64_t tiles_per_piece = uint64_t(rpo / pieces / 128) * uint64_t((n + 255) / 256);
    for (int o = 0; o < owners; ++o) {
      CAPTURE(o);
      const __nv_bfloat16* got = (remote ? sent.p : partial.p) + int64_t(o) * rpo * n;
      Compared r = compare(got, ref.p + int64_t(o) * rpo * n, int64_t(rpo) * n);
      Compared local = compare(partial.p + int64_t(o) * rpo * n, ref.p + int64_t(o) * rpo * n, int64_t(rpo) * n);
      if (o == own) {
        CHECK(local.bad == uint64_t(rpo) * n);
      } else {
        CHECK(r.bad == 0);
        CHECK(r.rel_err < 4e-3);
        if (remote) CHECK(local.bad == uint64_t(rpo) * n);
      }
      for (int j = 0; j < pieces; ++j)  // each owner's pieces counted once per tile, per run
        CHECK_MESSAGE(
            landed_h[size_t(o * pieces + j)] == (remote && o != own ? uint64_t(run + 1) * tiles_per_piece : 0),
            "piece " << j);
    }
    const std::vector<uint64_t> c = to_host(counts.p, nflags);
    const uint64_t per_piece = uint64_t(rpo / pieces / 128) * uint64_t((n + 255) / 256);
    for (int i = 0; i < nflags; ++i) CHECK_MESSAGE(c[size_t(i)] == per_piece, "piece " << i);
    std::vector<__nv_bfloat16> now = to_host(out.p, int64_t(rpo) * n);
    const std::vector<__nv_bfloat16> copy_h = to_host(copy.p, int64_t(2) * rpo * n);
    const std::vector<uint64_t> copied_h = to_host(copied.p, 2);
    for (int i = 0; i < 2; ++i) {
      CAPTURE(i);
      const bool same = memcmp(copy_h.data() + size_t(i) * now.size(), now.data(), now.size() * sizeof(now[0])) == 0;
      CHECK(same == (i < copies));  // a copy is the output bit for bit, or untouched (poison)
      CHECK(copied_h[size_t(i)] == (i < copies ? uint64_t(run + 1) * own_tiles : 0));
    }
    if (run == 0) {
      first = now;
    } else {
      CHECK(memcmp(first.data(), now.data(), now.size() * sizeof(now[0])) == 0);
    }
  }
}

}  // namespace

TEST_CASE(
    "reduce epilogue: own rows = accumulator + staged slots, other rows stored as partials, reruns bit-identical") {
  const int sms = require_hopper();
  // Own tiles: 0 from registers, 1 through TMA, 2 through TMA into two more copies (AllReduce's
  // broadcast into peers' C, here local buffers) with a count per copy; 3: own tiles through TMA
  // and partial tiles sent by TMA into the other owners' slots (here local buffers) with a count per
  // owner and piece. 1000: a partial last tile column (TMA clips it); 777: odd N, the pair-by-pair
  // path (no TMA; broadcast, remote partials and slot loads refused). ring: the staged slots come
  // in through the GEMM's TMA ring (enable_slot_loads); with 2, 4 and 8 owners (1, 3 and 7 slots:
  // 2, 4 and 10 extra stages, the last ones part full) and with K = 2048, where the tiles of the
  // one ragged wave are split along K and only an own tile's final slice loads the slots. Run 0
  // holds the counts of tiles stored by TMA until the next tile (kSignalDeferred), run 1 counts
  // them at once, run 2 from inside the next tile's main loop (kSignalInLoop). 9 and 11 owners: 8 and
  // 10 staged slots, as GEMM+RS across 2 x 8 and 4 x 8 GPUs stage them (G - 1 + N - 1), from the
  // consumers' loads (the ring takes at most 7).
  const Case cases[] = {{1280, 0, false, 4, 320}, {1280, 1, false, 4, 320},  {1280, 1, true, 4, 320},
                        {1280, 2, false, 4, 320}, {1280, 2, true, 4, 320},   {1000, 2, false, 4, 320},
                        {1000, 2, true, 4, 320},  {1280, 3, true, 4, 320},   {777, 0, false, 4, 320},
                        {777, 0, true, 4, 320},   {1280, 1, true, 2, 320},   {1280, 1, true, 8, 320},
                        {1280, 1, true, 4, 2048}, {1280, 0, false, 4, 2048}, {1280, 0, false, 11, 320},
                        {1280, 1, true, 11, 320}, {1280, 1, false, 9, 320}};
  for (const Case& cs : cases) check_reduce_case(cs, sms);
}

// The ring path alone on a small problem, for compute-sanitizer (scripts/gpu/20-gemm.sh).
TEST_CASE("reduce epilogue small: slots through the ring") {
  const int sms = require_hopper();
  check_reduce_case(Case{512, 1, true, 4, 128}, sms);
}

TEST_CASE("reduce epilogue: own tiles read their slots only after the gate; a gate that never opens times out") {
  const int sms = require_hopper();
  const int owners = 4, pieces = 2, own = 1, rpo = 256, m = owners * rpo, n = 1280, k = 1024;
  const int nflags = owners * pieces;
  DevBuf<__nv_bfloat16> a(int64_t(m) * k), b(int64_t(n) * k), partial(int64_t(m) * n), out(int64_t(rpo) * n);
  DevBuf<__nv_bfloat16> slots(int64_t(owners - 1) * rpo * n), staged(int64_t(owners - 1) * rpo * n);
  DevBuf<float> ref(int64_t(m) * n), want(int64_t(rpo) * n);
  DevBuf<uint64_t> gate(nflags), counts(nflags);
  cudaStream_t run = nullptr, late = nullptr;
  WEFT_CUDA_OK(cudaStreamCreateWithFlags(&run, cudaStreamNonBlocking));
  WEFT_CUDA_OK(cudaStreamCreateWithFlags(&late, cudaStreamNonBlocking));
  FrameHost frame;
  REQUIRE(frame.create(own) == Status::kOk);
  for (const bool ring : {true, false}) {
    CAPTURE(ring);
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    random_bf16(a.p, int64_t(m) * k, seed);
    random_bf16(b.p, int64_t(n) * k, seed + 1);
    random_bf16(staged.p, int64_t(owners - 1) * rpo * n, seed + 2, 8.0f);
    reference(a.p, b.p, nullptr, ref.p, m, n, k);
    own_reference<<<256, 256>>>(ref.p, staged.p, owners - 1, int64_t(rpo) * n, own * rpo, rpo, n, want.p);
    WEFT_CUDA_OK(cudaGetLastError());
    GemmArgs args;
    args.m = m, args.n = n, args.k = k, args.a = a.p, args.b = b.p;
    args.num_shards = nflags;
    args.first_shard = ((own + 1) % owners) * pieces;
    GemmParams g;
    REQUIRE(make_gemm_params(args, &g) == Status::kOk);
    EpiReduceSlots epi;
    epi.partial = partial.p;
    epi.out = out.p;
    for (int i = 0; i < owners - 1; ++i) epi.slots[epi.nslots++] = slots.p + int64_t(i) * rpo * n;
    epi.lo = own * rpo, epi.hi = (own + 1) * rpo, epi.ldc = n;
    REQUIRE(enable_own_tma_store(g, nullptr, 0, &epi) == Status::kOk);
    if (ring) REQUIRE(enable_slot_loads(g, &epi) == Status::kOk);
    CHECK(epi.slot_maps == (ring ? owners - 1 : 0));
    // Every piece may go but the own ones (one short); the slots hold poison until the gate opens.
    std::vector<uint64_t> gate_h(nflags, 3);
    for (int j = 0; j < pieces; ++j) gate_h[size_t(own * pieces + j)] = 2;
    const uint64_t open = 3;

    {  // late gate
      FrameParams fp;
      RoleCounts roles;
      roles.compute = sms;
      REQUIRE(frame.params(roles, &fp) == Status::kOk);
      WEFT_CUDA_OK(cudaMemcpy(gate.p, gate_h.data(), nflags * 8, cudaMemcpyHostToDevice));
      WEFT_CUDA_OK(cudaMemset(counts.p, 0, nflags * 8));
      poison_bf16(slots.p, int64_t(owners - 1) * rpo * n);
      poison_bf16(out.p, int64_t(rpo) * n);
      WEFT_CUDA_OK(cudaDeviceSynchronize());
      REQUIRE(launch_gemm(g, fp, epi, FlagGate{gate.p, kFlagPerShard, open, own * pieces, (own + 1) * pieces},
                          TileSignal{counts.p, kFlagPerShard, 1}, run) == Status::kOk);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      // The partials land, then the gate opens, in that order on one stream (as the op's copies).
      WEFT_CUDA_OK(
          cudaMemcpyAsync(slots.p, staged.p, size_t(owners - 1) * rpo * n * 2, cudaMemcpyDeviceToDevice, late));
      for (int j = 0; j < pieces; ++j)
        WEFT_CUDA_OK(cudaMemcpyAsync(gate.p + own * pieces + j, &open, 8, cudaMemcpyHostToDevice, late));
      WEFT_CUDA_OK(cudaStreamSynchronize(late));
      WEFT_CUDA_OK(cudaStreamSynchronize(run));
      REQUIRE(frame.check("reduce epilogue late gate") == Status::kOk);
      Compared r = compare(out.p, want.p, int64_t(rpo) * n);
      CHECK(r.bad == 0);
      CHECK(r.rel_err < 4e-3);
      const uint64_t per_piece = uint64_t(rpo / pieces / 128) * uint64_t((n + 255) / 256);
      for (uint64_t v : to_host(counts.p, nflags)) CHECK(v == per_piece);
    }
    {  // timeout
      frame.set_timeout(0.2);
      FrameParams fp;
      RoleCounts roles;
      roles.compute = sms;
      REQUIRE(frame.params(roles, &fp) == Status::kOk);
      WEFT_CUDA_OK(cudaMemcpy(gate.p, gate_h.data(), nflags * 8, cudaMemcpyHostToDevice));
      REQUIRE(launch_gemm(g, fp, epi, FlagGate{gate.p, kFlagPerShard, open, own * pieces, (own + 1) * pieces},
                          TileSignal{}, run) == Status::kOk);
      WEFT_CUDA_OK(cudaStreamSynchronize(run));
      CHECK(frame.check("reduce epilogue timeout") == Status::kTimeout);
      CHECK(frame.record().kind == int32_t(DeviceErrorKind::kFlagTimeout));
      const int32_t idx = frame.record().flag_index;
      CHECK((idx == own * pieces || idx == own * pieces + 1));
      // The next launch, with the gate open, is whole again.
      frame.set_timeout(10);
      REQUIRE(frame.params(roles, &fp) == Status::kOk);
      WEFT_CUDA_OK(cudaMemcpy(slots.p, staged.p, size_t(owners - 1) * rpo * n * 2, cudaMemcpyDeviceToDevice));
      for (int j = 0; j < pieces; ++j) gate_h[size_t(own * pieces + j)] = open;
      WEFT_CUDA_OK(cudaMemcpy(gate.p, gate_h.data(), nflags * 8, cudaMemcpyHostToDevice));
      poison_bf16(out.p, int64_t(rpo) * n);
      WEFT_CUDA_OK(cudaDeviceSynchronize());
      REQUIRE(launch_gemm(g, fp, epi, FlagGate{gate.p, kFlagPerShard, open, own * pieces, (own + 1) * pieces},
                          TileSignal{}, run) == Status::kOk);
      WEFT_CUDA_OK(cudaStreamSynchronize(run));
      REQUIRE(frame.check("reduce epilogue after timeout") == Status::kOk);
      Compared r = compare(out.p, want.p, int64_t(rpo) * n);
      CHECK(r.bad == 0);
      CHECK(r.rel_err < 4e-3);
    }
  }
  WEFT_CUDA_OK(cudaStreamDestroy(run));
  WEFT_CUDA_OK(cudaStreamDestroy(late));
}

TEST_CASE("peer reduce: simulated ranks sum every partial in rank order, gather every block, publish each phase once") {
  require_hopper();
  const int ranks = 3, blocks = 4;
  for (bool all_gather : {false, true})
    for (int64_t elems : {int64_t(8) * 1000, int64_t(1001)}) {  // the 16-byte path and the scalar tail
      CAPTURE(all_gather);
      CAPTURE(elems);
      const uint64_t seed = fresh_seed();
      INFO("seed " << seed);
      // Rank q's partial and C each hold all ranks' blocks: block r at (q * ranks + r) * elems.
      DevBuf<__nv_bfloat16> partials(int64_t(ranks) * ranks * elems), c(int64_t(ranks) * ranks * elems);
      DevBuf<uint64_t> flags(3 * ranks * ranks), arrive(2 * ranks);  // rank q's at 3q * ranks and 2q
      random_bf16(partials.p, int64_t(ranks) * ranks * elems, seed, 4.0f);
      WEFT_CUDA_OK(cudaMemset(flags.p, 0, 3 * ranks * ranks * 8));
      WEFT_CUDA_OK(cudaMemset(arrive.p, 0, 2 * ranks * 8));
      poison_bf16(c.p, int64_t(ranks) * ranks * elems);
      WEFT_CUDA_OK(cudaDeviceSynchronize());  // the legacy stream's memsets before the non-blocking launches
      std::vector<FrameHost> frames(ranks);
      std::vector<FrameParams> fps(ranks);
      std::vector<cudaStream_t> streams(ranks);
      RoleCounts roles;
      roles.intra_comm = blocks;
      for (int r = 0; r < ranks; ++r) {
        REQUIRE(frames[size_t(r)].create(r) == Status::kOk);
        frames[size_t(r)].set_timeout(5.0);
        REQUIRE(frames[size_t(r)].params(roles, &fps[size_t(r)]) == Status::kOk);
        WEFT_CUDA_OK(cudaStreamCreateWithFlags(&streams[size_t(r)], cudaStreamNonBlocking));
      }
      auto block = [&](__nv_bfloat16* base, int q, int r) { return base + (int64_t(q) * ranks + r) * elems; };
      for (uint64_t epoch = 1; epoch <= 2; ++epoch) {
        CAPTURE(epoch);
        for (int r = 0; r < ranks; ++r) {  // launched side by side: each waits for the others' phases
          PeerReduceArgs pr;
          pr.ranks = ranks;
          pr.rank = r;
          pr.elems = elems;
          pr.out = block(c.p, r, r);
          pr.all_gather = all_gather;
          for (int q = 0; q < ranks; ++q) {
            pr.src[q] = block(partials.p, q, r);
            pr.gather_src[q] = block(c.p, q, q);
            pr.gather_dst[q] = block(c.p, r, q);
            pr.flags_out[q] = flags.p + 3 * q * ranks;
          }
          pr.flags_in = flags.p + 3 * r * ranks;
          pr.arrive = arrive.p + 2 * r;
          pr.epoch = epoch;
          REQUIRE(launch_peer_reduce(pr, fps[size_t(r)], blocks, streams[size_t(r)]) == Status::kOk);
        }
        WEFT_CUDA_OK(cudaDeviceSynchronize());
        for (int r = 0; r < ranks; ++r) REQUIRE(frames[size_t(r)].check("peer reduce test") == Status::kOk);
        const std::vector<__nv_bfloat16> p = to_host(partials.p, int64_t(ranks) * ranks * elems);
        const std::vector<__nv_bfloat16> got = to_host(c.p, int64_t(ranks) * ranks * elems);
        int64_t wrong = 0, stray = 0;
        for (int q = 0; q < ranks; ++q)
          for (int r = 0; r < ranks; ++r)
            for (int64_t i = 0; i < elems; ++i) {
              const __nv_bfloat16 have = got[size_t((int64_t(q) * ranks + r) * elems + i)];
              if (!all_gather && q != r) {  // reduce-scatter: only the own block is written
                if (!std::isnan(__bfloat162float(have))) ++stray;
                continue;
              }
              float sum = 0;  // fp32 in rank order, rounded once: the kernel's exact arithmetic
              for (int s = 0; s < ranks; ++s) sum += __bfloat162float(p[size_t((int64_t(s) * ranks + r) * elems + i)]);
              const __nv_bfloat16 want = __float2bfloat16_rn(sum);
              if (memcmp(&want, &have, sizeof want) != 0) ++wrong;
            }
        CHECK(wrong == 0);
        CHECK(stray == 0);  // elements a reduce-scatter wrote outside its own block
        const std::vector<uint64_t> f = to_host(flags.p, 3 * ranks * ranks), ar = to_host(arrive.p, 2 * ranks);
        for (int q = 0; q < ranks; ++q)
          for (int k = 0; k < 3 * ranks; ++k) {
            const bool used = k < ranks || k >= 2 * ranks || all_gather;  // reduced flags only with the gather
            CHECK_MESSAGE(f[size_t(3 * q * ranks + k)] == (used ? epoch : 0), "rank " << q << " flag " << k);
          }
        for (int q = 0; q < ranks; ++q) {
          CHECK(ar[size_t(2 * q)] == epoch * blocks);
          CHECK(ar[size_t(2 * q + 1)] == (all_gather ? epoch * blocks : 0));
        }
      }
      for (cudaStream_t s : streams) cudaStreamDestroy(s);
    }
}
