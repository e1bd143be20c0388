// `weftrun plan` end to end: every example gives a plan (exit 0, JSON that parses, roles summing to the
// SM count); bad files give a non-zero exit and one file:line:col message, never a crash.
#include <dirent.h>
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

namespace {

struct Result {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Runs weftrun with `args` (already shell-quoted where needed), capturing stdout and stderr apart.
Result weftrun(const std::string& args) {
  const std::string out = std::string(WEFT_BINARY_DIR) + "/test_plan_cli.out";
  const std::string err = std::string(WEFT_BINARY_DIR) + "/test_plan_cli.err";
  const std::string cmd = std::string("'") + WEFTRUN_PATH + "' " + args + " >'" + out + "' 2>'" + err + "'";
  int status = std::system(cmd.c_str());
  Result r;
  if (WIFEXITED(status))
    r.exit_code = WEXITSTATUS(status);
  else
    r.exit_code = 1000 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);  // a crash
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

std::vector<std::string> yaml_files(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  REQUIRE(d != nullptr);
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n.size() > 5 && n.substr(n.size() - 5) == ".yaml") out.push_back(dir + "/" + n);
  }
  closedir(d);
  return out;
}

// Exactly one message line, "weftrun plan: FILE:LINE:COL: key: ...".
void check_one_located_error(const Result& r, const std::string& file, const std::string& key) {
  CHECK(r.exit_code == 2);
  CHECK(r.out.empty());
  std::smatch m;
  const std::regex re("^weftrun plan: (.+):([0-9]+):([0-9]+): ([^:]+): .+\n$");
  REQUIRE_MESSAGE(std::regex_match(r.err, m, re), r.err);
  CHECK(m[1].str() == file);
  CHECK(std::stoi(m[2].str()) >= 1);
  CHECK(std::stoi(m[3].str()) >= 1);
  CHECK(m[4].str() == key);
}

}  // namespace

TEST_CASE("weftrun plan --json on every example: exit 0, valid JSON, roles sum to the SM count") {
  unsetenv("WEFT_TOPO_FILE");
  unsetenv("WEFT_GPU_ARCH");
  auto files = yaml_files(std::string(WEFT_SOURCE_DIR) + "/configs/examples");
  REQUIRE(files.size() >= 10);
  for (const auto& f : files) {
    INFO(f);
    Result r = weftrun("plan --json '" + f + "'");
    CHECK_MESSAGE(r.exit_code == 0, r.err);
    nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
    REQUIRE_FALSE(j.is_discarded());
    const auto& roles = j["roles"];
    const int total = roles["compute"].get<int>() + roles["intra_comm"].get<int>() + roles["inter_send"].get<int>() +
                      roles["inter_reduce"].get<int>();
    CHECK(total == j["machine"]["sm_count"].get<int>());
    CHECK(roles["compute"].get<int>() >= 1);
    CHECK(j["predicted"]["makespan_us"].get<double>() >= j["predicted"]["bound_us"].get<double>());
    CHECK(j["links"].size() == 3);
    if (j["layout"]["nodes"].get<int>() == 1) CHECK(roles["inter_send"].get<int>() == 0);
    // The table form works too.
    Result t = weftrun("plan '" + f + "'");
    CHECK(t.exit_code == 0);
    CHECK(t.out.find("makespan") != std::string::npos);
  }
}

TEST_CASE("weftrun plan on a machine description without GPUs says the GPU is assumed") {
  const std::string ex = std::string(WEFT_SOURCE_DIR) + "/configs/examples/ag_gemm_2x2.yaml";
  Result r = weftrun("plan --json --topology '" + std::string(WEFT_SOURCE_DIR) +
                     "/tests/data/psmgmt-topo.mel3001.xml' '" + ex + "'");
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  nlohmann::json j = nlohmann::json::parse(r.out);
  CHECK(j["machine"]["assumed"].get<bool>());
  CHECK(j["machine"]["gpu"] == "h200");
  Result t =
      weftrun("plan --topology '" + std::string(WEFT_SOURCE_DIR) + "/tests/data/psmgmt-topo.mel3001.xml' '" + ex + "'");
  CHECK(t.out.find("no GPU in this topology") != std::string::npos);
  // A node with 4 GPUs and 4 NICs maps them and plans ibverbs.
  r = weftrun("plan --json --topology '" + std::string(WEFT_SOURCE_DIR) + "/tests/data/psmgmt-topo.jwb0004.xml' '" +
              ex + "'");
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  j = nlohmann::json::parse(r.out);
  CHECK_FALSE(j["machine"]["assumed"].get<bool>());
  CHECK(j["machine"]["inter_backend"] == "ibverbs");
  CHECK(j["roles"]["inter_send"].get<int>() >= 1);
}

TEST_CASE("--nodes plans for N such nodes and re-checks divisibility") {
  const std::string ex = std::string(WEFT_SOURCE_DIR) + "/configs/examples/ag_gemm_llama70b.yaml";
  Result r = weftrun("plan --json --nodes 2 '" + ex + "'");
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  nlohmann::json j = nlohmann::json::parse(r.out);
  CHECK(j["layout"]["nodes"] == 2);
  CHECK(j["layout"]["world_size"] == 8);
  CHECK(j["roles"]["inter_send"].get<int>() >= 1);
  r = weftrun("plan --nodes 3 '" + ex + "'");  // 8192 rows over 12 ranks
  CHECK(r.exit_code == 2);
  CHECK(r.err.find(ex + ":6:12: shape.m: 8192 is not divisible by the 12 ranks") != std::string::npos);
}

TEST_CASE("a workload's plan: map is the plan's execution, chosen by the workload") {
  const std::string file = std::string(WEFT_SOURCE_DIR) + "/tests/runtime/data/plan_map.yaml";
  Result r = weftrun("plan --json '" + file + "'");
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  CHECK(j["chosen_by"] == "workload");
  const nlohmann::json& e = j["execution"];
  CHECK(e["executable"] == true);
  CHECK(e["variant"] == "sm_movers");
  CHECK(e["sm_mover"] == "push_vec");
  CHECK(e["group_m"] == 8);
  CHECK(e["gemm"]["split_tail"] == false);
  CHECK(e["gemm"]["chunked_tail"] == false);
  CHECK(e["gemm"]["dynamic_tiles"] == true);
  CHECK(e["gemm"]["tma_store"] == false);
  CHECK(j["roles"]["intra_comm"] == 16);
  // The table says it too; and the tuning cache is not consulted for it.
  r = weftrun("plan '" + file + "'");
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  CHECK(r.out.find("runs     sm_movers (push_vec)") != std::string::npos);
  CHECK(r.out.find("chosen by the workload") != std::string::npos);
  CHECK(r.out.find("gemm     split tail off, chunked tail off, dynamic tiles on, TMA store off") != std::string::npos);
  // weftrun tune refuses it before looking for a GPU: its result would serve every workload of the problem.
  r = weftrun("tune '" + file + "'");
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(r.err.find("weftrun tune: " + file +
                           ":8:3: plan: this map fixes the execution, so there is nothing "
                           "to tune") != std::string::npos,
                r.err);
}

TEST_CASE("bad workloads: non-zero exit, one located message naming the key") {
  const std::string dir = std::string(WEFT_SOURCE_DIR) + "/tests/runtime/data/";
  struct Case {
    const char* file;
    const char* key;
  } cases[] = {
      {"bad_tab.yaml", "m"},
      {"bad_duplicate.yaml", "op"},
      {"bad_misspelt.yaml", "layuot"},
      {"bad_topk.yaml", "shape.topk"},
      {"bad_indivisible.yaml", "shape.k"},
      {"bad_roles.yaml", "roles.compute"},
      {"bad_roles_one_node.yaml", "roles.inter_send"},
      {"bad_syntax.yaml", "shape"},
      {"bad_empty.yaml", "(file)"},
      {"bad_plan_key.yaml", "plan.copies"},
      {"bad_plan_variant.yaml", "plan.variant"},
  };
  for (const auto& c : cases) {
    INFO(c.file);
    Result r = weftrun(std::string("plan '") + dir + c.file + "'");
    check_one_located_error(r, dir + c.file, c.key);
    Result j = weftrun(std::string("plan --json '") + dir + c.file + "'");
    CHECK(j.exit_code == 2);
    CHECK(j.out.empty());
  }
  // Binary input (this test binary itself) and a file that does not exist.
  Result r = weftrun(std::string("plan '") + WEFTRUN_PATH + "'");
  check_one_located_error(r, WEFTRUN_PATH, "(file)");
  CHECK(r.err.find("binary data") != std::string::npos);
  r = weftrun("plan /nonexistent/workload.yaml");
  check_one_located_error(r, "/nonexistent/workload.yaml", "(file)");
  // A topology file that cannot be read is an error too (not a silent fallback).
  r = weftrun("plan --topology /nonexistent/topo.xml '" + std::string(WEFT_SOURCE_DIR) +
              "/configs/examples/ag_gemm_llama70b.yaml'");
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("/nonexistent/topo.xml") != std::string::npos);
}

TEST_CASE("a grouped workload: the plan is one group's, and lists every job rank's group and group rank") {
  unsetenv("WEFT_TOPO_FILE");
  const std::string ex = std::string(WEFT_SOURCE_DIR) + "/configs/examples/ag_gemm_tp8_16x8.yaml";
  Result r = weftrun("plan --json '" + ex + "'");
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  CHECK(j["layout"]["nodes"] == 1);  // the op is planned for one 1 x 8 group
  CHECK(j["layout"]["world_size"] == 8);
  CHECK(j["roles"]["inter_send"] == 0);
  const nlohmann::json& g = j["groups"];
  CHECK(g["count"] == 16);
  CHECK(g["group"]["size"] == 8);
  CHECK(g["job"]["world_size"] == 128);
  REQUIRE(g["ranks"].size() == 128);
  CHECK(g["ranks"][21]["group"] == 2);
  CHECK(g["ranks"][21]["rank"] == 5);
  CHECK(g["ranks"][127]["group"] == 15);
  r = weftrun("plan '" + ex + "'");
  REQUIRE(r.exit_code == 0);
  CHECK_MESSAGE(r.out.find("groups   16 groups of 8 in a job of 16 nodes x 8 GPUs = 128 ranks; job rank -> "
                           "group.rank: 0->0.0 1->0.1") != std::string::npos,
                r.out);
  // 2 x 8 groups: planned across 2 nodes; --nodes must keep the tiling.
  const std::string rs = std::string(WEFT_SOURCE_DIR) + "/configs/examples/gemm_rs_tp16_16x8.yaml";
  r = weftrun("plan --json '" + rs + "'");
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  const nlohmann::json k = nlohmann::json::parse(r.out);
  CHECK(k["layout"]["nodes"] == 2);
  CHECK(k["groups"]["count"] == 8);
  r = weftrun("plan --nodes 3 '" + rs + "'");
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(r.err.find(rs + ":8:16: group.nodes: 2 nodes per group do not tile the layout's 3 nodes x 8 GPUs") !=
                    std::string::npos,
                r.err);
  // The whole job as one expert-parallel group.
  r = weftrun("plan --json '" + std::string(WEFT_SOURCE_DIR) + "/configs/examples/moe_ep1024_128x8.yaml'");
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  const nlohmann::json m = nlohmann::json::parse(r.out);
  CHECK(m["layout"]["world_size"] == 1024);
  CHECK(m["groups"]["count"] == 1);
}
