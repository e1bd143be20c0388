// The NCCL functions weftrun bench calls, forwarded to libnccl loaded on first use (bench_libs.h).
#include <nccl.h>

#include "runtime/ops/bench_libs.h"

namespace {

#define WEFT_STR2(x) #x
#define WEFT_STR(x) WEFT_STR2(x)
constexpr const char* kSoname = "libnccl.so." WEFT_STR(NCCL_MAJOR);

// The library's `name`, as a pointer of the declared function's type, resolved once.
template <class F>
F* nccl_fn(const char* name) {
  void* lib = weft::runtime::ops::bench_library(kSoname, "NCCL");
  return reinterpret_cast<F*>(weft::runtime::ops::bench_symbol(lib, name, "NCCL"));
}

}  // namespace

extern "C" {

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  static auto* f = nccl_fn<decltype(ncclGetUniqueId)>("ncclGetUniqueId");
  return f ? f(id) : ncclSystemError;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  static auto* f = nccl_fn<decltype(ncclCommInitRank)>("ncclCommInitRank");
  return f ? f(comm, nranks, id, rank) : ncclSystemError;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  static auto* f = nccl_fn<decltype(ncclCommDestroy)>("ncclCommDestroy");
  return f ? f(comm) : ncclSystemError;
}

const char* ncclGetErrorString(ncclResult_t result) {
  static auto* f = nccl_fn<decltype(ncclGetErrorString)>("ncclGetErrorString");
  return f ? f(result) : "NCCL could not be loaded (see the warning above)";
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  static auto* f = nccl_fn<decltype(ncclAllReduce)>("ncclAllReduce");
  return f ? f(send, recv, count, type, op, comm, stream) : ncclSystemError;
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) {
  static auto* f = nccl_fn<decltype(ncclReduceScatter)>("ncclReduceScatter");
  return f ? f(send, recv, count, type, op, comm, stream) : ncclSystemError;
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream) {
  static auto* f = nccl_fn<decltype(ncclAllGather)>("ncclAllGather");
  return f ? f(send, recv, count, type, comm, stream) : ncclSystemError;
}

ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  static auto* f = nccl_fn<decltype(ncclSend)>("ncclSend");
  return f ? f(send, count, type, peer, comm, stream) : ncclSystemError;
}

ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t stream) {
  static auto* f = nccl_fn<decltype(ncclRecv)>("ncclRecv");
  return f ? f(recv, count, type, peer, comm, stream) : ncclSystemError;
}

ncclResult_t ncclGroupStart() {
  static auto* f = nccl_fn<decltype(ncclGroupStart)>("ncclGroupStart");
  return f ? f() : ncclSystemError;
}

ncclResult_t ncclGroupEnd() {
  static auto* f = nccl_fn<decltype(ncclGroupEnd)>("ncclGroupEnd");
  return f ? f() : ncclSystemError;
}

}  // extern "C"
