// The analytic GPU/link model the tuner predicts with: throughputs of H100 and H200, overridable.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace weft::runtime {

// Throughputs are per GPU unless the name says per SM, per channel or per NIC. GB/s = 1e9 bytes/s,
// TFLOP/s = 1e12 FLOP/s. The H200 defaults are fitted to weft's own ops and GEMM core as measured on
// 4x H200 (tests/runtime/data/h200_measured.csv; docs/tuner.md has the fit), the rest come from
// datasheets and cuBLAS/NCCL/SDPA runs; every field can be overridden from a workload's `machine:`.
struct MachineModel {
  std::string gpu = "h200";  // "h100" or "h200"
  int sm_count = 132;
  // Compute. A tile of T FLOPs takes T / (tensor_tflops / sm_count) + tile_overhead_us on one SM.
  double tensor_tflops = 765;     // weft's GEMM main loop on all SMs under the 700 W cap; fp8 doubles it
  double tile_overhead_us = 3;    // per tile beyond its MMAs: last k-block drain, epilogue, stores
  double attention_tflops = 634;  // attention forward, all SMs (SDPA measured)
  double hbm_gbps = 4800;
  // NVLink.
  double nvlink_gbps = 395;         // one GPU's NVLink send bandwidth (one peer copy measured)
  double ce_pull_gbps = 380;        // copy engines reading the peers' memory into this GPU (a gather)
  double ce_push_gbps = 250;        // copy engines writing into the peers' memory beside a GEMM (RS/AR)
  double nvlink_sm_gbps = 35;       // what one SM mover (16-byte stores) moves over NVLink alone
  double nvlink_sm_max_gbps = 580;  // the SM movers' joint ceiling: n movers move 1/(1/(n*sm) + 1/max)
  double sm_mover_busy = 0.85;      // share of the SM movers' rate left while the GEMM runs beside them
  // Inter-node.
  double nic_gbps = 50;               // one NIC (ConnectX-7, 400 Gb/s)
  double pcie_gbps = 55;              // GPU <-> NIC through a PCIe Gen5 x16 switch
  double pcie_remote_gbps = 25;       // GPU <-> NIC across the CPU interconnect (NIC on the other socket)
  double socket_gbps = 13;            // one node's socket backend (page-locked staging + TCP), all channels
  double socket_channel_gbps = 2.45;  // one proxy channel (thread and TCP streams) of the socket backend
  int net_channels = 4;               // proxy channels a run uses (WEFT_NET_CHANNELS when make_plan picks it)
  double fifo_sm_gbps = 200;          // bytes one inter_send SM can describe to the proxy per second
  // Reduction and signals.
  double reduce_sm_gbps = 20;  // partial sums one SM folds per second (bytes of one operand)
  double tile_signal_us = 4;   // a per-tile count after the tile's stores (GEMM+RS/AR overlap path)
  double latency_us = 10;      // one signal round or copy (flag write, poll, proxy hop, launch)
};

MachineModel machine_model_h200();
MachineModel machine_model_h100();
// "h100" or "h200" (any case; "H100 SXM" etc. match too). kInvalidArgument otherwise.
Status machine_model_for(const std::string& gpu, MachineModel* out);

// Picks the model for a machine: `workload_gpu` if set, else a GPU name in the topology that says
// H100/H200, else WEFT_GPU_ARCH (h100/h200), else H200. *why says which rule chose it.
Status choose_machine_model(const std::string& workload_gpu, const std::vector<std::string>& topology_gpu_names,
                            MachineModel* out, std::string* why);

// "H100 SXM5 80GB" for a known Hopper PCI id ("10de:2330"), else "".
std::string gpu_name_from_pci_id(const std::string& pci_id);

// Names of the overridable numeric fields ("sm_count", "tensor_tflops", ...), as in YAML.
const std::vector<std::string>& machine_model_keys();
// Sets one field by name; kInvalidArgument for an unknown key or a value <= 0 (sm_count, net_channels: not a
// whole number) with *error saying which.
Status set_machine_model_value(MachineModel* m, const std::string& key, double value, std::string* error);

}  // namespace weft::runtime
