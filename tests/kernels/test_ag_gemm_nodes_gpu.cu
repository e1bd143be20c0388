// GPU tests of the multi-node AllGather+GEMM kernel (kernels/ag_gemm_nodes.h) on its own, without
// weftrun: ranks forked as emulated nodes (2 x 2 and 4 x 1), the device FIFO, proxy and socket backend
// between nodes, CUDA IPC within a node, as the plan (kernels/ag_gemm_nodes_plan.h) routes each shard.
//   - Every element of a rank's shard encodes that rank: after each of three calls every position of
//     every rank's gathered A equals its source rank's shard bit for bit (a misrouted shard differs),
//     every flag holds the call's epoch, and C (poisoned before each call) matches an fp32 reference.
//   - The gather alone (no compute blocks) moves the same bytes.
//   - 20 calls back to back with random host delays and no barrier: the "freed" round keeps every
//     put and forward out of a peer still in its last run (no deadlock, every check right at the end).
//   - A rank that never launches: its rail peer's wait for that shard ends within the device timeout
//     with kTimeout, and the job ends (every wait bounded).
// One rank per GPU where there are enough; otherwise ranks share GPUs and compute on a few SMs each
// (the protocol, not NVLink). Exits 77 (skipped) where no Hopper GPU is visible.
#include <cuda_runtime.h>
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "fork_gpu.h"
#include "kernels/ag_gemm_nodes.h"
#include "kernels/ag_gemm_nodes_plan.h"
#include "kernels/frame.h"
#include "kernels/gemm.h"
#include "local_bootstrap.h"
#include "tests/kernels/gemm_testing.cuh"
#include "transport/cuda_transport.h"
#include "transport/heap.h"
#include "transport/transport.h"

using weft::RoleCounts;
using weft::Status;
namespace kt = weft::kernels::testing;
namespace wk = weft::kernels;
namespace wt = weft::transport;
using bf16 = __nv_bfloat16;

namespace {

constexpr int kRanks = 4;
constexpr int64_t kRowsPerRank = 256, kK = 512, kN = 256;  // 2 row tiles per shard: 2 chunks of one tile

// An exactly representable bf16 (a multiple of 1/64 in [-2, 2)) that depends on the source rank.
__host__ __device__ inline float shard_value(int rank, int64_t i) {
  const uint32_t h = uint32_t(i) * 2654435761u ^ (uint32_t(rank + 1) * 0x9E3779B9u);
  return float(int((h >> 8) % 256) - 128) / 64.f;
}

__global__ void fill_shard(bf16* p, int64_t n, int rank) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16(shard_value(rank, i));
}

// Elements of `got` (the shard of `rank`) that differ from that rank's data.
__global__ void count_wrong(const bf16* got, int64_t n, int rank, unsigned long long* wrong) {
  unsigned long long bad = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    bad += __bfloat16_as_ushort(got[i]) != __bfloat16_as_ushort(__float2bfloat16(shard_value(rank, i)));
  atomicAdd(wrong, bad);
}

// What one rank holds for the kernel.
struct Rank {
  int rank = 0, world = 0, chunks = 1;
  int64_t m = 0;
  uint64_t shard_bytes = 0, chunk_bytes = 0, a_off = 0, flags_off = 0, freed_off = 0;
  wk::AgNodesPlan plan;
  std::unique_ptr<wt::CudaHeap> heap;
  std::unique_ptr<wt::Transport> tp;
  std::unique_ptr<wt::DeviceFifoHandle> fifo;
  wk::FrameHost frame;
  wk::AgNodesKernelParams kp;
  RoleCounts roles;
  bf16 *b = nullptr, *c = nullptr, *a_full = nullptr;
  float* ref = nullptr;
  int32_t* push_err = nullptr;
  uint64_t* epochs = nullptr;  // pinned host: epochs[e] = e (e < 32), the source of every flag write of call e
  unsigned long long* wrong = nullptr;
  cudaStream_t main = nullptr, copy = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;

  char* base() const { return static_cast<char*>(heap->local()); }
  bf16* pos_ptr(int pos) const { return reinterpret_cast<bf16*>(base() + a_off + uint64_t(pos) * shard_bytes); }
  uint64_t* flag(int pos, int chunk) const {
    return reinterpret_cast<uint64_t*>(base() + flags_off) + int64_t(pos) * chunks + chunk;
  }

  // One call of epoch e: own flags, the node-mates' shards pulled by the copy engines (their flags
  // written by a copy too: no SM is free beside the persistent kernel), then the kernel.
  cudaError_t enqueue(uint64_t e, bool compute) {
    cudaError_t err = cudaEventRecord(fork, main);
    if (err == cudaSuccess) err = cudaStreamWaitEvent(copy, fork);
    for (int ch = 0; ch < chunks && err == cudaSuccess; ++ch)
      err = cudaMemcpyAsync(flag(0, ch), epochs + e, 8, cudaMemcpyHostToDevice, main);
    for (const wk::AgNodesPull& p : plan.pulls) {
      const char* src = static_cast<const char*>(heap->peer(p.mate)) + a_off;
      for (int ch = 0; ch < chunks && err == cudaSuccess; ++ch) {
        err = cudaMemcpyAsync(reinterpret_cast<char*>(pos_ptr(p.dst_pos)) + ch * chunk_bytes, src + ch * chunk_bytes,
                              chunk_bytes, cudaMemcpyDeviceToDevice, copy);
        if (err == cudaSuccess) err = cudaMemcpyAsync(flag(p.dst_pos, ch), epochs + e, 8, cudaMemcpyHostToDevice, copy);
      }
    }
    if (err != cudaSuccess) return err;
    kp.epoch = e;
    kp.gate.expected = e;
    kp.compute = compute ? 1 : 0;
    if (wk::launch_ag_gemm_nodes(kp, main) != Status::kOk) return cudaErrorLaunchFailure;
    err = cudaEventRecord(join, copy);
    if (err == cudaSuccess) err = cudaStreamWaitEvent(main, join);
    return err;
  }

  ~Rank() {
    cudaDeviceSynchronize();
    for (void* p : {static_cast<void*>(b), static_cast<void*>(c), static_cast<void*>(a_full), static_cast<void*>(ref),
                    static_cast<void*>(push_err), static_cast<void*>(wrong)})
      if (p) cudaFree(p);
    if (epochs) cudaFreeHost(epochs);
    if (fork) cudaEventDestroy(fork);
    if (join) cudaEventDestroy(join);
    if (copy) cudaStreamDestroy(copy);
    if (main) cudaStreamDestroy(main);
    fifo.reset();  // before the transport that owns the ring
    if (tp) tp->stop();
  }
};

int setup(weft::testing::ForkBootstrap& boot, int ngpu, Rank& r) {
  const auto& info = boot.info();
  r.rank = info.rank;
  r.world = info.size;
  const int dev = r.rank % ngpu;
  FORK_CUDA_TRY(cudaSetDevice(dev));
  FORK_TRY(wt::preload_kernels({wk::ag_gemm_nodes_kernel_ptr(), reinterpret_cast<const void*>(fill_shard),
                                reinterpret_cast<const void*>(count_wrong)},
                               "test_ag_gemm_nodes_gpu"),
           21);
  // Placement: the bootstrap's node and local rank of every rank.
  const int32_t mine[2] = {info.node, info.local_rank};
  std::vector<weft::bootstrap::Blob> all;
  FORK_TRY(boot.allgather("placement",
                          weft::bootstrap::Blob(reinterpret_cast<const uint8_t*>(mine),
                                                reinterpret_cast<const uint8_t*>(mine) + sizeof mine),
                          &all),
           22);
  std::vector<int> node_of, local_of;
  for (const auto& a : all) {
    int32_t v[2];
    if (a.size() != sizeof v) return boot.report("placement entry of the wrong size"), 23;
    memcpy(v, a.data(), sizeof v);
    node_of.push_back(v[0]);
    local_of.push_back(v[1]);
  }
  std::string why;
  if (!wk::make_ag_nodes_plan(node_of, local_of, r.rank, &r.plan, &why)) return boot.report("plan: " + why), 24;
  r.m = kRowsPerRank * r.world;
  r.chunks = wk::ag_nodes_chunks(kRowsPerRank, wk::GemmConfig::kTileM, 2);
  r.shard_bytes = uint64_t(kRowsPerRank * kK) * sizeof(bf16);
  r.chunk_bytes = r.shard_bytes / uint64_t(r.chunks);
  const uint64_t a_bytes = r.shard_bytes * uint64_t(r.world), flag_bytes = 8ull * uint64_t(r.world * r.chunks);
  wt::HeapAllocator alloc(a_bytes + flag_bytes + 16ull * uint64_t(r.world) + 4096);
  FORK_TRY(alloc.allocate(a_bytes, 1024, "A", &r.a_off), 25);
  FORK_TRY(alloc.allocate(flag_bytes, 8, "flags", &r.flags_off), 25);
  FORK_TRY(alloc.allocate(16ull * uint64_t(r.world), 8, "freed", &r.freed_off), 25);
  FORK_TRY(wt::CudaHeap::create(boot, alloc.used(), &r.heap), 26);
  wt::TransportOptions opt;
  opt.backend = "socket";
  opt.signal_mode = "batched";
  opt.use_topology = false;
  opt.fifo_memory = wt::cuda_fifo_memory();
  opt.copy_hooks = wt::cuda_copy_hooks(dev);
  FORK_TRY(wt::Transport::create(boot, r.heap->region(), opt, &r.tp), 27);
  FORK_TRY(wt::DeviceFifoHandle::create(r.tp->fifo_ring(0), r.tp->timeout_s(), &r.fifo), 28);

  int sms = 0;
  FORK_TRY(wk::device_sm_count(&sms), 29);
  const bool shared = ngpu < r.world;
  const int forward_items = int(r.plan.forwards.size()) * r.chunks;
  r.roles.inter_send = r.plan.sends.empty() ? 0 : 1;
  r.roles.intra_comm = std::min(4, forward_items);
  // Sharing a GPU, every rank's persistent launch must fit beside the others' (and the copies').
  r.roles.compute = shared ? 16 : sms - r.roles.inter_send - r.roles.intra_comm;

  FORK_CUDA_TRY(cudaStreamCreateWithFlags(&r.main, cudaStreamNonBlocking));
  FORK_CUDA_TRY(cudaStreamCreateWithFlags(&r.copy, cudaStreamNonBlocking));
  FORK_CUDA_TRY(cudaEventCreateWithFlags(&r.fork, cudaEventDisableTiming));
  FORK_CUDA_TRY(cudaEventCreateWithFlags(&r.join, cudaEventDisableTiming));
  FORK_CUDA_TRY(cudaMalloc(&r.b, size_t(kN * kK) * sizeof(bf16)));
  FORK_CUDA_TRY(cudaMalloc(&r.c, size_t(r.m * kN) * sizeof(bf16)));
  FORK_CUDA_TRY(cudaMalloc(&r.a_full, size_t(r.m * kK) * sizeof(bf16)));
  FORK_CUDA_TRY(cudaMalloc(&r.ref, size_t(r.m * kN) * sizeof(float)));
  FORK_CUDA_TRY(cudaMalloc(&r.push_err, 2 * sizeof(int32_t)));
  FORK_CUDA_TRY(cudaMalloc(&r.wrong, sizeof(unsigned long long)));
  FORK_CUDA_TRY(cudaMemset(r.push_err, 0, 2 * sizeof(int32_t)));
  FORK_CUDA_TRY(cudaHostAlloc(&r.epochs, 32 * sizeof(uint64_t), cudaHostAllocDefault));
  for (uint64_t e = 0; e < 32; ++e) r.epochs[e] = e;

  // This rank's shard at its position 0; B fresh and random; the reference over every rank's shard.
  fill_shard<<<256, 256>>>(r.pos_ptr(0), kRowsPerRank * kK, r.rank);
  kt::random_bf16(r.b, kN * kK, kt::fresh_seed(), 0.5f);
  for (int q = 0; q < r.world; ++q)
    fill_shard<<<256, 256>>>(r.a_full + int64_t(q) * kRowsPerRank * kK, kRowsPerRank * kK, q);
  kt::reference(r.a_full, r.b, nullptr, r.ref, int(r.m), int(kN), int(kK));
  FORK_CUDA_TRY(cudaDeviceSynchronize());

  wk::GemmArgs args;
  args.m = r.m;
  args.n = kN;
  args.k = kK;
  args.a = r.pos_ptr(0);
  args.b = r.b;
  args.num_shards = r.world * r.chunks;
  args.first_shard = 0;
  FORK_TRY(wk::make_gemm_params(args, &r.kp.gemm), 30);
  FORK_TRY(r.frame.create(r.rank), 31);
  FORK_TRY(r.frame.params(r.roles, &r.kp.frame), 32);
  r.kp.epi.rows_per_owner = kRowsPerRank;
  r.kp.epi.ldc = kN;
  r.kp.epi.paired = true;
  for (int pos = 0; pos < r.world; ++pos) r.kp.epi.dst[pos] = r.c + int64_t(r.plan.order[pos]) * kRowsPerRank * kN;
  r.kp.gate.flags = r.flag(0, 0);
  r.kp.gate.granularity = wk::kFlagPerShard;
  // freed: zero, as the heap is created (every peer has freed run 0).
  r.kp.moves = wk::ag_nodes_device_moves(r.plan, r.chunks, r.a_off, r.shard_bytes, r.flags_off, r.freed_off);
  r.kp.fifo[0] = r.fifo->get();
  r.kp.channels = 1;
  r.kp.heap = r.base();
  r.kp.peers = reinterpret_cast<char* const*>(r.heap->device_peer_table());
  r.kp.push_error = r.push_err;
  r.kp.push_error_peer = r.push_err + 1;
  FORK_TRY(boot.barrier("inputs"), 33);  // every shard written before anyone reads one
  return 0;
}

// After a synchronized call of epoch e: positions, flags, pushes, the proxy and (compute) C.
std::string check_call(Rank& r, uint64_t e, bool compute) {
  std::string bad;
  if (r.frame.check("ag_gemm_nodes") != Status::kOk) bad += " device wait timed out;";
  int32_t pe[2] = {0, 0};
  cudaMemcpy(pe, r.push_err, sizeof pe, cudaMemcpyDeviceToHost);
  if (pe[0]) bad += " push to rank " + std::to_string(pe[1]) + " failed (" + std::to_string(pe[0]) + ");";
  if (r.tp->status() != Status::kOk) bad += " transport: " + r.tp->error_message() + ";";
  for (int pos = 0; pos < r.world; ++pos) {
    cudaMemset(r.wrong, 0, sizeof(unsigned long long));
    count_wrong<<<128, 256>>>(r.pos_ptr(pos), kRowsPerRank * kK, r.plan.order[pos], r.wrong);
    unsigned long long w = 0;
    cudaMemcpy(&w, r.wrong, sizeof w, cudaMemcpyDeviceToHost);
    if (w)
      bad += " position " + std::to_string(pos) + " (shard of rank " + std::to_string(r.plan.order[pos]) +
             "): " + std::to_string(w) + " elements not that rank's;";
    for (int ch = 0; ch < r.chunks; ++ch) {
      uint64_t f = 0;
      cudaMemcpy(&f, r.flag(pos, ch), 8, cudaMemcpyDeviceToHost);
      if (f != e)
        bad += " flag (" + std::to_string(pos) + ", " + std::to_string(ch) + ") = " + std::to_string(f) +
               ", expected " + std::to_string(e) + ";";
    }
  }
  if (compute) {
    const kt::Compared cmp = kt::compare(r.c, r.ref, r.m * kN);
    if (cmp.bad || cmp.rel_err > 1e-2)
      bad += " C: " + std::to_string(cmp.bad) + " unwritten, rel err " + std::to_string(cmp.rel_err) + ";";
  }
  return bad;
}

// Three calls with the GEMM, one gather alone; a barrier between calls, so that positions can be
// poisoned before each.
int rank_body(weft::testing::ForkBootstrap& boot, int ngpu) {
  Rank r;
  if (int rc = setup(boot, ngpu, r)) return rc;
  std::string summary = "rank " + std::to_string(r.rank) + " (" + std::to_string(r.plan.sends.size()) + " sends, " +
                        std::to_string(r.plan.pulls.size()) + " pulls, " + std::to_string(r.plan.forwards.size()) +
                        " forwards, " + std::to_string(r.chunks) + " chunks)";
  for (uint64_t e = 1; e <= 4; ++e) {
    const bool compute = e != 3;
    FORK_CUDA_TRY(cudaMemset(r.c, 0xFF, size_t(r.m * kN) * sizeof(bf16)));  // poison: NaN
    FORK_CUDA_TRY(cudaMemset(r.base() + r.a_off + r.shard_bytes, 0xFF, r.shard_bytes * uint64_t(r.world - 1)));
    FORK_CUDA_TRY(cudaDeviceSynchronize());
    FORK_TRY(boot.barrier("call." + std::to_string(e)), 40);
    FORK_CUDA_TRY(r.enqueue(e, compute));
    FORK_CUDA_TRY(cudaStreamSynchronize(r.main));
    const std::string bad = check_call(r, e, compute);
    summary += "; call " + std::to_string(e) + (compute ? "" : " (gather alone)") + (bad.empty() ? ": ok" : ":" + bad);
    if (!bad.empty()) return boot.report(summary), 41;
  }
  FORK_TRY(r.tp->flush(), 42);
  FORK_TRY(boot.barrier("done"), 43);  // every rank has all it waits for: the transports may stop
  r.fifo.reset();
  FORK_TRY(r.tp->stop(), 44);
  boot.report(summary);
  return r.heap->close(boot) == Status::kOk ? 0 : 45;
}

// Back to back: 20 calls with random host delays and no barrier between them; the freed round keeps a
// rank from putting into (or forwarding into) a peer still in its last run. After the last call every
// position, flag and C are checked.
int back_to_back_body(weft::testing::ForkBootstrap& boot, int ngpu) {
  Rank r;
  if (int rc = setup(boot, ngpu, r)) return rc;
  std::mt19937 rng(uint32_t(r.rank) * 7919u + 17u);
  constexpr uint64_t kCalls = 20;
  for (uint64_t e = 1; e <= kCalls; ++e) {
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
    FORK_CUDA_TRY(r.enqueue(e, true));
  }
  FORK_CUDA_TRY(cudaStreamSynchronize(r.main));
  const std::string bad = check_call(r, kCalls, true);
  const std::string summary = "rank " + std::to_string(r.rank) + ": " + std::to_string(kCalls) + " calls back to back" +
                              (bad.empty() ? ": ok" : ":" + bad);
  if (!bad.empty()) return boot.report(summary), 60;
  FORK_TRY(r.tp->flush(), 61);
  FORK_TRY(boot.barrier("done"), 62);
  r.fifo.reset();
  FORK_TRY(r.tp->stop(), 63);
  boot.report(summary);
  return r.heap->close(boot) == Status::kOk ? 0 : 64;
}

// Rank `victim` never launches call 1: its rail peers wait for its shard until the device timeout.
int stall_body(weft::testing::ForkBootstrap& boot, int ngpu, int victim) {
  setenv("WEFT_DEVICE_TIMEOUT", "3", 1);
  Rank r;
  if (int rc = setup(boot, ngpu, r)) return rc;
  bool mine = false;  // the victim's shard comes to this rank over the net
  for (int pos = 1; pos < r.world; ++pos)
    if (r.plan.source[pos] == wk::AgNodesSource::kNet && r.plan.order[pos] == victim) mine = true;
  if (r.rank == victim) {
    boot.report("rank " + std::to_string(r.rank) + ": the victim, never launched");
    std::this_thread::sleep_for(std::chrono::seconds(8));
    return 0;
  }
  const auto t0 = std::chrono::steady_clock::now();
  FORK_CUDA_TRY(r.enqueue(1, true));
  FORK_CUDA_TRY(cudaStreamSynchronize(r.main));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const Status st = r.frame.check("ag_gemm_nodes, a peer never launched");
  boot.report("rank " + std::to_string(r.rank) + (mine ? " (the victim's rail peer)" : "") + ": " +
              weft::to_string(st) + " after " + std::to_string(s) + " s");
  if (mine && st != Status::kTimeout) return 50;
  if (s > 20) return 51;
  return 0;
}

void check_results(const std::vector<weft::testing::ForkResult>& res) {
  for (const auto& r : res) {
    MESSAGE(r.report);
    CAPTURE(r.rank);
    CHECK(r.exited);
    CHECK(r.exit_code == 0);
  }
}

}  // namespace

TEST_CASE("ag_gemm_nodes: 2 nodes x 2, every shard where the plan puts it, C right, three calls and a gather") {
  const int ngpu = weft::testing::fork_gpus_or_skip(kRanks, true);
  check_results(weft::testing::run_forked(
      kRanks, 2, [&](weft::testing::ForkBootstrap& b) { return rank_body(b, ngpu); }, 240));
}

TEST_CASE("ag_gemm_nodes: 4 nodes x 1 (every shard over the proxy)") {
  const int ngpu = weft::testing::fork_gpus_or_skip(kRanks, true);
  check_results(weft::testing::run_forked(
      kRanks, 1, [&](weft::testing::ForkBootstrap& b) { return rank_body(b, ngpu); }, 240));
}

TEST_CASE("ag_gemm_nodes: 20 calls back to back without a barrier (the freed round), 2 x 2 and 4 x 1") {
  const int ngpu = weft::testing::fork_gpus_or_skip(kRanks, true);
  for (int per_node : {2, 1}) {
    CAPTURE(per_node);
    check_results(weft::testing::run_forked(
        kRanks, per_node, [&](weft::testing::ForkBootstrap& b) { return back_to_back_body(b, ngpu); }, 240));
  }
}

TEST_CASE("ag_gemm_nodes: a rank that never launches ends its rail peer's wait within the device timeout") {
  const int ngpu = weft::testing::fork_gpus_or_skip(kRanks, true);
  check_results(weft::testing::run_forked(
      kRanks, 2, [&](weft::testing::ForkBootstrap& b) { return stall_body(b, ngpu, 3); }, 120));
}
