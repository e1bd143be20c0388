// Stream memory operations (driver waits and writes on a stream, no SM) and a bounded stream sync.
#include "runtime/exec/stream_ops.h"

#include <cuda.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "base/log.h"

namespace weft::runtime {

namespace {
using WriteValue64Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);

WriteValue64Fn write_value_fn() {
  static WriteValue64Fn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuStreamWriteValue64", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      return WriteValue64Fn(nullptr);
    return reinterpret_cast<WriteValue64Fn>(p);
  }();
  return fn;
}

Status write_value(cudaStream_t s, uint64_t* addr, uint64_t value, unsigned flags) {
  WriteValue64Fn fn = write_value_fn();
  if (!fn) {
    WEFT_WARN(kKernel, "cuStreamWriteValue64 is not available from this driver");
    return Status::kUnsupported;
  }
  CUresult r = fn(reinterpret_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(addr), value, flags);
  if (r != CUDA_SUCCESS) {
    WEFT_WARN(kKernel, "cuStreamWriteValue64(%p, %llu) failed: CUresult %d", static_cast<void*>(addr),
              static_cast<unsigned long long>(value), int(r));
    return Status::kCudaError;
  }
  return Status::kOk;
}
}  // namespace

Status stream_write_u64(cudaStream_t s, uint64_t* addr, uint64_t value) {
  return write_value(s, addr, value, CU_STREAM_WRITE_VALUE_DEFAULT);
}

namespace {
using WaitValue64Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
WaitValue64Fn wait_value_fn() {
  static WaitValue64Fn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue64", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      return WaitValue64Fn(nullptr);
    return reinterpret_cast<WaitValue64Fn>(p);
  }();
  return fn;
}
}  // namespace

Status stream_wait_u64_geq(cudaStream_t s, const uint64_t* addr, uint64_t value) {
  WaitValue64Fn fn = wait_value_fn();
  if (!fn) {
    WEFT_WARN(kKernel, "cuStreamWaitValue64 is not available from this driver");
    return Status::kUnsupported;
  }
  CUresult r = fn(reinterpret_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(addr), value, CU_STREAM_WAIT_VALUE_GEQ);
  if (r != CUDA_SUCCESS) {
    WEFT_WARN(kKernel, "cuStreamWaitValue64(%p >= %llu) failed: CUresult %d", static_cast<const void*>(addr),
              static_cast<unsigned long long>(value), int(r));
    return Status::kCudaError;
  }
  return Status::kOk;
}

namespace {
using BatchMemOpFn = CUresult (*)(CUstream, unsigned int, CUstreamBatchMemOpParams*, unsigned int);
BatchMemOpFn batch_mem_op_fn() {
  static BatchMemOpFn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuStreamBatchMemOp", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      return BatchMemOpFn(nullptr);
    return reinterpret_cast<BatchMemOpFn>(p);
  }();
  return fn;
}
}  // namespace

Status stream_mem_ops(cudaStream_t s, const std::vector<StreamMemOp>& ops) {
  if (ops.empty()) return Status::kOk;
  BatchMemOpFn fn = batch_mem_op_fn();
  if (!fn || ops.size() > 255) {
    WEFT_WARN(kKernel, "cuStreamBatchMemOp %s (%zu steps)", fn ? "takes at most 255 steps" : "is not available",
              ops.size());
    return Status::kUnsupported;
  }
  std::vector<CUstreamBatchMemOpParams> p(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    memset(&p[i], 0, sizeof p[i]);
    if (ops[i].kind == StreamMemOp::kWaitGeq) {
      p[i].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_64;
      p[i].waitValue.address = reinterpret_cast<CUdeviceptr>(ops[i].addr);
      p[i].waitValue.value64 = ops[i].value;
      p[i].waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
    } else {
      p[i].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
      p[i].writeValue.address = reinterpret_cast<CUdeviceptr>(ops[i].addr);
      p[i].writeValue.value64 = ops[i].value;
      p[i].writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
    }
  }
  CUresult r = fn(reinterpret_cast<CUstream>(s), unsigned(p.size()), p.data(), 0);
  if (r != CUDA_SUCCESS) {
    WEFT_WARN(kKernel, "cuStreamBatchMemOp of %zu steps (first %s %p, %llu) failed: CUresult %d", ops.size(),
              ops[0].kind == StreamMemOp::kWaitGeq ? "wait for" : "write", static_cast<void*>(ops[0].addr),
              static_cast<unsigned long long>(ops[0].value), int(r));
    return Status::kCudaError;
  }
  return Status::kOk;
}

namespace {

// Polls `query` (cudaStreamQuery / cudaEventQuery) until it is done, at most timeout_s; past that
// calls `unstick` (every 100 ms) and waits 10 s more.
Status wait_bounded(const std::function<cudaError_t()>& query, double timeout_s, const char* what,
                    const std::function<void()>& unstick) {
  auto start = std::chrono::steady_clock::now();
  auto waited = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  bool unstuck = false;
  auto next_unstick = start;
  for (;;) {
    cudaError_t e = query();
    if (e == cudaSuccess) break;
    if (e != cudaErrorNotReady) {
      WEFT_WARN(kKernel, "%s failed on the device: %s", what, cudaGetErrorString(e));
      return Status::kCudaError;
    }
    // Past the timeout, the waits are released again every 100 ms: a call queued behind the stuck
    // one may reset a word the first release raised, and must be released as well.
    if (waited() > timeout_s && (!unstuck || std::chrono::steady_clock::now() >= next_unstick)) {
      if (unstick) unstick();
      unstuck = true;
      next_unstick = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
    }
    if (waited() > timeout_s + 10) {
      WEFT_WARN(kKernel, "%s did not finish within %.1f s (WEFT_DEVICE_TIMEOUT bounds each device wait)", what,
                timeout_s);
      return Status::kTimeout;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (unstuck) {
    WEFT_WARN(kKernel, "%s waited past %.1f s for a flag that never came; released the waits", what, timeout_s);
    return Status::kTimeout;
  }
  return Status::kOk;
}

}  // namespace

Status sync_bounded(cudaStream_t s, double timeout_s, const char* what, const std::function<void()>& unstick) {
  return wait_bounded([s] { return cudaStreamQuery(s); }, timeout_s, what, unstick);
}

bool retire_clock_stream(cudaStream_t s, const char* what) {
  if (!s) return true;
  if (sync_bounded(s, 10, what, nullptr) != Status::kOk) return false;
  cudaStreamDestroy(s);
  return true;
}

Status event_wait_bounded(cudaEvent_t e, double timeout_s, const char* what, const std::function<void()>& unstick) {
  return wait_bounded([e] { return cudaEventQuery(e); }, timeout_s, what, unstick);
}

Status record_done(cudaEvent_t e, cudaStream_t s) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaError_t err = cudaStreamIsCapturing(s, &capture);
  // During a capture a plain record only orders streams inside the graph and leaves the event
  // unusable outside it (a later cudaEventQuery fails with an invalid argument): an external record
  // node records it on every replay instead.
  if (err == cudaSuccess)
    err = cudaEventRecordWithFlags(
        e, s, capture == cudaStreamCaptureStatusActive ? cudaEventRecordExternal : cudaEventRecordDefault);
  if (err == cudaSuccess) return Status::kOk;
  WEFT_WARN(kKernel, "recording an op's completion event failed: %s", cudaGetErrorString(err));
  return Status::kCudaError;
}

}  // namespace weft::runtime
