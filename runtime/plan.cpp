// Printing a Plan: the table `weftrun plan` shows, and the JSON `weftrun plan --json` emits.
#include "runtime/plan.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>

#include "transport/peer_set.h"

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

bootstrap::GroupShape Plan::group_shape() const {
  bootstrap::GroupShape g;
  g.group_nodes = nodes;
  g.group_gpus = gpus_per_node;
  g.nodes = job_nodes > 0 ? job_nodes : nodes;
  g.gpus_per_node = job_gpus_per_node > 0 ? job_gpus_per_node : gpus_per_node;
  return g;
}

namespace {
std::string group_text(int nodes, int gpus) {
  return nodes > 0 ? std::to_string(nodes) + " x " + std::to_string(gpus) : "none (the whole job)";
}
}  // namespace

bool check_plan_group(const Plan& p, const bootstrap::GroupShape* ctx_group, int job_size, std::string* why) {
  // A context whose one group is the whole job runs the whole job's plans.
  if (ctx_group && ctx_group->group_nodes == ctx_group->nodes && ctx_group->group_gpus == ctx_group->gpus_per_node)
    ctx_group = nullptr;
  const bootstrap::GroupShape ps = p.group_shape();
  const bool same = ctx_group ? p.grouped() && ps.group_nodes == ctx_group->group_nodes &&
                                    ps.group_gpus == ctx_group->group_gpus && ps.world_size() == job_size
                              : !p.grouped();
  if (same) return true;
  *why = "the plan's rank group is " + group_text(p.grouped() ? ps.group_nodes : 0, ps.group_gpus) +
         ", this context's is " +
         (ctx_group ? group_text(ctx_group->group_nodes, ctx_group->group_gpus) : group_text(0, 0)) +
         " (Context::Options::group_nodes / group_gpus must match the workload's group:)";
  return false;
}

const HeapRegion* Plan::region(const std::string& name) const {
  for (const auto& r : heap)
    if (r.name == name) return &r;
  return nullptr;
}

namespace {

nlohmann::json shape_json(const Plan& p) {
  switch (p.op) {
    case Op::kAgGemm:
    case Op::kGemmRs:
    case Op::kGemmAr:
      return {{"m", p.gemm.m}, {"n", p.gemm.n}, {"k", p.gemm.k}};
    case Op::kMoe:
      return {{"tokens", p.moe.tokens},
              {"hidden", p.moe.hidden},
              {"ffn", p.moe.ffn},
              {"experts", p.moe.experts},
              {"topk", p.moe.topk}};
    case Op::kRingAttention:
      return {{"seq", p.attention.seq},
              {"heads", p.attention.heads},
              {"head_dim", p.attention.head_dim},
              {"causal", p.attention.causal}};
  }
  return nlohmann::json::object();
}

// The plan's notes and what its execution adds, from the execution itself: a plan whose execution
// came from the tuning cache or a candidate list says what it runs, not what the model chose.
std::vector<std::string> all_notes(const Plan& p) {
  std::vector<std::string> notes = p.notes;
  if (p.exec.variant == "peer")
    notes.push_back(
        "runs the peer variant (the GEMM, then the reduction); the predictions are the overlap path's, "
        "which the model plans where it can run (every rank's rows whole tiles, a GPU per rank, the heap "
        "for its slots); weftrun tune measures both");
  if (p.exec.variant == "overlap" && p.roles.intra_comm > 0)
    notes.push_back(std::to_string(p.roles.intra_comm) +
                    " intra_comm SMs push each round's last owner's pieces beside the GEMM (its compute blocks: " +
                    std::to_string(p.roles.compute) + "; the predictions are for the GEMM on every SM)");
  if (p.exec.variant == "hierarchical" && (p.op == Op::kGemmRs || p.op == Op::kGemmAr))
    notes.push_back(
        "runs every other SM computing and one inter_send (the copy engines move the NVLink bytes, the GEMM's "
        "epilogue sums what arrives); the predictions are for the model's split of the SMs");
  return notes;
}

nlohmann::json execution_json(const Execution& e) {
  nlohmann::json j = {{"variant", e.variant},
                      {"sm_mover", e.sm_mover},
                      {"copy_chunks", e.copy_chunks},
                      {"cluster", e.cluster},
                      {"group_m", e.group_m},
                      {"capturable", e.capturable},
                      {"reduce_blocks", e.reduce_blocks},
                      {"gemm",
                       {{"split_tail", e.gemm.split_tail},
                        {"chunked_tail", e.gemm.chunked_tail},
                        {"dynamic_tiles", e.gemm.dynamic_tiles},
                        {"tma_store", e.gemm.tma_store}}},
                      {"executable", e.executable},
                      {"not_executable", e.not_executable}};
  if (e.split_k > 0) j["split_k"] = e.split_k;  // moe only: the other ops' plans (and hashes) stay as they were
  if (e.variant == "overlap") {                 // only there: the other variants' plans (and hashes) stay as they were
    j["pieces"] = e.pieces;
    j["lag"] = e.lag;
    j["send"] = e.send;
    j["gather"] = e.gather;
  }
  if (e.variant == "hierarchical") {  // likewise
    j["channels"] = e.channels;
    j["signal_mode"] = e.signal_mode;
    if (e.pieces > 0) j["pieces"] = e.pieces;  // gemm_rs / gemm_ar across nodes
  }
  return j;
}

nlohmann::json heap_json(const Plan& p) {
  nlohmann::json regions = nlohmann::json::array();
  for (const auto& r : p.heap) regions.push_back({{"name", r.name}, {"offset", r.offset}, {"bytes", r.bytes}});
  return {{"bytes", p.heap_bytes}, {"regions", regions}};
}

nlohmann::json roles_json(const Plan& p) {
  return {{"compute", p.roles.compute},
          {"intra_comm", p.roles.intra_comm},
          {"inter_send", p.roles.inter_send},
          {"inter_reduce", p.roles.inter_reduce},
          {"explicit", p.roles_explicit}};
}

nlohmann::json groups_json(const Plan& p) {
  const bootstrap::GroupShape g = p.group_shape();
  nlohmann::json ranks = nlohmann::json::array();
  if (g.valid())
    for (int r = 0; r < g.world_size(); ++r) {
      const bootstrap::GroupPosition at = bootstrap::group_position(g, r);
      ranks.push_back({{"group", at.group}, {"rank", at.rank}});
    }
  return {{"group", {{"nodes", g.group_nodes}, {"gpus_per_node", g.group_gpus}, {"size", g.group_size()}}},
          {"count", g.num_groups()},
          {"job", {{"nodes", g.nodes}, {"gpus_per_node", g.gpus_per_node}, {"world_size", g.world_size()}}},
          {"ranks", ranks}};
}

std::string hex64(uint64_t v) {
  char buf[20];
  snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

std::string executed_json(const Plan& p) {
  nlohmann::json j;
  j["op"] = to_string(p.op);
  j["dtype"] = to_string(p.dtype);
  j["shape"] = shape_json(p);
  j["layout"] = {{"nodes", p.nodes}, {"gpus_per_node", p.gpus_per_node}, {"world_size", p.world_size}};
  // Only a grouped plan says its job: plans of whole-job ops hash as they always did.
  if (p.grouped()) j["job"] = {{"nodes", p.job_nodes}, {"gpus_per_node", p.job_gpus_per_node}};
  j["sm_count"] = p.sm_count;
  j["inter_backend"] = p.inter_backend;
  j["intra_mover"] = to_string(p.intra_mover());
  j["roles"] = roles_json(p);
  j["roles"].erase("explicit");  // where the counts came from does not change what runs
  j["tiles"] = {{"m", p.tile_m}, {"n", p.tile_n}, {"k", p.tile_k}};
  j["execution"] = execution_json(p.exec);
  j["heap"] = heap_json(p);
  return j.dump();  // keys sorted by nlohmann::json: canonical
}

namespace {

template <class T>
void read(const nlohmann::json& j, const char* key, T* out) {
  *out = j.at(key).get<T>();
}

bool op_from(const std::string& s, Op* out) {
  for (Op o : {Op::kAgGemm, Op::kGemmRs, Op::kGemmAr, Op::kMoe, Op::kRingAttention})
    if (s == to_string(o)) return *out = o, true;
  return false;
}

bool dtype_from(const std::string& s, DType* out) {
  for (DType d : {DType::kBf16, DType::kFp16, DType::kFp8})
    if (s == to_string(d)) return *out = d, true;
  return false;
}

}  // namespace

Status read_plan_file(const std::string& path, Plan* out, std::string* error) {
  FILE* f = fopen(path.c_str(), "rb");
  if (!f) {
    *error = "cannot read " + path + ": " + strerror(errno);
    return Status::kNotFound;
  }
  std::string text;
  char buf[1 << 16];
  size_t got = 0;
  while ((got = fread(buf, 1, sizeof buf, f)) > 0 && text.size() <= (1u << 20)) text.append(buf, got);
  fclose(f);
  const Status s = parse_executed_json(text, out, error);
  if (s != Status::kOk) *error = path + ": " + *error;
  return s;
}

Status parse_executed_json(const std::string& text, Plan* out, std::string* error) {
  if (text.size() > (1u << 20)) {
    *error = "plan: " + std::to_string(text.size()) + " bytes; expected at most 1 MiB";
    return Status::kInvalidArgument;
  }
  const char* at = "the text";
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    Plan p;
    at = "op";
    if (!op_from(j.at("op").get<std::string>(), &p.op)) throw std::invalid_argument("unknown op");
    at = "dtype";
    if (!dtype_from(j.at("dtype").get<std::string>(), &p.dtype)) throw std::invalid_argument("unknown dtype");
    at = "shape";
    const auto& sh = j.at("shape");
    if (is_gemm_op(p.op)) {
      read(sh, "m", &p.gemm.m), read(sh, "n", &p.gemm.n), read(sh, "k", &p.gemm.k);
    } else if (p.op == Op::kMoe) {
      read(sh, "tokens", &p.moe.tokens), read(sh, "hidden", &p.moe.hidden), read(sh, "ffn", &p.moe.ffn);
      read(sh, "experts", &p.moe.experts), read(sh, "topk", &p.moe.topk);
    } else {
      read(sh, "seq", &p.attention.seq), read(sh, "heads", &p.attention.heads);
      read(sh, "head_dim", &p.attention.head_dim), read(sh, "causal", &p.attention.causal);
    }
    const int64_t kMaxDim = int64_t(1) << 24;  // a tensor side; the product is bounded by the heap below
    for (int64_t v : {p.gemm.m, p.gemm.n, p.gemm.k, p.moe.tokens, p.moe.hidden, p.moe.ffn, p.moe.experts, p.moe.topk,
                      p.attention.seq, p.attention.heads, p.attention.head_dim})
      if (v < 0 || v > kMaxDim) throw std::invalid_argument("sizes must be from 0 to 2^24");
    at = "layout";
    const auto& l = j.at("layout");
    read(l, "nodes", &p.nodes), read(l, "gpus_per_node", &p.gpus_per_node), read(l, "world_size", &p.world_size);
    if (p.nodes < 1 || p.gpus_per_node < 1 || p.nodes > 65536 || p.gpus_per_node > 64 ||
        p.world_size != p.nodes * p.gpus_per_node)
      throw std::invalid_argument("world_size must be nodes x gpus_per_node");
    if (j.contains("job")) {
      at = "job";
      read(j.at("job"), "nodes", &p.job_nodes), read(j.at("job"), "gpus_per_node", &p.job_gpus_per_node);
      if (p.job_nodes < 1 || p.job_gpus_per_node < 1 || p.job_nodes > 65536 || p.job_gpus_per_node > 64 ||
          !p.group_shape().valid())
        throw std::invalid_argument("the job's nodes and gpus_per_node must be multiples of the layout's");
    }
    // `weftrun plan --json` keeps these two under "machine".
    const nlohmann::json& machine = j.contains("machine") ? j.at("machine") : j;
    at = "sm_count";
    read(machine, "sm_count", &p.sm_count);
    at = "inter_backend";
    read(machine, "inter_backend", &p.inter_backend);
    at = "intra_mover";
    const std::string mover = j.at("intra_mover").get<std::string>();
    if (mover != "sm" && mover != "copy_engine") throw std::invalid_argument("expected sm or copy_engine");
    at = "roles";
    const auto& r = j.at("roles");
    read(r, "compute", &p.roles.compute), read(r, "intra_comm", &p.roles.intra_comm);
    read(r, "inter_send", &p.roles.inter_send), read(r, "inter_reduce", &p.roles.inter_reduce);
    if (p.roles.compute < 0 || p.roles.intra_comm < 0 || p.roles.inter_send < 0 || p.roles.inter_reduce < 0 ||
        p.roles.total() > 1024)
      throw std::invalid_argument("counts must be >= 0 and sum to at most 1024");
    at = "tiles";
    read(j.at("tiles"), "m", &p.tile_m), read(j.at("tiles"), "n", &p.tile_n), read(j.at("tiles"), "k", &p.tile_k);
    if (p.tile_m < 1 || p.tile_n < 1 || p.tile_k < 1 || p.tile_m > 1024 || p.tile_n > 1024 || p.tile_k > 1024)
      throw std::invalid_argument("tile sides from 1 to 1024");
    at = "execution";
    const auto& e = j.at("execution");
    read(e, "variant", &p.exec.variant), read(e, "sm_mover", &p.exec.sm_mover);
    read(e, "copy_chunks", &p.exec.copy_chunks), read(e, "cluster", &p.exec.cluster);
    read(e, "group_m", &p.exec.group_m), read(e, "capturable", &p.exec.capturable);
    read(e, "reduce_blocks", &p.exec.reduce_blocks);
    if (p.exec.copy_chunks < 1 || p.exec.copy_chunks > 1024 || p.exec.cluster < 1 || p.exec.cluster > 2 ||
        p.exec.group_m < 1 || p.exec.group_m > 1024)
      throw std::invalid_argument("copy_chunks 1 to 1024, cluster 1 or 2, group_m 1 to 1024");
    if (p.exec.reduce_blocks < 0 || p.exec.reduce_blocks > 4096)
      throw std::invalid_argument("reduce_blocks: 0 to 4096");
    if (e.contains("split_k")) read(e, "split_k", &p.exec.split_k);
    if (p.exec.split_k < 0 || p.exec.split_k > 4) throw std::invalid_argument("split_k: 0 to 4");
    if (p.exec.variant == "overlap") {  // its choices, only there
      read(e, "pieces", &p.exec.pieces), read(e, "lag", &p.exec.lag);
      read(e, "send", &p.exec.send), read(e, "gather", &p.exec.gather);
      if (p.exec.pieces < 1 || p.exec.pieces > 64 || p.exec.lag < 1 || p.exec.lag > p.exec.pieces ||
          (p.exec.send != "copy" && p.exec.send != "sm") ||
          (p.exec.gather != "" && p.exec.gather != "push" && p.exec.gather != "sm"))
        throw std::invalid_argument(
            "overlap: pieces 1 to 64, lag 1 to pieces, send copy or sm, gather push, sm or empty");
    }
    if (p.exec.variant == "hierarchical") {
      read(e, "channels", &p.exec.channels), read(e, "signal_mode", &p.exec.signal_mode);
      if (e.contains("pieces")) read(e, "pieces", &p.exec.pieces);
      if (p.exec.channels < 1 || p.exec.channels > 8 || p.exec.pieces < 0 || p.exec.pieces > 64 ||
          (p.exec.signal_mode != "serial" && p.exec.signal_mode != "fenced" && p.exec.signal_mode != "batched"))
        throw std::invalid_argument(
            "hierarchical: channels 1 to 8, pieces 0 to 64, signal_mode serial, fenced or batched");
    }
    if (e.contains("gemm")) {  // plans written before the GEMM's choices were the plan's have the defaults
      at = "execution.gemm";
      const auto& g = e.at("gemm");
      read(g, "split_tail", &p.exec.gemm.split_tail), read(g, "chunked_tail", &p.exec.gemm.chunked_tail);
      read(g, "dynamic_tiles", &p.exec.gemm.dynamic_tiles), read(g, "tma_store", &p.exec.gemm.tma_store);
      at = "execution";
    }
    read(e, "executable", &p.exec.executable), read(e, "not_executable", &p.exec.not_executable);
    at = "heap";
    const auto& h = j.at("heap");
    read(h, "bytes", &p.heap_bytes);
    if (p.heap_bytes > (uint64_t(1) << 40)) throw std::invalid_argument("bytes: at most 1 TiB");
    at = "heap.regions";
    const auto& regions = h.at("regions");
    if (!regions.is_array() || regions.size() > 64) throw std::invalid_argument("expected at most 64 regions");
    for (const auto& reg : regions) {
      HeapRegion hr;
      read(reg, "name", &hr.name), read(reg, "offset", &hr.offset), read(reg, "bytes", &hr.bytes);
      if (hr.offset + hr.bytes > p.heap_bytes || hr.bytes > p.heap_bytes)
        throw std::invalid_argument("region " + hr.name + " ends past heap.bytes");
      p.heap.push_back(hr);
    }
    at = "intra_mover";  // said twice in the text: it must agree with the variant, which decides it
    if (mover != to_string(p.intra_mover()))
      throw std::invalid_argument(mover + " disagrees with execution.variant '" + p.exec.variant + "'");
    p.roles_explicit = true;  // the counts are the plan's, not the tuner's to change
    *out = std::move(p);
    return Status::kOk;
  } catch (const std::exception& ex) {
    *error = std::string("plan: ") + at + ": " + ex.what();
    return Status::kInvalidArgument;
  }
}

uint64_t plan_hash(const Plan& p) {
  const std::string text = executed_json(p);
  uint64_t h = 1469598103934665603ull;  // FNV-1a 64
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

IntraMover Plan::intra_mover() const {
  if (exec.variant == "copy_engine") return IntraMover::kCopyEngine;
  if (exec.variant == "sm_movers") return IntraMover::kSm;
  return default_mover(op);
}

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
     << (p.grouped() ? " per group" : "") << "; inter-node: " << p.inter_backend;
  if (p.nodes > 1) os << " (" << p.nics_per_node << " NIC" << (p.nics_per_node == 1 ? "" : "s") << " per node)";
  os << "\n";
  if (p.nodes > 1 && p.nic_sharers > 0) {
    snprintf(line, sizeof(line), "  NICs     %d rank%s per NIC at once: %.1f GB/s of the NIC per rank\n", p.nic_sharers,
             p.nic_sharers == 1 ? "" : "s", p.nic_share_gbps);
    os << line;
  }
  const bootstrap::GroupShape g = p.group_shape();
  if (p.grouped() && g.valid()) {
    os << "  groups   " << g.num_groups() << " groups of " << p.world_size << " in a job of " << g.nodes << " node"
       << (g.nodes == 1 ? "" : "s") << " x " << g.gpus_per_node << " GPU" << (g.gpus_per_node == 1 ? "" : "s") << " = "
       << g.world_size() << " ranks; job rank -> group.rank:";
    constexpr int kShown = 16;  // the JSON lists every rank
    for (int r = 0; r < g.world_size() && r < kShown; ++r) {
      const bootstrap::GroupPosition at = bootstrap::group_position(g, r);
      os << " " << r << "->" << at.group << "." << at.rank;
    }
    if (g.world_size() > kShown) os << " ... (--json lists all)";
    os << "\n";
  }
  os << "  machine  " << p.gpu << ", " << p.sm_count << " SMs (" << p.gpu_reason << ")\n";
  if (p.gpu_assumed) os << "  NOTE: no GPU in this topology; this plan assumes " << p.gpu << " GPUs\n";
  snprintf(line, sizeof(line), "  tiles    %d x %d x %d; chunks %s (NVLink), %s (NIC)\n", p.tile_m, p.tile_n, p.tile_k,
           p.intra_chunk_bytes ? human_bytes(double(p.intra_chunk_bytes)).c_str() : "-",
           p.inter_chunk_bytes ? human_bytes(double(p.inter_chunk_bytes)).c_str() : "-");
  os << line;
  if (p.intra_mover() == IntraMover::kCopyEngine && p.roles.intra_comm == 0 && p.exec.variant != "overlap")
    os << "  NVLink   moved by the copy engines (no intra_comm SM)\n";
  if (!p.exec.variant.empty()) {
    os << "  runs     " << p.exec.variant;
    if (!p.exec.sm_mover.empty()) os << " (" << p.exec.sm_mover << ")";
    if (p.exec.variant == "copy_engine")
      os << ", " << p.exec.copy_chunks << " cop" << (p.exec.copy_chunks == 1 ? "y" : "ies") << " per shard";
    if (p.exec.variant == "overlap") {
      os << ", " << p.exec.pieces << " piece" << (p.exec.pieces == 1 ? "" : "s") << " per rank's rows, own lag "
         << p.exec.lag << ", sends by " << (p.exec.send == "sm" ? "the epilogue" : "the copy engines");
      if (p.roles.intra_comm > 0) os << " and " << p.roles.intra_comm << " mover SMs";
      if (!p.exec.gather.empty())
        os << ", gather by " << (p.exec.gather == "sm" ? "the epilogue" : "copy-engine pushes");
    }
    if (p.exec.variant == "peer") os << ", " << p.exec.reduce_blocks << " reduction blocks";
    if (p.exec.variant == "hierarchical" && p.exec.pieces > 0)
      os << ", " << p.exec.pieces << " piece" << (p.exec.pieces == 1 ? "" : "s") << " per rank's rows, "
         << p.exec.channels << " proxy channel" << (p.exec.channels == 1 ? "" : "s") << " (" << p.inter_backend << ", "
         << p.exec.signal_mode << " signals)";
    else if (p.exec.variant == "hierarchical")
      os << ", " << p.exec.copy_chunks << " chunk" << (p.exec.copy_chunks == 1 ? "" : "s") << " per shard, "
         << p.exec.channels << " proxy channel" << (p.exec.channels == 1 ? "" : "s") << " (" << p.inter_backend << ", "
         << p.exec.signal_mode << " signals)";
    if (p.exec.split_k == 1) os << ", no K split of the FFN";
    if (p.exec.split_k > 1)
      os << ", the FFN's down projection and gate/up's last wave split over K (up to " << p.exec.split_k
         << " parts, where they fit one wave)";
    os << ", " << p.exec.cluster << "-CTA clusters, raster groups of " << p.exec.group_m << " tiles"
       << (p.exec.capturable ? ", capturable in a CUDA graph" : "") << "; chosen by the " << p.chosen_by << "\n";
    const GemmChoices& g = p.exec.gemm;
    auto on = [](bool b) { return b ? "on" : "off"; };
    os << "  gemm     split tail " << on(g.split_tail) << ", chunked tail " << on(g.chunked_tail) << ", dynamic tiles "
       << on(g.dynamic_tiles) << ", TMA store " << on(g.tma_store) << "\n";
  }
  if (p.heap_bytes > 0) {
    os << "  heap     " << human_bytes(double(p.heap_bytes)) << " per rank:";
    for (const auto& r : p.heap) os << " " << r.name << " " << human_bytes(double(r.bytes)) << " @" << r.offset << ";";
    os << "\n";
  }
  if (!p.exec.executable) os << "  NOT RUNNABLE: " << p.exec.not_executable << "\n";
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
  for (const auto& n : all_notes(p)) os << "  NOTE: " << n << "\n";
  return os.str();
}

std::string format_plan_json(const Plan& p) {
  using nlohmann::json;
  json j;
  j["workload"] = p.workload;
  j["source"] = p.source;
  j["op"] = to_string(p.op);
  j["dtype"] = to_string(p.dtype);
  j["intra_mover"] = to_string(p.intra_mover());
  j["layout"] = {{"nodes", p.nodes}, {"gpus_per_node", p.gpus_per_node}, {"world_size", p.world_size}};
  j["groups"] = groups_json(p);
  j["machine"] = {{"gpu", p.gpu},
                  {"reason", p.gpu_reason},
                  {"assumed", p.gpu_assumed},
                  {"sm_count", p.sm_count},
                  {"inter_backend", p.inter_backend},
                  {"nics_per_node", p.nics_per_node},
                  {"nic_sharers", p.nic_sharers},
                  {"nic_share_gbps", p.nic_share_gbps}};
  j["shape"] = shape_json(p);
  j["roles"] = roles_json(p);
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
  j["notes"] = all_notes(p);
  j["execution"] = execution_json(p.exec);
  j["chosen_by"] = p.chosen_by;
  j["heap"] = heap_json(p);
  // Per rank: what the fused op's wiring opens and holds, from the peer-set function Transport::create uses.
  uint64_t nic_out = 0;
  for (const auto& l : p.links) nic_out = l.link == "nic" ? static_cast<uint64_t>(l.bytes_out) : nic_out;
  j["resources"] = nlohmann::json::parse(transport::plan_resources_json(p.nodes, p.gpus_per_node, p.inter_backend,
                                                                        p.heap_bytes, nic_out, p.inter_chunk_bytes));
  j["hash"] = hex64(plan_hash(p));
  return j.dump(2);
}

}  // namespace weft::runtime
