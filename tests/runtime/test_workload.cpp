// Workload files: every example parses; every kind of bad input gives one "file:line:col: key: ..." error.
#include <dirent.h>
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "runtime/workload.h"

using weft::Status;
using namespace weft::runtime;

namespace {

const char* kGood =
    "name: t\n"
    "op: ag_gemm\n"
    "dtype: bf16\n"
    "shape: {m: 8192, n: 28672, k: 8192}\n"
    "layout: {nodes: 1, gpus_per_node: 4}\n";

// Parses text that must fail, and returns the message.
std::string error_of(const std::string& text) {
  Workload w;
  std::string err;
  Status s = parse_workload(text, "w.yaml", &w, &err);
  CHECK(s == Status::kInvalidArgument);
  CHECK(err.find('\n') == std::string::npos);  // one line
  return err;
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::vector<std::string> example_files() {
  std::vector<std::string> out;
  std::string dir = std::string(WEFT_SOURCE_DIR) + "/configs/examples";
  DIR* d = opendir(dir.c_str());
  REQUIRE(d != nullptr);
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n.size() > 5 && n.substr(n.size() - 5) == ".yaml") out.push_back(dir + "/" + n);
  }
  closedir(d);
  return out;
}

}  // namespace

TEST_CASE("a complete workload parses into the struct, with per-rank shards") {
  Workload w;
  std::string err;
  std::string text = std::string(kGood) +
                     "roles: {compute: 116, intra_comm: 12, inter_send: 2, inter_reduce: 2}\n"
                     "transport: {inter_node: socket, signal_mode: fenced}\n"
                     "run: {warmup: 3, iters: 7, validate: false}\n";
  REQUIRE_MESSAGE(parse_workload(text, "w.yaml", &w, &err) == Status::kOk, err);
  CHECK(w.name == "t");
  CHECK(w.op == Op::kAgGemm);
  CHECK(w.dtype == DType::kBf16);
  CHECK(w.gemm.m == 8192);
  CHECK(w.gemm.n == 28672);
  CHECK(w.gemm.k == 8192);
  CHECK(w.world_size() == 4);
  CHECK_FALSE(w.roles.automatic);
  CHECK(w.roles.counts.compute == 116);
  CHECK(w.roles.counts.inter_reduce == 2);
  CHECK(w.transport.inter_node == InterNode::kSocket);
  CHECK(w.transport.signal_mode == SignalMode::kFenced);
  CHECK(w.run.warmup == 3);
  CHECK(w.run.iters == 7);
  CHECK_FALSE(w.run.validate);
  GemmShard s = w.gemm_shard();
  CHECK(s.n == 7168);  // n 28672 over 4 ranks: each computes a 7168-column block
  CHECK(s.m == 8192);
  CHECK(s.a_rows == 2048);
  CHECK(s.k == 8192);
  CHECK(w.loc_of("shape.n").line == 4);
}

TEST_CASE("defaults: name from the file, bf16, roles auto, batched signals, 5 warm-ups, 50 iterations") {
  Workload w;
  std::string err;
  REQUIRE(parse_workload("op: gemm_rs\nshape: {m: 64, n: 64, k: 64}\n", "dir/my_work.yaml", &w, &err) == Status::kOk);
  CHECK(w.name == "my_work");
  CHECK(w.dtype == DType::kBf16);
  CHECK(w.roles.automatic);
  CHECK(w.layout.nodes == 1);
  CHECK(w.layout.gpus_per_node == 1);
  CHECK(w.transport.inter_node == InterNode::kAuto);
  CHECK(w.transport.signal_mode == SignalMode::kBatched);
  CHECK(w.run.warmup == 5);
  CHECK(w.run.iters == 50);
  CHECK(w.run.validate);
}

TEST_CASE("gemm_rs and gemm_ar split k; gemm_rs scatters rows of C") {
  Workload w;
  std::string err;
  REQUIRE(parse_workload("op: gemm_rs\nshape: {m: 8192, n: 8192, k: 7168}\nlayout: {gpus_per_node: 4}\n", "a.yaml", &w,
                         &err) == Status::kOk);
  GemmShard s = w.gemm_shard();
  CHECK(s.k == 1792);
  CHECK(s.n == 8192);
  CHECK(s.c_rows == 2048);
  REQUIRE(parse_workload("op: gemm_ar\nshape: {m: 256, n: 8192, k: 7168}\nlayout: {gpus_per_node: 4}\n", "a.yaml", &w,
                         &err) == Status::kOk);
  s = w.gemm_shard();
  CHECK(s.k == 1792);
  CHECK(s.c_rows == 256);
}

TEST_CASE("every example in configs/examples parses, and the required ones exist with their shapes") {
  auto files = example_files();
  CHECK(files.size() >= 10);
  bool seen[5] = {};
  for (const auto& f : files) {
    Workload w;
    std::string err;
    CHECK_MESSAGE(load_workload(f, &w, &err) == Status::kOk, err);
    seen[static_cast<int>(w.op)] = true;
  }
  for (bool s : seen) CHECK(s);  // every op has an example

  Workload w;
  std::string err;
  const std::string dir = std::string(WEFT_SOURCE_DIR) + "/configs/examples/";
  REQUIRE(load_workload(dir + "ag_gemm_llama70b.yaml", &w, &err) == Status::kOk);
  CHECK(w.gemm.m == 8192);
  CHECK(w.gemm.n == 28672);
  CHECK(w.gemm.k == 8192);
  CHECK(w.world_size() == 4);
  REQUIRE(load_workload(dir + "ag_gemm_m16384.yaml", &w, &err) == Status::kOk);
  CHECK(w.gemm_shard().n == 2048);
  REQUIRE(load_workload(dir + "ag_gemm_2x2.yaml", &w, &err) == Status::kOk);
  CHECK(w.layout.nodes == 2);
  CHECK(w.layout.gpus_per_node == 2);
  REQUIRE(load_workload(dir + "gemm_rs_m8192.yaml", &w, &err) == Status::kOk);
  CHECK(w.gemm.k == 7168);
  for (const char* name : {"ag_gemm_m2048.yaml", "gemm_rs_m2048.yaml", "gemm_ar_m8192.yaml", "gemm_ar_m256.yaml"})
    CHECK_MESSAGE(load_workload(dir + name, &w, &err) == Status::kOk, name);
}

TEST_CASE("a missing file is kNotFound with the path in the message") {
  Workload w;
  std::string err;
  CHECK(load_workload("/nonexistent/x.yaml", &w, &err) == Status::kNotFound);
  CHECK(starts_with(err, "/nonexistent/x.yaml:1:1: "));
}

TEST_CASE("empty file, or only comments and blank lines") {
  for (const char* text : {"", "\n\n", "# nothing here\n   \n"}) {
    std::string e = error_of(text);
    CHECK(starts_with(e, "w.yaml:1:1: (file): empty"));
    CHECK(contains(e, "expected"));
  }
}

TEST_CASE("binary data and invalid UTF-8 are refused with the offset") {
  std::string bin = std::string("op: ag_gemm\nsh\0pe", 17) + "\x01\x02";
  std::string e = error_of(bin);
  CHECK(starts_with(e, "w.yaml:2:3: (file): binary data (byte 0x00"));
  e = error_of("op: ag_gemm\nname: caf\xe9\n");  // Latin-1, not UTF-8
  CHECK(starts_with(e, "w.yaml:2:10: (file): binary data (byte 0xe9"));
  // Valid UTF-8 in a value is fine.
  Workload w;
  std::string err;
  CHECK(parse_workload("name: caf\xc3\xa9\nop: gemm_ar\nshape: {m: 1, n: 1, k: 1}\n", "w.yaml", &w, &err) ==
        Status::kOk);
}

TEST_CASE("YAML syntax errors name the line and the key there") {
  std::string e = error_of("op: ag_gemm\nshape: {m: 1, n: 2\nlayout: {nodes: 1}\n");
  CHECK(starts_with(e, "w.yaml:"));
  CHECK(contains(e, "YAML syntax error"));
  // An unclosed bracket is found at the end of the file; the message points at the bracket.
  e = error_of("op: ag_gemm\nshape: {m: 8192, n: [1], k: 8192\n\n");
  CHECK(starts_with(e, "w.yaml:2:8: shape: YAML syntax error"));
  e = error_of("op: ag_gemm\nshape: [1, 2\n");
  CHECK(contains(e, "YAML syntax error"));
  e = error_of("op: ag_gemm\n  shape: bad: indentation\n");
  CHECK(contains(e, "YAML syntax error"));
  CHECK(starts_with(e, "w.yaml:2:"));
}

TEST_CASE("tabs in indentation are refused at the tab, naming the key") {
  std::string e = error_of("op: ag_gemm\nshape:\n\tm: 1\n");
  CHECK(starts_with(e, "w.yaml:3:1: m: tab character in indentation; expected spaces"));
  e = error_of("op: ag_gemm\nshape:\n  \tn: 1\n");
  CHECK(starts_with(e, "w.yaml:3:3: n: tab"));
  // A tab after the value (a separator, which YAML allows) is not an error by itself.
  Workload w;
  std::string err;
  CHECK(parse_workload("op: gemm_ar\t# comment\nshape: {m: 1, n: 1, k: 1}\n", "w.yaml", &w, &err) == Status::kOk);
}

TEST_CASE("the top level must be a map") {
  CHECK(starts_with(error_of("- op: ag_gemm\n- shape: 1\n"), "w.yaml:1:1: (top level): expected a map"));
  std::string e = error_of("just a sentence\n");
  CHECK(starts_with(e, "w.yaml:1:1: (top level): expected a map"));
  CHECK(contains(e, "'just a sentence'"));
}

TEST_CASE("more than one YAML document is refused") {
  std::string e = error_of(std::string(kGood) + "---\nop: gemm_rs\n");
  CHECK(starts_with(e, "w.yaml:6:1: (file): a second YAML document"));
  e = error_of(std::string(kGood) + "...\nop: gemm_rs\n");
  CHECK(starts_with(e, "w.yaml:7:1: (file): content after the document end"));
  // Explicit markers around one document are fine.
  Workload w;
  std::string err;
  CHECK(parse_workload("---\n" + std::string(kGood) + "...\n# done\n", "w.yaml", &w, &err) == Status::kOk);
}

TEST_CASE("text that yields no YAML value is pointed at, not called empty") {
  // yaml-cpp reads a leading ',' as nothing at all (and LoadAll loops on it).
  std::string e = error_of("# a comment\n, stray\nop: ag_gemm\n");
  CHECK(starts_with(e, "w.yaml:2:1: (top level): no YAML value could be read here"));
}

TEST_CASE("duplicate keys, at the top and nested, name the second one and the first line") {
  std::string e = error_of(std::string(kGood) + "op: gemm_rs\n");
  CHECK(starts_with(e, "w.yaml:6:1: op: duplicate key (first set at line 2)"));
  e = error_of("op: ag_gemm\nshape: {m: 8, m: 16, n: 4, k: 4}\n");
  CHECK(starts_with(e, "w.yaml:2:15: shape.m: duplicate key"));
}

TEST_CASE("unknown keys suggest the nearest known one") {
  std::string e = error_of("op: ag_gemm\nshpe: {m: 1, n: 1, k: 1}\n");
  CHECK(starts_with(e, "w.yaml:2:1: shpe: unknown key; did you mean 'shape'?"));
  e = error_of("op: ag_gemm\nshape: {m: 4, n: 4, k: 4}\nlayout: {nodes: 1, gpus_per_nod: 4}\n");
  CHECK(starts_with(e, "w.yaml:3:20: layout.gpus_per_nod: unknown key; did you mean 'gpus_per_node'?"));
  e = error_of("op: ag_gemm\nshape: {m: 4, n: 4, k: 4}\nrun: {iterations: 4}\n");
  CHECK(contains(e, "run.iterations: unknown key"));
  CHECK(contains(e, "warmup, iters, validate"));
  // A key of another op's shape is unknown for this op.
  e = error_of("op: ag_gemm\nshape: {m: 4, n: 4, k: 4, topk: 2}\n");
  CHECK(contains(e, "shape.topk: unknown key for op ag_gemm"));
  // Something nowhere near any key gets the list, not a wild guess.
  e = error_of("op: ag_gemm\nshape: {m: 4, n: 4, k: 4}\nzzzzzzzzzz: 1\n");
  CHECK_FALSE(contains(e, "did you mean"));
  CHECK(contains(e, "expected one of: name, op"));
  CHECK(edit_distance("kitten", "sitting") == 3);
}

TEST_CASE("op is required and must be known; dtype must be known") {
  std::string e = error_of("shape: {m: 1, n: 1, k: 1}\n");
  CHECK(starts_with(e, "w.yaml:1:1: op: missing; expected one of ag_gemm"));
  e = error_of("op: ag_gem\nshape: {m: 1, n: 1, k: 1}\n");
  CHECK(starts_with(e, "w.yaml:1:5: op: unknown value 'ag_gem'; did you mean 'ag_gemm'?"));
  e = error_of("op: ag_gemm\ndtype: fp64\nshape: {m: 1, n: 1, k: 1}\n");
  CHECK(starts_with(e, "w.yaml:2:8: dtype: unknown value 'fp64'"));
  CHECK(contains(e, "bf16, fp16, fp8"));
  e = error_of("op: ag_gemm\n");
  CHECK(contains(e, "shape: missing; expected a map {m, n, k} for op ag_gemm"));
}

TEST_CASE("wrong types: strings, lists, maps and floats where integers or booleans belong") {
  CHECK(starts_with(error_of("op: ag_gemm\nshape: {m: \"8192\", n: 4, k: 4}\n"),
                    "w.yaml:2:12: shape.m: expected an integer between 1 and 2147483647, got a quoted string"));
  CHECK(contains(error_of("op: ag_gemm\nshape: {m: [1, 2], n: 4, k: 4}\n"), "shape.m: expected an integer"));
  CHECK(contains(error_of("op: ag_gemm\nshape: {m: 8.5, n: 4, k: 4}\n"), "got '8.5'"));
  CHECK(contains(error_of("op: ag_gemm\nshape: {m: 1e4, n: 4, k: 4}\n"), "got '1e4'"));
  CHECK(contains(error_of("op: ag_gemm\nshape: {m: , n: 4, k: 4}\n"), "shape.m: expected an integer"));
  CHECK(contains(error_of("op: ag_gemm\nshape: 42\n"),
                 "shape: expected a map {m, n, k} for op ag_gemm, got a scalar '42'"));
  CHECK(contains(error_of("op: [ag_gemm]\n"), "op: expected one of"));
  CHECK(contains(error_of(std::string(kGood) + "run: {validate: maybe}\n"),
                 "run.validate: expected true or false, got a scalar 'maybe'"));
  CHECK(contains(error_of(std::string(kGood) + "roles: automatic\n"), "roles: expected auto or a map"));
  CHECK(contains(error_of(std::string(kGood) + "layout2: 1\n"), "did you mean 'layout'"));
  CHECK(contains(error_of("op: ag_gemm\nshape: {m: 4, n: 4, k: 4}\nlayout: 4\n"),
                 "layout: expected a map {nodes, gpus_per_node}"));
}

TEST_CASE("zero, negative and overflowing sizes") {
  CHECK(starts_with(error_of("op: ag_gemm\nshape: {m: 0, n: 4, k: 4}\n"),
                    "w.yaml:2:12: shape.m: expected an integer between 1 and 2147483647, got 0"));
  CHECK(contains(error_of("op: ag_gemm\nshape: {m: 4, n: -8, k: 4}\n"),
                 "shape.n: expected an integer between 1 and 2147483647, got -8"));
  CHECK(contains(error_of("op: ag_gemm\nshape: {m: 4, n: 4, k: 99999999999999999999999}\n"),
                 "shape.k: expected an integer between 1 and 2147483647, got 99999999999999999999999"));
  CHECK(contains(error_of("op: ag_gemm\nshape: {m: 4, n: 4, k: 4294967296}\n"), "shape.k: expected an integer"));
  // Each dimension fits, the matrices do not.
  CHECK(contains(error_of("op: gemm_ar\nshape: {m: 2000000000, n: 2000000000, k: 8}\n"),
                 "shape: a matrix of this shape would exceed"));
  CHECK(contains(error_of("op: ag_gemm\nshape: {m: 4, n: 4, k: 4}\nlayout: {nodes: 0}\n"),
                 "layout.nodes: expected an integer between 1"));
  CHECK(contains(error_of("op: ag_gemm\nshape: {m: 4, n: 4, k: 4}\nrun: {iters: 0}\n"),
                 "run.iters: expected an integer between 1"));
  CHECK(contains(error_of("op: ag_gemm\nshape: {m: 4, n: 4, k: 4}\nrun: {warmup: -1}\n"),
                 "run.warmup: expected an integer between 0"));
}

TEST_CASE("sizes the layout does not divide, per op") {
  std::string e = error_of("op: ag_gemm\nshape: {m: 8190, n: 28672, k: 8192}\nlayout: {nodes: 1, gpus_per_node: 4}\n");
  CHECK(starts_with(
      e, "w.yaml:2:12: shape.m: 8190 is not divisible by the 4 ranks (1 node x 4 GPUs); expected a multiple of 4"));
  CHECK(contains(error_of("op: ag_gemm\nshape: {m: 8192, n: 100, k: 8}\nlayout: {nodes: 2, gpus_per_node: 4}\n"),
                 "shape.n: 100 is not divisible by the 8 ranks (2 nodes x 4 GPUs)"));
  CHECK(contains(error_of("op: gemm_rs\nshape: {m: 64, n: 64, k: 7000}\nlayout: {gpus_per_node: 3}\n"),
                 "shape.k: 7000 is not divisible by the 3 ranks"));
  CHECK(contains(error_of("op: gemm_rs\nshape: {m: 62, n: 64, k: 6000}\nlayout: {gpus_per_node: 4}\n"), "shape.m: 62"));
  CHECK(contains(error_of("op: gemm_ar\nshape: {m: 7, n: 7, k: 7}\nlayout: {gpus_per_node: 2}\n"),
                 "shape.k: 7 is not divisible"));
  CHECK(contains(
      error_of("op: moe\nshape: {tokens: 100, hidden: 8, ffn: 8, experts: 8, topk: 2}\nlayout: {gpus_per_node: 8}\n"),
      "shape.tokens: 100 is not divisible"));
  CHECK(contains(
      error_of("op: moe\nshape: {tokens: 64, hidden: 8, ffn: 8, experts: 6, topk: 2}\nlayout: {gpus_per_node: 4}\n"),
      "shape.experts: 6 is not divisible"));
  CHECK(
      contains(error_of("op: ring_attention\nshape: {seq: 1000, heads: 8, head_dim: 64}\nlayout: {gpus_per_node: 3}\n"),
               "shape.seq: 1000 is not divisible"));
  // gemm_ar does not split m, so an odd m is fine.
  Workload w;
  std::string err;
  CHECK(parse_workload("op: gemm_ar\nshape: {m: 7, n: 7, k: 8}\nlayout: {gpus_per_node: 2}\n", "w.yaml", &w, &err) ==
        Status::kOk);
  // --nodes re-checks with the new world size and still points at the key.
  REQUIRE(parse_workload("op: ag_gemm\nshape: {m: 8192, n: 28672, k: 8}\nlayout: {gpus_per_node: 4}\n", "w.yaml", &w,
                         &err) == Status::kOk);
  CHECK(validate_layout(w, Layout{3, 4}, &err) == Status::kInvalidArgument);
  CHECK(starts_with(err, "w.yaml:2:12: shape.m: 8192 is not divisible by the 12 ranks (3 nodes x 4 GPUs)"));
  CHECK(validate_layout(w, Layout{2, 4}, &err) == Status::kOk);
}

TEST_CASE("moe: topk may not exceed experts") {
  std::string e = error_of("op: moe\nshape: {tokens: 64, hidden: 8, ffn: 8, experts: 4, topk: 6}\n");
  CHECK(starts_with(e, "w.yaml:2:58: shape.topk: 6 > experts (4); expected topk between 1 and experts"));
  CHECK(contains(error_of("op: moe\nshape: {tokens: 64, hidden: 8, ffn: 8, experts: 4}\n"), "shape.topk: missing"));
}

TEST_CASE("ring_attention: causal defaults to true and must be a boolean") {
  Workload w;
  std::string err;
  REQUIRE(parse_workload("op: ring_attention\nshape: {seq: 4096, heads: 8, head_dim: 128}\n", "w.yaml", &w, &err) ==
          Status::kOk);
  CHECK(w.attention.causal);
  CHECK(contains(error_of("op: ring_attention\nshape: {seq: 4096, heads: 8, head_dim: 128, causal: 1}\n"),
                 "shape.causal: expected true or false"));
}

TEST_CASE("explicit roles: no more than the SM count, at least one compute SM") {
  unsetenv("WEFT_GPU_ARCH");
  std::string e = error_of(std::string(kGood) + "roles: {compute: 120, intra_comm: 16}\n");
  CHECK(starts_with(e,
                    "w.yaml:6:18: roles.compute: compute 120 + intra_comm 16 + inter_send 0 + inter_reduce 0 = 136; "
                    "expected at most 132 SMs"));
  e = error_of(std::string(kGood) + "roles: {compute: 0, intra_comm: 16}\n");
  CHECK(contains(e, "roles.compute: compute 0"));
  CHECK(contains(e, "at least 1 compute SM"));
  // compute left out: the rest of the SMs; none left is an error at `roles`.
  e = error_of(std::string(kGood) + "roles: {intra_comm: 132}\n");
  CHECK(starts_with(e, "w.yaml:6:8: roles: compute 0"));
  CHECK(contains(error_of(std::string(kGood) + "roles: {intra_comm: 200}\n"),
                 "roles.intra_comm: expected an integer between 0 and 132"));
  CHECK(contains(error_of(std::string(kGood) + "roles: {intra_comm: -1}\n"),
                 "roles.intra_comm: expected an integer between 0"));
  Workload w;
  std::string err;
  REQUIRE(parse_workload(std::string(kGood) + "roles: {intra_comm: 12}\n", "w.yaml", &w, &err) == Status::kOk);
  CHECK(w.roles.counts.compute == 120);
  // A machine override changes the SM count the counts are checked against.
  REQUIRE(parse_workload(std::string(kGood) + "machine: {sm_count: 114}\nroles: {compute: 100, intra_comm: 14}\n",
                         "w.yaml", &w, &err) == Status::kOk);
  CHECK(contains(error_of(std::string(kGood) + "machine: {sm_count: 114}\nroles: {compute: 110, intra_comm: 14}\n"),
                 "expected at most 114 SMs"));
}

TEST_CASE("machine overrides: known keys, positive numbers, h100/h200") {
  Workload w;
  std::string err;
  REQUIRE(parse_workload(std::string(kGood) + "machine: {gpu: h100, nvlink_gbps: 300, nic_gbps: 25}\n", "w.yaml", &w,
                         &err) == Status::kOk);
  CHECK(w.gpu == "h100");
  REQUIRE(w.machine_overrides.size() == 2);
  CHECK(w.machine_overrides[0].first == "nvlink_gbps");
  CHECK(w.machine_overrides[0].second == 300);
  CHECK(contains(error_of(std::string(kGood) + "machine: {nvlink_gbs: 3}\n"), "did you mean 'nvlink_gbps'"));
  CHECK(contains(error_of(std::string(kGood) + "machine: {nic_gbps: 0}\n"), "machine.nic_gbps: expected a number > 0"));
  CHECK(contains(error_of(std::string(kGood) + "machine: {nic_gbps: fast}\n"), "machine.nic_gbps: expected a number"));
  CHECK(contains(error_of(std::string(kGood) + "machine: {gpu: a100}\n"), "machine.gpu: unknown value 'a100'"));
}

TEST_CASE("transport and run values are checked") {
  CHECK(contains(error_of(std::string(kGood) + "transport: {inter_node: rdma}\n"),
                 "transport.inter_node: unknown value 'rdma'; expected one of auto, ibverbs, socket"));
  CHECK(contains(error_of(std::string(kGood) + "transport: {signal_mode: batch}\n"), "did you mean 'batched'"));
}

TEST_CASE("plan: map: every key parses into the workload; unset keys stay the tuner's") {
  Workload w;
  std::string err;
  REQUIRE_MESSAGE(
      parse_workload(std::string(kGood) + "plan:\n  variant: sm_movers\n  sm_mover: push_bulk\n  cluster: 1\n"
                                          "  group_m: 8\n  gemm: {split_tail: false, tma_store: false}\n",
                     "w.yaml", &w, &err) == Status::kOk,
      err);
  CHECK(w.plan.variant == std::optional<std::string>("sm_movers"));
  CHECK(w.plan.sm_mover == std::optional<std::string>("push_bulk"));
  CHECK(w.plan.cluster == std::optional<int>(1));
  CHECK(w.plan.group_m == std::optional<int>(8));
  CHECK(w.plan.split_tail == std::optional<bool>(false));
  CHECK(w.plan.tma_store == std::optional<bool>(false));
  CHECK_FALSE(w.plan.copy_chunks);
  CHECK_FALSE(w.plan.reduce_blocks);
  CHECK_FALSE(w.plan.chunked_tail);
  CHECK_FALSE(w.plan.dynamic_tiles);
  CHECK_FALSE(w.plan.empty());
  CHECK(w.loc_of("plan.group_m").line == 10);
  Workload none;
  REQUIRE(parse_workload(kGood, "w.yaml", &none, &err) == Status::kOk);
  CHECK(none.plan.empty());
}

TEST_CASE("plan: map: unknown keys, wrong types and values out of range are refused where they are") {
  const std::string g(kGood);
  CHECK(starts_with(error_of(g + "plan: {variant: copy_engine, clustre: 2}\n"),
                    "w.yaml:6:30: plan.clustre: unknown key; did you mean 'cluster'? expected one of: variant, "
                    "sm_mover, copy_chunks, cluster, group_m, reduce_blocks, pieces, lag, send, gather, split_k, "
                    "gemm"));
  CHECK(contains(error_of(g + "plan: {split_k: 5}\n"), "plan.split_k"));
  CHECK(contains(error_of(g + "plan: {split_k: 0}\n"), "plan.split_k"));
  CHECK(contains(error_of(g + "plan: {variant: sm_mover}\n"),
                 "w.yaml:6:17: plan.variant: unknown value 'sm_mover'; did you mean 'sm_movers'? expected one of "
                 "copy_engine, sm_movers, peer"));
  CHECK(contains(error_of(g + "plan: {sm_mover: pull}\n"), "plan.sm_mover: unknown value 'pull'"));
  CHECK(
      contains(error_of(g + "plan: {cluster: 4}\n"), "w.yaml:6:17: plan.cluster: expected an integer between 1 and 2"));
  CHECK(contains(error_of(g + "plan: {copy_chunks: 0}\n"), "plan.copy_chunks: expected an integer between 1 and 1024"));
  CHECK(contains(error_of(g + "plan: {group_m: '8'}\n"), "plan.group_m: expected an integer between 1 and 1024"));
  CHECK(contains(error_of(g + "plan: {reduce_blocks: 5000}\n"), "plan.reduce_blocks: expected an integer"));
  CHECK(contains(error_of(g + "plan: {pieces: 65}\n"), "plan.pieces: expected an integer between 1 and 64"));
  CHECK(contains(error_of(g + "plan: {lag: 0}\n"), "plan.lag: expected an integer between 1 and 64"));
  CHECK(contains(error_of(g + "plan: {send: nvlink}\n"), "plan.send: unknown value 'nvlink'"));
  CHECK(contains(error_of(g + "plan: {gather: pull}\n"), "plan.gather: unknown value 'pull'"));
  CHECK(contains(error_of(g + "plan: copy_engine\n"), "w.yaml:6:7: plan: expected a map {variant, sm_mover"));
  CHECK(contains(error_of(g + "plan: {gemm: {split: false}}\n"),
                 "plan.gemm.split: unknown key; expected one of: split_tail, chunked_tail, dynamic_tiles, tma_store"));
  CHECK(contains(error_of(g + "plan: {gemm: {tma_store: 0}}\n"), "plan.gemm.tma_store: expected true or false"));
  CHECK(contains(error_of(g + "plan: {gemm: true}\n"), "plan.gemm: expected a map {split_tail"));
}

TEST_CASE("mutated examples never crash or throw: each gives a workload or one located error") {
  // Deterministic mutations (delete, insert, replace) with characters that matter to YAML.
  const std::string alphabet = std::string(":{}[],-#\"'\t\n 0123456789abk&*!|>%@`") + std::string(1, '\0') + "\xff";
  uint32_t seed = 12345;
  auto next = [&seed] { return seed = seed * 1664525u + 1013904223u; };
  int ok = 0, bad = 0;
  for (const auto& f : example_files()) {
    Workload w;
    std::string err;
    REQUIRE(load_workload(f, &w, &err) == Status::kOk);
    std::string original;
    {
      FILE* fp = fopen(f.c_str(), "rb");
      REQUIRE(fp != nullptr);
      char buf[4096];
      size_t n;
      while ((n = fread(buf, 1, sizeof(buf), fp)) > 0) original.append(buf, n);
      fclose(fp);
    }
    for (int i = 0; i < 150; ++i) {
      std::string t = original;
      for (int edits = 1 + next() % 3; edits > 0 && !t.empty(); --edits) {
        size_t at = next() % t.size();
        char c = alphabet[next() % alphabet.size()];
        switch (next() % 3) {
          case 0:
            t.erase(at, 1);
            break;
          case 1:
            t.insert(at, 1, c);
            break;
          default:
            t[at] = c;
            break;
        }
      }
      Status s = Status::kInternal;
      err.clear();
      CHECK_NOTHROW(s = parse_workload(t, "w.yaml", &w, &err));
      if (s == Status::kOk) {
        ++ok;
        continue;
      }
      ++bad;
      CHECK(s == Status::kInvalidArgument);
      INFO(err);
      CHECK(starts_with(err, "w.yaml:"));
      // "w.yaml:LINE:COL: key: what"
      size_t a = err.find(':', 7), b = err.find(": ", a + 1);
      CHECK(a != std::string::npos);
      CHECK(b != std::string::npos);
      CHECK(err.find('\n') == std::string::npos);
    }
  }
  CHECK(ok > 0);
  CHECK(bad > 0);
}

// Bounded input (issue 24): wrong files and hostile YAML are refused quickly, by their reason.
namespace {

std::string temp_path(const char* name) { return "/tmp/weft-test-workload-" + std::to_string(getpid()) + "-" + name; }

std::string load_error(const std::string& path, Status want) {
  Workload w;
  std::string err;
  CHECK(load_workload(path, &w, &err) == want);
  CHECK(err.find('\n') == std::string::npos);
  CHECK(starts_with(err, path + ":1:1: (file): "));
  return err;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("non-regular files are refused by their type, without reading them") {
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(contains(load_error("/dev/zero", Status::kInvalidArgument), "is a character device; expected a regular"));
  CHECK(contains(load_error("/tmp", Status::kInvalidArgument), "is a directory; expected a regular YAML file"));
  const std::string fifo = temp_path("fifo");
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  // Opening a FIFO with no writer would block a plain open(); the reader must not wait.
  CHECK(contains(load_error(fifo, Status::kInvalidArgument), "is a FIFO"));
  unlink(fifo.c_str());
  CHECK(seconds_since(t0) < 2.0);
}

TEST_CASE("a file over the size cap is refused before it is read; one at the cap is read") {
  const std::string path = temp_path("big.yaml");
  std::string text = kGood;
  text += "# " + std::string(kMaxWorkloadBytes - text.size() - 3, 'x') + "\n";
  REQUIRE(text.size() == kMaxWorkloadBytes);
  auto write = [&](const std::string& t) {
    FILE* f = fopen(path.c_str(), "wb");
    REQUIRE(f != nullptr);
    REQUIRE(fwrite(t.data(), 1, t.size(), f) == t.size());
    fclose(f);
  };
  write(text);
  Workload w;
  std::string err;
  CHECK_MESSAGE(load_workload(path, &w, &err) == Status::kOk, err);
  write(text + "#");
  std::string e = load_error(path, Status::kInvalidArgument);
  CHECK(contains(e, std::to_string(kMaxWorkloadBytes + 1) + " bytes; expected a YAML file of at most 1048576 bytes"));
  // A big program given by mistake is called binary, from its first bytes.
  std::string elf = std::string(
                        "\x7f"
                        "ELF\x02\x01",
                        6) +
                    std::string(kMaxWorkloadBytes, 'x');
  write(elf);
  e = load_error(path, Status::kInvalidArgument);
  CHECK(contains(e, "binary data (byte 0x7f at offset 0) and 1048582 bytes; expected a YAML file of at most"));
  // The same bound holds for text handed to parse_workload directly.
  CHECK(contains(error_of(text + "#"), "bytes; expected a YAML file of at most"));
  unlink(path.c_str());
}

TEST_CASE("anchors and aliases are refused where they are, before any expansion") {
  std::string e = error_of(std::string(kGood) + "run: &r {iters: 3}\n");
  CHECK(starts_with(e, "w.yaml:6:6: (anchor): a YAML anchor (&r)"));
  // The nine-level "billion laughs": each level names the previous one ten times.
  std::string bomb = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i <= 9; ++i) {
    bomb += "a" + std::to_string(i) + ": &a" + std::to_string(i) + " [";
    for (int j = 0; j < 10; ++j) bomb += (j ? ", *a" : "*a") + std::to_string(i - 1);
    bomb += "]\n";
  }
  const auto t0 = std::chrono::steady_clock::now();
  e = error_of(bomb);
  CHECK(seconds_since(t0) < 1.0);
  CHECK(starts_with(e, "w.yaml:1:5: (anchor): a YAML anchor (&a0); expected plain values"));
  // An alias with no anchor is a YAML error, located like every other.
  e = error_of(std::string(kGood) + "run: *r\n");
  CHECK(starts_with(e, "w.yaml:6:"));
}

TEST_CASE("long values are refused at their place and never echoed back") {
  const std::string big(10000, 'n');
  std::string e = error_of("name: " + big + "\n" + std::string(kGood).substr(8));
  CHECK(starts_with(e, "w.yaml:1:7: (value): a value of 10000 bytes; expected at most 256"));
  CHECK(e.size() < 200);
  e = error_of(std::string(kGood) + big + ": 1\n");
  CHECK(e.find(big.substr(0, 100)) == std::string::npos);
  CHECK(e.size() < 200);
  // A value at the bound is fine.
  Workload w;
  std::string err;
  const std::string name(kMaxWorkloadScalarBytes, 'q');
  REQUIRE_MESSAGE(
      parse_workload("name: " + name + "\n" + std::string(kGood).substr(8), "w.yaml", &w, &err) == Status::kOk, err);
  CHECK(w.name == name);
}

TEST_CASE("too many values, and too deep nesting, are refused") {
  std::string list = "name: [";
  for (int i = 0; i < kMaxWorkloadNodes; ++i) list += i ? ",1" : "1";
  list += "]\n";
  std::string e = error_of(list + std::string(kGood).substr(8));
  CHECK(contains(e, "(file): more than 4096 YAML values"));
  const std::string deep = "name: " + std::string(kMaxWorkloadDepth + 5, '[') + std::string(kMaxWorkloadDepth + 5, ']');
  e = error_of(deep + "\n");
  CHECK(starts_with(e, "w.yaml:1:22: (file): maps and lists nested more than 16 deep"));
}

TEST_CASE("values echoed in messages keep the message on one line (found by fuzz_workload)") {
  // A plain scalar over a blank line keeps a newline; a quoted key may hold any control byte.
  std::string e = error_of("x\n\ny\n");
  CHECK(contains(e, "got a scalar 'x\\ny'"));
  e = error_of(std::string(kGood) + "\"la\\tyout\\r\": 1\n");
  CHECK(contains(e, "la\\x09yout\\x0d"));
}
