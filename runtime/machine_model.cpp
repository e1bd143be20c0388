// H100 / H200 constants for the tuner's analytic model, and how a run picks and overrides them.
#include "runtime/machine_model.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "base/log.h"
#include "base/params.h"

namespace weft::runtime {
namespace {

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The one list that ties YAML key names to fields.
struct Field {
  const char* key;
  double MachineModel::*dbl;
  int MachineModel::*integer;
};
const Field kFields[] = {
    {"sm_count", nullptr, &MachineModel::sm_count},
    {"tensor_tflops", &MachineModel::tensor_tflops, nullptr},
    {"tile_overhead_us", &MachineModel::tile_overhead_us, nullptr},
    {"attention_tflops", &MachineModel::attention_tflops, nullptr},
    {"hbm_gbps", &MachineModel::hbm_gbps, nullptr},
    {"nvlink_gbps", &MachineModel::nvlink_gbps, nullptr},
    {"ce_pull_gbps", &MachineModel::ce_pull_gbps, nullptr},
    {"ce_push_gbps", &MachineModel::ce_push_gbps, nullptr},
    {"nvlink_sm_gbps", &MachineModel::nvlink_sm_gbps, nullptr},
    {"nvlink_sm_max_gbps", &MachineModel::nvlink_sm_max_gbps, nullptr},
    {"sm_mover_busy", &MachineModel::sm_mover_busy, nullptr},
    {"nic_gbps", &MachineModel::nic_gbps, nullptr},
    {"pcie_gbps", &MachineModel::pcie_gbps, nullptr},
    {"pcie_remote_gbps", &MachineModel::pcie_remote_gbps, nullptr},
    {"socket_gbps", &MachineModel::socket_gbps, nullptr},
    {"socket_channel_gbps", &MachineModel::socket_channel_gbps, nullptr},
    {"net_channels", nullptr, &MachineModel::net_channels},
    {"fifo_sm_gbps", &MachineModel::fifo_sm_gbps, nullptr},
    {"reduce_sm_gbps", &MachineModel::reduce_sm_gbps, nullptr},
    {"tile_signal_us", &MachineModel::tile_signal_us, nullptr},
    {"latency_us", &MachineModel::latency_us, nullptr},
};

}  // namespace

MachineModel machine_model_h200() { return MachineModel{}; }

MachineModel machine_model_h100() {
  MachineModel m;
  m.gpu = "h100";
  m.sm_count = 132;  // H100 SXM
  // The H200 rate fitted to weft's GEMM (765) scaled by the cuBLAS ratio of the two parts (800 on
  // H100 SXM against 861 on H200): the same 700 W cap and core, slower HBM3. Not measured on H100.
  m.tensor_tflops = 765.0 * 800 / 861;
  m.attention_tflops = 590;  // the same attention/GEMM ratio as measured on H200
  m.hbm_gbps = 3350;         // HBM3
  // NVLink4, the copy engines, ConnectX-7 and the host stack are the same parts as on H200
  // systems: the fitted link, mover, socket and signal constants are kept as they are.
  return m;
}

Status machine_model_for(const std::string& gpu, MachineModel* out) {
  std::string g = lower(gpu);
  if (g.find("h200") != std::string::npos) {
    *out = machine_model_h200();
    return Status::kOk;
  }
  if (g.find("h100") != std::string::npos) {
    *out = machine_model_h100();
    return Status::kOk;
  }
  return Status::kInvalidArgument;
}

Status choose_machine_model(const std::string& workload_gpu, const std::vector<std::string>& topology_gpu_names,
                            MachineModel* out, std::string* why) {
  if (!workload_gpu.empty()) {
    if (machine_model_for(workload_gpu, out) != Status::kOk) {
      WEFT_WARN(kTune, "machine.gpu '%s' is not h100 or h200", workload_gpu.c_str());
      return Status::kInvalidArgument;
    }
    *why = "machine.gpu in the workload";
    return Status::kOk;
  }
  for (const auto& name : topology_gpu_names) {
    if (machine_model_for(name, out) == Status::kOk) {
      *why = "GPU '" + name + "' in the topology";
      return Status::kOk;
    }
  }
  std::string arch;
  WEFT_CHECK(get_param("WEFT_GPU_ARCH", &arch));
  std::string a = lower(arch);
  if (a != "auto" && !a.empty()) {
    if (machine_model_for(a, out) != Status::kOk) {
      WEFT_WARN(kTune, "WEFT_GPU_ARCH='%s' is not auto, h100 or h200", arch.c_str());
      return Status::kInvalidArgument;
    }
    *why = "WEFT_GPU_ARCH=" + arch;
    return Status::kOk;
  }
  *out = machine_model_h200();
  *why = topology_gpu_names.empty()
             ? "no GPU in the topology: default H200 (set WEFT_GPU_ARCH=h100 to change)"
             : "topology GPU '" + topology_gpu_names[0] + "' is not an H100 or H200: H200 constants assumed";
  return Status::kOk;
}

std::string gpu_name_from_pci_id(const std::string& pci_id) {
  // PCI device ids of the Hopper parts weft models (pci.ids); others are left to the name.
  static const struct {
    const char* id;
    const char* name;
  } kIds[] = {{"10de:2330", "H100 SXM5 80GB"}, {"10de:2321", "H100 NVL"}, {"10de:2335", "H200 SXM 141GB"}};
  const std::string id = lower(pci_id);
  for (const auto& k : kIds)
    if (id == k.id) return k.name;
  return "";
}

const std::vector<std::string>& machine_model_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k;
    for (const auto& f : kFields) k.push_back(f.key);
    return k;
  }();
  return keys;
}

Status set_machine_model_value(MachineModel* m, const std::string& key, double value, std::string* error) {
  for (const auto& f : kFields) {
    if (key != f.key) continue;
    if (!(value > 0) || !std::isfinite(value)) {
      *error = "expected a number > 0";
      return Status::kInvalidArgument;
    }
    if (f.integer) {
      if (value != std::floor(value) || value > 1024) {
        *error = std::string("expected a whole number of ") +
                 (f.integer == &MachineModel::sm_count ? "SMs" : "channels") + " between 1 and 1024";
        return Status::kInvalidArgument;
      }
      m->*f.integer = static_cast<int>(value);
    } else {
      m->*f.dbl = value;
    }
    return Status::kOk;
  }
  *error = "unknown machine model key";
  return Status::kInvalidArgument;
}

}  // namespace weft::runtime
