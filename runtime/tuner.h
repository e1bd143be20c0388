// The tuner: Workload x Topology x Mapping x MachineModel -> Plan, minimising the predicted makespan.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/machine_model.h"
#include "runtime/plan.h"
#include "runtime/status.h"
#include "runtime/workload.h"
#include "topology/topology.h"

namespace weft::runtime {

// What one rank must do, before SMs are assigned: the analytic model's inputs.
struct Demand {
  struct TileGroup {
    double tiles = 0;       // independent tiles
    double tile_flops = 0;  // FLOPs in one
  };
  std::vector<TileGroup> groups;  // compute work; each group runs in ceil(tiles / SMs) waves
  double flops = 0;
  double hbm_bytes = 0;  // compute's minimum HBM traffic
  double tflops = 0;     // all-SM throughput for this op's compute (GEMM or attention, dtype)
  double nvlink_out = 0, nvlink_in = 0;
  double nic_out = 0, nic_in = 0;
  double reduce_bytes = 0;  // partial sums arriving from other nodes, folded by inter_reduce
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
};

// The pure core: no environment, no files. `layout` is the one to plan for (a --nodes override
// already applied and validated). On error (explicit counts that cannot run, a topology with fewer
// GPUs than the layout) returns kInvalidArgument with *error as "file:line:col: key: what".
Status tune(const Workload& w, const Layout& layout, const topology::Topology& topo, const topology::Mapping& mapping,
            const MachineModel& model, Plan* out, std::string* error);
// The same for a given NVLink mover: with kCopyEngine the intra_comm role gets no SM (explicit
// counts may say 0), and the NVLink time is the link's at full bandwidth, next to all compute SMs.
Status tune(const Workload& w, const Layout& layout, const topology::Topology& topo, const topology::Mapping& mapping,
            const MachineModel& model, IntraMover mover, Plan* out, std::string* error);

// Exposed for tests and for the GPU benchmarks that compare measurement with prediction.
Demand compute_demand(const Workload& w, const Layout& layout, const MachineModel& model, const Plan& tiles);
Status link_rates(const Workload& w, const Layout& layout, const topology::Topology& topo,
                  const topology::Mapping& mapping, const MachineModel& model, LinkRates* out, std::string* error);
// Predicted busy time of each role and the makespan for given counts (counts with no SMs for work
// that exists give infinity).
void predict(const Demand& d, const LinkRates& r, const MachineModel& model, const RoleCounts& counts, Plan* plan);
// The counts (summing to model.sm_count) with the smallest predicted makespan; among equal ones the
// fewest communication SMs. A role gets SMs only if it has work.
RoleCounts best_roles(const Demand& d, const LinkRates& r, const MachineModel& model);

// The convenience the CLI uses: chooses the MachineModel (workload machine.gpu, topology GPU names,
// WEFT_GPU_ARCH, else H200), applies the workload's machine overrides, then tune().
// `gpu_names`, when given, replaces the topology's GPU names for choosing the model (a plan made
// without the topology's GPUs can still use what they are).
Status make_plan(const Workload& w, const Layout& layout, const topology::Topology& topo,
                 const topology::Mapping& mapping, Plan* out, std::string* error,
                 const std::vector<std::string>* gpu_names = nullptr);
// The same for a given NVLink mover (see tune()).
Status make_plan(const Workload& w, const Layout& layout, const topology::Topology& topo,
                 const topology::Mapping& mapping, IntraMover mover, Plan* out, std::string* error,
                 const std::vector<std::string>* gpu_names = nullptr);
// The names make_plan identifies GPUs by: the part name for known PCI ids, else the topology's name.
std::vector<std::string> gpu_model_names(const topology::Topology& topo);

}  // namespace weft::runtime
