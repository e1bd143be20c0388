// Fuzz target: the topology loader (hwloc XML from memory, then weft's conversion and GPU->NIC mapping).
#include <cstdint>
#include <string>

#include "fuzz_common.h"
#include "topology/topology.h"

using namespace weft;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz_quiet_logs();
  setenv("HWLOC_XML_VERBOSE", "0", 1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string xml(reinterpret_cast<const char*>(data), size);
  topology::Topology t;
  if (topology::load_xml_buffer(xml, "fuzz.xml", &t) != Status::kOk) return 0;
  const topology::Mapping m = topology::map_gpus_to_nics(t);
  FUZZ_ASSERT(m.gpus.size() == t.gpus.size());
  for (const auto& link : m.gpus) {
    FUZZ_ASSERT(link.primary_nic >= -1 && link.primary_nic < static_cast<int>(t.nics.size()));
    for (int n : link.nearest_nics) FUZZ_ASSERT(n >= 0 && n < static_cast<int>(t.nics.size()));
  }
  FUZZ_ASSERT(m.socket_fallback == t.nics.empty());
  for (const auto& g : t.gpus) FUZZ_ASSERT(topology::find_gpu(t, g.pci_bus_id) >= 0 || g.pci_bus_id.empty());
  return 0;
}
