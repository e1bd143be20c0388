// The Plan holds what runs: the variant, the heap layout and the hash of both, for every example;
// what this build cannot run is refused in the plan with the file:line:col reason; the executed
// form reads back to the same hash, and malformed plans are refused with the key named.
#include <dirent.h>
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/frame.cuh"
#include "kernels/moe_nodes_plan.h"
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

TEST_CASE("AllGather+GEMM on one node: 2-CTA clusters as a choice of the plan and a tuning candidate") {
  CHECK(plan_for(parse(ag())).exec.cluster == 1);  // the model's (measured faster for the op)
  const Plan two = plan_for(parse(ag("plan: {cluster: 2}\n")));
  CHECK(two.exec.executable);
  CHECK(two.exec.cluster == 2);
  CHECK(!two.exec.gemm.dynamic_tiles);  // 2-CTA clusters walk their tiles statically
  // Shards of 128 rows cannot be split into row pairs of tiles.
  const Plan small =
      plan_for(parse("name: t\nop: ag_gemm\nshape: {m: 512, n: 28672, k: 8192}\nlayout: {nodes: 1, "
                     "gpus_per_node: 4}\nplan: {cluster: 2}\n"));
  CHECK(!small.exec.executable);
  CHECK(small.exec.not_executable.find("m / ranks (128) to be a multiple of 256 rows") != std::string::npos);
  // weftrun tune measures both cluster sizes for each compute count it lists.
  Workload w = parse(ag());
  const std::vector<Plan> cands = candidate_plans(w, plan_for(w), false);
  int ones = 0, twos = 0;
  for (const Plan& c : cands)
    if (c.exec.variant == "copy_engine") (c.exec.cluster == 2 ? twos : ones) += 1;
  CHECK(ones >= 1);
  CHECK(twos >= 1);
  CHECK(ones == twos);  // every compute count here is even
}

TEST_CASE("AllGather+GEMM on one node: copy engines, the whole gathered A and its words in the heap") {
  const Plan p = plan_for(parse(ag()));
  CHECK(p.exec.executable);
  CHECK(p.exec.variant == "copy_engine");
  CHECK(p.exec.copy_chunks == 1);
  CHECK(p.exec.cluster == 1);
  CHECK(p.exec.capturable);  // every stream operation's value is a constant token
  CHECK(p.intra_mover() == IntraMover::kCopyEngine);
  CHECK(p.roles.compute == p.sm_count);
  REQUIRE(p.region("ag_gemm.a") != nullptr);
  CHECK(p.region("ag_gemm.a")->bytes == uint64_t(8192) * 8192 * 2);
  REQUIRE(p.region("ag_gemm.gate") != nullptr);
  CHECK(p.region("ag_gemm.gate")->bytes == 4 * 8);
  CHECK(p.region("ag_gemm.ready") == nullptr);  // the copy engines push: no peer waits for another's call
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
  CHECK(p.region("ag_gemm.ready") != nullptr);  // the movers pull once each peer's shard is in place
  check_heap(p);
  // intra_comm 0 with fewer compute SMs: the copy engines on exactly those SMs.
  const Plan fewer = plan_for(parse(ag("roles: {compute: 128, intra_comm: 0}\n")));
  CHECK(fewer.exec.variant == "copy_engine");
  CHECK(fewer.roles.compute == 128);
  CHECK(plan_hash(fewer) != plan_hash(plan_for(parse(ag()))));
}

std::string plan_error(const Workload& w) {
  Plan p;
  std::string err;
  CHECK(tune(w, w.layout, {}, {}, machine_model_h200(), &p, &err) == Status::kInvalidArgument);
  return err;
}

TEST_CASE("the workload's plan: map is what runs, and chosen_by says so") {
  // Every ag_gemm choice of the copy-engine variant, with the GEMM's.
  const Plan ce =
      plan_for(parse(ag("plan:\n  variant: copy_engine\n  group_m: 4\n"
                        "  gemm: {split_tail: false, chunked_tail: false, dynamic_tiles: false, "
                        "tma_store: false}\n")));
  CHECK(ce.exec.executable);
  CHECK(ce.chosen_by == "workload");
  CHECK(ce.exec.variant == "copy_engine");
  CHECK(ce.exec.group_m == 4);
  CHECK(!ce.exec.gemm.split_tail);
  CHECK(!ce.exec.gemm.chunked_tail);
  CHECK(!ce.exec.gemm.dynamic_tiles);
  CHECK(!ce.exec.gemm.tma_store);
  const Plan model = plan_for(parse(ag()));
  CHECK(model.chosen_by == "model");
  CHECK(model.exec.gemm.split_tail);
  CHECK(model.exec.gemm.dynamic_tiles);
  CHECK(plan_hash(ce) != plan_hash(model));
  // Without the split tail the model predicts a whole last wave: never faster.
  CHECK(ce.role_time(weft::Role::kCompute) >= model.role_time(weft::Role::kCompute));
  // The SM movers with roles left to the tuner: it gives them intra_comm SMs; the mover as written.
  const Plan sm = plan_for(parse(ag("plan: {variant: sm_movers, sm_mover: push_bulk}\n")));
  CHECK(sm.exec.executable);
  CHECK(sm.exec.variant == "sm_movers");
  CHECK(sm.exec.sm_mover == "push_bulk");
  CHECK(sm.roles.intra_comm > 0);
  CHECK(sm.intra_mover() == IntraMover::kSm);
  REQUIRE(sm.region("ag_gemm.flags") != nullptr);
  // GEMM+RS: the reduction's blocks and a 2-CTA GEMM (even grid), dynamic tiles off with it.
  const Plan rs =
      plan_for(parse("name: t\nop: gemm_rs\nshape: {m: 8192, n: 8192, k: 7168}\nlayout: {nodes: 1, gpus_per_node: 4}\n"
                     "plan: {variant: peer, reduce_blocks: 64, cluster: 2}\n"));
  CHECK(rs.exec.executable);
  CHECK(rs.exec.reduce_blocks == 64);
  CHECK(rs.exec.cluster == 2);
  CHECK(!rs.exec.gemm.dynamic_tiles);
  CHECK(rs.chosen_by == "workload");
  // The executed form carries the choices: it reads back to the same plan.
  Plan back;
  std::string err;
  REQUIRE(parse_executed_json(executed_json(ce), &back, &err) == Status::kOk);
  CHECK(plan_hash(back) == plan_hash(ce));
  CHECK(!back.exec.gemm.tma_store);
  // tune measures nothing against a plan: map.
  const std::vector<Plan> c =
      candidate_plans(parse(ag("plan: {group_m: 8}\n")), plan_for(parse(ag("plan: {group_m: 8}\n"))), false);
  REQUIRE(c.size() == 1);
  CHECK(c[0].exec.group_m == 8);
}

TEST_CASE("plan: choices that do not apply are refused with file:line:col and the reason") {
  CHECK(plan_error(parse(ag("plan: {variant: peer}\n"))) ==
        "t.yaml:5:17: plan.variant: peer is a variant of gemm_rs and gemm_ar; expected copy_engine or sm_movers");
  CHECK(plan_error(parse(ag("plan: {variant: overlap}\n"))).find("plan.variant: overlap is a variant of gemm_rs") !=
        std::string::npos);
  CHECK(plan_error(parse(ag("plan: {pieces: 2}\n"))).find("plan.pieces: a choice of gemm_rs and gemm_ar's overlap") !=
        std::string::npos);
  CHECK(plan_error(parse(ag("roles: {compute: 120, intra_comm: 12}\nplan: {variant: copy_engine}\n")))
            .rfind("t.yaml:6:17: plan.variant: copy_engine moves the shards without SMs, but roles.intra_comm is 12",
                   0) == 0);
  CHECK(plan_error(parse(ag("roles: {compute: 120, intra_comm: 0}\nplan: {variant: sm_movers}\n")))
            .find("plan.variant: sm_movers moves the shards on intra_comm SMs, but roles.intra_comm is 0") !=
        std::string::npos);
  CHECK(plan_error(parse(ag("plan: {sm_mover: pull_vec}\n")))
            .rfind("t.yaml:5:18: plan.sm_mover: only the sm_movers variant has SM movers", 0) == 0);
  CHECK(plan_error(parse(ag("plan: {variant: sm_movers, copy_chunks: 2}\n")))
            .find("plan.copy_chunks: only the copy_engine variant copies shards") != std::string::npos);
  CHECK(plan_error(parse(ag("plan: {reduce_blocks: 8}\n"))).find("plan.reduce_blocks: ag_gemm has no reduction") !=
        std::string::npos);
  CHECK(plan_error(parse(ag("plan: {cluster: 2, gemm: {dynamic_tiles: true}}\n")))
            .find("plan.gemm.dynamic_tiles: true, but 2-CTA clusters walk their tiles statically") !=
        std::string::npos);
  const std::string rs =
      "name: t\nop: gemm_rs\nshape: {m: 8192, n: 8192, k: 7168}\nlayout: {nodes: 1, gpus_per_node: 4}\n";
  CHECK(plan_error(parse(rs + "plan: {variant: copy_engine}\n")) ==
        "t.yaml:5:17: plan.variant: copy_engine is a variant of ag_gemm; expected peer or overlap for gemm_rs");
  CHECK(plan_error(parse(rs + "plan: {sm_mover: pull_vec}\n")).find("plan.sm_mover: gemm_rs has no SM movers") !=
        std::string::npos);
  // Ops and layouts without runtime variants take no plan: map.
  CHECK(plan_error(parse(ag("plan: {group_m: 8}\n", 2, 2)))
            .rfind("t.yaml:5:7: plan: ag_gemm across nodes has no execution choices", 0) == 0);
  // moe takes two keys, its variant and split_k; split_k belongs to moe only.
  const std::string moe = "name: t\nop: moe\nshape: {tokens: 4096, hidden: 4096, ffn: 1024, experts: 8, topk: 2}\n";
  CHECK(plan_error(parse(moe + "plan: {group_m: 8}\n")).find("plan: moe has two execution choices") !=
        std::string::npos);
  CHECK(plan_error(parse(rs + "plan: {split_k: 1}\n"))
            .find("plan.split_k: the split of the MoE expert FFN's down projection; gemm_rs has none") !=
        std::string::npos);
  CHECK(plan_error(parse(moe + "plan: {variant: overlap}\n"))
            .find("plan.variant: overlap is not a variant of moe on this layout; expected staged or ffn_combine") !=
        std::string::npos);
  CHECK(plan_error(parse(rs + "plan: {variant: ffn_combine}\n"))
            .find("plan.variant: ffn_combine is a variant of moe; expected peer or overlap for gemm_rs") !=
        std::string::npos);
  CHECK(plan_error(parse(ag("plan: {variant: staged}\n")))
            .find("plan.variant: staged is a variant of moe; expected copy_engine or sm_movers for ag_gemm") !=
        std::string::npos);
}

TEST_CASE("plan: choices this build's op does not run make the plan not runnable, naming the line") {
  const Plan cl = plan_for(parse(ag("roles: {compute: 131}\nplan: {cluster: 2}\n")));
  CHECK(!cl.exec.executable);
  CHECK(cl.exec.not_executable.rfind("t.yaml:6:17: plan.cluster: 2: 2-CTA clusters need m / ranks (2048) to be a "
                                     "multiple of 256 rows and an even number of compute SMs and of SMs in all (the "
                                     "plan has 131 and 131)",
                                     0) == 0);
  const Plan sm = plan_for(parse(ag("roles: {compute: 124, intra_comm: 8}\nplan: {cluster: 2}\n")));
  CHECK(!sm.exec.executable);
  CHECK(sm.exec.not_executable.find("plan.cluster: 2: the SM movers' kernel runs 1-CTA clusters") != std::string::npos);
  const Plan ch = plan_for(parse(ag("plan: {copy_chunks: 4}\n")));
  CHECK(!ch.exec.executable);
  CHECK(ch.exec.not_executable.find("plan.copy_chunks: 4: this build's ag_gemm op makes one copy per shard") !=
        std::string::npos);
  const Plan rb =
      plan_for(parse("name: t\nop: gemm_ar\nshape: {m: 8192, n: 8192, k: 7168}\nlayout: {nodes: 1, gpus_per_node: 4}\n"
                     "plan: {reduce_blocks: 4000}\n"));
  CHECK(!rb.exec.executable);
  CHECK(rb.exec.not_executable.find("plan.reduce_blocks: 4000: the reduction's blocks wait for their peers") !=
        std::string::npos);
  const Plan odd =
      plan_for(parse("name: t\nop: gemm_rs\nshape: {m: 8192, n: 8192, k: 7168}\nlayout: {nodes: 1, gpus_per_node: 4}\n"
                     "roles: {compute: 131}\nplan: {cluster: 2}\n"));
  CHECK(!odd.exec.executable);
  CHECK(odd.exec.not_executable.find("plan.cluster: 2: the GEMM's grid and its compute blocks must be even") !=
        std::string::npos);
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
  // A shard that is not whole tile rows.
  const Plan odd =
      plan_for(parse("name: t\nop: ag_gemm\nshape: {m: 4160, n: 4096, k: 4096}\nlayout: {nodes: 1, "
                     "gpus_per_node: 4}\n"));
  CHECK(!odd.exec.executable);
  CHECK(odd.exec.not_executable.find("shape.m: m / ranks = 1040 rows") != std::string::npos);
}

TEST_CASE("AllGather+GEMM across nodes: the hierarchical variant, its chunks, channels and heap, refusals") {
  const Plan p = plan_for(parse(ag("", 2, 2)));
  REQUIRE_MESSAGE(p.exec.executable, p.exec.not_executable);
  CHECK(p.exec.variant == "hierarchical");
  CHECK(p.exec.copy_chunks == 8);  // 2048 rows per shard: 16 tiles, at most 8 chunks
  CHECK(p.exec.channels == 4);
  CHECK(!p.exec.capturable);  // the calls' waits carry their epoch
  CHECK(!p.exec.gemm.split_tail);
  CHECK(!p.exec.gemm.dynamic_tiles);
  CHECK(p.roles.inter_send >= 1);
  CHECK(p.roles.intra_comm >= 1);  // two GPUs per node: the forwards
  REQUIRE(p.region("ag_nodes.a") != nullptr);
  CHECK(p.region("ag_nodes.a")->bytes == uint64_t(8192) * 8192 * 2);
  REQUIRE(p.region("ag_nodes.flags") != nullptr);
  CHECK(p.region("ag_nodes.flags")->bytes == 4 * 8 * 8);
  REQUIRE(p.region("ag_nodes.freed") != nullptr);
  CHECK(p.region("ag_nodes.freed")->bytes == 2 * 4 * 8);
  REQUIRE(p.region("ag_nodes.ready") != nullptr);
  check_heap(p);
  // The plan's JSON carries the channels and reads back to the same plan.
  Plan back;
  std::string error;
  REQUIRE_MESSAGE(parse_executed_json(executed_json(p), &back, &error) == Status::kOk, error);
  CHECK(back.exec.channels == 4);
  CHECK(back.exec.signal_mode == "batched");
  CHECK(plan_hash(back) == plan_hash(p));
  // The workload's signal mode is the plan's (the op's transport runs it).
  const Plan fenced = plan_for(parse(ag("transport: {signal_mode: fenced}\n", 2, 2)));
  CHECK(fenced.exec.signal_mode == "fenced");
  CHECK(plan_hash(fenced) != plan_hash(p));
  // One GPU per node: no forwards, so no intra_comm SM needed.
  const Plan four = plan_for(parse(ag("", 4, 1)));
  CHECK_MESSAGE(four.exec.executable, four.exec.not_executable);
  // Explicit roles run as written.
  const Plan roles = plan_for(parse(ag("roles: {compute: 126, intra_comm: 4, inter_send: 2}\n", 2, 2)));
  CHECK(roles.exec.executable);
  CHECK(roles.roles.intra_comm == 4);
  CHECK(roles.roles.inter_send == 2);
  // More ranks than the kernel's scatter epilogue holds.
  const Plan big =
      plan_for(parse("name: t\nop: ag_gemm\nshape: {m: 65536, n: 65536, k: 8192}\nlayout: {nodes: 8, "
                     "gpus_per_node: 8}\n"));
  CHECK(!big.exec.executable);
  CHECK(big.exec.not_executable.find("at most 32") != std::string::npos);
}

TEST_CASE("GEMM+RS and GEMM+AR across nodes: the hierarchical variant, its pieces, roles and heap, refusals") {
  for (const char* op : {"gemm_rs", "gemm_ar"}) {
    CAPTURE(op);
    const std::string base = std::string("name: t\nop: ") + op +
                             "\nshape: {m: 8192, n: 8192, k: 7168}\nlayout: {nodes: 2, gpus_per_node: 2}\n";
    const Plan p = plan_for(parse(base));
    REQUIRE_MESSAGE(p.exec.executable, p.exec.not_executable);
    CHECK(p.exec.variant == "hierarchical");
    CHECK(p.exec.pieces == 8);  // 2048 rows of 16 KiB: 8 pieces of 4 MiB
    CHECK(p.exec.channels == 4);
    CHECK(!p.exec.capturable);
    CHECK(p.exec.gemm.tma_store);
    CHECK(!p.exec.gemm.dynamic_tiles);
    CHECK(p.roles.inter_send == 1);
    CHECK(p.roles.intra_comm == 0);
    CHECK(p.roles.inter_reduce == 0);
    CHECK(p.roles.compute == p.sm_count - 1);
    REQUIRE(p.region("gemm_reduce_nodes.partial") != nullptr);
    CHECK(p.region("gemm_reduce_nodes.partial")->bytes == uint64_t(8192) * 8192 * 2);
    CHECK((p.region("gemm_reduce_nodes.c") != nullptr) == (std::string(op) == "gemm_ar"));
    REQUIRE(p.region("gemm_reduce_nodes.rail_freed") != nullptr);
    check_heap(p);
    Plan back;
    std::string error;
    REQUIRE_MESSAGE(parse_executed_json(executed_json(p), &back, &error) == Status::kOk, error);
    CHECK(back.exec.pieces == 8);
    CHECK(plan_hash(back) == plan_hash(p));
  }
}

TEST_CASE("GEMM+RS and GEMM+AR on one node: the peer variant, its heap, refusals") {
  const std::string rs =
      "name: t\nop: gemm_rs\nshape: {m: 8192, n: 8192, k: 7168}\nlayout: {nodes: 1, gpus_per_node: "
      "4}\nplan: {variant: peer}\n";
  const Plan p = plan_for(parse(rs));
  CHECK(p.exec.executable);
  CHECK(p.exec.variant == "peer");
  CHECK(!p.exec.capturable);
  CHECK(p.exec.reduce_blocks == 16);  // the reduction's default: at most 16 blocks of 512 threads
  REQUIRE(p.region("gemm_reduce.partial") != nullptr);
  CHECK(p.region("gemm_reduce.partial")->bytes == 2 * uint64_t(8192) * 8192 * 2);  // two copies
  CHECK(p.region("gemm_reduce.c") == nullptr);
  CHECK(p.region("gemm_reduce.flags")->bytes == 9 * 8);  // ready and gathered per rank, the tile count
  CHECK(p.region("gemm_reduce.arrive") == nullptr);
  for (int blocks : {p.sm_count, p.sm_count + 1}) {  // one per SM: all resident; one more: refused
    std::string wide = rs;
    wide.replace(wide.find("variant: peer"), 13, "variant: peer, reduce_blocks: " + std::to_string(blocks));
    const Plan b = plan_for(parse(wide));
    CHECK(b.exec.executable == (blocks == p.sm_count));
    if (blocks == p.sm_count) CHECK(b.exec.reduce_blocks == blocks);
    if (blocks > p.sm_count) CHECK(b.exec.not_executable.find("at most 1 per SM") != std::string::npos);
  }
  check_heap(p);
  std::string ar = rs;
  ar.replace(ar.find("gemm_rs"), 7, "gemm_ar");
  const Plan a = plan_for(parse(ar));
  CHECK(a.exec.executable);
  REQUIRE(a.region("gemm_reduce.c") != nullptr);
  check_heap(a);
  // A rank's row block must be whole 16-byte vectors: 100 / 4 rows x 4100 columns is not.
  std::string narrow = rs;
  narrow.replace(narrow.find("m: 8192, n: 8192"), 16, "m: 100, n: 4100");
  const Plan nv = plan_for(parse(narrow));
  CHECK(!nv.exec.executable);
  CHECK(nv.exec.not_executable.find("shape.n: 4100: the peer variant reduces 16-byte vectors") != std::string::npos);
  std::string odd = rs;
  odd.replace(odd.find("k: 7168"), 7, "k: 7180");
  const Plan o = plan_for(parse(odd));
  CHECK(!o.exec.executable);
  CHECK(o.exec.not_executable.find("shape.k") != std::string::npos);
  std::string two = rs.substr(0, rs.find("plan:"));
  two.replace(two.find("nodes: 1, gpus_per_node: 4"), 26, "nodes: 2, gpus_per_node: 2");
  const Plan t = plan_for(parse(two));  // across nodes: the hierarchical variant (its own case)
  CHECK(t.exec.executable);
  CHECK(t.exec.variant == "hierarchical");
}

TEST_CASE("GEMM+RS and GEMM+AR's overlap variant: its choices, mover SMs and heap as planned, or refused") {
  const std::string rs =
      "name: t\nop: gemm_rs\nshape: {m: 8192, n: 8192, k: 7168}\nlayout: {nodes: 1, gpus_per_node: 4}\n";
  std::string ar = rs;
  ar.replace(ar.find("gemm_rs"), 7, "gemm_ar");
  // RS: 2048 rows per rank in 4 pieces of 8 MiB, own rows last, copy sends and 4 mover SMs.
  const Plan p = plan_for(parse(rs + "plan: {variant: overlap}\n"));
  REQUIRE(p.exec.executable);
  CHECK(p.exec.variant == "overlap");
  CHECK(p.exec.pieces == 4);
  CHECK(p.exec.lag == 4);
  CHECK(p.exec.send == "copy");
  CHECK(p.exec.gather.empty());
  CHECK(p.exec.reduce_blocks == 0);
  CHECK(!p.exec.capturable);
  CHECK(p.roles.intra_comm == 4);
  CHECK(p.roles.compute == p.sm_count - 4);
  CHECK(p.roles.total() == p.sm_count);
  for (const char* r : {"gemm_reduce.partial", "gemm_reduce.staging"}) {
    REQUIRE(p.region(r) != nullptr);
    CHECK(p.region(r)->bytes == uint64_t(8192) * 8192 * 2);
  }
  CHECK(p.region("gemm_reduce.c") == nullptr);
  for (const char* r :
       {"gemm_reduce.arrived", "gemm_reduce.landed", "gemm_reduce.moved", "gemm_reduce.tiles", "gemm_reduce.gate"}) {
    REQUIRE(p.region(r) != nullptr);
    CHECK(p.region(r)->bytes == 4 * 4 * 8);
  }
  REQUIRE(p.region("gemm_reduce.freed") != nullptr);
  CHECK(p.region("gemm_reduce.freed")->bytes == 4 * 8);
  check_heap(p);
  // Its GEMM walks tiles statically and splits its tail into K-slices only: the plan says so.
  CHECK(!p.exec.gemm.dynamic_tiles);
  CHECK(!p.exec.gemm.chunked_tail);
  CHECK(p.exec.gemm.split_tail);
  const std::string table = format_plan_table(p);
  CHECK(table.find("4 intra_comm SMs push each round's last owner's pieces") != std::string::npos);
  CHECK(table.find("runs the peer variant") == std::string::npos);
  CHECK(table.find("no intra_comm SM") == std::string::npos);
  CHECK(format_plan_table(plan_for(parse(rs + "plan: {variant: peer}\n"))).find("runs the peer variant") !=
        std::string::npos);
  // Only an overlap plan carries the overlap's fields: other plans (and their hashes) are unchanged.
  CHECK(executed_json(p).find("\"pieces\"") != std::string::npos);
  CHECK(executed_json(plan_for(parse(rs + "plan: {variant: peer}\n"))).find("\"pieces\"") == std::string::npos);
  CHECK(format_plan_table(p).find("runs     overlap, 4 pieces per rank's rows, own lag 4, sends by the copy engines "
                                  "and 4 mover SMs") != std::string::npos);
  Plan back;
  std::string err;
  REQUIRE(parse_executed_json(executed_json(p), &back, &err) == Status::kOk);
  CHECK(plan_hash(back) == plan_hash(p));
  CHECK(back.exec.pieces == 4);
  CHECK(back.exec.send == "copy");
  // AR: the epilogue sends and gathers, own piece one round late, no mover SM.
  const Plan a = plan_for(parse(ar + "plan: {variant: overlap}\n"));
  REQUIRE(a.exec.executable);
  CHECK(a.exec.send == "sm");
  CHECK(a.exec.gather == "sm");
  CHECK(a.exec.lag == 1);
  CHECK(a.roles.intra_comm == 0);
  REQUIRE(a.region("gemm_reduce.c") != nullptr);
  check_heap(a);
  // As written: pieces, lag, copy sends with pushes; explicit roles set the mover SMs.
  const Plan w = plan_for(parse(ar + "roles: {compute: 120, intra_comm: 8}\n"
                                     "plan: {variant: overlap, pieces: 2, lag: 2, send: copy, gather: push}\n"));
  REQUIRE_MESSAGE(w.exec.executable, w.exec.not_executable);
  CHECK(w.exec.pieces == 2);
  CHECK(w.exec.lag == 2);
  CHECK(w.exec.gather == "push");
  CHECK(w.roles.compute == 120);
  CHECK(w.roles.intra_comm == 8);
  for (const auto& n : w.notes) CHECK_MESSAGE(n.find("will idle") == std::string::npos, n);
  // Two ranks: no round has a last owner for the movers.
  std::string two = rs;
  two.replace(two.find("gpus_per_node: 4"), 16, "gpus_per_node: 2");
  const Plan t = plan_for(parse(two + "plan: {variant: overlap}\n"));
  REQUIRE(t.exec.executable);
  CHECK(t.roles.intra_comm == 0);
  CHECK(t.roles.compute == t.sm_count);
  // Refused, naming the key.
  auto refused = [&](const std::string& text, const std::string& what) {
    const Plan r = plan_for(parse(text));
    CHECK_MESSAGE(!r.exec.executable, text);
    CHECK_MESSAGE(r.exec.not_executable.find(what) != std::string::npos, r.exec.not_executable);
  };
  refused(rs + "plan: {variant: overlap, pieces: 3}\n", "plan.pieces: 3: each rank's 2048 rows must split");
  refused(rs + "plan: {variant: overlap, lag: 8}\n", "plan.lag: 8: expected 1 to the 4 pieces");
  CHECK(plan_error(parse(rs + "roles: {compute: 124, intra_comm: 8}\nplan: {variant: overlap, send: sm}\n"))
            .find("roles.intra_comm: 8 mover SMs, but plan.send is sm") != std::string::npos);
  CHECK(plan_error(parse(rs + "plan: {variant: overlap, pieces: 2, lag: 3}\n"))
            .find("plan.lag: 3, but plan.pieces is 2") != std::string::npos);
  refused(two + "roles: {compute: 124, intra_comm: 8}\nplan: {variant: overlap}\n", "roles.intra_comm: 8 mover SMs");
  refused(rs + "plan: {variant: overlap, cluster: 2}\n", "plan.cluster: 2: the overlap variant runs 1-CTA clusters");
  refused(rs + "plan: {variant: overlap, gemm: {dynamic_tiles: true}}\n",
          "plan.gemm.dynamic_tiles: true: the overlap variant's GEMM walks its tiles statically");
  refused(rs + "plan: {variant: overlap, gemm: {chunked_tail: true}}\n", "plan.gemm.chunked_tail: true");
  std::string small = ar;
  small.replace(small.find("m: 8192"), 7, "m: 256");
  refused(small + "plan: {variant: overlap}\n", "shape.m: 256: the overlap variant needs m / ranks");
  CHECK(plan_error(parse(rs + "plan: {variant: overlap, gather: sm}\n")).find("plan.gather: gemm_rs gathers nothing") !=
        std::string::npos);
  CHECK(plan_error(parse(rs + "plan: {pieces: 2}\n")).find("plan.pieces: a choice of the overlap variant") !=
        std::string::npos);
  CHECK(plan_error(parse(rs + "plan: {variant: overlap, reduce_blocks: 8}\n"))
            .find("plan.reduce_blocks: the peer variant's reduction kernel") != std::string::npos);
}

TEST_CASE("GEMM+RS and GEMM+AR's model plan: the overlap variant where it can run as planned, else peer") {
  auto plan_of = [](const std::string& op, int64_t m, const std::string& extra) {
    return plan_for(parse("name: t\nop: " + op + "\nshape: {m: " + std::to_string(m) +
                          ", n: 8192, k: 7168}\nlayout: {nodes: 1, gpus_per_node: 4}\n" + extra));
  };
  // RS 8192: 32 MiB per rank's rows, copy sends and 4 mover SMs, the same plan as variant: overlap.
  const Plan rs = plan_of("gemm_rs", 8192, "");
  REQUIRE(rs.exec.executable);
  CHECK(rs.exec.variant == "overlap");
  CHECK(rs.exec.send == "copy");
  CHECK(rs.roles.intra_comm == 4);
  CHECK(rs.chosen_by == "model");
  CHECK(plan_hash(rs) == plan_hash(plan_of("gemm_rs", 8192, "plan: {variant: overlap}\n")));
  // RS 2048: 8 MiB per rank's rows, under the 16 MiB a copy's latency hides behind: the epilogue sends.
  const Plan small = plan_of("gemm_rs", 2048, "");
  REQUIRE(small.exec.executable);
  CHECK(small.exec.variant == "overlap");
  CHECK(small.exec.send == "sm");
  CHECK(small.exec.pieces == 4);
  CHECK(small.roles.intra_comm == 0);
  CHECK(small.roles.compute == small.sm_count);
  // AR 8192: the epilogue sends and gathers.
  const Plan ar = plan_of("gemm_ar", 8192, "");
  CHECK(ar.exec.variant == "overlap");
  CHECK(ar.exec.send == "sm");
  CHECK(ar.exec.gather == "sm");
  // Where the overlap variant cannot run as planned: peer, executable.
  const Plan tiny = plan_of("gemm_ar", 256, "");  // 64 rows per rank: not whole tiles
  CHECK(tiny.exec.executable);
  CHECK(tiny.exec.variant == "peer");
  CHECK(tiny.exec.reduce_blocks == 16);
  for (const char* extra : {"plan: {reduce_blocks: 64}\n", "plan: {cluster: 2}\n", "plan: {variant: peer}\n"}) {
    CAPTURE(extra);
    const Plan peer = plan_of("gemm_rs", 8192, extra);
    CHECK_MESSAGE(peer.exec.executable, peer.exec.not_executable);
    CHECK(peer.exec.variant == "peer");
    CHECK(peer.exec.reduce_blocks > 0);
    REQUIRE(peer.region("gemm_reduce.partial") != nullptr);
    CHECK(peer.region("gemm_reduce.staging") == nullptr);  // the overlap variant's slots are not there
  }
  // Roles written for the peer variant that the overlap variant cannot take: peer, as written.
  const Plan roles = plan_of("gemm_ar", 8192, "roles: {compute: 124, intra_comm: 8}\n");
  CHECK_MESSAGE(roles.exec.executable, roles.exec.not_executable);
  CHECK(roles.exec.variant == "peer");
  CHECK(roles.roles.intra_comm == 8);
  // Two ranks: no round has a last owner for the movers; copy sends alone.
  const Plan two = plan_for(
      parse("name: t\nop: gemm_rs\nshape: {m: 8192, n: 8192, k: 7168}\nlayout: {nodes: 1, gpus_per_node: 2}\n"));
  CHECK(two.exec.variant == "overlap");
  CHECK(two.roles.intra_comm == 0);
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
           {"\"gpus_per_node\":4", "\"gpus_per_node\":4000", "plan: layout:"},
           // The mover is the variant's: a plan saying otherwise is refused, not half believed.
           {"\"intra_mover\":\"copy_engine\"", "\"intra_mover\":\"sm\"",
            "plan: intra_mover: sm disagrees with execution.variant 'copy_engine'"}}) {
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
  CHECK(why.find("the grid had 132 blocks, 128 ran per launch") != std::string::npos);
}

TEST_CASE("moe: the expert FFN's recorded K parts within the plan's split_k, or the run is refused") {
  const std::string moe =
      "name: t\nop: moe\nshape: {tokens: 1024, hidden: 4096, ffn: 14336, experts: 8, topk: 2}\n"
      "layout: {nodes: 1, gpus_per_node: 4}\n";
  const Plan split = plan_for(parse(moe));
  const Plan never = plan_for(parse(moe + "plan: {split_k: 1}\n"));
  weft::kernels::LaunchRecord rec{};
  std::string why;
  CHECK(!check_moe_split(rec, split, &why));  // nothing recorded: no FFN ran
  CHECK(why.find("no expert FFN launch recorded") != std::string::npos);
  for (int parts = 1; parts <= 4; ++parts) {
    CAPTURE(parts);
    rec.parts = parts;
    CHECK(check_moe_split(rec, split, &why));
    CHECK(check_moe_split(rec, never, &why) == (parts == 1));
  }
  rec.parts = 2;
  CHECK(!check_moe_split(rec, never, &why));
  CHECK(why.find("ran a projection in 2 K parts; the plan's split_k allows 1 to 1") != std::string::npos);
  rec.parts = 5;
  CHECK(!check_moe_split(rec, split, &why));
}

TEST_CASE("GEMM+RS/AR overlap: pieces, lag, send and gather come from the GEMM's record of its schedule") {
  auto plan = [](const char* op) {
    return plan_for(parse(std::string("name: t\nop: ") + op +
                          "\nshape: {m: 8192, n: 8192, k: 7168}\nlayout: {nodes: 1, gpus_per_node: 4}\n"));
  };
  weft::kernels::LaunchRecord rec{};
  rec.launches = 1;
  rec.kernel = int32_t(weft::kernels::KernelKind::kGemmReduceSlots);
  rec.shards = 8;
  rec.lag = 1;
  Plan rs = plan("gemm_rs");
  REQUIRE(rs.exec.variant == "overlap");
  REQUIRE(rs.exec.pieces == 4);  // the plan says 4 pieces; the record below says what ran
  std::string why;
  REQUIRE(apply_reduce_schedule(rec, &rs, &why));
  CHECK(rs.exec.pieces == 2);
  CHECK(rs.exec.lag == 1);
  CHECK(rs.exec.send == "copy");
  CHECK(rs.exec.gather.empty());
  rec.epilogue = weft::kernels::kEpilogueRemotePartials;
  REQUIRE(apply_reduce_schedule(rec, &rs, &why));
  CHECK(rs.exec.send == "sm");
  Plan ar = plan("gemm_ar");
  rec.shards = 16;
  rec.epilogue = weft::kernels::kEpilogueRemotePartials | weft::kernels::kEpilogueBroadcast;
  REQUIRE(apply_reduce_schedule(rec, &ar, &why));
  CHECK(ar.exec.pieces == 4);
  CHECK(ar.exec.send == "sm");
  CHECK(ar.exec.gather == "sm");
  rec.epilogue = 0;
  REQUIRE(apply_reduce_schedule(rec, &ar, &why));
  CHECK(ar.exec.send == "copy");
  CHECK(ar.exec.gather == "push");
  // Refused: a ReduceScatter epilogue that broadcast, shards that are not ranks x pieces, a lag past
  // the pieces or none (rotated order), another kernel's record, no launch.
  rec.epilogue = weft::kernels::kEpilogueBroadcast;
  CHECK(!apply_reduce_schedule(rec, &rs, &why));
  CHECK(why.find("GEMM+RS epilogue stored reduced tiles") != std::string::npos);
  rec.epilogue = 0;
  rec.shards = 10;
  CHECK(!apply_reduce_schedule(rec, &rs, &why));
  CHECK(why.find("10 shards, not a multiple of the 4 ranks") != std::string::npos);
  rec.shards = 16;
  for (int lag : {0, 5}) {
    rec.lag = lag;
    CHECK(!apply_reduce_schedule(rec, &rs, &why));
    CHECK(why.find("lag " + std::to_string(lag)) != std::string::npos);
  }
  rec.lag = 4;
  REQUIRE(apply_reduce_schedule(rec, &rs, &why));
  rec.kernel = int32_t(weft::kernels::KernelKind::kGemm);
  CHECK(!apply_reduce_schedule(rec, &rs, &why));
  rec.kernel = int32_t(weft::kernels::KernelKind::kGemmReduceSlots);
  rec.launches = 0;
  CHECK(!apply_reduce_schedule(rec, &rs, &why));
}

TEST_CASE("moe: the staged op with every SM computing and its heap; across nodes the hierarchical variant") {
  auto moe = [](const std::string& shape, int nodes, int gpus, const std::string& extra = "") {
    return "name: t\nop: moe\nshape: " + shape + "\nlayout: {nodes: " + std::to_string(nodes) +
           ", gpus_per_node: " + std::to_string(gpus) + "}\n" + extra;
  };
  const Plan p = plan_for(parse(moe("{tokens: 16384, hidden: 4096, ffn: 14336, experts: 8, topk: 2}", 1, 4)));
  REQUIRE(p.exec.executable);
  CHECK(p.exec.variant == "staged");
  CHECK(p.exec.capturable);
  CHECK(p.roles.intra_comm == 0);
  CHECK(p.roles.inter_send == 0);
  CHECK(p.roles.compute == p.sm_count);
  weft::kernels::MoeShape s;
  s.tokens = 4096, s.hidden = 4096, s.ffn = 14336, s.experts = 8, s.topk = 2, s.world = 4;
  weft::kernels::MoeHeapLayout h;
  const char* why = nullptr;
  REQUIRE(weft::kernels::moe_heap_layout(s, 0, &h, &why));  // WEFT_HEAP_BYTES unset: the worst case
  CHECK(p.heap_bytes == uint64_t(h.total_bytes));
  REQUIRE(p.region("moe.y") != nullptr);
  CHECK(p.region("moe.y")->bytes == uint64_t(h.grouped_rows * 4096 * 2));
  CHECK(h.grouped_rows == weft::kernels::moe_worst_grouped_rows(s));
  REQUIRE(p.region("moe.recv") != nullptr);
  CHECK(p.region("moe.recv")->bytes == uint64_t(4 * 4096 * weft::kernels::moe_slot_bytes(4096)));
  REQUIRE(p.region("moe.combine") != nullptr);
  CHECK(p.region("moe.combine")->offset == uint64_t(h.combine_offset));
  REQUIRE(p.region("moe.flags") != nullptr);
  CHECK(p.region("moe.flags")->bytes == (4 * 2 + 4 * 32) * 8);  // 2 W flags, W x 32 token tiles' comb_done

  // The FFN's K split (down, and gate/up's last wave): up to 4 parts where they fit one wave, unless the
  // workload caps it;
  // the cap reaches the printed plan, its JSON (and so its hash) and the model's prediction.
  CHECK(p.exec.split_k == weft::kernels::kMoeMaxSplit);
  CHECK(format_plan_table(p).find("split over K (up to 4 parts") != std::string::npos);
  const Plan capped = plan_for(
      parse(moe("{tokens: 1024, hidden: 4096, ffn: 14336, experts: 8, topk: 2}", 1, 4, "plan: {split_k: 1}\n")));
  REQUIRE(capped.exec.executable);
  CHECK(capped.exec.split_k == 1);
  CHECK(capped.chosen_by == "workload");
  CHECK(format_plan_table(capped).find("no K split") != std::string::npos);
  Plan back;
  std::string perr;
  REQUIRE(parse_executed_json(executed_json(capped), &back, &perr) == Status::kOk);
  CHECK(back.exec.split_k == 1);
  const Plan decode = plan_for(parse(moe("{tokens: 1024, hidden: 4096, ffn: 14336, experts: 8, topk: 2}", 1, 4)));
  CHECK(plan_hash(decode) != plan_hash(capped));
  REQUIRE(parse_executed_json(executed_json(decode), &back, &perr) == Status::kOk);
  CHECK(back.exec.split_k == weft::kernels::kMoeMaxSplit);

  // The FFN, combine and home reduction in one launch, as the workload asks: the same heap.
  const Plan fused = plan_for(parse(
      moe("{tokens: 16384, hidden: 4096, ffn: 14336, experts: 8, topk: 2}", 1, 4, "plan: {variant: ffn_combine}\n")));
  REQUIRE(fused.exec.executable);
  CHECK(fused.exec.variant == "ffn_combine");
  CHECK(fused.heap_bytes == p.heap_bytes);
  CHECK(fused.roles.compute == p.roles.compute);

  // A stated heap budget below the worst case: counts first, the grouped rows the budget leaves.
  setenv("WEFT_HEAP_BYTES", std::to_string(h.x_offset + 20000LL * (2 * 4096 + 14336) * 2).c_str(), 1);
  const Plan budget = plan_for(parse(moe("{tokens: 16384, hidden: 4096, ffn: 14336, experts: 8, topk: 2}", 1, 4)));
  unsetenv("WEFT_HEAP_BYTES");
  REQUIRE(budget.exec.executable);
  REQUIRE(budget.region("moe.y") != nullptr);
  CHECK(budget.region("moe.y")->bytes == uint64_t(19968) * 4096 * 2);  // 20000 rows, whole 128-row tiles
  bool noted = false;
  for (const auto& n : budget.notes) noted |= n.find("counts first") == 0;
  CHECK(noted);
  setenv("WEFT_HEAP_BYTES", "1000000", 1);
  const Plan tiny = plan_for(parse(moe("{tokens: 16384, hidden: 4096, ffn: 14336, experts: 8, topk: 2}", 1, 4)));
  unsetenv("WEFT_HEAP_BYTES");
  CHECK(!tiny.exec.executable);
  CHECK(tiny.exec.not_executable.find("heap budget too small") != std::string::npos);

  // Across nodes: the hierarchical variant, the cross-node regions after the one-node ones.
  const Plan two = plan_for(parse(moe("{tokens: 8192, hidden: 2048, ffn: 1408, experts: 64, topk: 6}", 2, 2)));
  REQUIRE(two.exec.executable);
  CHECK(two.exec.variant == "hierarchical");
  CHECK(two.exec.capturable);
  CHECK(two.exec.channels >= 1);
  weft::kernels::MoeShape s2;
  s2.tokens = 2048, s2.hidden = 2048, s2.ffn = 1408, s2.experts = 64, s2.topk = 6, s2.world = 4;
  weft::kernels::MoeHeapLayout h2;
  REQUIRE(weft::kernels::moe_heap_layout(s2, 0, &h2, &why));
  weft::kernels::MoeNodesHeap n2;
  REQUIRE(weft::kernels::moe_nodes_heap(s2, 2, 2, two.exec.channels, h2.total_bytes, &n2, &why));
  CHECK(two.heap_bytes == uint64_t(n2.total_bytes));
  REQUIRE(two.region("moe.rail_out") != nullptr);
  CHECK(two.region("moe.rail_out")->offset == uint64_t(h2.total_bytes));  // right after the one-node layout
  CHECK(two.region("moe.rail_out")->bytes == 2 * uint64_t(n2.block_bytes));
  REQUIRE(two.region("moe.node_comb") != nullptr);
  CHECK(two.region("moe.node_comb")->bytes == uint64_t(2 * 2 * 2048) * 2048 * 2);  // [node][mate][token] rows
  REQUIRE(two.region("moe.rail_flags") != nullptr);
  CHECK(two.region("moe.rail_flags")->bytes == uint64_t(2 * 2 * two.exec.channels) * 8);  // [2 N][C]
  // A block holds the route (count word + T slots) and T compact slots.
  CHECK(n2.block_bytes >= int64_t(16 + 4 * 2048) + 2048 * weft::kernels::moe_slot_bytes(2048));
  for (const auto& r : two.heap) CHECK(r.offset + r.bytes <= two.heap_bytes);
  // Compute-only roles, as written (the phases run on every SM; the puts come from one-block kernels).
  const Plan two_compute = plan_for(parse(moe("{tokens: 8192, hidden: 2048, ffn: 1408, experts: 64, topk: 6}", 2, 2,
                                              "roles: {compute: 120, intra_comm: 0, inter_send: 0}\n")));
  CHECK(two_compute.exec.executable);
  CHECK(two_compute.roles.compute == 120);
  const Plan two_hier = plan_for(parse(
      moe("{tokens: 8192, hidden: 2048, ffn: 1408, experts: 64, topk: 6}", 2, 2, "plan: {variant: hierarchical}\n")));
  CHECK(two_hier.exec.executable);
  CHECK(two_hier.heap_bytes == two.heap_bytes);
  for (const auto& [layout, variant] : std::vector<std::pair<std::pair<int, int>, std::string>>{
           {{2, 2}, "staged"}, {{2, 2}, "ffn_combine"}, {{1, 4}, "hierarchical"}}) {
    const Workload wl = parse(moe("{tokens: 8192, hidden: 2048, ffn: 1408, experts: 64, topk: 6}", layout.first,
                                  layout.second, "plan: {variant: " + variant + "}\n"));
    Plan refused;
    std::string err;
    CHECK(tune(wl, wl.layout, {}, {}, machine_model_h200(), &refused, &err) != Status::kOk);
    CHECK_MESSAGE(err.find("is not a variant of moe on this layout") != std::string::npos, err);
  }
  const Plan wide = plan_for(parse(moe("{tokens: 8192, hidden: 2048, ffn: 1408, experts: 64, topk: 6}", 4, 4)));
  CHECK(!wide.exec.executable);
  CHECK(wide.exec.not_executable.find("at most 8") != std::string::npos);
  const Plan movers = plan_for(parse(moe("{tokens: 8192, hidden: 2048, ffn: 1408, experts: 64, topk: 6}", 1, 4,
                                         "roles: {compute: 100, intra_comm: 16}\n")));
  CHECK(!movers.exec.executable);
  CHECK(movers.exec.not_executable.find("roles for movers are for the fused launch") != std::string::npos);
  const Plan explicit_compute = plan_for(parse(moe("{tokens: 8192, hidden: 2048, ffn: 1408, experts: 64, topk: 6}", 1,
                                                   4, "roles: {compute: 120, intra_comm: 0}\n")));
  CHECK(explicit_compute.exec.executable);
  CHECK(explicit_compute.roles.compute == 120);
  const Plan odd = plan_for(parse(moe("{tokens: 8192, hidden: 2048, ffn: 1400, experts: 64, topk: 6}", 1, 4)));
  CHECK(!odd.exec.executable);
  CHECK(odd.exec.not_executable.find("ffn of 128") != std::string::npos);
}
