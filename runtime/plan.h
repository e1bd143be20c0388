// The Plan the tuner produces (SM role counts, tiles, chunks, predicted times, bytes per link) and its printers.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "base/roles.h"
#include "bootstrap/rank_group.h"
#include "runtime/workload.h"

namespace weft::kernels {
struct LaunchRecord;
}

namespace weft::runtime {

// Who moves the bytes between the GPUs of a node: intra_comm SMs (loads and stores through the
// peer-mapped heap), or the GPUs' copy engines (peer copies enqueued on a stream, each followed by a
// stream write of its flag): those use no SM and get the link's full bandwidth.
enum class IntraMover : int { kSm = 0, kCopyEngine };
const char* to_string(IntraMover m);  // "sm", "copy_engine"
// The op's own mover where nothing else decides: the copy engines for GEMM+RS/AR, SMs otherwise.
IntraMover default_mover(Op op);

// One buffer or flag array of an op in the symmetric heap. Every rank lays the op out the same way,
// so a peer's buffer is (rank, offset).
struct HeapRegion {
  std::string name;     // "ag_gemm.a", "ag_gemm.gate", ...
  uint64_t offset = 0;  // from the op's base in the heap
  uint64_t bytes = 0;
};

// The GEMM core's launch choices (the ops pass them to kernels::launch_gemm as kernels::GemmOptions).
struct GemmChoices {
  bool split_tail = true;     // cut the last wave's tiles along K where blocks would otherwise idle
  bool chunked_tail = true;   // ... into one chunk of k-blocks per block (a static walk only)
  bool dynamic_tiles = true;  // compute blocks claim their next tile when ready (1-CTA clusters)
  bool tma_store = true;      // C leaves through shared memory and TMA where its layout allows
};

// How the op runs: every choice the op makes at run time. The tuner fills it; the op executes it as
// it is (runtime/ops), and `weftrun run` reports it read back from the launch.
struct Execution {
  std::string variant;  // "copy_engine", "sm_movers" or "hierarchical" (ag_gemm); "peer" / "overlap" (gemm_rs, gemm_ar)
  std::string sm_mover;   // ag_gemm SM movers: "pull_vec", "push_vec", "pull_bulk", "push_bulk"; else ""
  int copy_chunks = 1;    // copy engines: copies per shard, each with its own flag
  int cluster = 1;        // GEMM CTAs per cluster: 1 claims tiles (K-sliced tail), 2 walks statically (chunked tail)
  int group_m = 16;       // raster group height in 128-row tiles
  int reduce_blocks = 0;  // gemm_rs / gemm_ar "peer": blocks of the reduction kernel after the GEMM
  // gemm_rs / gemm_ar "overlap" (runtime/exec/reduce_overlap.h): partial pieces move while the GEMM runs.
  int pieces = 0;      // pieces of each owner's row block (M-shards of the tile order)
  int lag = 0;         // own piece j computed after round j + lag of the other owners' pieces
  std::string send;    // "copy": copy engines (and roles.intra_comm mover SMs); "sm": the epilogue's stores
  std::string gather;  // gemm_ar: "push" (copy engines) or "sm" (the epilogue's stores); else ""
  // ag_gemm "hierarchical" (across nodes, runtime/exec/ag_gemm_nodes.h): copy_chunks is the chunks per
  // shard (a put+signal each across nodes, a pull or forward each inside one), channels the proxy
  // channels (a proxy thread and its connections each) the puts are spread over.
  int channels = 0;
  std::string signal_mode;  // "hierarchical": the proxy path's signal ordering (the workload's transport.signal_mode)
  // moe: the expert FFN's projections split over K into at most this many parts, taken per call where
  // the parts fit one wave of the compute SMs (kernels/moe_plan.h: down's pairs, moe_split_parts, and
  // gate/up's last wave, moe_up_tail_parts; decode counts); 1: never split, so a row's bits do not
  // depend on the other rows' counts. 0: not moe.
  int split_k = 0;
  GemmChoices gemm;         // the GEMM core's launch choices
  bool capturable = false;  // op.run may be captured in a CUDA graph
  bool executable = false;  // this build can run the plan; else `not_executable` says why
  std::string not_executable;
};

// Traffic of one GPU (the busiest rank) on one kind of link, for one run of the op.
struct LinkLoad {
  std::string link;      // "nvlink", "nic" or "pcie" (GPU <-> NIC path of GPUDirect RDMA)
  double bytes_out = 0;  // sent by one GPU
  double bytes_in = 0;   // received by one GPU
  double gbps = 0;       // bandwidth one GPU gets on it (GB/s = 1e9 B/s)
  double time_s = 0;     // max(bytes_out, bytes_in) / gbps: this link alone, at full speed
};

// What the persistent kernel will be launched with, and what the model predicts for it.
struct Plan {
  // The problem.
  std::string workload;  // Workload::name
  std::string source;    // the YAML file
  Op op = Op::kAgGemm;
  DType dtype = DType::kBf16;
  int nodes = 1;  // nodes, gpus_per_node, world_size: the ranks the op runs on (one group's)
  int gpus_per_node = 1;
  int world_size = 1;
  // The job the groups tile (`group:`); 0: the op runs on the whole job (one group).
  int job_nodes = 0;
  int job_gpus_per_node = 0;
  GemmShape gemm;            // ag_gemm, gemm_rs, gemm_ar: the global problem (of one group)
  MoeShape moe;              // moe
  AttentionShape attention;  // ring_attention

  // The machine model used.
  std::string gpu;           // "h100" / "h200"
  std::string gpu_reason;    // why that model was chosen
  bool gpu_assumed = false;  // the topology has no GPU: planned for the model's default GPU
  int sm_count = 0;
  std::string inter_backend;  // "none" (one node), "ibverbs", "ofi" or "socket"
  int nics_per_node = 0;      // distinct NICs the node's GPUs use (assumed when gpu_assumed)
  int nic_sharers = 0;        // ibverbs: the most ranks of a node sending through one NIC at once; else 0
  double nic_share_gbps = 0;  // ibverbs: one NIC's bandwidth divided among those ranks (before PCIe)

  // The launch.
  RoleCounts roles;  // blocks per role; roles.total() == sm_count when tuned
  bool roles_explicit = false;
  int tile_m = 128, tile_n = 256, tile_k = 64;  // GEMM / attention tile (attention: q rows, kv rows, head_dim)
  int64_t intra_chunk_bytes = 0;                // NVLink transfer (and signal) granularity; 0: no NVLink traffic
  int64_t inter_chunk_bytes = 0;                // NIC transfer granularity (a batch of intra chunks); 0: no NIC traffic
  Execution exec;                               // how the op runs (variant, cluster, copies, ...)
  std::string chosen_by = "model";              // "model", "tuning cache" (weftrun tune measured it) or
                                                // "workload" (its `plan:` map set the execution)
  std::vector<HeapRegion> heap;                 // the op's symmetric-heap layout
  uint64_t heap_bytes = 0;                      // the op's share of the heap on every rank

  // The prediction, per rank (the busiest one).
  double flops = 0;
  std::array<double, kNumRoles> role_time_s{};  // busy time of each role with its SM count
  std::vector<LinkLoad> links;                  // nvlink, nic, pcie (always in this order)
  double tail_s = 0;                            // pipeline fill/drain that does not overlap (latency + last chunk)
  double makespan_s = 0;                        // max(role times) + tail
  std::string limited_by;                       // the role whose time sets the makespan
  double compute_alone_s = 0;                   // every SM computing, no communication
  double comm_alone_s = 0;                      // the busiest link alone at full bandwidth
  double bound_s = 0;                           // max(compute_alone, comm_alone): no schedule beats it
  std::vector<std::string> notes;

  double role_time(Role r) const { return role_time_s[static_cast<int>(r)]; }
  // The job and its groups; bootstrap::group_position(group_shape(), rank) is a rank's place in them.
  bootstrap::GroupShape group_shape() const;
  bool grouped() const { return job_nodes > 0 && (job_nodes != nodes || job_gpus_per_node != gpus_per_node); }
  const LinkLoad* link(const std::string& name) const;
  const HeapRegion* region(const std::string& name) const;
  // Who moves the NVLink bytes, from exec.variant (the one place it is decided): copy_engine and
  // sm_movers say it; a plan without such a variant (peer, or an op this build does not run) moves
  // them as default_mover(op) says, which is what the tuner planned it with.
  IntraMover intra_mover() const;
};

// A plan shared with a context must be for the context's rank group: `ctx_group` (null: the context
// runs on the whole job of `job_size` ranks). False, with both named in `why`, where they differ.
bool check_plan_group(const Plan& p, const bootstrap::GroupShape* ctx_group, int job_size, std::string* why);

// The part of a plan that decides what runs (problem, layout, launch, execution, heap), as canonical
// JSON; predictions and notes are left out. Two plans that execute the same way print the same.
std::string executed_json(const Plan& plan);
// Reads executed_json's form back (rank 0's plan on the other ranks, a plan given to `weftrun run
// --plan`): the fields that decide what runs; predictions stay empty. kInvalidArgument with *error
// naming the key for text that is not such a plan (at most 1 MiB).
Status parse_executed_json(const std::string& text, Plan* out, std::string* error);
// A plan file (`weftrun plan --json`'s form): at most 1 MiB and a block more is read, then
// parse_executed_json. *error starts with the path.
Status read_plan_file(const std::string& path, Plan* out, std::string* error);
// FNV-1a 64 of executed_json: every rank checks rank 0's before the first launch.
uint64_t plan_hash(const Plan& plan);

// Fills plan->exec and plan->heap for a tuned plan (shape, layout, roles set): the variant the op
// runs (AllGather+GEMM on one node: the copy engines or the SM movers, as `mover`, the tuner's) (the workload's `plan:`
// choices as written, the rest the op's defaults) and its heap layout, or exec.executable = false with the reason as
// "file:line:col: key: what" (a dtype or an op this build cannot run, a shape the kernels refuse, a `plan:` choice this
// build's op does not run).
void plan_execution(const Workload& w, IntraMover mover, Plan* plan);

// The part of a plan the launches themselves say (kernels/frame.cuh's record, read back after they
// completed): role counts per launch and CTAs per cluster. Sets *why and returns false when nothing
// was recorded or the blocks that started do not add up to the grid.
bool apply_launch_record(const kernels::LaunchRecord& rec, Plan* plan, std::string* why);
// GEMM+RS/AR's overlap variant on one node: the schedule its GEMM recorded (the pieces per rank,
// the own pieces' lag, and whether its epilogue sent the partials and gathered C itself, else the
// copy engines did) into plan->exec's pieces, lag, send and gather. False with *why when the record
// is not that GEMM's or does not fit the plan's ranks.
bool apply_reduce_schedule(const kernels::LaunchRecord& rec, Plan* plan, std::string* why);
// moe: the most K parts the expert FFN's last launch recorded for a projection, against the plan's
// split_k (1 to split_k, or 1 where split_k is 0). False with *why when outside: it did not run as
// planned.
bool check_moe_split(const kernels::LaunchRecord& rec, const Plan& plan, std::string* why);

// The plans `weftrun tune` measures for a problem: the model's plan first, then the variants and
// role splits the op can run (AllGather+GEMM on one node: the copy engines on every SM, on the
// fewest SMs that give the same waves and on the most whose last round is full; the SM movers with
// 8 and 16 intra_comm SMs; GEMM+RS/AR on one node: the peer variant and the overlap variant with
// copy or epilogue sends and, AllReduce, push or epilogue gathers), each executable, with its own
// heap layout, no two alike. share_gpus: copy-engine candidates leave 8 SMs for the copies between
// ranks of one GPU.
std::vector<Plan> candidate_plans(const Workload& w, const Plan& model, bool share_gpus);

// A human-readable table (role counts, time per role, bytes per link, makespan, bound).
std::string format_plan_table(const Plan& plan);
// The same as one JSON object (2-space indented), stable key names:
// {"workload","op","dtype","intra_mover","layout":{nodes,gpus_per_node,world_size} (one group's),
//  "groups":{"group":{nodes,gpus_per_node,size},"count","job":{nodes,gpus_per_node,world_size},
//            "ranks":[{group,rank}, one per job rank]},"machine":{gpu,reason,assumed,sm_count,
//  inter_backend,nics_per_node,nic_sharers,nic_share_gbps},"roles":{compute,intra_comm,inter_send,inter_reduce,explicit},
//  "tiles":{m,n,k},"chunks":{intra_bytes,inter_bytes},"predicted":{role_us:{...},makespan_us,tail_us,
//  limited_by,compute_alone_us,comm_alone_us,bound_us,flops},"links":[{link,bytes_out,bytes_in,gbps,us}],"notes":[...],
//  "execution":{variant,sm_mover,copy_chunks,cluster,group_m,capturable,reduce_blocks,
//               pieces,lag,send,gather (overlap
//               only),gemm:{split_tail,chunked_tail,dynamic_tiles,tma_store},executable,not_executable},"chosen_by",
//  "heap":{bytes,regions:[{name,offset,bytes}]},"hash":"16 hex digits"}
std::string format_plan_json(const Plan& plan);

}  // namespace weft::runtime
