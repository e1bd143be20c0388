// Printing a Plan: the table `weftrun plan` shows, and the JSON `weftrun plan --json` emits.
#include "runtime/plan.h"

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

namespace weft::runtime {
namespace {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  char buf[32];
  snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
  return buf;
}

std::string us(double s) {
  if (std::isinf(s)) return "never";
  char buf[32];
  snprintf(buf, sizeof(buf), "%.1f us", s * 1e6);
  return buf;
}

// JSON has no infinity; a role that can never finish is null.
nlohmann::json us_json(double s) {
  if (!std::isfinite(s)) return nullptr;
  return std::round(s * 1e7) / 10;  // 0.1 us resolution
}

}  // namespace

const char* to_string(IntraMover m) { return m == IntraMover::kCopyEngine ? "copy_engine" : "sm"; }

const LinkLoad* Plan::link(const std::string& name) const {
  for (const auto& l : links)
    if (l.link == name) return &l;
  return nullptr;
}

std::string format_plan_table(const Plan& p) {
  std::ostringstream os;
  char line[256];
  os << "plan for " << p.workload << " (" << to_string(p.op) << ", " << to_string(p.dtype) << ") from " << p.source
     << "\n";
  os << "  layout   " << p.nodes << " node" << (p.nodes == 1 ? "" : "s") << " x " << p.gpus_per_node << " GPU"
     << (p.gpus_per_node == 1 ? "" : "s") << " = " << p.world_size << " rank" << (p.world_size == 1 ? "" : "s")
     << "; inter-node: " << p.inter_backend;
  if (p.nodes > 1) os << " (" << p.nics_per_node << " NIC" << (p.nics_per_node == 1 ? "" : "s") << " per node)";
  os << "\n";
  os << "  machine  " << p.gpu << ", " << p.sm_count << " SMs (" << p.gpu_reason << ")\n";
  if (p.gpu_assumed) os << "  NOTE: no GPU in this topology; this plan assumes " << p.gpu << " GPUs\n";
  snprintf(line, sizeof(line), "  tiles    %d x %d x %d; chunks %s (NVLink), %s (NIC)\n", p.tile_m, p.tile_n, p.tile_k,
           p.intra_chunk_bytes ? human_bytes(double(p.intra_chunk_bytes)).c_str() : "-",
           p.inter_chunk_bytes ? human_bytes(double(p.inter_chunk_bytes)).c_str() : "-");
  os << line;
  if (p.intra_mover == IntraMover::kCopyEngine) os << "  NVLink   moved by the copy engines (no intra_comm SM)\n";
  os << "\n  role           SMs   predicted" << (p.roles_explicit ? "   (counts from the workload)" : "   (tuned)")
     << "\n";
  const int32_t counts[kNumRoles] = {p.roles.compute, p.roles.intra_comm, p.roles.inter_send, p.roles.inter_reduce};
  for (int r = 0; r < kNumRoles; ++r) {
    const bool idle = counts[r] == 0 && p.role_time_s[r] == 0;
    snprintf(line, sizeof(line), "  %-13s %4d   %12s\n", to_string(static_cast<Role>(r)), counts[r],
             idle ? "-" : us(p.role_time_s[r]).c_str());
    os << line;
  }
  snprintf(line, sizeof(line), "  %-13s %4d\n", "total", p.roles.total());
  os << line;
  os << "\n  link      sent/GPU     received/GPU   GB/s     alone\n";
  for (const auto& l : p.links) {
    snprintf(line, sizeof(line), "  %-8s %11s  %13s  %6.1f  %10s\n", l.link.c_str(), human_bytes(l.bytes_out).c_str(),
             human_bytes(l.bytes_in).c_str(), l.gbps, (l.bytes_out > 0 || l.bytes_in > 0) ? us(l.time_s).c_str() : "-");
    os << line;
  }
  const double tflops = p.makespan_s > 0 && std::isfinite(p.makespan_s) ? p.flops / p.makespan_s / 1e12 : 0;
  os << "\n  makespan " << us(p.makespan_s) << " (limited by " << p.limited_by << ", + " << us(p.tail_s)
     << " fill/drain), " << (tflops > 0 ? std::to_string(int(std::lround(tflops))) : std::string("-"))
     << " TFLOP/s per GPU\n";
  os << "  bound    " << us(p.bound_s) << " = max(compute alone " << us(p.compute_alone_s) << ", communication alone "
     << us(p.comm_alone_s) << ")\n";
  for (const auto& n : p.notes) os << "  NOTE: " << n << "\n";
  return os.str();
}

std::string format_plan_json(const Plan& p) {
  using nlohmann::json;
  json j;
  j["workload"] = p.workload;
  j["source"] = p.source;
  j["op"] = to_string(p.op);
  j["dtype"] = to_string(p.dtype);
  j["intra_mover"] = to_string(p.intra_mover);
  j["layout"] = {{"nodes", p.nodes}, {"gpus_per_node", p.gpus_per_node}, {"world_size", p.world_size}};
  j["machine"] = {{"gpu", p.gpu},           {"reason", p.gpu_reason},           {"assumed", p.gpu_assumed},
                  {"sm_count", p.sm_count}, {"inter_backend", p.inter_backend}, {"nics_per_node", p.nics_per_node}};
  j["roles"] = {{"compute", p.roles.compute},
                {"intra_comm", p.roles.intra_comm},
                {"inter_send", p.roles.inter_send},
                {"inter_reduce", p.roles.inter_reduce},
                {"explicit", p.roles_explicit}};
  j["tiles"] = {{"m", p.tile_m}, {"n", p.tile_n}, {"k", p.tile_k}};
  j["chunks"] = {{"intra_bytes", p.intra_chunk_bytes}, {"inter_bytes", p.inter_chunk_bytes}};
  json roles_us = json::object();
  for (int r = 0; r < kNumRoles; ++r) roles_us[to_string(static_cast<Role>(r))] = us_json(p.role_time_s[r]);
  j["predicted"] = {{"role_us", roles_us},
                    {"makespan_us", us_json(p.makespan_s)},
                    {"tail_us", us_json(p.tail_s)},
                    {"limited_by", p.limited_by},
                    {"compute_alone_us", us_json(p.compute_alone_s)},
                    {"comm_alone_us", us_json(p.comm_alone_s)},
                    {"bound_us", us_json(p.bound_s)},
                    {"flops", p.flops}};
  json links = json::array();
  for (const auto& l : p.links)
    links.push_back({{"link", l.link},
                     {"bytes_out", l.bytes_out},
                     {"bytes_in", l.bytes_in},
                     {"gbps", l.gbps},
                     {"us", us_json(l.time_s)}});
  j["links"] = links;
  j["notes"] = p.notes;
  return j.dump(2);
}

}  // namespace weft::runtime
