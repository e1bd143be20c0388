// Host side of the persistent GEMM: argument checks, tensor maps, launches of the standalone kernel.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "base/log.h"
#include "kernels/gemm.h"
#include "kernels/gemm_sm90.cuh"

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

// 2-D bf16 tensor (rows x cols, row stride ld elements) accessed in boxes of box_rows x 64 columns.
Status encode_operand(const char* name, const void* ptr, int64_t rows, int64_t cols, int64_t ld, uint32_t box_rows,
                      CUtensorMap* out, CUtensorMapL2promotion promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_256B) {
  EncodeTiledFn fn = nullptr;
  WEFT_CHECK(encode_fn(&fn));
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(ld) * 2};
  const cuuint32_t box[2] = {uint32_t(GemmConfig::kTileK), box_rows};
  const cuuint32_t elem_strides[2] = {1, 1};
  CUresult r =
      fn(out, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(ptr), dims, strides, box, elem_strides,
         CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, promotion, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    WEFT_WARN(kKernel, "gemm: cannot encode the tensor map of %s (%lld x %lld, ld %lld): CUresult %d", name,
              (long long)rows, (long long)cols, (long long)ld, int(r));
    return Status::kInvalidArgument;
  }
  return Status::kOk;
}

template <int kCluster, class Epilogue>
Status launch_cluster(const GemmParams& g, const FrameParams& frame, const Epilogue& epi, const FlagGate& gate,
                      const TileSignal& signal, cudaStream_t stream) {
  auto kernel = gemm_persistent_kernel<kCluster, Epilogue>;
  const int smem = int(gemm_smem_bytes());
  if (frame.roles.compute <= 0 || frame.roles.compute % kCluster || frame.roles.total() % kCluster) {
    WEFT_WARN(kKernel,
              "gemm: rank %d: %d compute blocks of %d; with clusters of %d CTAs both must be positive multiples of %d",
              frame.rank, frame.roles.compute, frame.roles.total(), kCluster, kCluster);
    return Status::kInvalidArgument;
  }
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  GemmKernelParams<Epilogue> p;
  p.gemm = g;
  p.frame = frame;
  p.epi = epi;
  p.gate = gate;
  p.signal = signal;
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  cfg.gridDim = dim3(unsigned(frame.roles.total()));
  cfg.blockDim = dim3(GemmConfig::kThreads);
  cfg.dynamicSmemBytes = size_t(smem);
  cfg.stream = stream;
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kCluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  if (err == cudaSuccess) {
    // A persistent grid whose clusters cannot all be resident at once serialises (and flag waits
    // between blocks could time out): say so once.
    static bool warned = false;
    int max_clusters = 0;
    if (!warned && cudaOccupancyMaxActiveClusters(&max_clusters, kernel, &cfg) == cudaSuccess &&
        max_clusters * kCluster < frame.roles.total()) {
      warned = true;
      WEFT_WARN(kKernel, "gemm: rank %d: only %d clusters of %d CTAs fit at once, the grid has %d blocks", frame.rank,
                max_clusters, kCluster, frame.roles.total());
    }
    err = cudaLaunchKernelEx(&cfg, kernel, p);
  }
  if (err == cudaSuccess) err = cudaGetLastError();
  if (err != cudaSuccess) {
    WEFT_WARN(kKernel, "gemm: rank %d launch failed: %s", frame.rank, cudaGetErrorString(err));
    return Status::kCudaError;
  }
  return Status::kOk;
}

static_assert(GemmConfig::kStoreBox == GemmConfig::kTileK, "the C box reuses the operands' 64-column box");

template <class Epilogue>
Status launch(const GemmParams& g, const FrameParams& frame, const Epilogue& epi, const FlagGate& gate,
              const TileSignal& signal, cudaStream_t stream, const GemmOptions& opt) {
  GemmParams gs = g;
  // Only kernels built to claim get the words (not GEMM+RS/AR's: gemm_detail::kClaimsTiles).
  if (opt.dynamic_tiles && !g.claims && gemm_detail::kClaimsTiles<1, Epilogue>)
    WEFT_CHECK(enable_dynamic_tiles(stream, &gs));
  // Chunks only for a static walk of a kernel built for them (enable_tail_split).
  if (g.sched.split <= 1)
    WEFT_CHECK(enable_tail_split(frame.roles.compute, stream, &gs,
                                 opt.chunked_tail && gemm_detail::kChunkedTail<Epilogue> && !gs.claims,
                                 opt.split_tail ? kMaxTailSplit : 1));
  if (gs.sched.chunks > 0 && !gemm_detail::kChunkedTail<Epilogue>) {
    WEFT_WARN(kKernel, "launch_gemm: this epilogue's kernel walks K-slices only; the schedule has a chunked tail");
    return Status::kInvalidArgument;
  }
  if (g.cluster_m == 2) return launch_cluster<2>(gs, frame, epi, gate, signal, stream);
  return launch_cluster<1>(gs, frame, epi, gate, signal, stream);
}

// Split-tail flags: one per split CTA tile (at most one per compute block), 64 KiB in front of
// the partials.
constexpr size_t kSplitFlagSlots = 8192;
constexpr size_t kSplitFlagBytes = kSplitFlagSlots * sizeof(uint64_t);

// Split-tail workspaces, one per (device, stream): launches on one stream run one after another,
// so they can share one; launches on different streams may overlap and get their own.
struct SplitWorkspace {
  void* mem = nullptr;
  size_t bytes = 0;
  uint32_t* claims = nullptr;  // enable_dynamic_tiles' two words, zero between launches
};
std::mutex g_ws_mu;
std::map<std::pair<int, cudaStream_t>, SplitWorkspace> g_ws;

// Device memory for the workspaces of `stream`, zero in its first `zero` bytes before the next launch on
// `stream`. Stream-ordered (cudaMallocAsync) normally; while `stream` is being captured in a CUDA
// graph a stream-ordered allocation would belong to the graph and be gone outside it, so then an
// ordinary allocation, zeroed synchronously, under relaxed capture rules for this thread.
cudaError_t alloc_zeroed(cudaStream_t stream, size_t bytes, size_t zero, void** out) {
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  cudaStreamIsCapturing(stream, &cs);
  if (cs == cudaStreamCaptureStatusNone) {
    cudaError_t err = cudaMallocAsync(out, bytes, stream);
    if (err == cudaSuccess) err = cudaMemsetAsync(*out, 0, zero, stream);
    return err;
  }
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  cudaError_t err = cudaMalloc(out, bytes);
  if (err == cudaSuccess) {
    const std::vector<uint8_t> zeros(zero, 0);
    err = cudaMemcpy(*out, zeros.data(), zero, cudaMemcpyHostToDevice);  // done before it returns
  }
  cudaThreadExchangeStreamCaptureMode(&mode);
  return err;
}

// An old workspace: freed in stream order, or kept while the stream is captured (a captured graph
// may still name it).
void release_old(cudaStream_t stream, void* p) {
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  cudaStreamIsCapturing(stream, &cs);
  if (p && cs == cudaStreamCaptureStatusNone) cudaFreeAsync(p, stream);
}

Status split_workspace(cudaStream_t stream, size_t bytes, void** out) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return Status::kCudaError;
  std::lock_guard<std::mutex> lock(g_ws_mu);
  SplitWorkspace& w = g_ws[{dev, stream}];
  if (w.bytes < bytes) {
    // Stream-ordered: earlier launches on `stream` may still use the old workspace, and the new one's
    // flags must be zero before the next launch on `stream` starts (a cudaMemset on the legacy stream
    // does not order against a non-blocking stream: two ops of different sizes on one stream got
    // garbage flags in the split tail and wrong tiles).
    release_old(stream, w.mem);
    w.mem = nullptr;
    w.bytes = 0;
    cudaError_t err = alloc_zeroed(stream, bytes, kSplitFlagBytes, &w.mem);  // the flags start at zero
    if (err != cudaSuccess) {
      WEFT_WARN(kKernel, "gemm: cannot allocate %zu bytes for the split tail (%s); tiles stay whole", bytes,
                cudaGetErrorString(err));
      cudaGetLastError();
      release_old(stream, w.mem);
      w.mem = nullptr;
      *out = nullptr;
      return Status::kOk;
    }
    w.bytes = bytes;
  }
  *out = w.mem;
  return Status::kOk;
}

// The dynamic-claim words of (device, stream); null (logged) when they cannot be allocated.
Status claim_words(cudaStream_t stream, uint32_t** out) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return Status::kCudaError;
  std::lock_guard<std::mutex> lock(g_ws_mu);
  SplitWorkspace& w = g_ws[{dev, stream}];
  if (!w.claims) {
    void* p = nullptr;
    cudaError_t err = alloc_zeroed(stream, 2 * sizeof(uint32_t), 2 * sizeof(uint32_t), &p);  // zero before use
    if (err != cudaSuccess) {
      WEFT_WARN(kKernel, "gemm: cannot allocate the tile-claim words (%s); tiles stay statically striped",
                cudaGetErrorString(err));
      cudaGetLastError();
      release_old(stream, p);
      *out = nullptr;
      return Status::kOk;
    }
    w.claims = static_cast<uint32_t*>(p);
  }
  *out = w.claims;
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
  if (args.cluster_m != 1 && args.cluster_m != 2) {
    WEFT_WARN(kKernel, "gemm: cluster_m must be 1 or 2, not %d", args.cluster_m);
    return Status::kInvalidArgument;
  }
  if (!TileSchedule::make(args.m, args.n, GemmConfig::kTileM * args.cluster_m, GemmConfig::kTileN, args.group_m,
                          args.num_shards, args.first_shard, &out->sched, &why)) {
    WEFT_WARN(kKernel, "gemm %lld x %lld x %lld: bad tile schedule (%d shards, first %d, group %d): %s",
              (long long)args.m, (long long)args.n, (long long)args.k, args.num_shards, args.first_shard, args.group_m,
              why);
    return Status::kInvalidArgument;
  }
  if (args.piece_major_owners > 0 &&
      (args.num_shards % args.piece_major_owners != 0 ||
       !out->sched.set_piece_major(args.piece_major_owners, args.num_shards / args.piece_major_owners,
                                   args.piece_major_owner, args.piece_major_lag, &why))) {
    WEFT_WARN(kKernel, "gemm: piece-major order over %d owners (owner %d, lag %d) of %d shards refused: %s",
              args.piece_major_owners, args.piece_major_owner, args.piece_major_lag, args.num_shards,
              why ? why : "the shards must split evenly over the owners");
    return Status::kInvalidArgument;
  }
  WEFT_CHECK(encode_operand("A", args.a, args.m, args.k, lda, GemmConfig::kTileM, &out->tmap_a));
  WEFT_CHECK(encode_operand("B", args.b, args.n, args.k, ldb, GemmConfig::kTileN / args.cluster_m, &out->tmap_b));
  out->sched.k_iters = int32_t((args.k + GemmConfig::kTileK - 1) / GemmConfig::kTileK);
  out->cluster_m = args.cluster_m;
  out->cta_m_blocks = int32_t((args.m + GemmConfig::kTileM - 1) / GemmConfig::kTileM);
  out->n_blocks = int32_t((args.n + GemmConfig::kTileN - 1) / GemmConfig::kTileN);
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

Status enable_tail_split(int32_t compute_blocks, cudaStream_t stream, GemmParams* g, bool chunked, int32_t max_split) {
  constexpr size_t kMaxWorkspace = size_t(64) << 20;
  constexpr size_t kPartialBytes = size_t(GemmConfig::kTileM) * GemmConfig::kTileN * sizeof(float);
  TileSchedule& sc = g->sched;
  max_split = std::max<int32_t>(1, std::min(max_split, kMaxTailSplit));
  for (;;) {
    sc.plan_split(compute_blocks / g->cluster_m, max_split, chunked);
    if (sc.split <= 1) break;
    const size_t ws = size_t(sc.tail_tiles()) * size_t(g->cluster_m) * size_t(sc.split - 1) * kPartialBytes;
    if (ws <= kMaxWorkspace) break;
    max_split = sc.split - 1;
  }
  if (sc.split <= 1) {
    g->split_ws = nullptr;
    g->split_flags = nullptr;
    return Status::kOk;
  }
  // The flags sit at the start of the workspace, at the same place for every launch that shares
  // it: they are zero between launches only where the last launch left them (its final slices
  // reset them); partials of another shape may have left any bits after them.
  const size_t slots = size_t(sc.tail_tiles()) * size_t(g->cluster_m);
  const size_t ws_bytes = slots * size_t(sc.split - 1) * kPartialBytes;
  void* mem = nullptr;
  if (slots <= kSplitFlagSlots) WEFT_CHECK(split_workspace(stream, kSplitFlagBytes + ws_bytes, &mem));
  if (!mem) {
    sc.plan_split(compute_blocks, 1);  // no workspace: whole tiles
    return Status::kOk;
  }
  g->split_flags = static_cast<uint64_t*>(mem);
  g->split_ws = reinterpret_cast<float*>(static_cast<char*>(mem) + kSplitFlagBytes);
  return Status::kOk;
}

Status enable_dynamic_tiles(cudaStream_t stream, GemmParams* g) {
  g->claims = nullptr;
  // A 2-CTA cluster would have to share its claims between the two producers.
  if (g->cluster_m != 1) return Status::kOk;
  return claim_words(stream, &g->claims);
}

namespace {
// A bf16 destination the epilogue stores 64 x 64 boxes into (no L2 promotion: written, not reread).
Status encode_store_map(const char* name, const void* ptr, int64_t rows, int64_t cols, int64_t ld, CUtensorMap* out) {
  return encode_operand(name, ptr, rows, cols, ld, GemmConfig::kStoreBox, out, CU_TENSOR_MAP_L2_PROMOTION_NONE);
}
}  // namespace

Status enable_tma_store(const EpiStoreBf16& epi, GemmParams* g) {
  g->store_tma = false;
  if (!epi.paired || !epi.c || epi.ldc % 8 != 0 || epi.ldc < g->n || reinterpret_cast<uintptr_t>(epi.c) % 16 != 0)
    return Status::kOk;  // stores from registers (odd ldc, unaligned C): still correct, slower
  WEFT_CHECK(encode_store_map("C", epi.c, g->m, g->n, epi.ldc, &g->tmap_c));
  g->store_tma = true;
  return Status::kOk;
}

Status enable_tma_store(const EpiReduceSlots& epi, GemmParams* g) {
  EpiStoreBf16 partial;
  partial.c = epi.partial;
  partial.ldc = epi.ldc;
  partial.paired = epi.paired;
  return enable_tma_store(partial, g);
}

Status enable_own_tma_store(const GemmParams& g, __nv_bfloat16* const* peers, int npeers, EpiReduceSlots* epi) {
  epi->own_maps = 0;
  const int64_t rows = int64_t(epi->hi) - epi->lo;
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  bool ok = epi->paired && epi->out && rows > 0 && epi->lo % GemmConfig::kTileM == 0 &&
            rows % GemmConfig::kTileM == 0 && epi->ldc % 8 == 0 && epi->ldc >= g.n && aligned(epi->out) &&
            npeers >= 0 && npeers < EpiReduceSlots::kMaxOwnMaps;
  for (int i = 0; ok && i < npeers; ++i) ok = peers[i] && aligned(peers[i]);
  if (!ok) {
    if (npeers > 0) {
      WEFT_WARN(kKernel,
                "gemm: own tiles to %d peers need 128-row aligned own rows [%d, %d), paired 16-byte aligned "
                "stores and ldc %lld a multiple of 8 >= n %d",
                npeers, epi->lo, epi->hi, static_cast<long long>(epi->ldc), g.n);
      return Status::kInvalidArgument;
    }
    return Status::kOk;  // stores from registers: still correct
  }
  WEFT_CHECK(encode_store_map("own rows", epi->out, rows, g.n, epi->ldc, &epi->own_map[0]));
  for (int i = 0; i < npeers; ++i)
    WEFT_CHECK(encode_store_map("a peer's own rows", peers[i], rows, g.n, epi->ldc, &epi->own_map[1 + i]));
  epi->own_maps = 1 + npeers;
  return Status::kOk;
}

Status enable_remote_partials(const GemmParams& g, __nv_bfloat16* const* slots, uint64_t* const* counts, int owners,
                              int rows_per_piece, EpiReduceSlots* epi) {
  epi->part_owners = 0;
  const int64_t rows = int64_t(epi->hi) - epi->lo;
  bool ok = epi->paired && rows > 0 && rows % GemmConfig::kTileM == 0 && epi->lo % rows == 0 && owners >= 1 &&
            owners <= EpiReduceSlots::kMaxOwnMaps && int64_t(owners) * rows == g.m && rows_per_piece > 0 &&
            rows_per_piece % GemmConfig::kTileM == 0 && rows % rows_per_piece == 0 && epi->ldc % 8 == 0 &&
            epi->ldc >= g.n;
  for (int o = 0; ok && o < owners; ++o)
    ok = o == epi->lo / rows || (slots[o] && counts[o] && reinterpret_cast<uintptr_t>(slots[o]) % 16 == 0);
  if (!ok) {
    WEFT_WARN(kKernel,
              "gemm: partial tiles to %d owners need M %d = owners x a multiple of %d rows, pieces of a "
              "multiple of %d rows, paired 16-byte aligned stores and ldc %lld a multiple of 8 >= n %d",
              owners, g.m, GemmConfig::kTileM, GemmConfig::kTileM, static_cast<long long>(epi->ldc), g.n);
    return Status::kInvalidArgument;
  }
  for (int o = 0; o < owners; ++o) {
    if (o == epi->lo / rows) continue;  // own rows are reduced here, never sent
    WEFT_CHECK(encode_store_map("an owner's slot", slots[o], rows, g.n, epi->ldc, &epi->part_map[o]));
    epi->part_flags[o] = counts[o];
  }
  epi->rows_per_owner = int32_t(rows);
  epi->rows_per_piece = rows_per_piece;
  epi->part_owners = owners;
  return Status::kOk;
}

Status enable_slot_loads(const GemmParams& g, EpiReduceSlots* epi) {
  epi->slot_maps = 0;
  const int64_t rows = int64_t(epi->hi) - epi->lo;
  bool ok = epi->own_maps > 0 && epi->nslots > 0 && epi->nslots <= EpiReduceSlots::kMaxRingSlots && rows > 0 &&
            epi->ldc % 8 == 0 && epi->ldc >= g.n;
  for (int i = 0; ok && i < epi->nslots; ++i)
    ok = epi->slots[i] && reinterpret_cast<uintptr_t>(epi->slots[i]) % 16 == 0;
  if (!ok) return Status::kOk;  // the consumers load the slots themselves
  for (int i = 0; i < epi->nslots; ++i)
    WEFT_CHECK(
        encode_operand("a staged slot", epi->slots[i], rows, g.n, epi->ldc, GemmConfig::kTileM, &epi->slot_map[i]));
  epi->slot_maps = epi->nslots;
  return Status::kOk;
}

namespace {
// Epilogues whose tiles may leave through TMA stores: encode their C first (unless turned off).
template <class Epilogue>
Status launch_tma_capable(const GemmParams& g, const FrameParams& frame, const Epilogue& epi, const FlagGate& gate,
                          const TileSignal& signal, cudaStream_t stream, const GemmOptions& opt) {
  if (!opt.tma_store) return launch(g, frame, epi, gate, signal, stream, opt);
  GemmParams with_c = g;
  WEFT_CHECK(enable_tma_store(epi, &with_c));
  return launch(with_c, frame, epi, gate, signal, stream, opt);
}
}  // namespace

Status launch_gemm(const GemmParams& g, const FrameParams& frame, const EpiStoreBf16& epi, const FlagGate& gate,
                   const TileSignal& signal, cudaStream_t stream, const GemmOptions& opt) {
  return launch_tma_capable(g, frame, epi, gate, signal, stream, opt);
}
Status launch_gemm(const GemmParams& g, const FrameParams& frame, const EpiAddF32& epi, const FlagGate& gate,
                   const TileSignal& signal, cudaStream_t stream, const GemmOptions& opt) {
  return launch(g, frame, epi, gate, signal, stream, opt);
}
Status launch_gemm(const GemmParams& g, const FrameParams& frame, const EpiAddBf16& epi, const FlagGate& gate,
                   const TileSignal& signal, cudaStream_t stream, const GemmOptions& opt) {
  return launch(g, frame, epi, gate, signal, stream, opt);
}
Status launch_gemm(const GemmParams& g, const FrameParams& frame, const EpiScatterBf16& epi, const FlagGate& gate,
                   const TileSignal& signal, cudaStream_t stream, const GemmOptions& opt) {
  return launch(g, frame, epi, gate, signal, stream, opt);
}
Status launch_gemm(const GemmParams& g, const FrameParams& frame, const EpiReduceSlots& epi, const FlagGate& gate,
                   const TileSignal& signal, cudaStream_t stream, const GemmOptions& opt) {
  return launch_tma_capable(g, frame, epi, gate, signal, stream, opt);
}

}  // namespace weft::kernels
