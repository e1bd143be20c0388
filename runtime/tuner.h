// The tuner: Workload x Topology x Mapping x MachineModel -> Plan, minimising the predicted makespan.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "runtime/machine_model.h"
#include "runtime/plan.h"
#include "runtime/workload.h"
#include "topology/topology.h"

namespace weft::runtime {

// What one rank must do, before SMs are assigned: the analytic model's inputs.
struct Demand {
  struct TileGroup {
    double tiles = 0;       // independent tiles
    double tile_flops = 0;  // FLOPs in one
    double k_blocks = 0;    // 64-deep k-blocks in one (the split tail's cost model); 0: unknown
  };
  std::vector<TileGroup> groups;  // compute work; each group runs in ceil(tiles / SMs) waves (see split_tail)
  bool split_tail = false;        // the GEMM core cuts a ragged last wave along K (plan_split): fewer waves
  double flops = 0;
  double hbm_bytes = 0;  // compute's minimum HBM traffic
  double tflops = 0;     // all-SM throughput for this op's compute (GEMM or attention, dtype)
  double nvlink_out = 0, nvlink_in = 0;
  double nic_out = 0, nic_in = 0;
  double reduce_bytes = 0;       // partial sums arriving from other nodes, folded by inter_reduce
  bool epilogue_reduce = false;  // ... or, with no inter_reduce SM, by the compute SMs' epilogue
  double fold_bytes = 0;         // partials the compute SMs add in their epilogue (node-mates' partials)
  bool tile_counts = false;      // every tile is counted after its stores (GEMM+RS/AR overlap path)
  bool intra_push = false;       // copy engines write into the peers (RS/AR) instead of reading them (AG)
  double intra_copies = 0;       // copy-engine copies in a row on one stream (each costs a latency)
  bool sequential = false;       // the NVLink exchange runs after the GEMM (GEMM+RS/AR small-shape path)
  int rounds = 0;                // flag rounds of that exchange
  double last_fraction = 0;      // share of the compute that can start only after the last transfer unit
  double last_unit_bytes = 0;    // that unit (a shard or a piece) as the copy engines move it
  int64_t intra_chunk = 0, inter_chunk = 0;
  IntraMover intra_mover = IntraMover::kSm;  // kCopyEngine: NVLink bytes need no intra_comm SM
};

// Bandwidths one GPU gets, from the topology and mapping (or assumed, without GPUs).
struct LinkRates {
  double nvlink_gbps = 0;
  double nic_gbps = 0;  // NIC path per GPU: min(NIC share, PCIe path); socket when no NIC
  double pcie_gbps = 0;
  std::string inter_backend;
  int nics_per_node = 0;
  // NIC sharing (RDMA NICs only; 0 otherwise): the most ranks of the node on one NIC, all sending at
  // once, and what each of them gets of it (model.nic_gbps / nic_sharers, before the PCIe path).
  int nic_sharers = 0;
  double nic_share_gbps = 0;
};

// The pure core: no environment, no files. Fills every field of the Plan, plan->exec and plan->heap
// included (plan_execution), with the op's own mover (plan_mover). `layout` is the one to plan for (a --nodes override
// already applied and validated). On error (explicit counts that cannot run, a topology with fewer
// GPUs than the layout) returns kInvalidArgument with *error as "file:line:col: key: what".
Status tune(const Workload& w, const Layout& layout, const topology::Topology& topo, const topology::Mapping& mapping,
            const MachineModel& model, Plan* out, std::string* error);
// The same for a given NVLink mover: with kCopyEngine the intra_comm role gets no SM (explicit
// counts may say 0), and the NVLink time is the copy engines' (model.ce_pull_gbps / ce_push_gbps).
// The overload above plans with the op's own mover: copy engines for gemm_rs / gemm_ar (their only
// one), SM movers otherwise.
Status tune(const Workload& w, const Layout& layout, const topology::Topology& topo, const topology::Mapping& mapping,
            const MachineModel& model, IntraMover mover, Plan* out, std::string* error);

// Exposed for tests and for the GPU benchmarks that compare measurement with prediction.
Demand compute_demand(const Workload& w, const Layout& layout, const MachineModel& model, const Plan& tiles);
Status link_rates(const Workload& w, const Layout& layout, const topology::Topology& topo,
                  const topology::Mapping& mapping, const MachineModel& model, LinkRates* out, std::string* error);
// The mover the plan (and so `weftrun run`) uses for this workload: the copy engines for
// AllGather+GEMM on one node unless the workload's roles give intra_comm SMs, else default_mover.
IntraMover plan_mover(const Workload& w, const Layout& layout);
// Predicted busy time of each role and the makespan for given counts (counts with no SMs for work
// that exists give infinity; inter_reduce 0 with d.epilogue_reduce folds in the compute epilogue).
// docs/tuner.md describes the model and its fit to the H200 measurements.
void predict(const Demand& d, const LinkRates& r, const MachineModel& model, const RoleCounts& counts, Plan* plan);
// The counts (summing to model.sm_count) with the smallest predicted makespan; among equal ones the
// fewest communication SMs. A role gets SMs only if it has work.
RoleCounts best_roles(const Demand& d, const LinkRates& r, const MachineModel& model);

// The convenience the CLI uses: chooses the MachineModel (workload machine.gpu, topology GPU names,
// WEFT_GPU_ARCH, else H200), takes net_channels from WEFT_NET_CHANNELS, applies the workload's
// machine overrides, then tune().
// `gpu_names`, when given, replaces the topology's GPU names for choosing the model (a plan made
// without the topology's GPUs can still use what they are).
Status make_plan(const Workload& w, const Layout& layout, const topology::Topology& topo,
                 const topology::Mapping& mapping, Plan* out, std::string* error,
                 const std::vector<std::string>* gpu_names = nullptr);
// The same for a given NVLink mover (see tune()).
Status make_plan(const Workload& w, const Layout& layout, const topology::Topology& topo,
                 const topology::Mapping& mapping, IntraMover mover, Plan* out, std::string* error,
                 const std::vector<std::string>* gpu_names = nullptr);
// What decide_plan() plans for besides the workload.
struct TuneMachine;
struct DecideOptions {
  std::string topology;     // hwloc XML; "": WEFT_TOPO_FILE, else this machine
  int nodes = 0;            // 0: the workload's layout.nodes
  bool share_gpus = false;  // ranks of a node share GPUs: leave SMs for the copies between them
  // The symmetric heap the op must fit in, bytes per rank (a weft::Context's free heap); 0: the plan
  // sizes the heap (weftrun run).
  uint64_t heap_budget = 0;
  // This machine, to look the problem up in the tuning cache (tune_cache.h); nullptr: the model's plan.
  const TuneMachine* machine = nullptr;
  std::string tune_cache;  // "": tune_cache_path()
};
// The Plan `weftrun plan` prints and `weftrun run` executes: make_plan on this machine's topology
// (or the given one; without the live one, or where the live machine has fewer GPUs than the layout,
// for the layout with a note), then the tuning cache's plan for it where options.machine matches an
// entry (plan->chosen_by says which, a note says why). On error *error says why; *bad_input tells a wrong workload or
// flag from an unreadable topology.
Status decide_plan(const Workload& w, const DecideOptions& options, Plan* plan, std::string* error, bool* bad_input);
// The names make_plan identifies GPUs by: the part name for known PCI ids, else the topology's name.
std::vector<std::string> gpu_model_names(const topology::Topology& topo);

}  // namespace weft::runtime
