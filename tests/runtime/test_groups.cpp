// Rank groups: the group math inside bigger jobs, and `group:` in a workload validated against its layout.
#include <doctest/doctest.h>

#include <set>
#include <string>
#include <vector>

#include "bootstrap/rank_group.h"
#include "runtime/plan.h"
#include "runtime/workload.h"

using weft::Status;
using weft::bootstrap::group_members;
using weft::bootstrap::group_position;
using weft::bootstrap::GroupPosition;
using weft::bootstrap::GroupShape;
using weft::bootstrap::job_rank;
using namespace weft::runtime;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Every rank of the job is in exactly one group, at exactly one group rank; a group's members are G
// consecutive local ranks on each of N consecutive nodes; group_position and job_rank are inverses.
void check_tiling(const GroupShape& s) {
  INFO("job ", s.nodes, " x ", s.gpus_per_node, ", group ", s.group_nodes, " x ", s.group_gpus);
  REQUIRE(s.valid());
  const int groups = s.num_groups();
  CHECK(groups * s.group_size() == s.world_size());
  std::set<std::pair<int, int>> seen;
  for (int r = 0; r < s.world_size(); ++r) {
    const GroupPosition p = group_position(s, r);
    REQUIRE(p.group >= 0);
    REQUIRE(p.group < groups);
    REQUIRE(p.rank >= 0);
    REQUIRE(p.rank < s.group_size());
    CHECK(p.rank == p.node * s.group_gpus + p.local_rank);
    CHECK(seen.insert({p.group, p.rank}).second);
    CHECK(job_rank(s, p.group, p.rank) == r);
  }
  for (int g = 0; g < groups; ++g) {
    const std::vector<int> m = group_members(s, g);
    REQUIRE(static_cast<int>(m.size()) == s.group_size());
    const int first_node = m[0] / s.gpus_per_node, first_local = m[0] % s.gpus_per_node;
    CHECK(first_node % s.group_nodes == 0);
    CHECK(first_local % s.group_gpus == 0);
    for (int i = 0; i < s.group_size(); ++i) {
      CHECK(m[i] / s.gpus_per_node == first_node + i / s.group_gpus);   // consecutive nodes
      CHECK(m[i] % s.gpus_per_node == first_local + i % s.group_gpus);  // consecutive GPUs on each
      CHECK(group_position(s, m[i]).group == g);
    }
  }
}

Workload parse_ok(const std::string& text) {
  Workload w;
  std::string err;
  REQUIRE_MESSAGE(parse_workload(text, "g.yaml", &w, &err) == Status::kOk, err);
  return w;
}

std::string error_of(const std::string& text) {
  Workload w;
  std::string err;
  CHECK(parse_workload(text, "g.yaml", &w, &err) == Status::kInvalidArgument);
  CHECK(err.find('\n') == std::string::npos);
  return err;
}

std::string gemm(const char* op, const std::string& layout, const std::string& group) {
  return std::string("op: ") + op + "\nshape: {m: 8192, n: 8192, k: 8192}\nlayout: " + layout + "\n" +
         (group.empty() ? "" : "group: " + group + "\n");
}

}  // namespace

TEST_CASE("tensor-parallel groups 1x2, 1x8, 2x4, 2x8, 4x8 tile bigger jobs") {
  for (auto [n, g] : std::vector<std::pair<int, int>>{{1, 2}, {1, 8}, {2, 4}, {2, 8}, {4, 8}}) {
    check_tiling({n, 8, n, g});   // the group's own nodes
    check_tiling({16, 8, n, g});  // inside 16 nodes x 8
    check_tiling({4, 8, n, g});
  }
  // Spot values: 16 x 8 in 1 x 8 groups is one group per node; in 1 x 2, four per node.
  CHECK(group_position({16, 8, 1, 8}, 21).group == 2);
  CHECK(group_position({16, 8, 1, 8}, 21).rank == 5);
  CHECK(group_position({16, 8, 1, 2}, 21).group == 10);  // node 2, GPUs 4-5: 2 * 4 + 2
  CHECK(group_position({16, 8, 1, 2}, 21).rank == 1);
  // 2 x 4 groups in 4 x 8: nodes 0-1 hold groups 0 (GPUs 0-3) and 1 (GPUs 4-7).
  CHECK(group_members({4, 8, 2, 4}, 1) == std::vector<int>{4, 5, 6, 7, 12, 13, 14, 15});
  CHECK(group_members({4, 8, 2, 4}, 2) == std::vector<int>{16, 17, 18, 19, 24, 25, 26, 27});
  const GroupPosition p = group_position({4, 8, 2, 4}, 13);
  CHECK(p.group == 1);
  CHECK(p.rank == 5);
  CHECK(p.node == 1);
  CHECK(p.local_rank == 1);
}

TEST_CASE("the MoE op's expert-parallel group can be the whole job: 128 x 8") {
  check_tiling({128, 8, 128, 8});
  check_tiling({128, 8, 32, 8});
  const GroupShape whole{128, 8, 128, 8};
  CHECK(whole.num_groups() == 1);
  CHECK(group_position(whole, 1023).rank == 1023);
  CHECK(group_position(whole, 1023).node == 127);
  CHECK(!GroupShape{3, 8, 2, 8}.valid());  // 2-node groups do not tile 3 nodes
  CHECK(!GroupShape{2, 6, 1, 4}.valid());
}

TEST_CASE("group: in a workload sets the ranks the op runs on; shards are per group") {
  Workload w = parse_ok(gemm("ag_gemm", "{nodes: 16, gpus_per_node: 8}", "{nodes: 1, gpus_per_node: 8}"));
  REQUIRE(w.group.has_value());
  CHECK(w.world_size() == 128);
  CHECK(w.group_size() == 8);
  CHECK(w.num_groups() == 16);
  CHECK(w.gemm_shard().n == 1024);  // n 8192 over the 8 ranks of a group, not the 128 of the job
  CHECK(w.loc_of("group.nodes").line == 4);
  // An unset side: one node, the layout's GPUs per node.
  w = parse_ok(gemm("gemm_rs", "{nodes: 4, gpus_per_node: 8}", "{gpus_per_node: 4}"));
  CHECK(w.group_layout().nodes == 1);
  CHECK(w.group_layout().gpus_per_node == 4);
  CHECK(w.num_groups() == 8);
  // Without a group, the job is the group.
  w = parse_ok(gemm("gemm_ar", "{nodes: 2, gpus_per_node: 4}", ""));
  CHECK_FALSE(w.group.has_value());
  CHECK(w.group_size() == 8);
  CHECK(w.num_groups() == 1);
  // Every listed shape of the issue parses for the tensor-parallel ops, inside a 16 x 8 job.
  for (const char* op : {"ag_gemm", "gemm_rs", "gemm_ar", "ring_attention"})
    for (auto [n, g] : std::vector<std::pair<int, int>>{{1, 2}, {1, 8}, {2, 4}, {2, 8}, {4, 8}}) {
      const std::string group = "{nodes: " + std::to_string(n) + ", gpus_per_node: " + std::to_string(g) + "}";
      const std::string text = std::string(op) == "ring_attention"
                                   ? "op: ring_attention\nshape: {seq: 32768, heads: 8, head_dim: 128}\nlayout: "
                                     "{nodes: 16, gpus_per_node: 8}\ngroup: " +
                                         group + "\n"
                                   : gemm(op, "{nodes: 16, gpus_per_node: 8}", group);
      INFO(op, " ", group);
      CHECK(parse_ok(text).group_size() == n * g);
    }
  w = parse_ok(
      "op: moe\nshape: {tokens: 1048576, hidden: 7168, ffn: 2048, experts: 1024, topk: 8}\n"
      "layout: {nodes: 128, gpus_per_node: 8}\ngroup: {nodes: 128, gpus_per_node: 8}\n");
  CHECK(w.group_size() == 1024);
  CHECK(w.moe_experts_per_rank() == 1);
}

TEST_CASE("a group that breaks a bound or does not tile the layout is refused at its line") {
  const std::string job = "{nodes: 16, gpus_per_node: 8}";
  std::string e = error_of(gemm("ag_gemm", job, "{nodes: 8, gpus_per_node: 8}"));
  CHECK_MESSAGE(contains(e, "g.yaml:4:"), e);
  CHECK_MESSAGE(contains(e, "group.nodes: expected 1 to 4 nodes for ag_gemm's tensor-parallel group, got 8"), e);
  e = error_of(gemm("gemm_rs", "{nodes: 2, gpus_per_node: 16}", "{nodes: 1, gpus_per_node: 16}"));
  CHECK_MESSAGE(contains(e, "group.gpus_per_node: expected 1 to 8 GPUs"), e);
  e = error_of(gemm("gemm_ar", "{nodes: 6, gpus_per_node: 8}", "{nodes: 4, gpus_per_node: 8}"));
  CHECK_MESSAGE(contains(e,
                         "group.nodes: 4 nodes per group do not tile the layout's 6 nodes x 8 GPUs; expected a "
                         "divisor of 6"),
                e);
  e = error_of(gemm("ag_gemm", "{nodes: 1, gpus_per_node: 6}", "{nodes: 1, gpus_per_node: 4}"));
  CHECK_MESSAGE(contains(e, "group.gpus_per_node: 4 GPUs per node per group do not tile"), e);
  e = error_of(gemm("ag_gemm", "{nodes: 1, gpus_per_node: 4}", "{nodes: 2, gpus_per_node: 4}"));
  CHECK_MESSAGE(contains(e, "group.nodes: 2 nodes per group do not tile"), e);
  // MoE: whole nodes of 8 (or of the node's GPUs), up to 128 nodes.
  const std::string moe = "op: moe\nshape: {tokens: 65536, hidden: 1024, ffn: 1024, experts: 256, topk: 2}\n";
  e = error_of(moe + "layout: {nodes: 256, gpus_per_node: 8}\ngroup: {nodes: 256, gpus_per_node: 8}\n");
  CHECK_MESSAGE(contains(e, "group.nodes: expected 1 to 128 nodes for moe's expert-parallel group, got 256"), e);
  e = error_of(moe + "layout: {nodes: 4, gpus_per_node: 8}\ngroup: {nodes: 4, gpus_per_node: 4}\n");
  CHECK_MESSAGE(contains(e, "group.gpus_per_node: expected 8 or the node's 8"), e);
  CHECK(parse_ok(moe + "layout: {nodes: 4, gpus_per_node: 4}\ngroup: {nodes: 2, gpus_per_node: 4}\n").num_groups() ==
        2);
  // Sizes must split over a group's ranks (not the job's).
  e = error_of(
      "op: ag_gemm\nshape: {m: 8196, n: 8192, k: 8192}\nlayout: {nodes: 2, gpus_per_node: 8}\n"
      "group: {nodes: 1, gpus_per_node: 8}\n");
  CHECK_MESSAGE(contains(e, "shape.m: 8196 is not divisible by the 8 ranks (1 node x 8 GPUs per group)"), e);
  // Unknown keys and wrong kinds, located.
  e = error_of(gemm("ag_gemm", job, "{nodes: 1, gpus: 8}"));
  CHECK_MESSAGE(contains(e, "group.gpus: unknown key; expected one of: nodes, gpus_per_node"), e);
  e = error_of(gemm("ag_gemm", job, "8"));
  CHECK_MESSAGE(contains(e, "g.yaml:4:8: group: expected a map {nodes, gpus_per_node}"), e);
  // --nodes re-checks the tiling.
  Workload w = parse_ok(gemm("ag_gemm", job, "{nodes: 2, gpus_per_node: 8}"));
  std::string err;
  CHECK(validate_layout(w, Layout{3, 8}, &err) == Status::kInvalidArgument);
  CHECK_MESSAGE(contains(err, "group.nodes: 2 nodes per group do not tile the layout's 3 nodes"), err);
  CHECK(validate_layout(w, Layout{4, 8}, &err) == Status::kOk);
}

TEST_CASE("a grouped plan says its job, round-trips, and hashes apart from the ungrouped one") {
  Plan p;
  p.op = Op::kAgGemm;
  p.nodes = 2, p.gpus_per_node = 4, p.world_size = 8;
  p.gemm = {8192, 8192, 8192};
  p.sm_count = 132;
  p.roles.compute = 132;
  const uint64_t whole = plan_hash(p);
  CHECK_FALSE(p.grouped());
  CHECK(p.group_shape().num_groups() == 1);
  p.job_nodes = 4, p.job_gpus_per_node = 8;
  CHECK(p.grouped());
  CHECK(p.group_shape().num_groups() == 4);
  CHECK(plan_hash(p) != whole);
  Plan back;
  std::string err;
  REQUIRE_MESSAGE(parse_executed_json(executed_json(p), &back, &err) == Status::kOk, err);
  CHECK(back.job_nodes == 4);
  CHECK(back.job_gpus_per_node == 8);
  CHECK(plan_hash(back) == plan_hash(p));
  // A job the group does not tile is refused.
  std::string text = executed_json(p);
  const std::string from = "\"job\":{\"gpus_per_node\":8,\"nodes\":4}";
  REQUIRE(contains(text, from));
  text.replace(text.find(from), from.size(), "\"job\":{\"gpus_per_node\":8,\"nodes\":3}");
  CHECK(parse_executed_json(text, &back, &err) == Status::kInvalidArgument);
  CHECK_MESSAGE(contains(err, "plan: job:"), err);
  // The JSON lists every job rank's group and group rank.
  const std::string json = format_plan_json(p);
  CHECK(contains(json, "\"count\": 4"));
  const std::string table = format_plan_table(p);
  CHECK_MESSAGE(contains(table, "groups   4 groups of 8 in a job of 4 nodes x 8 GPUs = 32 ranks"), table);
  CHECK_MESSAGE(contains(table, " 13->1.5"), table);
}

TEST_CASE("a context takes only a plan of its own rank group (the whole job, or its group shape)") {
  Plan p;
  p.op = Op::kAgGemm;
  p.nodes = 1, p.gpus_per_node = 4, p.world_size = 4;
  p.gemm = {8192, 8192, 8192};
  std::string why;
  // A context without groups (Options 0 x 0) and a plan for the whole job of 4.
  CHECK_MESSAGE(check_plan_group(p, nullptr, 4, &why), why);
  // The same context and a plan of 1 x 2 groups in that job.
  p.gpus_per_node = 2, p.world_size = 2;
  p.job_nodes = 1, p.job_gpus_per_node = 4;
  CHECK_FALSE(check_plan_group(p, nullptr, 4, &why));
  CHECK_MESSAGE(contains(why, "the plan's rank group is 1 x 2, this context's is none (the whole job)"), why);
  // A context of 1 x 2 groups takes it; one of 1 x 1 groups, or 1 x 2 in a job of 8, does not.
  GroupShape g;
  g.nodes = 1, g.gpus_per_node = 4, g.group_nodes = 1, g.group_gpus = 2;
  CHECK_MESSAGE(check_plan_group(p, &g, 4, &why), why);
  CHECK_FALSE(check_plan_group(p, &g, 8, &why));
  g.group_gpus = 1;
  CHECK_FALSE(check_plan_group(p, &g, 4, &why));
  CHECK_MESSAGE(contains(why, "this context's is 1 x 1"), why);
  // And a grouped context refuses the whole job's plan.
  p.gpus_per_node = 4, p.world_size = 4, p.job_nodes = 0, p.job_gpus_per_node = 0;
  g.group_gpus = 2;
  CHECK_FALSE(check_plan_group(p, &g, 4, &why));
  CHECK_MESSAGE(contains(why, "the plan's rank group is none (the whole job), this context's is 1 x 2"), why);
  // Unless its one group is the whole job.
  g.group_gpus = 4;
  CHECK_MESSAGE(check_plan_group(p, &g, 4, &why), why);
}
