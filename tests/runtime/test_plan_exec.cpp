// The Plan holds what runs: the variant, the heap layout and the hash of both, for every example;
// what this build cannot run is refused in the plan with the file:line:col reason; the executed
// form reads back to the same hash, and malformed plans are refused with the key named.
#include <dirent.h>
#include <doctest/doctest.h>

#include <string>
#include <tuple>
#include <vector>

#include "kernels/frame.cuh"
#include "kernels/moe_plan.h"
#include "runtime/plan.h"
#include "runtime/tuner.h"
#include "runtime/workload.h"

using weft::Status;
using namespace weft::runtime;

namespace {

Workload parse(const std::string& text) {
  Workload w;
  std::string err;
  REQUIRE_MESSAGE(parse_workload(text, "t.yaml", &w, &err) == Status::kOk, err);
  return w;
}

Plan plan_for(const Workload& w) {
  Plan p;
  std::string err;
  REQUIRE_MESSAGE(tune(w, w.layout, {}, {}, machine_model_h200(), &p, &err) == Status::kOk, err);
  return p;
}

std::string ag(const std::string& extra = "", int nodes = 1, int gpus = 4) {
  return "name: t\nop: ag_gemm\nshape: {m: 8192, n: 28672, k: 8192}\nlayout: {nodes: " + std::to_string(nodes) +
         ", gpus_per_node: " + std::to_string(gpus) + "}\n" + extra;
}

std::vector<Workload> examples() {
  std::vector<Workload> out;
  const std::string dir = std::string(WEFT_SOURCE_DIR) + "/configs/examples";
  DIR* d = opendir(dir.c_str());
  REQUIRE(d != nullptr);
  while (dirent* e = readdir(d)) {
    const std::string n = e->d_name;
    if (n.size() < 6 || n.substr(n.size() - 5) != ".yaml") continue;
    Workload w;
    std::string err;
    REQUIRE_MESSAGE(load_workload(dir + "/" + n, &w, &err) == Status::kOk, err);
    out.push_back(w);
  }
  closedir(d);
  REQUIRE(out.size() >= 10);
  return out;
}

// Regions in order, aligned, inside the op's share and not overlapping.
void check_heap(const Plan& p) {
  uint64_t end = 0;
  for (const auto& r : p.heap) {
    CHECK_MESSAGE(r.offset % 256 == 0, r.name);
    CHECK_MESSAGE(r.offset >= end, r.name);
    CHECK(r.bytes > 0);
    end = r.offset + r.bytes;
  }
  CHECK(end <= p.heap_bytes);
  CHECK(p.heap_bytes % 4096 == 0);
}

}  // namespace

TEST_CASE("AllGather+GEMM on one node: copy engines, the whole gathered A and its words in the heap") {
  const Plan p = plan_for(parse(ag()));
  CHECK(p.exec.executable);
  CHECK(p.exec.variant == "copy_engine");
  CHECK(p.exec.copy_chunks == 1);
  CHECK(p.exec.cluster == 1);
  CHECK(p.exec.capturable);  // every stream operation's value is a constant token
  CHECK(p.intra_mover == IntraMover::kCopyEngine);
  CHECK(p.roles.compute == p.sm_count);
  REQUIRE(p.region("ag_gemm.a") != nullptr);
  CHECK(p.region("ag_gemm.a")->bytes == uint64_t(8192) * 8192 * 2);
  REQUIRE(p.region("ag_gemm.gate") != nullptr);
  CHECK(p.region("ag_gemm.gate")->bytes == 4 * 8);
  CHECK(p.region("ag_gemm.ready") != nullptr);
  CHECK(p.region("ag_gemm.consumed") != nullptr);
  CHECK(p.region("ag_gemm.flags") == nullptr);
  check_heap(p);
}

TEST_CASE("explicit roles with intra_comm SMs run the SM movers, as written") {
  const Plan p = plan_for(parse(ag("roles: {compute: 120, intra_comm: 12}\n")));
  CHECK(p.exec.executable);
  CHECK(p.exec.variant == "sm_movers");
  CHECK(p.exec.sm_mover == "pull_vec");
  CHECK(!p.exec.capturable);  // the per-tile flags count launches through a kernel argument
  CHECK(p.roles.compute == 120);
  CHECK(p.roles.intra_comm == 12);
  REQUIRE(p.region("ag_gemm.flags") != nullptr);
  // One word per (128-row block, 256-column block of the rank's 7168 columns), then 4 clear-to-send.
  CHECK(p.region("ag_gemm.flags")->bytes == uint64_t(64 * 28 + 4) * 8);
  check_heap(p);
  // intra_comm 0 with fewer compute SMs: the copy engines on exactly those SMs.
  const Plan fewer = plan_for(parse(ag("roles: {compute: 128, intra_comm: 0}\n")));
  CHECK(fewer.exec.variant == "copy_engine");
  CHECK(fewer.roles.compute == 128);
  CHECK(plan_hash(fewer) != plan_hash(plan_for(parse(ag()))));
}

TEST_CASE("what this build cannot run is refused in the plan, with where and why") {
  const Plan fp8 = plan_for(parse(ag("dtype: fp8\n")));
  CHECK(!fp8.exec.executable);
  CHECK(fp8.exec.not_executable.rfind("t.yaml:5:8: dtype: fp8: this build's kernels take bf16 only", 0) == 0);
  const Plan fp16 = plan_for(parse(ag("dtype: fp16\n")));
  CHECK(!fp16.exec.executable);
  CHECK(fp16.exec.not_executable.find("dtype: fp16") != std::string::npos);
  const Plan ra =
      plan_for(parse("name: t\nop: ring_attention\nshape: {seq: 32768, heads: 32, head_dim: 128}\nlayout: {nodes: 1, "
                     "gpus_per_node: 4}\n"));
  CHECK(!ra.exec.executable);
  CHECK(ra.exec.not_executable.find("ring_attention is not built yet") != std::string::npos);
  const Plan two = plan_for(parse(ag("", 2, 2)));
  CHECK(!two.exec.executable);
  CHECK(two.exec.not_executable.find("weftrun bench") != std::string::npos);
  // A shard that is not whole tile rows.
  const Plan odd =
      plan_for(parse("name: t\nop: ag_gemm\nshape: {m: 4160, n: 4096, k: 4096}\nlayout: {nodes: 1, "
                     "gpus_per_node: 4}\n"));
  CHECK(!odd.exec.executable);
  CHECK(odd.exec.not_executable.find("shape.m: m / ranks = 1040 rows") != std::string::npos);
}

TEST_CASE("GEMM+RS and GEMM+AR on one node: the peer variant, its heap, refusals") {
  const std::string rs =
      "name: t\nop: gemm_rs\nshape: {m: 8192, n: 8192, k: 7168}\nlayout: {nodes: 1, gpus_per_node: 4}\n";
  const Plan p = plan_for(parse(rs));
  CHECK(p.exec.executable);
  CHECK(p.exec.variant == "peer");
  CHECK(!p.exec.capturable);
  CHECK(p.exec.reduce_blocks == 2 * p.sm_count);
  REQUIRE(p.region("gemm_reduce.partial") != nullptr);
  CHECK(p.region("gemm_reduce.partial")->bytes == uint64_t(8192) * 8192 * 2);
  CHECK(p.region("gemm_reduce.c") == nullptr);
  CHECK(p.region("gemm_reduce.flags")->bytes == 12 * 8);
  check_heap(p);
  std::string ar = rs;
  ar.replace(ar.find("gemm_rs"), 7, "gemm_ar");
  const Plan a = plan_for(parse(ar));
  CHECK(a.exec.executable);
  REQUIRE(a.region("gemm_reduce.c") != nullptr);
  check_heap(a);
  std::string odd = rs;
  odd.replace(odd.find("k: 7168"), 7, "k: 7180");
  const Plan o = plan_for(parse(odd));
  CHECK(!o.exec.executable);
  CHECK(o.exec.not_executable.find("shape.k") != std::string::npos);
  std::string two = rs;
  two.replace(two.find("nodes: 1, gpus_per_node: 4"), 26, "nodes: 2, gpus_per_node: 2");
  const Plan t = plan_for(parse(two));
  CHECK(!t.exec.executable);
  CHECK(t.exec.not_executable.find("weftrun bench") != std::string::npos);
}

TEST_CASE("every example: the executed form reads back to the same plan hash") {
  for (const Workload& w : examples()) {
    CAPTURE(w.source);
    const Plan p = plan_for(w);
    check_heap(p);
    Plan back;
    std::string err;
    REQUIRE_MESSAGE(parse_executed_json(executed_json(p), &back, &err) == Status::kOk, err);
    CHECK(plan_hash(back) == plan_hash(p));
    CHECK(executed_json(back) == executed_json(p));
    // Any executed field changes the hash.
    Plan other = back;
    other.exec.group_m += 1;
    CHECK(plan_hash(other) != plan_hash(p));
    other = back;
    if (!other.heap.empty()) {
      other.heap[0].offset += 256;
      CHECK(plan_hash(other) != plan_hash(p));
    }
  }
}

TEST_CASE("weftrun plan --json's form reads back as the plan it prints") {
  const Plan p = plan_for(parse(ag("roles: {compute: 120, intra_comm: 12}\n")));
  Plan back;
  std::string err;
  REQUIRE_MESSAGE(parse_executed_json(format_plan_json(p), &back, &err) == Status::kOk, err);
  CHECK(plan_hash(back) == plan_hash(p));
}

TEST_CASE("a malformed plan is refused with the key named") {
  const std::string good = executed_json(plan_for(parse(ag())));
  Plan p;
  std::string err;
  CHECK(parse_executed_json("{", &p, &err) == Status::kInvalidArgument);
  CHECK(err.rfind("plan: the text:", 0) == 0);
  CHECK(parse_executed_json(std::string(2 << 20, ' '), &p, &err) == Status::kInvalidArgument);
  CHECK(err.find("at most 1 MiB") != std::string::npos);
  std::string bad = good;
  bad.replace(bad.find("\"ag_gemm\""), 9, "\"ag_gemx\"");
  CHECK(parse_executed_json(bad, &p, &err) == Status::kInvalidArgument);
  CHECK(err.rfind("plan: op:", 0) == 0);
  bad = good;
  bad.replace(bad.find("\"execution\""), 11, "\"executiox\"");
  CHECK(parse_executed_json(bad, &p, &err) == Status::kInvalidArgument);
  CHECK(err.rfind("plan: execution:", 0) == 0);
  bad = good;
  const size_t at = bad.find("\"offset\":0");
  REQUIRE(at != std::string::npos);
  bad.replace(at, 10, "\"offset\":999999999999");
  CHECK(parse_executed_json(bad, &p, &err) == Status::kInvalidArgument);
  CHECK(err.find("ends past heap.bytes") != std::string::npos);
  // Values a plan file could carry that no op may be created from.
  for (const auto& [from, to, key] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"\"m\":8192", "\"m\":-512", "plan: shape:"},
           {"\"cluster\":1", "\"cluster\":7", "plan: execution:"},
           {"\"gpus_per_node\":4", "\"gpus_per_node\":4000", "plan: layout:"}}) {
    bad = good;
    const size_t at2 = bad.find(from);
    REQUIRE_MESSAGE(at2 != std::string::npos, from);
    bad.replace(at2, from.size(), to);
    CHECK(parse_executed_json(bad, &p, &err) == Status::kInvalidArgument);
    CHECK_MESSAGE(err.rfind(key, 0) == 0, err);
  }
}

TEST_CASE("the launch record gives the roles and cluster a launch ran with, or says why not") {
  Plan p = plan_for(parse(ag()));
  weft::kernels::LaunchRecord rec{};
  std::string why;
  CHECK(!apply_launch_record(rec, &p, &why));
  CHECK(why.find("no launch recorded") != std::string::npos);
  rec.launches = 3;
  rec.grid = 128;
  rec.cluster = 2;
  rec.blocks[int(weft::Role::kCompute)] = 3 * 120;
  rec.blocks[int(weft::Role::kIntraComm)] = 3 * 8;
  REQUIRE(apply_launch_record(rec, &p, &why));
  CHECK(p.roles.compute == 120);
  CHECK(p.roles.intra_comm == 8);
  CHECK(p.exec.cluster == 2);
  rec.grid = 132;  // 4 blocks never started
  CHECK(!apply_launch_record(rec, &p, &why));
  CHECK(why.find("the grid had 132 blocks, 128 started") != std::string::npos);
}

TEST_CASE("moe on one node: the staged op with every SM computing and its heap; across nodes refused") {
  auto moe = [](const std::string& shape, int nodes, int gpus, const std::string& extra = "") {
    return "name: t\nop: moe\nshape: " + shape + "\nlayout: {nodes: " + std::to_string(nodes) +
           ", gpus_per_node: " + std::to_string(gpus) + "}\n" + extra;
  };
  const Plan p = plan_for(parse(moe("{tokens: 16384, hidden: 4096, ffn: 14336, experts: 8, topk: 2}", 1, 4)));
  REQUIRE(p.exec.executable);
  CHECK(p.exec.variant == "staged");
  CHECK(!p.exec.capturable);
  CHECK(p.roles.intra_comm == 0);
  CHECK(p.roles.inter_send == 0);
  CHECK(p.roles.compute == p.sm_count);
  weft::kernels::MoeShape s;
  s.tokens = 4096, s.hidden = 4096, s.ffn = 14336, s.experts = 8, s.topk = 2, s.world = 4;
  const weft::kernels::MoeHeapLayout h = weft::kernels::moe_heap_layout(s);
  CHECK(p.heap_bytes == uint64_t(h.total_bytes));
  REQUIRE(p.region("moe.recv") != nullptr);
  CHECK(p.region("moe.recv")->bytes == uint64_t(4 * 4096 * weft::kernels::moe_slot_bytes(4096)));
  REQUIRE(p.region("moe.combine") != nullptr);
  CHECK(p.region("moe.combine")->offset == uint64_t(h.combine_offset));
  REQUIRE(p.region("moe.flags") != nullptr);
  CHECK(p.region("moe.flags")->bytes == 4 * 2 * 8);

  const Plan two = plan_for(parse(moe("{tokens: 8192, hidden: 2048, ffn: 1408, experts: 64, topk: 6}", 2, 2)));
  CHECK(!two.exec.executable);
  CHECK(two.exec.not_executable.find("moe across nodes is not built yet") != std::string::npos);
  const Plan movers = plan_for(parse(moe("{tokens: 8192, hidden: 2048, ffn: 1408, experts: 64, topk: 6}", 1, 4,
                                         "roles: {compute: 100, intra_comm: 16}\n")));
  CHECK(!movers.exec.executable);
  CHECK(movers.exec.not_executable.find("roles for movers are for the fused launch") != std::string::npos);
  const Plan odd = plan_for(parse(moe("{tokens: 8192, hidden: 2048, ffn: 1400, experts: 64, topk: 6}", 1, 4)));
  CHECK(!odd.exec.executable);
  CHECK(odd.exec.not_executable.find("ffn of 128") != std::string::npos);
}
