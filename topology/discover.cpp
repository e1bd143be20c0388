// Reads a machine into weft's Topology through hwloc 2.x: the live machine or an hwloc v1/v2 XML export.
#include <fcntl.h>
#include <hwloc.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "base/log.h"
#include "base/params.h"
#include "topology/topology.h"

namespace weft::topology {
namespace {

constexpr uint16_t kNvidiaVendor = 0x10de;
constexpr uint16_t kClassVga = 0x0300;
constexpr uint16_t kClass3d = 0x0302;

// Owns an hwloc topology handle for the duration of one load.
class HwlocHandle {
 public:
  HwlocHandle() = default;
  ~HwlocHandle() {
    if (topo_) hwloc_topology_destroy(topo_);
  }
  HwlocHandle(const HwlocHandle&) = delete;
  HwlocHandle& operator=(const HwlocHandle&) = delete;
  hwloc_topology_t* out() { return &topo_; }
  hwloc_topology_t get() const { return topo_; }

 private:
  hwloc_topology_t topo_ = nullptr;
};

std::string bitmap_list(hwloc_const_bitmap_t bitmap) {
  if (!bitmap) return "";
  char* text = nullptr;
  if (hwloc_bitmap_list_asprintf(&text, bitmap) < 0 || !text) return "";
  std::string out(text);
  free(text);
  return out;
}

std::string format_bus_id(const hwloc_obj_attr_u::hwloc_pcidev_attr_s& pci) {
  char buf[32];
  snprintf(buf, sizeof buf, "%04x:%02x:%02x.%x", static_cast<unsigned>(pci.domain), pci.bus, pci.dev, pci.func);
  return buf;
}

// A label for one ancestor that is unique among the objects at the same tree depth, so that two
// paths can be compared position by position.
std::string ancestor_label(hwloc_obj_t obj) {
  char buf[96];
  // The bridge type is read as the integer it is: an XML file may hold a value outside the enum
  // (hwloc does not check it), and loading that as the enum type is undefined behaviour.
  static_assert(sizeof(hwloc_obj_bridge_type_t) == sizeof(int), "read as an int");
  int upstream = -1;
  if (obj->type == HWLOC_OBJ_BRIDGE) memcpy(&upstream, &obj->attr->bridge.upstream_type, sizeof upstream);
  if (obj->type == HWLOC_OBJ_BRIDGE && upstream == static_cast<int>(HWLOC_OBJ_BRIDGE_HOST)) {
    const auto& down = obj->attr->bridge.downstream.pci;
    snprintf(buf, sizeof buf, "HostBridge %04x:[%02x-%02x]", static_cast<unsigned>(down.domain), down.secondary_bus,
             down.subordinate_bus);
    return buf;
  }
  if (obj->type == HWLOC_OBJ_BRIDGE) return "PCIBridge " + format_bus_id(obj->attr->bridge.upstream.pci);
  if (obj->type == HWLOC_OBJ_PCI_DEVICE) return "PCIDev " + format_bus_id(obj->attr->pcidev);
  char type[64];
  hwloc_obj_type_snprintf(type, sizeof type, obj, 0);
  snprintf(buf, sizeof buf, "%s#%u", type, obj->logical_index);
  return buf;
}

std::vector<std::string> ancestors_of(hwloc_obj_t obj) {
  std::vector<std::string> path;
  for (hwloc_obj_t p = obj->parent; p; p = p->parent) path.push_back(ancestor_label(p));
  std::reverse(path.begin(), path.end());
  return path;
}

// The NUMA node (OS index) an I/O object is attached to; -1 when its locality spans several nodes.
int numa_of(hwloc_topology_t topo, hwloc_obj_t io, std::string* cpuset) {
  hwloc_obj_t local = hwloc_get_non_io_ancestor_obj(topo, io);
  if (!local) return -1;
  *cpuset = bitmap_list(local->cpuset);
  if (!local->nodeset || hwloc_bitmap_weight(local->nodeset) != 1) return -1;
  return hwloc_bitmap_first(local->nodeset);
}

hwloc_obj_t pci_parent(hwloc_obj_t osdev) {
  for (hwloc_obj_t p = osdev->parent; p; p = p->parent) {
    if (p->type == HWLOC_OBJ_PCI_DEVICE) return p;
    if (p->type != HWLOC_OBJ_OS_DEVICE) return nullptr;
  }
  return nullptr;
}

bool starts_with(const char* s, const char* prefix) { return s && strncmp(s, prefix, strlen(prefix)) == 0; }

// CUDA ("cuda0") and NVML ("nvml0") OS devices name NVIDIA GPUs; DRM devices ("card0", "renderD128")
// name any display adapter, so they are not used.
bool is_nvidia_osdev(hwloc_obj_t osdev) {
  return starts_with(osdev->name, "cuda") || starts_with(osdev->name, "nvml") ||
         (osdev->subtype && (!strcmp(osdev->subtype, "CUDA") || !strcmp(osdev->subtype, "NVML")));
}

bool is_nvidia_gpu_function(hwloc_obj_t pci) {
  const auto& a = pci->attr->pcidev;
  return a.vendor_id == kNvidiaVendor && (a.class_id == kClassVga || a.class_id == kClass3d);
}

std::string pci_model(hwloc_obj_t pci) {
  const char* device = hwloc_obj_get_info_by_name(pci, "PCIDevice");
  if (device && *device) return device;
  char buf[16];
  snprintf(buf, sizeof buf, "%04x:%04x", pci->attr->pcidev.vendor_id, pci->attr->pcidev.device_id);
  return buf;
}

void collect_gpus(hwloc_topology_t topo, Topology* out) {
  // PCI function -> OS device name; one GPU may carry both a CUDA and an NVML device: count it once.
  std::map<hwloc_obj_t, std::string> os_names;
  for (hwloc_obj_t os = hwloc_get_next_osdev(topo, nullptr); os; os = hwloc_get_next_osdev(topo, os)) {
    if (!is_nvidia_osdev(os)) continue;
    hwloc_obj_t pci = pci_parent(os);
    if (!pci) {
      WEFT_INFO(kTopo, "GPU OS device %s has no PCI parent in the topology; it cannot be matched by bus id, skipped",
                os->name ? os->name : "?");
      continue;
    }
    std::string& name = os_names[pci];
    if (name.empty() || (starts_with(os->name, "cuda") && !starts_with(name.c_str(), "cuda"))) name = os->name;
  }
  for (hwloc_obj_t pci = hwloc_get_next_pcidev(topo, nullptr); pci; pci = hwloc_get_next_pcidev(topo, pci)) {
    auto named = os_names.find(pci);
    if (named == os_names.end() && !is_nvidia_gpu_function(pci)) continue;
    Gpu gpu;
    gpu.pci_bus_id = format_bus_id(pci->attr->pcidev);
    gpu.name = named != os_names.end() ? named->second : pci_model(pci);
    char id[16];
    snprintf(id, sizeof id, "%04x:%04x", pci->attr->pcidev.vendor_id, pci->attr->pcidev.device_id);
    gpu.pci_id = id;
    gpu.numa_node = numa_of(topo, pci, &gpu.cpuset);
    gpu.ancestors = ancestors_of(pci);
    out->gpus.push_back(std::move(gpu));
  }
  std::sort(out->gpus.begin(), out->gpus.end(), [](const Gpu& a, const Gpu& b) { return a.pci_bus_id < b.pci_bus_id; });
  for (size_t i = 0; i < out->gpus.size(); ++i) out->gpus[i].index = static_cast<int>(i);
}

void collect_nics(hwloc_topology_t topo, Topology* out) {
  for (hwloc_obj_t os = hwloc_get_next_osdev(topo, nullptr); os; os = hwloc_get_next_osdev(topo, os)) {
    if (os->attr->osdev.type != HWLOC_OBJ_OSDEV_OPENFABRICS) continue;
    Nic nic;
    nic.name = os->name ? os->name : "";
    // hwloc exports each port's state as "Port<N>State" (ibv_port_state); ports are numbered from 1.
    for (int port = 1; port <= 16; ++port) {
      char key[32];
      snprintf(key, sizeof key, "Port%dState", port);
      const char* v = hwloc_obj_get_info_by_name(os, key);
      if (!v) continue;
      char* end = nullptr;
      long st = strtol(v, &end, 10);
      nic.ports.push_back({port, end != v && st >= 0 && st <= 5 ? static_cast<int>(st) : 0});
    }
    hwloc_obj_t pci = pci_parent(os);
    if (pci) nic.pci_bus_id = format_bus_id(pci->attr->pcidev);
    nic.numa_node = numa_of(topo, pci ? pci : os, &nic.cpuset);
    nic.ancestors = ancestors_of(pci ? pci : os);
    out->nics.push_back(std::move(nic));
  }
  std::sort(out->nics.begin(), out->nics.end(), [](const Nic& a, const Nic& b) {
    return a.pci_bus_id != b.pci_bus_id ? a.pci_bus_id < b.pci_bus_id : a.name < b.name;
  });
  for (size_t i = 0; i < out->nics.size(); ++i) out->nics[i].index = static_cast<int>(i);
}

void collect_numa(hwloc_topology_t topo, Topology* out) {
  hwloc_obj_t node = nullptr;
  while ((node = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, node))) {
    NumaNode n;
    n.os_index = static_cast<int>(node->os_index);
    n.cpuset = bitmap_list(node->cpuset);
    n.memory_bytes = node->attr ? node->attr->numanode.local_memory : 0;
    out->numa_nodes.push_back(std::move(n));
  }
  std::sort(out->numa_nodes.begin(), out->numa_nodes.end(),
            [](const NumaNode& a, const NumaNode& b) { return a.os_index < b.os_index; });
}

// Fills `out` from a loaded hwloc topology.
void convert(hwloc_topology_t topo, const std::string& source, Topology* out) {
  *out = Topology{};
  out->source = source;
  hwloc_obj_t root = hwloc_get_root_obj(topo);
  const char* host = hwloc_obj_get_info_by_name(root, "HostName");
  if (host) {
    out->hostname = host;
  } else if (source == "live") {
    char buf[256] = "";
    if (gethostname(buf, sizeof buf - 1) == 0) out->hostname = buf;
  }
  out->cores = std::max(0, hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE));
  out->pus = std::max(0, hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU));
  collect_gpus(topo, out);
  collect_nics(topo, out);
  collect_numa(topo, out);
  WEFT_INFO(kTopo, "topology from %s: %zu GPUs, %zu NICs, %zu NUMA nodes, %d cores, %d PUs", source.c_str(),
            out->gpus.size(), out->nics.size(), out->numa_nodes.size(), out->cores, out->pus);
}

// Creates a topology handle that keeps every I/O object (hwloc drops them by default).
Status init_handle(HwlocHandle* h, const char* what) {
  if (hwloc_topology_init(h->out()) != 0) {
    WEFT_WARN(kTopo, "hwloc_topology_init failed for %s: %s", what, strerror(errno));
    return Status::kSystemError;
  }
  hwloc_topology_set_io_types_filter(h->get(), HWLOC_TYPE_FILTER_KEEP_ALL);
  return Status::kOk;
}

}  // namespace

Status load_xml_buffer(const std::string& xml, const std::string& source, Topology* out) {
  if (xml.empty() || xml.size() > kMaxTopologyXmlBytes) {
    WEFT_WARN(kTopo, "hwloc XML topology '%s': %zu bytes; expected 1 to %zu", source.c_str(), xml.size(),
              kMaxTopologyXmlBytes);
    return Status::kInvalidArgument;
  }
  // hwloc's own XML parser reads the buffer as a C string: hand it one, ending \0 included.
  std::string text = xml;
  text.push_back('\0');
  auto parse = [&](HwlocHandle* h) {
    return hwloc_topology_set_xmlbuffer(h->get(), text.data(), static_cast<int>(text.size())) == 0 &&
           hwloc_topology_load(h->get()) == 0;
  };
  // hwloc 2.9 crashes on some malformed XML (a NULL bitmap in hwloc_insert_object_by_parent, found
  // by fuzz_topology): parse in a child first, so that such a file is refused instead of killing
  // this process. Costs one fork per file load (a millisecond).
  fflush(nullptr);
  const pid_t child = fork();
  if (child == 0) {
    // A crash here only has to end the probe: no core file, no crash handlers (a sanitizer's or a
    // fuzzer's would report hwloc's bug as this process's).
    const rlimit no_core{0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) signal(sig, SIG_DFL);
    HwlocHandle probe;
    _exit(init_handle(&probe, source.c_str()) == Status::kOk && parse(&probe) ? 0 : 1);
  }
  int wstatus = 0;
  if (child > 0) {
    while (waitpid(child, &wstatus, 0) < 0 && errno == EINTR) {
    }
    if (WIFSIGNALED(wstatus)) {
      WEFT_WARN(kTopo, "'%s' crashed hwloc's XML reader (signal %d in a probe process); not a usable topology",
                source.c_str(), WTERMSIG(wstatus));
      return Status::kInvalidArgument;
    }
  }
  HwlocHandle h;
  WEFT_CHECK(init_handle(&h, source.c_str()));
  if (!parse(&h)) {
    WEFT_WARN(kTopo,
              "'%s' is not an hwloc XML topology (hwloc reads the XML of hwloc 1.x and 2.x, "
              "written by 'lstopo --of xml FILE')",
              source.c_str());
    return Status::kInvalidArgument;
  }
  convert(h.get(), source, out);
  return Status::kOk;
}

Status load_xml(const std::string& path, Topology* out) {
  // O_NONBLOCK: a FIFO given as the topology must not block the open; its type refuses it next.
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) {
    int err = errno;
    WEFT_WARN(kTopo, "cannot read hwloc XML topology '%s': %s", path.c_str(), strerror(err));
    return err == ENOENT ? Status::kNotFound : Status::kSystemError;
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    WEFT_WARN(kTopo, "hwloc XML topology '%s' is %s; expected a regular file (lstopo --of xml FILE)", path.c_str(),
              S_ISDIR(st.st_mode) ? "a directory" : "not a regular file");
    close(fd);
    return Status::kInvalidArgument;
  }
  if (st.st_size == 0 || static_cast<uint64_t>(st.st_size) > kMaxTopologyXmlBytes) {
    WEFT_WARN(kTopo, "hwloc XML topology '%s' is %lld bytes; expected 1 to %zu", path.c_str(),
              static_cast<long long>(st.st_size), kMaxTopologyXmlBytes);
    close(fd);
    return Status::kInvalidArgument;
  }
  // At most one byte past the cap, whatever the size said (the file may be growing).
  std::string xml(kMaxTopologyXmlBytes + 1, '\0');
  size_t got = 0;
  int err = 0;
  while (got < xml.size()) {
    ssize_t n = read(fd, &xml[got], xml.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : 0;
      break;
    }
    got += static_cast<size_t>(n);
  }
  close(fd);
  if (err) {
    WEFT_WARN(kTopo, "cannot read hwloc XML topology '%s': %s", path.c_str(), strerror(err));
    return Status::kSystemError;
  }
  xml.resize(got);
  return load_xml_buffer(xml, path, out);
}

Status discover_live(Topology* out) {
  HwlocHandle h;
  WEFT_CHECK(init_handle(&h, "the live machine"));
  // hwloc's CUDA and OpenCL plugins (where installed) create a CUDA context in this process, which
  // must not happen in a launcher that forks ranks afterwards; NVIDIA GPUs are found by PCI class.
  for (const char* plugin : {"cuda", "opencl"})
    hwloc_topology_set_components(h.get(), HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, plugin);
  if (hwloc_topology_load(h.get()) != 0) {
    WEFT_WARN(kTopo, "hwloc could not discover this machine's topology: %s", strerror(errno));
    return Status::kSystemError;
  }
  convert(h.get(), "live", out);
  return Status::kOk;
}

Status load(const std::string& path, Topology* out) {
  if (!path.empty()) return load_xml(path, out);
  std::string from_env;
  WEFT_CHECK(get_param("WEFT_TOPO_FILE", &from_env));
  if (!from_env.empty()) {
    WEFT_INFO(kTopo, "topology from WEFT_TOPO_FILE=%s", from_env.c_str());
    return load_xml(from_env, out);
  }
  return discover_live(out);
}

}  // namespace weft::topology
