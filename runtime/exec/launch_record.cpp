// OpLaunchRecord: allocation, clearing and the plan as executed.
#include "runtime/exec/launch_record.h"

#include "base/log.h"
#include "runtime/exec/cuda_check.h"

namespace weft::runtime {

OpLaunchRecord::~OpLaunchRecord() {
  if (record_) cudaFree(record_);
}

Status OpLaunchRecord::create() {
  WEFT_CUDA_CHECK(cudaMalloc(&record_, sizeof(kernels::LaunchRecord)));
  WEFT_CUDA_CHECK(cudaMemset(record_, 0, sizeof(kernels::LaunchRecord)));
  return Status::kOk;
}

Status OpLaunchRecord::clear() {
  WEFT_CUDA_CHECK(cudaDeviceSynchronize());
  WEFT_CUDA_CHECK(cudaMemset(record_, 0, sizeof(kernels::LaunchRecord)));
  WEFT_CUDA_CHECK(cudaDeviceSynchronize());
  return Status::kOk;
}

Status OpLaunchRecord::read(kernels::LaunchRecord* out) const {
  WEFT_CUDA_CHECK(cudaMemcpy(out, record_, sizeof *out, cudaMemcpyDeviceToHost));
  return Status::kOk;
}

Status OpLaunchRecord::executed(const Plan& planned, const std::vector<HeapRegion>& heap, uint64_t heap_bytes, int rank,
                                const char* op, std::string (*variant_of)(int32_t kernel), Plan* out) const {
  kernels::LaunchRecord rec{};
  WEFT_CHECK(read(&rec));
  Plan p = planned;
  std::string why;
  if (!apply_launch_record(rec, &p, &why)) {
    WEFT_WARN(kKernel, "rank %d: %s: %s", rank, op, why.c_str());
    return Status::kNotFound;
  }
  p.exec.variant = variant_of(rec.kernel);
  p.heap = heap;
  p.heap_bytes = heap_bytes;
  *out = std::move(p);
  return Status::kOk;
}

}  // namespace weft::runtime
