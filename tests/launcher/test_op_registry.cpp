// The op-runner and check-transport registries: lookups by name, replacement, and absence.
#include <doctest/doctest.h>

#include <algorithm>

#include "launcher/check_hooks.h"
#include "launcher/launch.h"
#include "launcher/op_registry.h"

using weft::Status;
using namespace weft::launcher;

namespace {
Status runner_a(const RankContext&, const weft::runtime::Workload&, weft::bootstrap::Bootstrap&) { return Status::kOk; }
Status runner_b(const RankContext&, const weft::runtime::Workload&, weft::bootstrap::Bootstrap&) {
  return Status::kUnsupported;
}
Status check_x(const RankContext&, weft::bootstrap::Bootstrap&, int, CheckTransportReport*) { return Status::kOk; }
}  // namespace

TEST_CASE("op runners are found by the op's YAML name; an unknown op has none") {
  CHECK((find_op("test_op_registry_op") == nullptr));
  register_op("test_op_registry_op", runner_a);
  CHECK((find_op("test_op_registry_op") == runner_a));
  register_op("test_op_registry_op", runner_b);  // a later registration replaces
  CHECK((find_op("test_op_registry_op") == runner_b));
  auto names = registered_ops();
  CHECK(std::count(names.begin(), names.end(), "test_op_registry_op") == 1);
  CHECK((find_op("no_such_op") == nullptr));
}

TEST_CASE("transport checks are found by their --transport name") {
  CHECK((find_check_transport("test_x") == nullptr));
  register_check_transport("test_x", check_x);
  CHECK((find_check_transport("test_x") == check_x));
  auto names = check_transport_names();
  CHECK(std::find(names.begin(), names.end(), "test_x") != names.end());
}

TEST_CASE("emulated nodes split the visible GPUs into contiguous slices; one node does not split") {
  CHECK(gpu_slice_for_node(0, 1, 4, "") == "");
  CHECK(gpu_slice_for_node(0, 2, 4, "") == "0,1");
  CHECK(gpu_slice_for_node(1, 2, 4, "") == "2,3");
  CHECK(gpu_slice_for_node(1, 2, 4, "4,5,6,7") == "6,7");  // the user's CUDA_VISIBLE_DEVICES is sliced
  CHECK(gpu_slice_for_node(2, 3, 8, "") == "5,6,7");
  CHECK(gpu_slice_for_node(1, 2, 1, "") == "");  // fewer GPUs than nodes: share, do not split
  CHECK(default_rank_count(0, 1) == 1);
  CHECK(default_rank_count(4, 1) == 4);
  CHECK(default_rank_count(0, 3) == 3);
}
