// The analytic GPU/link model the tuner predicts with: throughputs of H100 and H200, overridable.
#pragma once

#include <string>
#include <vector>

#include "runtime/status.h"

namespace weft::runtime {

// Throughputs are per GPU unless the name says per SM or per NIC. GB/s = 1e9 bytes/s,
// TFLOP/s = 1e12 FLOP/s. The defaults come from measurements on 4x H200 (cuBLAS, peer copy, NCCL,
// SDPA) and datasheets; every field can be overridden from a workload's `machine:` section.
struct MachineModel {
  std::string gpu = "h200";  // "h100" or "h200"
  int sm_count = 132;
  double tensor_tflops = 861;     // dense 16-bit GEMM, all SMs (cuBLAS measured); fp8 doubles it
  double attention_tflops = 634;  // attention forward, all SMs (SDPA measured)
  double hbm_gbps = 4800;
  double nvlink_gbps = 395;      // one GPU's NVLink send bandwidth (peer copy measured)
  double nvlink_sm_gbps = 24;    // what one SM's loads/stores move over NVLink
  double nic_gbps = 50;          // one NIC (ConnectX-7, 400 Gb/s)
  double pcie_gbps = 55;         // GPU <-> NIC through a PCIe Gen5 x16 switch
  double pcie_remote_gbps = 25;  // GPU <-> NIC across the CPU interconnect (NIC on the other socket)
  double socket_gbps = 3;        // inter-node TCP (socket backend, no RDMA NIC)
  double fifo_sm_gbps = 200;     // bytes one inter_send SM can describe to the proxy per second
  double reduce_sm_gbps = 40;    // partial sums one SM folds per second (bytes of one operand)
  double latency_us = 8;         // one chunk's signal round (flag write, poll, proxy hop)
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
// Sets one field by name; kInvalidArgument for an unknown key or a value <= 0 (sm_count: not a
// whole number) with *error saying which.
Status set_machine_model_value(MachineModel* m, const std::string& key, double value, std::string* error);

}  // namespace weft::runtime
