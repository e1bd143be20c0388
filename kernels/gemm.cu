// Host side of the persistent GEMM: argument checks, tensor maps, launches of the standalone kernel.
#include <cuda.h>
#include <cuda_runtime.h>

#include "kernels/gemm.h"
#include "kernels/gemm_sm90.cuh"
#include "runtime/log.h"

namespace weft::kernels {
namespace {

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// Found once through the runtime, so nothing links against the driver library directly.
Status encode_fn(EncodeTiledFn* out) {
  static EncodeTiledFn fn = nullptr;
  if (!fn) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q);
    if (err != cudaSuccess || q != cudaDriverEntryPointSuccess || !p) {
      WEFT_WARN(kKernel, "cuTensorMapEncodeTiled is not available from the driver (%s)", cudaGetErrorString(err));
      return Status::kCudaError;
    }
    fn = reinterpret_cast<EncodeTiledFn>(p);
  }
  *out = fn;
  return Status::kOk;
}

// 2-D bf16 tensor (rows x cols, row stride ld elements) read in boxes of box_rows x 64 columns.
Status encode_operand(const char* name, const void* ptr, int64_t rows, int64_t cols, int64_t ld, uint32_t box_rows,
                      CUtensorMap* out) {
  EncodeTiledFn fn = nullptr;
  WEFT_CHECK(encode_fn(&fn));
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(ld) * 2};
  const cuuint32_t box[2] = {uint32_t(GemmConfig::kTileK), box_rows};
  const cuuint32_t elem_strides[2] = {1, 1};
  CUresult r = fn(out, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(ptr), dims, strides, box, elem_strides,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    WEFT_WARN(kKernel, "gemm: cannot encode the tensor map of %s (%lld x %lld, ld %lld): CUresult %d", name,
              (long long)rows, (long long)cols, (long long)ld, int(r));
    return Status::kInvalidArgument;
  }
  return Status::kOk;
}

template <class Epilogue>
Status launch(const GemmParams& g, const FrameParams& frame, const Epilogue& epi, const FlagGate& gate,
              const TileSignal& signal, cudaStream_t stream) {
  auto kernel = gemm_persistent_kernel<Epilogue>;
  const int smem = int(gemm_smem_bytes());
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err == cudaSuccess) {
    GemmKernelParams<Epilogue> p;
    p.gemm = g;
    p.frame = frame;
    p.epi = epi;
    p.gate = gate;
    p.signal = signal;
    if (frame.roles.compute <= 0 || frame.roles.total() <= 0) {
      WEFT_WARN(kKernel, "gemm: rank %d launch with %d compute blocks of %d", frame.rank, frame.roles.compute,
                frame.roles.total());
      return Status::kInvalidArgument;
    }
    kernel<<<frame.roles.total(), GemmConfig::kThreads, smem, stream>>>(p);
    err = cudaGetLastError();
  }
  if (err != cudaSuccess) {
    WEFT_WARN(kKernel, "gemm: rank %d launch failed: %s", frame.rank, cudaGetErrorString(err));
    return Status::kCudaError;
  }
  return Status::kOk;
}

}  // namespace

Status make_gemm_params(const GemmArgs& args, GemmParams* out) {
  const int64_t lda = args.lda ? args.lda : args.k;
  const int64_t ldb = args.ldb ? args.ldb : args.k;
  const char* why = nullptr;
  if (args.m <= 0 || args.n <= 0 || args.k <= 0) {
    why = "M, N and K must be positive";
  } else if (args.m >= (int64_t(1) << 31) || args.n >= (int64_t(1) << 31) || args.k >= (int64_t(1) << 31)) {
    why = "M, N and K must be below 2^31";
  } else if (args.k % 8 != 0 || lda % 8 != 0 || ldb % 8 != 0) {
    why = "K, lda and ldb must be multiples of 8 (the copy engine needs 16-byte rows); M and N may be anything";
  } else if (lda < args.k || ldb < args.k) {
    why = "lda and ldb must be >= K";
  } else if (!args.a || !args.b || (reinterpret_cast<uintptr_t>(args.a) % 16) ||
             (reinterpret_cast<uintptr_t>(args.b) % 16)) {
    why = "A and B must be non-null and 16-byte aligned";
  }
  if (why) {
    WEFT_WARN(kKernel, "gemm %lld x %lld x %lld (lda %lld, ldb %lld) rejected: %s", (long long)args.m,
              (long long)args.n, (long long)args.k, (long long)lda, (long long)ldb, why);
    return Status::kInvalidArgument;
  }
  if (!TileSchedule::make(args.m, args.n, GemmConfig::kTileM, GemmConfig::kTileN, args.group_m, args.num_shards,
                          args.first_shard, &out->sched, &why)) {
    WEFT_WARN(kKernel, "gemm %lld x %lld x %lld: bad tile schedule (%d shards, first %d, group %d): %s",
              (long long)args.m, (long long)args.n, (long long)args.k, args.num_shards, args.first_shard,
              args.group_m, why);
    return Status::kInvalidArgument;
  }
  WEFT_CHECK(encode_operand("A", args.a, args.m, args.k, lda, GemmConfig::kTileM, &out->tmap_a));
  WEFT_CHECK(encode_operand("B", args.b, args.n, args.k, ldb, GemmConfig::kTileN, &out->tmap_b));
  out->m = int32_t(args.m);
  out->n = int32_t(args.n);
  out->k = int32_t(args.k);
  return Status::kOk;
}

size_t gemm_shared_bytes() { return gemm_smem_bytes(); }

Status device_sm_count(int* out) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(out, cudaDevAttrMultiProcessorCount, dev);
  if (err != cudaSuccess) {
    WEFT_WARN(kKernel, "cannot read the SM count: %s", cudaGetErrorString(err));
    return Status::kCudaError;
  }
  return Status::kOk;
}

Status launch_gemm(const GemmParams& g, const FrameParams& frame, const EpiStoreBf16& epi, const FlagGate& gate,
                   const TileSignal& signal, cudaStream_t stream) {
  return launch(g, frame, epi, gate, signal, stream);
}
Status launch_gemm(const GemmParams& g, const FrameParams& frame, const EpiAddF32& epi, const FlagGate& gate,
                   const TileSignal& signal, cudaStream_t stream) {
  return launch(g, frame, epi, gate, signal, stream);
}
Status launch_gemm(const GemmParams& g, const FrameParams& frame, const EpiAddBf16& epi, const FlagGate& gate,
                   const TileSignal& signal, cudaStream_t stream) {
  return launch(g, frame, epi, gate, signal, stream);
}

}  // namespace weft::kernels
