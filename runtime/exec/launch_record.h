// An op's launch record on the device and the plan read back from it (what `weftrun run` reports).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "kernels/frame.cuh"
#include "runtime/plan.h"

namespace weft::runtime {

// Owns the device LaunchRecord an op's kernel writes (FrameParams::launch).
class OpLaunchRecord {
 public:
  OpLaunchRecord() = default;
  OpLaunchRecord(const OpLaunchRecord&) = delete;
  OpLaunchRecord& operator=(const OpLaunchRecord&) = delete;
  ~OpLaunchRecord();

  Status create();  // allocated and zeroed
  kernels::LaunchRecord* device() const { return record_; }
  Status clear();                                 // after the device is idle: the next launch is the only one recorded
  Status read(kernels::LaunchRecord* out) const;  // after the device is idle

  // `planned` with the roles and cluster the recorded launch really had, the variant named by
  // `variant_of(kernel kind)` and the op's own heap; kNotFound (logged, naming rank and op) when the
  // record does not describe a launch of the plan's shape.
  Status executed(const Plan& planned, const std::vector<HeapRegion>& heap, uint64_t heap_bytes, int rank,
                  const char* op, std::string (*variant_of)(int32_t kernel), Plan* out) const;

 private:
  kernels::LaunchRecord* record_ = nullptr;
};

}  // namespace weft::runtime
