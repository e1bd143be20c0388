// The tuner's properties: counts sum to the SM count, comm SMs grow with bytes, no inter-node roles on
// one node, explicit counts respected and checked, predictions monotone in problem size; and every
// measured 4x H200 row (tests/runtime/data/h200_measured.csv) predicted within the stated tolerance.
#include <dirent.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/tuner.h"
#include "runtime/workload.h"
#include "tests/runtime/measured_rows.h"

using weft::RoleCounts;
using weft::Status;
using weft::testing::Measured;
using weft::testing::measured_rows;
using weft::testing::replay;
using namespace weft::runtime;
namespace topo = weft::topology;

namespace {

Workload parse(const std::string& text) {
  Workload w;
  std::string err;
  REQUIRE_MESSAGE(parse_workload(text, "t.yaml", &w, &err) == Status::kOk, err);
  return w;
}

Plan plan_for(const Workload& w, const MachineModel& m = machine_model_h200(), const topo::Topology& t = {},
              const topo::Mapping& map = {}) {
  Plan p;
  std::string err;
  REQUIRE_MESSAGE(tune(w, w.layout, t, map, m, &p, &err) == Status::kOk, err);
  return p;
}

int comm_sms(const RoleCounts& c) { return c.intra_comm + c.inter_send + c.inter_reduce; }

std::vector<Workload> examples() {
  std::vector<Workload> out;
  std::string dir = std::string(WEFT_SOURCE_DIR) + "/configs/examples";
  DIR* d = opendir(dir.c_str());
  REQUIRE(d != nullptr);
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n.size() < 6 || n.substr(n.size() - 5) != ".yaml") continue;
    Workload w;
    std::string err;
    REQUIRE_MESSAGE(load_workload(dir + "/" + n, &w, &err) == Status::kOk, err);
    out.push_back(w);
  }
  closedir(d);
  return out;
}

std::string text_for(const std::string& op, const std::string& shape, int nodes, int gpus) {
  return "op: " + op + "\nshape: " + shape + "\nlayout: {nodes: " + std::to_string(nodes) +
         ", gpus_per_node: " + std::to_string(gpus) + "}\n";
}

// A node of 4 GPUs; NICs as given (`nic_of[g]` = primary NIC index, -1 none).
void make_node(const std::vector<int>& nic_of, int nics, topo::Topology* t, topo::Mapping* m) {
  t->source = "test-node";
  for (size_t g = 0; g < nic_of.size(); ++g) {
    topo::Gpu gpu;
    gpu.index = static_cast<int>(g);
    gpu.name = "NVIDIA H100 80GB HBM3";
    t->gpus.push_back(gpu);
    topo::GpuNicLink l;
    l.gpu = static_cast<int>(g);
    l.primary_nic = nic_of[g];
    if (nic_of[g] >= 0) l.nearest_nics = {nic_of[g]};
    l.proximity = topo::Proximity::kSameSwitch;
    m->gpus.push_back(l);
  }
  for (int n = 0; n < nics; ++n) {
    topo::Nic nic;
    nic.index = n;
    nic.name = "mlx5_" + std::to_string(n);
    t->nics.push_back(nic);
  }
  m->socket_fallback = nics == 0;
}

}  // namespace

TEST_CASE("tuned counts use every SM, give every role with work at least one SM, and beat the bound never") {
  for (const auto& arch : {machine_model_h200(), machine_model_h100()}) {
    for (const auto& w : examples()) {
      if (!w.roles.automatic) continue;
      Plan p = plan_for(w, arch);
      INFO(w.name, " on ", arch.gpu);
      CHECK(p.roles.total() == arch.sm_count);
      CHECK(p.roles.compute >= 1);
      const auto* nv = p.link("nvlink");
      const auto* nic = p.link("nic");
      REQUIRE(nv != nullptr);
      REQUIRE(nic != nullptr);
      // GEMM+RS/AR plan with their copy engines (the only NVLink mover their runners have); the staged
      // MoE op (across nodes: its hierarchical variant) moves its rows with kernels between its phases,
      // on every SM.
      const bool phases = p.exec.variant == "staged" || (p.op == Op::kMoe && p.exec.variant == "hierarchical");
      if (phases)
        CHECK(p.roles.compute == arch.sm_count);
      else if (p.exec.variant == "overlap")  // mover SMs beside copy sends, with 3 or more ranks
        CHECK(p.roles.intra_comm == (p.exec.send == "copy" && p.world_size >= 3 ? 4 : 0));
      else if (p.intra_mover() == IntraMover::kSm)
        CHECK((nv->bytes_out > 0) == (p.roles.intra_comm > 0));
      else
        CHECK(p.roles.intra_comm == 0);
      if (!phases) CHECK((nic->bytes_out > 0) == (p.roles.inter_send > 0));
      CHECK(std::isfinite(p.makespan_s));
      CHECK(p.makespan_s >= p.bound_s);
      for (double t : p.role_time_s) CHECK(p.makespan_s >= t);
      CHECK(p.flops > 0);
    }
  }
}

TEST_CASE("one GPU: nothing to move, every SM computes") {
  Plan p = plan_for(parse(text_for("ag_gemm", "{m: 4096, n: 4096, k: 4096}", 1, 1)));
  CHECK(p.roles.compute == 132);
  CHECK(comm_sms(p.roles) == 0);
  CHECK(p.link("nvlink")->bytes_in == 0);
  CHECK(p.intra_chunk_bytes == 0);
  CHECK(p.inter_chunk_bytes == 0);
}

TEST_CASE("no inter-node roles on one node; inter-node roles on two") {
  const std::vector<std::pair<std::string, std::string>> ops = {
      {"ag_gemm", "{m: 8192, n: 28672, k: 8192}"},
      {"gemm_rs", "{m: 8192, n: 8192, k: 7168}"},
      {"gemm_ar", "{m: 8192, n: 8192, k: 7168}"},
      {"moe", "{tokens: 16384, hidden: 4096, ffn: 14336, experts: 8, topk: 2}"},
      {"ring_attention", "{seq: 32768, heads: 32, head_dim: 128}"}};
  for (const auto& [op, shape] : ops) {
    INFO(op);
    Plan one = plan_for(parse(text_for(op, shape, 1, 4)));
    CHECK(one.roles.inter_send == 0);
    CHECK(one.roles.inter_reduce == 0);
    CHECK(one.link("nic")->bytes_out == 0);
    CHECK(one.inter_backend == "none");
    Plan two = plan_for(parse(text_for(op, shape, 2, 4)));
    if (op == "moe")  // the hierarchical variant's phases run on every SM; its puts come from one-block kernels
      CHECK((two.exec.variant == "hierarchical" && two.roles.compute == 132));
    else
      CHECK(two.roles.inter_send >= 1);
    CHECK(two.link("nic")->bytes_out > 0);
    // Only the reducing ops fold partial sums from other nodes: the model gives that work time (the
    // op itself folds them in the GEMM's epilogue, so its plan runs no inter_reduce SM).
    CHECK((two.role_time(weft::Role::kInterReduce) > 0) == (op == "gemm_rs" || op == "gemm_ar"));
    CHECK(two.roles.total() == 132);
  }
}

TEST_CASE("more bytes never give fewer communication SMs") {
  const MachineModel m = machine_model_h200();
  LinkRates r;
  r.nvlink_gbps = m.nvlink_gbps;
  r.nic_gbps = m.nic_gbps;
  r.pcie_gbps = m.pcie_gbps;
  Demand base;
  base.groups.push_back({1792, 2.0 * 128 * 256 * 8192});
  base.flops = 1792 * 2.0 * 128 * 256 * 8192;
  base.tflops = m.tensor_tflops;
  base.intra_chunk = 2 << 20;
  base.inter_chunk = 2 << 20;
  for (int which = 0; which < 3; ++which) {
    int prev = -1, prev_role = -1;
    for (double bytes = 1 << 20; bytes < 64e9; bytes *= 1.37) {
      Demand d = base;
      d.nvlink_out = d.nvlink_in = which == 0 ? bytes : 50e6;
      d.nic_out = d.nic_in = which == 1 ? bytes : 5e6;
      d.reduce_bytes = which == 2 ? bytes : 5e6;
      RoleCounts c = best_roles(d, r, m);
      CHECK(c.total() == m.sm_count);
      const int role = which == 0 ? c.intra_comm : which == 1 ? c.inter_send : c.inter_reduce;
      INFO("link ", which, " bytes ", bytes);
      CHECK(role >= prev_role);
      // With one link carrying the bytes, that holds for all communication SMs too. (When the NIC
      // becomes the bottleneck, the makespan grows and the other roles may give SMs back.)
      if (which == 0) CHECK(comm_sms(c) >= prev);
      prev = comm_sms(c);
      prev_role = role;
    }
    // A lot of bytes does pull SMs to the role that moves them (one SM already feeds a whole NIC).
    CHECK(prev_role >= (which == 1 ? 1 : 8));
  }
  // And through whole workloads: a wider gathered A (more k at the same GEMM work per byte) or a
  // slower link never lowers intra_comm.
  int prev = 0;
  for (double gbps : {395.0, 300.0, 200.0, 100.0, 50.0}) {
    MachineModel slow = m;
    slow.nvlink_gbps = gbps;
    slow.nvlink_sm_gbps = gbps / 16;
    slow.nvlink_sm_max_gbps = gbps * 1.5;  // the movers' joint ceiling scales with the link too
    Plan p = plan_for(parse(text_for("ag_gemm", "{m: 16384, n: 8192, k: 8192}", 1, 4)), slow);
    CHECK(p.roles.intra_comm >= prev);
    prev = p.roles.intra_comm;
  }
}

TEST_CASE("predicted makespan is monotone in the problem size") {
  const std::vector<std::pair<std::string, std::string>> shapes = {
      {"ag_gemm", "{m: %d, n: 28672, k: 8192}"},
      {"gemm_rs", "{m: %d, n: 8192, k: 7168}"},
      {"gemm_ar", "{m: %d, n: 8192, k: 7168}"},
      {"moe", "{tokens: %d, hidden: 4096, ffn: 14336, experts: 8, topk: 2}"},
      {"ring_attention", "{seq: %d, heads: 32, head_dim: 128}"}};
  for (int nodes : {1, 2}) {
    for (const auto& [op, fmt] : shapes) {
      double prev = 0;
      for (int size = 256; size <= 65536; size += size / 2 + 256 - (size / 2) % 256) {
        char shape[128];
        snprintf(shape, sizeof(shape), fmt.c_str(), size);
        Plan p = plan_for(parse(text_for(op, shape, nodes, 4)));
        INFO(op, " size ", size, " nodes ", nodes);
        CHECK(p.makespan_s >= prev);
        CHECK(p.compute_alone_s > 0);
        prev = p.makespan_s;
      }
    }
  }
  // In k too, and in n.
  double prev = 0;
  for (int k = 1024; k <= 32768; k *= 2) {
    Plan p = plan_for(parse(text_for("gemm_rs", "{m: 4096, n: 8192, k: " + std::to_string(k) + "}", 1, 4)));
    CHECK(p.makespan_s >= prev);
    prev = p.makespan_s;
  }
}

TEST_CASE("explicit counts are used as given, and checked against the machine and layout") {
  Workload w = parse(text_for("gemm_rs", "{m: 8192, n: 8192, k: 7168}", 2, 4) +
                     "roles: {compute: 110, intra_comm: 16, inter_send: 2, inter_reduce: 4}\n");
  Plan p = plan_for(w);
  CHECK(p.roles_explicit);
  CHECK(p.roles.compute == 110);
  CHECK(p.roles.intra_comm == 16);
  CHECK(p.roles.inter_send == 2);
  CHECK(p.roles.inter_reduce == 4);
  Plan tuned = plan_for(parse(text_for("gemm_rs", "{m: 8192, n: 8192, k: 7168}", 2, 4)));
  CHECK(tuned.makespan_s <= p.makespan_s);  // the tuner's choice is at least as good as a hand pick

  std::string err;
  // The same counts on one node: inter-node roles have nothing to do.
  Workload one = parse(text_for("gemm_rs", "{m: 8192, n: 8192, k: 7168}", 1, 4) +
                       "roles: {compute: 110, intra_comm: 16, inter_send: 2}\n");
  CHECK(tune(one, one.layout, {}, {}, machine_model_h200(), &p, &err) == Status::kInvalidArgument);
  CHECK(err.rfind("t.yaml:4:51: roles.inter_send: expected 0 on a single node", 0) == 0);
  // No intra_comm SM while 4 GPUs must exchange data would hang the SM movers: refused for them...
  Workload none = parse(text_for("ag_gemm", "{m: 8192, n: 28672, k: 8192}", 1, 4) + "roles: {compute: 132}\n");
  CHECK(tune(none, none.layout, {}, {}, machine_model_h200(), IntraMover::kSm, &p, &err) == Status::kInvalidArgument);
  CHECK(err.find("roles.intra_comm: 0, but ag_gemm moves data between the node's GPUs") != std::string::npos);
  // ... while the plan's own mover for it is the copy engines, which need no SM.
  REQUIRE(tune(none, none.layout, {}, {}, machine_model_h200(), &p, &err) == Status::kOk);
  CHECK(p.intra_mover() == IntraMover::kCopyEngine);
  CHECK(p.exec.variant == "copy_engine");
  CHECK(p.roles.compute == 132);
  // inter_reduce for an op with nothing to reduce.
  Workload ag = parse(text_for("ag_gemm", "{m: 8192, n: 28672, k: 8192}", 2, 4) +
                      "roles: {compute: 120, intra_comm: 8, inter_send: 2, inter_reduce: 2}\n");
  CHECK(tune(ag, ag.layout, {}, {}, machine_model_h200(), &p, &err) == Status::kInvalidArgument);
  CHECK(err.find("roles.inter_reduce: ag_gemm has nothing to reduce") != std::string::npos);
  // More SMs than the GPU the plan is for has.
  MachineModel small = machine_model_h100();
  small.sm_count = 114;
  Workload big =
      parse(text_for("ag_gemm", "{m: 8192, n: 28672, k: 8192}", 1, 4) + "roles: {compute: 116, intra_comm: 16}\n");
  CHECK(tune(big, big.layout, {}, {}, small, &p, &err) == Status::kInvalidArgument);
  CHECK(err.find("roles: counts sum to 132 with 116 compute; expected at most 114 SMs") != std::string::npos);
  // Fewer than all SMs is allowed, and said.
  Workload few =
      parse(text_for("ag_gemm", "{m: 8192, n: 28672, k: 8192}", 1, 4) + "roles: {compute: 100, intra_comm: 8}\n");
  p = plan_for(few);
  CHECK(p.roles.total() == 108);
  REQUIRE(!p.notes.empty());
  CHECK(p.notes.back().find("108 of 132 SMs") != std::string::npos);
}

TEST_CASE("the model reproduces the measured H200 single-GPU GEMM times within 30%") {
  // BASELINES.md: cuBLAS on one rank's share, 4x H200.
  struct Case {
    const char* file;
    double gemm_ms;
  } cases[] = {{"ag_gemm_llama70b.yaml", 1.117}, {"ag_gemm_m2048.yaml", 0.376}, {"gemm_rs_m8192.yaml", 0.358}};
  for (const auto& c : cases) {
    Workload w;
    std::string err;
    REQUIRE(load_workload(std::string(WEFT_SOURCE_DIR) + "/configs/examples/" + c.file, &w, &err) == Status::kOk);
    Plan p = plan_for(w);
    INFO(c.file, " predicted ", p.compute_alone_s * 1e3, " ms");
    CHECK(p.compute_alone_s * 1e3 == doctest::Approx(c.gemm_ms).epsilon(0.3));
  }
  // H100 computes slower than H200 on the same work.
  Workload w = parse(text_for("ag_gemm", "{m: 8192, n: 28672, k: 8192}", 1, 4));
  CHECK(plan_for(w, machine_model_h100()).compute_alone_s > plan_for(w, machine_model_h200()).compute_alone_s);
}

TEST_CASE("bytes per link follow the op's data movement") {
  // ag_gemm on 4 GPUs: each receives the 3 other shards of A (2048 x 8192 bf16 = 32 MiB each).
  Plan p = plan_for(parse(text_for("ag_gemm", "{m: 8192, n: 28672, k: 8192}", 1, 4)));
  CHECK(p.link("nvlink")->bytes_in == doctest::Approx(3.0 * 2048 * 8192 * 2));
  // 2 x 2: one shard over the NIC from the rail peer, then two (own + rail) to the NVLink peer.
  Plan q = plan_for(parse(text_for("ag_gemm", "{m: 8192, n: 28672, k: 8192}", 2, 2)));
  CHECK(q.link("nic")->bytes_in == doctest::Approx(2048.0 * 8192 * 2));
  CHECK(q.link("nvlink")->bytes_out == doctest::Approx(2.0 * 2048 * 8192 * 2));
  // gemm_ar moves twice what gemm_rs does.
  Plan rs = plan_for(parse(text_for("gemm_rs", "{m: 8192, n: 8192, k: 7168}", 1, 4)));
  Plan ar = plan_for(parse(text_for("gemm_ar", "{m: 8192, n: 8192, k: 7168}", 1, 4)));
  CHECK(ar.link("nvlink")->bytes_out == doctest::Approx(2 * rs.link("nvlink")->bytes_out));
  CHECK(rs.tile_m == 128);
  CHECK(rs.tile_n == 256);
  CHECK(rs.tile_k == 64);
  CHECK(rs.intra_chunk_bytes == 128 * 256 * 2);
}

TEST_CASE("the topology's NICs set the inter-node bandwidth; no NIC means the socket backend") {
  Workload w = parse(text_for("ag_gemm", "{m: 8192, n: 28672, k: 8192}", 2, 4));
  topo::Topology t4, t2, t0;
  topo::Mapping m4, m2, m0;
  make_node({0, 1, 2, 3}, 4, &t4, &m4);
  make_node({0, 0, 1, 1}, 2, &t2, &m2);
  make_node({-1, -1, -1, -1}, 0, &t0, &m0);
  Plan p4 = plan_for(w, machine_model_h200(), t4, m4);
  Plan p2 = plan_for(w, machine_model_h200(), t2, m2);
  Plan p0 = plan_for(w, machine_model_h200(), t0, m0);
  CHECK(p4.nics_per_node == 4);
  CHECK(p2.nics_per_node == 2);
  CHECK(p2.link("nic")->gbps == doctest::Approx(p4.link("nic")->gbps / 2));
  CHECK(p2.makespan_s >= p4.makespan_s);
  CHECK(p4.inter_backend == "ibverbs");
  CHECK(p0.inter_backend == "socket");
  CHECK(p0.link("nic")->gbps < p2.link("nic")->gbps);
  CHECK_FALSE(p4.gpu_assumed);
  // Asking for ibverbs where there is no NIC is an error at that key.
  Workload ib = parse(text_for("ag_gemm", "{m: 8192, n: 28672, k: 8192}", 2, 4) + "transport: {inter_node: ibverbs}\n");
  Plan p;
  std::string err;
  CHECK(tune(ib, ib.layout, t0, m0, machine_model_h200(), &p, &err) == Status::kInvalidArgument);
  INFO(err);
  CHECK(err.find("t.yaml:4:25: transport.inter_node: ibverbs, but the topology") == 0);
  // ofi: its own backend in the plan (and its resource report), at an RDMA provider's rates where
  // every GPU has a NIC, else at the tcp provider's (the socket rates).
  Workload of = parse(text_for("ag_gemm", "{m: 8192, n: 28672, k: 8192}", 2, 4) + "transport: {inter_node: ofi}\n");
  Plan o4, o0;
  REQUIRE(tune(of, of.layout, t4, m4, machine_model_h200(), &o4, &err) == Status::kOk);
  REQUIRE(tune(of, of.layout, t0, m0, machine_model_h200(), &o0, &err) == Status::kOk);
  CHECK(o4.inter_backend == "ofi");
  CHECK(o0.inter_backend == "ofi");
  CHECK(o4.link("nic")->gbps == doctest::Approx(p4.link("nic")->gbps));
  CHECK(o0.link("nic")->gbps == doctest::Approx(p0.link("nic")->gbps));
  CHECK(format_plan_json(o4).find("\"backend\": \"ofi\"") != std::string::npos);
  // A layout wider than the node is refused.
  Workload wide = parse(text_for("ag_gemm", "{m: 8192, n: 28672, k: 8192}", 1, 8));
  CHECK(tune(wide, wide.layout, t4, m4, machine_model_h200(), &p, &err) == Status::kInvalidArgument);
  CHECK(err.find("layout.gpus_per_node: 8 GPUs per node, but the topology (test-node) has 4") != std::string::npos);
}

TEST_CASE("make_plan picks the model from the workload, the topology's GPU names, WEFT_GPU_ARCH") {
  unsetenv("WEFT_GPU_ARCH");
  Workload w = parse(text_for("ag_gemm", "{m: 8192, n: 28672, k: 8192}", 1, 4));
  Plan p;
  std::string err;
  REQUIRE(make_plan(w, w.layout, {}, {}, &p, &err) == Status::kOk);
  CHECK(p.gpu == "h200");
  CHECK(p.gpu_assumed);
  setenv("WEFT_GPU_ARCH", "h100", 1);
  REQUIRE(make_plan(w, w.layout, {}, {}, &p, &err) == Status::kOk);
  CHECK(p.gpu == "h100");
  setenv("WEFT_GPU_ARCH", "v100", 1);
  CHECK(make_plan(w, w.layout, {}, {}, &p, &err) == Status::kInvalidArgument);
  unsetenv("WEFT_GPU_ARCH");
  topo::Topology t;
  topo::Mapping m;
  make_node({0, 1, 2, 3}, 4, &t, &m);  // GPUs named "NVIDIA H100 80GB HBM3"
  REQUIRE(make_plan(w, w.layout, t, m, &p, &err) == Status::kOk);
  CHECK(p.gpu == "h100");
  CHECK_FALSE(p.gpu_assumed);
  // A live topology names GPUs by their CUDA device; the PCI id identifies the part.
  for (auto& g : t.gpus) g.name = "cuda" + std::to_string(g.index), g.pci_id = "10de:2335";
  REQUIRE(make_plan(w, w.layout, t, m, &p, &err) == Status::kOk);
  CHECK(p.gpu == "h200");
  CHECK(p.gpu_reason.find("H200 SXM") != std::string::npos);
  // A GPU weft has no model for: H200 constants, and the plan says why.
  for (auto& g : t.gpus) g.name = "GA100 [A100 SXM4 40GB]", g.pci_id = "10de:20b0";
  REQUIRE(make_plan(w, w.layout, t, m, &p, &err) == Status::kOk);
  CHECK(p.gpu == "h200");
  CHECK(p.gpu_reason.find("A100 SXM4 40GB]' is not an H100 or H200") != std::string::npos);
  Workload o =
      parse(text_for("ag_gemm", "{m: 8192, n: 28672, k: 8192}", 1, 4) + "machine: {gpu: h200, tensor_tflops: 400}\n");
  REQUIRE(make_plan(o, o.layout, t, m, &p, &err) == Status::kOk);
  CHECK(p.gpu == "h200");
  Plan fast;
  REQUIRE(make_plan(parse(text_for("ag_gemm", "{m: 8192, n: 28672, k: 8192}", 1, 4) + "machine: {gpu: h200}\n"),
                    o.layout, t, m, &fast, &err) == Status::kOk);
  // The override is the model tune() gets: the same plan as a model with that rate.
  CHECK(p.compute_alone_s > fast.compute_alone_s * 1.5);
  MachineModel slow = machine_model_h200();
  slow.tensor_tflops = 400;
  Plan direct;
  REQUIRE(tune(o, o.layout, t, m, slow, &direct, &err) == Status::kOk);
  CHECK(p.compute_alone_s == doctest::Approx(direct.compute_alone_s));
  CHECK(p.makespan_s == doctest::Approx(direct.makespan_s));
  // WEFT_NET_CHANNELS sets the socket backend's channels; the workload's machine: wins over it.
  Workload sock =
      parse(text_for("ag_gemm", "{m: 8192, n: 28672, k: 8192}", 2, 2) + "transport: {inter_node: socket}\n");
  Plan ch1, ch4, ch8;
  setenv("WEFT_NET_CHANNELS", "1", 1);
  REQUIRE(make_plan(sock, sock.layout, {}, {}, &ch1, &err) == Status::kOk);
  unsetenv("WEFT_NET_CHANNELS");
  REQUIRE(make_plan(sock, sock.layout, {}, {}, &ch4, &err) == Status::kOk);
  Workload sock8 = parse(text_for("ag_gemm", "{m: 8192, n: 28672, k: 8192}", 2, 2) +
                         "transport: {inter_node: socket}\nmachine: {net_channels: 8}\n");
  setenv("WEFT_NET_CHANNELS", "1", 1);
  REQUIRE(make_plan(sock8, sock8.layout, {}, {}, &ch8, &err) == Status::kOk);
  unsetenv("WEFT_NET_CHANNELS");
  CHECK(ch1.link("nic")->gbps == doctest::Approx(machine_model_h200().socket_channel_gbps));
  CHECK(ch4.link("nic")->gbps > 2 * ch1.link("nic")->gbps);
  CHECK(ch8.link("nic")->gbps >= ch4.link("nic")->gbps);
  CHECK(ch1.makespan_s > 2 * ch4.makespan_s);
}

TEST_CASE("JSON and table output carry the plan") {
  Plan p = plan_for(parse(text_for("gemm_rs", "{m: 8192, n: 8192, k: 7168}", 2, 4)));
  std::string j = format_plan_json(p);
  CHECK(j.find("\"inter_reduce\": " + std::to_string(p.roles.inter_reduce)) != std::string::npos);
  CHECK(j.find("\"makespan_us\"") != std::string::npos);
  std::string t = format_plan_table(p);
  CHECK(t.find("makespan") != std::string::npos);
  CHECK(t.find("nvlink") != std::string::npos);
  CHECK(t.find("inter_reduce") != std::string::npos);
}

TEST_CASE("copy-engine mover: the NVLink bytes take no intra_comm SM, and the plan says so") {
  const Workload w = parse(text_for("ag_gemm", "{m: 8192, n: 28672, k: 8192}", 1, 4));
  std::string err;
  Plan sm, ce;
  REQUIRE(tune(w, w.layout, {}, {}, machine_model_h200(), IntraMover::kSm, &sm, &err) == Status::kOk);
  REQUIRE(tune(w, w.layout, {}, {}, machine_model_h200(), IntraMover::kCopyEngine, &ce, &err) == Status::kOk);
  CHECK(sm.intra_mover() == IntraMover::kSm);
  CHECK(sm.roles.intra_comm >= 1);
  CHECK(ce.intra_mover() == IntraMover::kCopyEngine);
  CHECK(ce.roles.intra_comm == 0);
  CHECK(ce.roles.compute == ce.sm_count);
  // The link alone at full bandwidth, next to every SM computing.
  const LinkLoad* nv = ce.link("nvlink");
  REQUIRE(nv != nullptr);
  CHECK(nv->time_s > 0);
  // The copy engines' gather rate, one copy per peer shard (each a latency), never above the link.
  const MachineModel h200 = machine_model_h200();
  CHECK(ce.role_time(weft::Role::kIntraComm) >= nv->time_s);
  CHECK(ce.role_time(weft::Role::kIntraComm) ==
        doctest::Approx(nv->bytes_in / (h200.ce_pull_gbps * 1e9) + 3 * h200.latency_us * 1e-6));
  CHECK(ce.role_time(weft::Role::kCompute) == doctest::Approx(ce.compute_alone_s));
  CHECK(ce.makespan_s <= sm.makespan_s);
  CHECK(ce.bound_s == doctest::Approx(sm.bound_s));
  // On one node the plan's mover is the copy engines (the fastest in every measured run).
  Plan dflt = plan_for(w);
  CHECK(dflt.intra_mover() == IntraMover::kCopyEngine);
  CHECK(dflt.roles.intra_comm == 0);
  CHECK(dflt.makespan_s == doctest::Approx(ce.makespan_s));
  CHECK(dflt.exec.variant == "copy_engine");
  // A communication-heavy shape gets more intra_comm SMs from the SM mover, still none with copy engines.
  const Workload wide = parse(text_for("ag_gemm", "{m: 16384, n: 8192, k: 8192}", 1, 4));
  Plan wide_sm, wide_ce;
  REQUIRE(tune(wide, wide.layout, {}, {}, machine_model_h200(), IntraMover::kSm, &wide_sm, &err) == Status::kOk);
  REQUIRE(tune(wide, wide.layout, {}, {}, machine_model_h200(), IntraMover::kCopyEngine, &wide_ce, &err) ==
          Status::kOk);
  CHECK(wide_sm.roles.intra_comm > sm.roles.intra_comm);
  CHECK(wide_ce.roles.intra_comm == 0);
  // Across nodes the NIC still needs its SMs.
  const Workload two = parse(text_for("gemm_rs", "{m: 8192, n: 8192, k: 7168}", 2, 4));
  Plan two_ce;
  REQUIRE(tune(two, two.layout, {}, {}, machine_model_h200(), IntraMover::kCopyEngine, &two_ce, &err) == Status::kOk);
  CHECK(two_ce.roles.intra_comm == 0);
  CHECK(two_ce.roles.inter_send >= 1);
  // Explicit counts without intra_comm SMs are fine for copy engines; SMs given anyway are said to idle.
  const Workload none = parse(text_for("ag_gemm", "{m: 8192, n: 28672, k: 8192}", 1, 4) + "roles: {compute: 132}\n");
  Plan p;
  CHECK(tune(none, none.layout, {}, {}, machine_model_h200(), IntraMover::kCopyEngine, &p, &err) == Status::kOk);
  CHECK(p.roles.intra_comm == 0);
  CHECK(tune(none, none.layout, {}, {}, machine_model_h200(), IntraMover::kSm, &p, &err) == Status::kInvalidArgument);
  const Workload some =
      parse(text_for("ag_gemm", "{m: 8192, n: 28672, k: 8192}", 1, 4) + "roles: {compute: 120, intra_comm: 12}\n");
  REQUIRE(tune(some, some.layout, {}, {}, machine_model_h200(), IntraMover::kCopyEngine, &p, &err) == Status::kOk);
  bool said = false;
  for (const auto& n : p.notes) said = said || n.find("intra_comm SMs will idle") != std::string::npos;
  CHECK(said);
  // Printed.
  CHECK(format_plan_json(ce).find("\"intra_mover\": \"copy_engine\"") != std::string::npos);
  CHECK(format_plan_json(sm).find("\"intra_mover\": \"sm\"") != std::string::npos);
  CHECK(format_plan_table(ce).find("moved by the copy engines") != std::string::npos);
  CHECK(format_plan_table(sm).find("moved by the copy engines") == std::string::npos);
}

TEST_CASE("every measured 4x H200 row is predicted within 15% (docs/tuner.md)") {
  constexpr double kTolerance = 0.15;    // the spread between two calls on the same machine reaches 10%
  constexpr double kMedianBound = 0.06;  // and the fit as a whole stays close
  const std::vector<Measured> rows = measured_rows();
  REQUIRE(rows.size() >= 100);
  std::ostringstream table;
  table << "row  commit   op       M x N x K              layout mover        roles          part      measured "
           "predicted unit    error\n";
  std::vector<double> errors;
  int outside = 0;
  for (const auto& r : rows) {
    const double pred = replay(r, machine_model_h200());
    const double e = pred / r.measured - 1;
    errors.push_back(std::fabs(e));
    if (std::fabs(e) > kTolerance) ++outside;
    char line[320];
    snprintf(line, sizeof line,
             "%-4s %-8s %-8s %5lld x %5lld x %5lld  %dx%d    %-12s %3d/%2d/%d/%d  %-9s %8.3f %9.3f %-6s %+6.1f%%%s\n",
             r.row.c_str(), r.commit.c_str(), r.op.c_str(), static_cast<long long>(r.m), static_cast<long long>(r.n),
             static_cast<long long>(r.k), r.nodes, r.gpus, r.mover.c_str(), r.roles.compute, r.roles.intra_comm,
             r.roles.inter_send, r.roles.inter_reduce, r.part.c_str(), r.measured, pred, r.unit.c_str(), e * 100,
             std::fabs(e) > kTolerance ? "  <-- outside" : "");
    table << line;
  }
  std::sort(errors.begin(), errors.end());
  const double median = errors[errors.size() / 2], worst = errors.back();
  table << "max error " << worst * 100 << "%, median " << median * 100 << "%, " << outside << " of " << rows.size()
        << " rows outside " << kTolerance * 100 << "%\n";
  INFO(table.str());
  CHECK(outside == 0);
  CHECK(median <= kMedianBound);
  if (getenv("WEFT_TUNER_FIT_TABLE")) printf("%s", table.str().c_str());  // for docs/tuner.md
}

TEST_CASE("the fit's changes steer the plans the way the measurements did") {
  // AllGather+GEMM 16384 x 2048 per rank: the copy engines measured faster than any SM-mover split,
  // and the model agrees.
  const Workload wide = parse(text_for("ag_gemm", "{m: 16384, n: 8192, k: 8192}", 1, 4));
  std::string err;
  Plan sm, ce;
  REQUIRE(tune(wide, wide.layout, {}, {}, machine_model_h200(), IntraMover::kSm, &sm, &err) == Status::kOk);
  REQUIRE(tune(wide, wide.layout, {}, {}, machine_model_h200(), IntraMover::kCopyEngine, &ce, &err) == Status::kOk);
  CHECK(ce.makespan_s < sm.makespan_s);
  // GEMM+RS/AR: the small shapes take the peer path (after the GEMM), the large ones overlap.
  const Workload small = parse(text_for("gemm_ar", "{m: 256, n: 8192, k: 7168}", 1, 4));
  const Workload large = parse(text_for("gemm_ar", "{m: 8192, n: 8192, k: 7168}", 1, 4));
  const MachineModel m = machine_model_h200();
  Plan tiles;
  CHECK(compute_demand(small, small.layout, m, tiles).sequential);
  CHECK_FALSE(compute_demand(large, large.layout, m, tiles).sequential);
  // Across nodes the op folds the rail peers' sums in its epilogue: the plan may use no inter_reduce
  // SM, as the runner does, and explicit counts without one are accepted.
  const Workload rs = parse(text_for("gemm_rs", "{m: 8192, n: 8192, k: 7168}", 2, 2) +
                            "transport: {inter_node: socket}\nroles: {compute: 131, inter_send: 1}\n");
  Plan p;
  REQUIRE(tune(rs, rs.layout, {}, {}, m, &p, &err) == Status::kOk);
  CHECK(p.intra_mover() == IntraMover::kCopyEngine);
  CHECK(p.roles.inter_reduce == 0);
  CHECK(std::isfinite(p.makespan_s));
  CHECK(p.limited_by == "inter_send");
  // The socket channels set the pace there: 4 channels at the fitted rate, about 5.3 ms measured.
  CHECK(p.makespan_s * 1e3 == doctest::Approx(5.3).epsilon(0.15));
}

TEST_CASE("moe traffic is counted once per (token, destination rank) each way, NIC once per node") {
  // Mixtral-like, 1 node x 4: a rank holds 2 of 8 experts; a token's 2 experts miss it with
  // probability C(6,2)/C(8,2) = 15/28.
  const Plan one =
      plan_for(parse(text_for("moe", "{tokens: 16384, hidden: 4096, ffn: 14336, experts: 8, topk: 2}", 1, 4)));
  const double row = 4096 * 2 + 80, hit = 1 - 15.0 / 28.0;
  CHECK(one.link("nvlink")->bytes_out == doctest::Approx(2 * 4096 * row * 3 * hit));
  CHECK(one.link("nic")->bytes_out == 0);
  // Top-8 of 128 over 2 nodes x 4: a node holds 64 experts (hit 1 - C(64,8)/C(128,8)), a rank 16.
  const Plan two =
      plan_for(parse(text_for("moe", "{tokens: 16384, hidden: 2048, ffn: 768, experts: 128, topk: 8}", 2, 4)));
  double miss_node = 1, miss_rank = 1;
  for (int i = 0; i < 8; ++i) {
    miss_node *= double(64 - i) / double(128 - i);
    miss_rank *= double(112 - i) / double(128 - i);
  }
  const double row2 = 2048 * 2 + 80, t = 16384 / 8;
  CHECK(two.link("nic")->bytes_out == doctest::Approx(2 * t * row2 * 1 * (1 - miss_node)));
  // NVLink: a rank's own tokens to its 3 node-mates, and as the relay of its rail peer's tokens on
  // the other node the same again (kernels/moe_nodes_plan.h): 2 nodes, twice the one-node figure.
  CHECK(two.link("nvlink")->bytes_out == doctest::Approx(2 * t * row2 * 3 * (1 - miss_rank) * 2));
  // Never more than once per destination: below the per-(token, expert) count.
  CHECK(two.link("nvlink")->bytes_out < 2 * t * 8 * row2 * 3 / 8 * 2);
}
