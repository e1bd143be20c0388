// GEMM+RS / GEMM+AR across nodes: setup (heap, transport, buffers, kernel arguments) and one run's
// enqueue (the kernel, the copy engines' NVLink moves, the gates' stream waits). The picture is in
// kernels/gemm_reduce_nodes_plan.h.
//
// Streams of one run (all forked from `main`, joined back into it):
//   main   A into position order (copy engine) ─► the kernel (GEMM + inter_send) ─► mates' "freed"
//          ─► (AllReduce) every owner's rows are here
//   copy   per copy of the plan, piece by piece: this rank's tiles counted ─► copy into the mate's
//          slot over NVLink ─► the mate's arrived flag (stream write into its memory)
//   gates  per gated position and piece: every slot it sums has arrived (and, for a rail row block,
//          the rail peer freed its slot of the last run) ─► gate = epoch (the GEMM's producer waits)
//   ag     AllReduce: own piece reduced ─► into this rank's C and every mate's C ─► their flags
//   fwd    AllReduce: a rail peer's piece arrived through the proxy ─► into every mate's C ─► flags
#include "runtime/exec/gemm_reduce_nodes.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/params.h"
#include "bootstrap/placement.h"
#include "kernels/gemm.h"
#include "runtime/exec/context.h"
#include "runtime/exec/cuda_check.h"
#include "runtime/exec/device_data.h"
#include "runtime/exec/stream_ops.h"
#include "transport/cuda_transport.h"
#include "transport/heap.h"

namespace weft::runtime {

using bf16 = __nv_bfloat16;

bool RsNodes::slot_has_data(int s, int pos) const {
  if (pos < plan.lo) return false;
  const kernels::RsNodesGroup g = plan.group[size_t(pos)];
  if (plan.slots[size_t(s)].rail) return g == kernels::RsNodesGroup::kOwn;
  return g == kernels::RsNodesGroup::kOwn || g == kernels::RsNodesGroup::kRail;
}

Status RsNodes::place(bootstrap::Bootstrap& boot) {
  const char* name = all_reduce ? "gemm_ar" : "gemm_rs";
  std::vector<int> node_of, local_of;
  WEFT_CHECK(bootstrap::gather_node_placement(boot, &node_of, &local_of));
  std::string why;
  if (!kernels::make_rs_nodes_plan(node_of, local_of, rank, kernels::EpiReduceSlots::kMaxSlots, &plan, &why)) {
    WEFT_WARN(kKernel, "rank %d: %s across nodes: %s", rank, name, why.c_str());
    return Status::kUnsupported;
  }
  if (int(plan.rails.size()) > kernels::RsNodesKernelParams::kMaxRails) {
    WEFT_WARN(kKernel, "rank %d: %s across %d nodes: at most %d other nodes", rank, name, plan.nodes,
              kernels::RsNodesKernelParams::kMaxRails);
    return Status::kUnsupported;
  }
  return Status::kOk;
}

Status RsNodes::size(int want_pieces, int want_channels, uint64_t base_off, uint64_t* end) {
  const char* name = all_reduce ? "gemm_ar" : "gemm_rs";
  pieces = kernels::rs_nodes_pieces(m_loc, n * int64_t(sizeof(bf16)), kernels::GemmConfig::kTileM, want_pieces);
  if (pieces == 0) {
    WEFT_WARN(kKernel,
              "rank %d: %s across nodes: %d pieces must cut %lld rows into whole tiles of %d rows (at most 64)", rank,
              name, want_pieces, static_cast<long long>(m_loc), kernels::GemmConfig::kTileM);
    return Status::kInvalidArgument;
  }
  channels = std::clamp(want_channels, 1, kernels::RsNodesKernelParams::kMaxChannels);
  m_piece = m_loc / pieces;
  block_bytes = uint64_t(m_loc * n) * sizeof(bf16);
  piece_bytes = block_bytes / uint64_t(pieces);
  tiles_per_piece = uint64_t(m_piece / kernels::GemmConfig::kTileM) * uint64_t((n + 255) / 256);
  const int R = plan.reduce_rows(), W = world, S = pieces;
  const uint64_t mn_bytes = uint64_t(m * n) * sizeof(bf16);
  // Every region's offset from the heap's base: from base_off on (the op's arena in a context's heap).
  transport::HeapAllocator alloc(~0ull);
  regions.clear();
  auto region = [&](const char* what, uint64_t bytes, uint64_t align, uint64_t* off) -> Status {
    WEFT_CHECK(alloc.allocate(bytes, align, what, off));
    regions.push_back({std::string("gemm_reduce_nodes.") + what, *off, bytes});
    *off += base_off;
    return Status::kOk;
  };
  WEFT_CHECK(region("partial", mn_bytes, 1024, &partial_off));  // the TMA store's map covers M rows
  WEFT_CHECK(region("out", uint64_t(R) * block_bytes, 1024, &out_off));
  WEFT_CHECK(region("slots", uint64_t(nslots()) * R * block_bytes, 1024, &slots_off));
  if (all_reduce) WEFT_CHECK(region("c", mn_bytes, 1024, &c_off));
  WEFT_CHECK(region("arrived", 8ull * nslots() * W * S, 256, &arrived_off));
  WEFT_CHECK(region("mate_freed", 8ull * W, 256, &mate_freed_off));
  WEFT_CHECK(region("rail_freed", 8ull * W, 256, &rail_freed_off));
  WEFT_CHECK(region("c_arrived", 8ull * W * S, 256, &c_arrived_off));
  *end = base_off + alloc.used();
  return Status::kOk;
}

void RsNodes::attach(char* local, std::vector<char*> peers, transport::Transport* t,
                     const std::vector<transport::DeviceFifo>& rings) {
  heap_base = local;
  heap_peers = std::move(peers);
  tp = t;
  for (int c = 0; c < channels && c < int(rings.size()); ++c) kp.fifo[c] = rings[size_t(c)];
}

Status RsNodes::prepare(const RoleCounts& r, int32_t group_m_, kernels::LaunchRecord* launch) {
  const char* name = all_reduce ? "gemm_ar" : "gemm_rs";
  const int W = world, S = pieces;
  WEFT_CHECK(transport::preload_kernels({kernels::gemm_reduce_nodes_kernel_ptr()}, name));
  roles = r;
  group_m = group_m_;
  for (cudaStream_t* st : {&main, &copy, &gates, &ag, &fwd})
    WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(st, cudaStreamNonBlocking));
  WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  for (cudaEvent_t& e : joined) WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  WEFT_CUDA_CHECK(cudaMalloc(&a_pos, size_t(m * k_loc) * sizeof(bf16)));
  WEFT_CUDA_CHECK(cudaMalloc(&tiles, 8 * size_t(W * S)));
  WEFT_CUDA_CHECK(cudaMemset(tiles, 0, 8 * size_t(W * S)));
  WEFT_CUDA_CHECK(cudaMalloc(&gate, 8 * size_t(W * S)));
  WEFT_CUDA_CHECK(cudaHostAlloc(&push_err_host, 2 * sizeof(int32_t), cudaHostAllocMapped));
  push_err_host[0] = push_err_host[1] = 0;
  WEFT_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&push_err), push_err_host, 0));
  std::vector<uint64_t> gate_init(size_t(W * S), kNeverFlag);  // ungated shards never wait
  for (int pos = 0; pos < W; ++pos)
    if (!plan.gate_slots[size_t(pos)].empty() || plan.rail_freed_gate[size_t(pos)] >= 0)
      for (int j = 0; j < S; ++j) gate_init[size_t(shard(pos, j))] = 0;
  WEFT_CUDA_CHECK(cudaMemcpy(gate, gate_init.data(), 8 * gate_init.size(), cudaMemcpyHostToDevice));

  WEFT_CHECK(frame.create(rank));
  WEFT_CHECK(frame.params(roles, &frame_params));
  frame_params.launch = launch;
  kp.frame = frame_params;

  kernels::EpiReduceSlots& epi = kp.epi;
  epi = kernels::EpiReduceSlots{};
  epi.partial = at<bf16>(partial_off);
  epi.out = at<bf16>(out_off);
  for (int sl = 0; sl < nslots(); ++sl) epi.slots[epi.nslots++] = at<bf16>(slot_region(sl, plan.lo));
  epi.lo = int32_t(plan.lo * m_loc);
  epi.hi = int32_t(W * m_loc);
  epi.ldc = n;
  epi.paired = n % 2 == 0;
  epi.local_signal = true;  // the counts are read by this GPU only (inter_send, copy engines, stream waits)
  kp.gate = kernels::FlagGate{};
  kp.gate.flags = gate;
  kp.gate.granularity = kernels::kFlagPerShard;
  kp.gate.wait_lo = shard(plan.lo, 0);  // positions [0, lo) never wait: their TMA tiles may signal late
  kp.gate.wait_hi = shard(W - 1, S - 1) + 1;
  kp.signal = kernels::TileSignal{tiles, kernels::kFlagPerShard, 1};
  kp.channels = channels;
  kp.num_rails = int32_t(plan.rails.size());
  for (int i = 0; i < kp.num_rails; ++i) {
    kp.rail_peer[i] = plan.rails[size_t(i)];
    kp.rail_freed_remote[i] = rail_freed_off + 8ull * uint64_t(rank);
    kp.rail_freed_local[i] = at<uint64_t>(rail_freed_off + 8ull * uint64_t(plan.rails[size_t(i)]));
  }
  // Proxy messages, in the order their rows complete: the rail peers' node sums, then (AllReduce)
  // this rank's reduced rows to every rail peer.
  std::vector<kernels::RsNodesMessage> list;
  for (const kernels::RsNodesSend& snd : plan.sends) {
    const int rail = int(std::find(plan.rails.begin(), plan.rails.end(), snd.peer) - plan.rails.begin());
    for (int j = 0; j < S; ++j) {
      kernels::RsNodesMessage msg;
      msg.peer = snd.peer;
      msg.wait_shard = shard(snd.pos, j);
      msg.rail = rail;
      msg.src_off = out_region(snd.pos) + uint64_t(j) * piece_bytes;
      msg.dst_off = slot_region(snd.slot, snd.peer_pos) + uint64_t(j) * piece_bytes;
      msg.bytes = piece_bytes;
      msg.flag_off = arrived_flag(snd.slot, snd.peer_pos, j);
      list.push_back(msg);
    }
  }
  std::vector<const uint64_t*> wait_list;
  for (int sl = 0; sl < nslots(); ++sl)
    if (plan.slots[size_t(sl)].rail)
      for (int j = 0; j < S; ++j) wait_list.push_back(at<uint64_t>(arrived_flag(sl, W - 1, j)));
  if (all_reduce) {
    for (int j = 0; j < S; ++j)
      for (int peer : plan.rails) {
        kernels::RsNodesMessage msg;
        msg.peer = peer;
        msg.wait_shard = shard(W - 1, j);
        msg.src_off = out_region(W - 1) + uint64_t(j) * piece_bytes;
        msg.dst_off = c_off + uint64_t(rank) * block_bytes + uint64_t(j) * piece_bytes;
        msg.bytes = piece_bytes;
        msg.flag_off = c_arrived_flag(rank, j);
        list.push_back(msg);
      }
    for (int peer : plan.rails)
      for (int j = 0; j < S; ++j) wait_list.push_back(at<uint64_t>(c_arrived_flag(peer, j)));
  }
  num_msgs = int(list.size());
  num_waits = int(wait_list.size());
  WEFT_CUDA_CHECK(cudaMalloc(&msgs, sizeof(kernels::RsNodesMessage) * std::max<size_t>(1, list.size())));
  WEFT_CUDA_CHECK(cudaMemcpy(msgs, list.data(), sizeof(kernels::RsNodesMessage) * list.size(), cudaMemcpyHostToDevice));
  WEFT_CUDA_CHECK(cudaMalloc(&waits, sizeof(uint64_t*) * std::max<size_t>(1, wait_list.size())));
  WEFT_CUDA_CHECK(cudaMemcpy(waits, wait_list.data(), sizeof(uint64_t*) * wait_list.size(), cudaMemcpyHostToDevice));
  kp.msgs = msgs;
  kp.num_msgs = num_msgs;
  kp.waits = waits;
  kp.num_waits = num_waits;
  kp.tiles = tiles;
  kp.push_error = push_err;
  kp.push_error_peer = push_err + 1;
  WEFT_CUDA_CHECK(cudaDeviceSynchronize());
  return Status::kOk;
}

Status RsNodes::set_b(const bf16* b_in) {
  if (b_in == gemm_b) return Status::kOk;
  // The fused GEMM: A in position order, one M-shard per (position, piece), walked in order.
  kernels::GemmArgs args;
  args.m = m;
  args.n = n;
  args.k = k_loc;
  args.a = a_pos;
  args.b = b_in;
  args.num_shards = world * pieces;
  args.first_shard = 0;
  args.group_m = group_m;
  WEFT_CHECK(kernels::make_gemm_params(args, &kp.gemm));
  WEFT_CHECK(kernels::enable_tma_store(kp.epi, &kp.gemm));  // positions [0, lo) leave through TMA stores
  gemm_b = b_in;
  return Status::kOk;
}

Status RsNodes::enqueue(const bf16* a, const bf16* b, cudaStream_t main, bool compute) {
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t e = ++epoch;
  if (compute) WEFT_CHECK(set_b(b));
  if (compute) ++tile_runs;
  const uint64_t done = tile_runs * tiles_per_piece;
  const int W = world, S = pieces;
  WEFT_CUDA_CHECK(cudaEventRecord(fork, main));
  if (compute)  // the op takes A in global row order; the GEMM walks it in position order
    for (int pos = 0; pos < W; ++pos)
      WEFT_CUDA_CHECK(cudaMemcpyAsync(a_pos + int64_t(pos) * m_loc * k_loc,
                                      a + int64_t(plan.order[size_t(pos)]) * m_loc * k_loc,
                                      size_t(m_loc * k_loc) * sizeof(bf16), cudaMemcpyDeviceToDevice, main));
  kp.epoch = e;
  kp.tile_target = done;
  kp.compute = compute ? 1 : 0;
  kp.gate.expected = e;
  // The kernel goes first: its streams' waits must not hold it back should streams share a queue.
  WEFT_CHECK(kernels::launch_gemm_reduce_nodes(kp, main));

  std::vector<StreamMemOp> ops;
  auto wait = [&](uint64_t* addr, uint64_t v) { ops.push_back({StreamMemOp::kWaitGeq, addr, v}); };
  auto write = [&](uint64_t* addr, uint64_t v) { ops.push_back({StreamMemOp::kWrite, addr, v}); };
  auto flush = [&](cudaStream_t s) -> Status {
    WEFT_CHECK(stream_mem_ops(s, ops));
    ops.clear();
    return Status::kOk;
  };
  int used = 0;  // side streams to join
  cudaStream_t side[4] = {};
  if (compute) {
    WEFT_CUDA_CHECK(cudaStreamWaitEvent(copy, fork));
    side[used++] = copy;
    std::vector<int> targets;
    for (const kernels::RsNodesCopy& c : plan.copies)
      if (std::find(targets.begin(), targets.end(), c.target) == targets.end()) targets.push_back(c.target);
    for (int t : targets) wait(at<uint64_t>(mate_freed_off + 8ull * t), e - 1);  // t read my last run's slots
    for (const kernels::RsNodesCopy& c : plan.copies) {
      const uint64_t src = c.from_out ? out_region(c.pos) : partial_off + uint64_t(c.pos) * block_bytes;
      for (int j = 0; j < S; ++j) {
        wait(tiles + shard(c.pos, j), done);
        WEFT_CHECK(flush(copy));
        const uint64_t at_j = uint64_t(j) * piece_bytes;
        WEFT_CUDA_CHECK(cudaMemcpyAsync(peer_base(c.target) + slot_region(c.slot, c.target_pos) + at_j,
                                        base() + src + at_j, piece_bytes, cudaMemcpyDeviceToDevice, copy));
        write(peer_at<uint64_t>(c.target, arrived_flag(c.slot, c.target_pos, j)), e);
      }
    }
    WEFT_CHECK(flush(copy));

    WEFT_CUDA_CHECK(cudaStreamWaitEvent(gates, fork));
    side[used++] = gates;
    for (int pos = 0; pos < W; ++pos) {
      if (plan.gate_slots[size_t(pos)].empty() && plan.rail_freed_gate[size_t(pos)] < 0) continue;
      const int freed_by = plan.rail_freed_gate[size_t(pos)];
      if (freed_by >= 0) wait(at<uint64_t>(rail_freed_off + 8ull * freed_by), e - 1);
      for (int j = 0; j < S; ++j) {
        for (int s : plan.gate_slots[size_t(pos)]) wait(at<uint64_t>(arrived_flag(s, pos, j)), e);
        write(gate + shard(pos, j), e);
        if (ops.size() > 200) WEFT_CHECK(flush(gates));
      }
    }
    WEFT_CHECK(flush(gates));

    if (all_reduce) {
      WEFT_CUDA_CHECK(cudaStreamWaitEvent(ag, fork));
      side[used++] = ag;
      const uint64_t own = out_region(W - 1), mine = c_off + uint64_t(rank) * block_bytes;
      for (int j = 0; j < S; ++j) {
        wait(tiles + shard(W - 1, j), done);
        WEFT_CHECK(flush(ag));
        const uint64_t at_j = uint64_t(j) * piece_bytes;
        WEFT_CUDA_CHECK(
            cudaMemcpyAsync(base() + mine + at_j, base() + own + at_j, piece_bytes, cudaMemcpyDeviceToDevice, ag));
        for (int t : plan.mates) {
          WEFT_CUDA_CHECK(cudaMemcpyAsync(peer_base(t) + mine + at_j, base() + own + at_j, piece_bytes,
                                          cudaMemcpyDeviceToDevice, ag));
          write(peer_at<uint64_t>(t, c_arrived_flag(rank, j)), e);
        }
      }
      WEFT_CHECK(flush(ag));
      if (!plan.forwards.empty() && !plan.mates.empty()) {
        WEFT_CUDA_CHECK(cudaStreamWaitEvent(fwd, fork));
        side[used++] = fwd;
        for (int j = 0; j < S; ++j)
          for (int f : plan.forwards) {
            wait(at<uint64_t>(c_arrived_flag(f, j)), e);  // raised by the proxy after f's piece
            WEFT_CHECK(flush(fwd));
            const uint64_t at_fj = c_off + uint64_t(f) * block_bytes + uint64_t(j) * piece_bytes;
            for (int t : plan.mates) {
              WEFT_CUDA_CHECK(
                  cudaMemcpyAsync(peer_base(t) + at_fj, base() + at_fj, piece_bytes, cudaMemcpyDeviceToDevice, fwd));
              write(peer_at<uint64_t>(t, c_arrived_flag(f, j)), e);
            }
          }
        WEFT_CHECK(flush(fwd));
      }
    }
  }
  // On main, behind the kernel: this rank's slots of epoch e are read (every run, so a mate's wait
  // for e - 1 never waits for a run that had no GEMM); AllReduce: every owner's rows are here.
  for (int t : plan.mates) write(peer_at<uint64_t>(t, mate_freed_off + 8ull * rank), e);
  if (all_reduce && compute)
    for (int o = 0; o < W; ++o)
      if (o != rank)
        for (int j = 0; j < S; ++j) wait(at<uint64_t>(c_arrived_flag(o, j)), e);
  for (size_t i = 0; i < ops.size(); i += 200) {
    std::vector<StreamMemOp> part(ops.begin() + long(i), ops.begin() + long(std::min(ops.size(), i + 200)));
    WEFT_CHECK(stream_mem_ops(main, part));
  }
  ops.clear();
  for (int i = 0; i < used; ++i) {
    WEFT_CUDA_CHECK(cudaEventRecord(joined[i], side[i]));
    WEFT_CUDA_CHECK(cudaStreamWaitEvent(main, joined[i]));
  }
  host_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  ++host_runs;
  return Status::kOk;
}

Status RsNodes::poison() {
  WEFT_CHECK(poison_bf16(at<bf16>(partial_off), m * n, main));
  WEFT_CHECK(poison_bf16(at<bf16>(out_off), int64_t(plan.reduce_rows()) * m_loc * n, main));
  for (int s = 0; s < nslots(); ++s)
    for (int pos = plan.lo; pos < world; ++pos)
      if (slot_has_data(s, pos)) WEFT_CHECK(poison_bf16(at<bf16>(slot_region(s, pos)), m_loc * n, main));
  if (all_reduce) WEFT_CHECK(poison_bf16(at<bf16>(c_off), m * n, main));
  WEFT_CUDA_CHECK(cudaStreamSynchronize(main));
  return Status::kOk;
}

Status RsNodes::check(const char* what) const {
  const kernels::DeviceError& rec = frame.record();
  if (rec.committed && rec.role == int32_t(Role::kInterSend)) {
    // inter_send's waits: flag_index >= 0 is the shard whose tiles it awaited, -2 - i rail i's "freed".
    const int idx = rec.flag_index;
    if (idx >= 0)
      WEFT_WARN(kKernel,
                "rank %d: %s: inter_send waited for this rank's tiles of position %d (owner %d) piece %d "
                "before its put to rank %d (count %llu of %llu)",
                rank, what, idx / pieces, plan.order[size_t(idx / pieces)], idx % pieces, rec.tile_n,
                static_cast<unsigned long long>(rec.seen), static_cast<unsigned long long>(rec.expected));
    else
      WEFT_WARN(kKernel,
                "rank %d: %s: inter_send waited for rail peer %d to free its slot of epoch %llu (through the "
                "proxy; seen %llu)",
                rank, what, rec.tile_n, static_cast<unsigned long long>(rec.expected),
                static_cast<unsigned long long>(rec.seen));
  } else if (rec.committed && rec.role == int32_t(Role::kCompute) &&
             rec.kind == int32_t(kernels::DeviceErrorKind::kFlagTimeout)) {
    const int idx = rec.flag_index;
    if (kp.compute && idx >= 0 && idx < world * pieces)
      WEFT_WARN(kKernel,
                "rank %d: %s: the GEMM waited for the gate of position %d (owner %d, %s) piece %d: the "
                "staged partials of slots %s did not all arrive",
                rank, what, idx / pieces, plan.order[size_t(idx / pieces)],
                kernels::to_string(plan.group[size_t(idx / pieces)]), idx % pieces,
                plan.group[size_t(idx / pieces)] == kernels::RsNodesGroup::kOwn ? "(mates' and rails')" : "(mates')");
  }
  WEFT_CHECK(frame.check(what));
  const int32_t err[2] = {push_err_host[0], push_err_host[1]};  // host-mapped (the runs have completed)
  if (err[0]) {
    std::string rings;
    for (int c = 0; c < channels; ++c)
      rings += " channel " + std::to_string(c) + " tail " +
               std::to_string(__atomic_load_n(&tp->fifo_ring(c)->tail, __ATOMIC_ACQUIRE)) + ";";
    WEFT_WARN(kKernel,
              "rank %d: %s: inter_send's FIFO push for rank %d failed with status %d (%s): the proxy did not "
              "drain within WEFT_PROXY_TIMEOUT (rings:%s) %s",
              rank, what, err[1], err[0], to_string(static_cast<Status>(err[0])), rings.c_str(),
              tp->error_message().c_str());
    return static_cast<Status>(err[0]);
  }
  if (tp->status() != Status::kOk) {
    WEFT_WARN(kKernel, "rank %d: %s: transport failed: %s", rank, what, tp->error_message().c_str());
    return tp->status();
  }
  return Status::kOk;
}

void RsNodes::unstick() {
  cudaStream_t s = nullptr;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return;
  const int W = world, S = pieces;
  const uint64_t e = epoch.load(), done = tile_runs.load() * tiles_per_piece;
  const uint64_t flag_bytes = c_arrived_off + 8ull * W * S - arrived_off;
  std::vector<uint64_t> flags(flag_bytes / 8), counts(size_t(W * S));
  cudaMemcpyAsync(flags.data(), base() + arrived_off, flag_bytes, cudaMemcpyDeviceToHost, s);
  cudaMemcpyAsync(counts.data(), tiles, 8 * counts.size(), cudaMemcpyDeviceToHost, s);
  cudaStreamSynchronize(s);
  auto flag = [&](uint64_t off) { return flags[(off - arrived_off) / 8]; };
  const char* name = all_reduce ? "gemm_ar" : "gemm_rs";
  int shown = reported.exchange(true) ? 16 : 0;  // the report once; the release every time
  auto say = [&](const std::string& what, uint64_t seen, uint64_t want) {
    if (shown++ < 16)
      WEFT_WARN(kKernel, "rank %d: %s epoch %llu: still waiting for %s (flag %llu, want >= %llu)", rank, name,
                static_cast<unsigned long long>(e), what.c_str(), static_cast<unsigned long long>(seen),
                static_cast<unsigned long long>(want));
  };
  for (int pos = 0; pos < W; ++pos)
    for (int sl : plan.gate_slots[size_t(pos)])
      for (int j = 0; j < S; ++j)
        if (flag(arrived_flag(sl, pos, j)) < e)
          say("rank " + std::to_string(plan.slots[size_t(sl)].source) + "'s partial of owner " +
                  std::to_string(plan.order[size_t(pos)]) + " piece " + std::to_string(j) +
                  (plan.slots[size_t(sl)].rail ? " (through the proxy)" : " (NVLink copy)"),
              flag(arrived_flag(sl, pos, j)), e);
  for (int t : plan.mates)
    if (flag(mate_freed_off + 8ull * t) + 1 < e)
      say("node-mate " + std::to_string(t) + " to free this rank's slots there", flag(mate_freed_off + 8ull * t),
          e - 1);
  for (int r : plan.rails)
    if (flag(rail_freed_off + 8ull * r) + 1 < e)
      say("rail peer " + std::to_string(r) + " to free its slot (through the proxy)", flag(rail_freed_off + 8ull * r),
          e - 1);
  if (all_reduce)
    for (int o = 0; o < W; ++o)
      if (o != rank)
        for (int j = 0; j < S; ++j)
          if (flag(c_arrived_flag(o, j)) < e)
            say("owner " + std::to_string(o) + "'s reduced piece " + std::to_string(j) + " via " +
                    kernels::to_string(plan.path[size_t(o)]) + " (rank " + std::to_string(plan.path_rank[size_t(o)]) +
                    ")",
                flag(c_arrived_flag(o, j)), e);
  for (int sh = 0; sh < W * S; ++sh)
    if (counts[size_t(sh)] < done)
      say("this rank's GEMM tiles of position " + std::to_string(sh / S) + " piece " + std::to_string(sh % S),
          counts[size_t(sh)], done);
  // Release every local wait: the streams drain and the error can be reported.
  std::vector<uint64_t> big(flags.size(), kNeverFlag);
  cudaMemcpyAsync(base() + arrived_off, big.data(), flag_bytes, cudaMemcpyHostToDevice, s);
  cudaMemcpyAsync(tiles, big.data(), 8 * counts.size(), cudaMemcpyHostToDevice, s);
  cudaMemcpyAsync(gate, big.data(), 8 * counts.size(), cudaMemcpyHostToDevice, s);
  cudaStreamSynchronize(s);
  cudaStreamDestroy(s);
}

Status RsNodes::sync(const char* what) {
  return sync_bounded(main, 2 * param_double_or_default("WEFT_DEVICE_TIMEOUT"), what, [this] { unstick(); });
}

RsNodes::~RsNodes() {
  // The benchmark runner's own context is still held here only when it left early (on success it
  // is reset after the last barrier): no collective heap close a peer that failed may never join.
  if (own_ctx) own_ctx->poison("the benchmark runner stopped early on this rank");
  // This op's own streams only: a program's other work may still be running (the caller's stream
  // was waited for, bounded, by the runtime op before this).
  for (cudaStream_t s : {main, copy, gates, ag, fwd})
    if (s) cudaStreamSynchronize(s);
  for (void* p : {static_cast<void*>(a), static_cast<void*>(a_pos), static_cast<void*>(b), static_cast<void*>(ref),
                  static_cast<void*>(ref_partial), static_cast<void*>(scratch), static_cast<void*>(tiles),
                  static_cast<void*>(gate), static_cast<void*>(msgs), static_cast<void*>(waits)})
    if (p) cudaFree(p);
  if (push_err_host) cudaFreeHost(push_err_host);
  if (fork) cudaEventDestroy(fork);
  for (cudaEvent_t e : joined)
    if (e) cudaEventDestroy(e);
  for (cudaStream_t s : {main, copy, gates, ag, fwd})
    if (s) cudaStreamDestroy(s);
}  // then own_ctx (the runner's): its rings, transport and heap

}  // namespace weft::runtime
