// The sequential MoE layer of weftrun bench (moe_baseline.h): buffers, the NCCL exchanges, the host
// waits for the counts, the per-expert cuBLAS GEMMs.
#include "runtime/ops/moe_baseline.h"

#include <algorithm>
#include <string>
#include <type_traits>

#include "base/log.h"
#include "runtime/exec/stream_ops.h"
#include "runtime/ops/cuda_check.h"
#include "runtime/ops/op_harness.h"

namespace weft::runtime::ops {

MoeSequential::~MoeSequential() {
  for (void* p : {static_cast<void*>(xg_), static_cast<void*>(g_), static_cast<void*>(u_), static_cast<void*>(h_),
                  static_cast<void*>(y_)})
    if (p) cudaFree(p);
  for (void* p : owned_) cudaFree(p);
  for (int32_t* p : {h_counts_, h_ecounts_, h_offsets_})
    if (p) cudaFreeHost(p);
}

Status MoeSequential::fail(const char* what) const {
  WEFT_WARN(kBench, "rank %d: moe: sequential baseline (nccl + cublas): %s", sh_.rank, what);
  return Status::kInternal;
}

Status MoeSequential::create(const MoeSequentialShape& shape, const bf16* x, const bf16* gate, const bf16* up,
                             const bf16* down, ncclComm_t comm, cublasHandle_t blas, double timeout_s) {
  sh_ = shape;
  x_ = x, gate_ = gate, up_ = up, down_ = down, comm_ = comm, blas_ = blas, timeout_s_ = timeout_s;
  const int64_t W = sh_.world, T = sh_.tokens, H = sh_.hidden, K = sh_.topk;
  if (W < 1 || sh_.experts % W || T < 1 || H % 8 || sh_.ffn % 8 || K < 1 || K > 32 || W * T >= (int64_t(1) << 31))
    return fail("the shape is outside what it handles (hidden and ffn multiples of 8, topk 1 to 32)");
  local_ = sh_.experts / W;
  max_in_ = W * T;
  auto alloc = [&](size_t bytes, auto** out) -> Status {
    void* p = nullptr;
    WEFT_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
    owned_.push_back(p);
    *out = static_cast<std::remove_pointer_t<decltype(out)>>(p);
    return Status::kOk;
  };
  WEFT_CHECK(alloc(size_t(T * K) * 4, &ids_));
  WEFT_CHECK(alloc(size_t(T * K) * 4, &weights_));
  WEFT_CHECK(alloc(size_t(W * T) * 4, &tok_list_));
  WEFT_CHECK(alloc(size_t(T * W) * 4, &pos_));
  WEFT_CHECK(alloc(size_t(W) * 4, &counts_));
  WEFT_CHECK(alloc(size_t(W * W) * 4, &all_counts_));
  WEFT_CHECK(alloc(size_t(W * T * H) * 2, &send_));  // every token to every rank, at worst
  WEFT_CHECK(alloc(size_t(max_in_ * H) * 2, &recv_));
  WEFT_CHECK(alloc(size_t(max_in_ * H) * 2, &part_));
  WEFT_CHECK(alloc(size_t(W * T * H) * 2, &back_));
  WEFT_CHECK(alloc(size_t(W * T * 2 * K) * 4, &send_meta_));
  WEFT_CHECK(alloc(size_t(max_in_ * 2 * K) * 4, &recv_meta_));
  WEFT_CHECK(alloc(size_t(local_ * max_in_) * 4, &list_));
  WEFT_CHECK(alloc(size_t(max_in_ * K) * 4, &pair_pos_));
  WEFT_CHECK(alloc(size_t(local_) * 4, &ecounts_));
  WEFT_CHECK(alloc(size_t(local_ + 1) * 4, &offsets_));
  WEFT_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&h_counts_), size_t(W * W) * 4));
  WEFT_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&h_ecounts_), size_t(local_) * 4));
  WEFT_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&h_offsets_), size_t(local_ + 1) * 4));
  return Status::kOk;
}

Status MoeSequential::set_routing(const int32_t* ids, const float* weights, cudaStream_t s) {
  const size_t n = size_t(sh_.tokens * sh_.topk);
  WEFT_CUDA_CHECK(cudaMemcpyAsync(ids_, ids, n * 4, cudaMemcpyDeviceToDevice, s));
  WEFT_CUDA_CHECK(cudaMemcpyAsync(weights_, weights, n * 4, cudaMemcpyDeviceToDevice, s));
  return Status::kOk;
}

// One group of point-to-point calls: rows (and, if send2, a second payload per row) to and from every
// rank, self included. ncclGroupEnd is called whatever failed inside the group.
Status MoeSequential::exchange(const void* send, const std::vector<int64_t>& send_rows,
                               const std::vector<int64_t>& send_at, void* recv, const std::vector<int64_t>& recv_rows,
                               const std::vector<int64_t>& recv_at, size_t per_row, ncclDataType_t type,
                               const void* send2, void* recv2, size_t per_row2, cudaStream_t s) {
  const size_t bytes = type == ncclBfloat16 ? 2 : 4;
  WEFT_NCCL_CHECK(ncclGroupStart());
  ncclResult_t r = ncclSuccess;
  for (int q = 0; q < sh_.world && r == ncclSuccess; ++q) {
    const size_t n_out = size_t(send_rows[size_t(q)]), n_in = size_t(recv_rows[size_t(q)]);
    const size_t at_out = size_t(send_at[size_t(q)]), at_in = size_t(recv_at[size_t(q)]);
    if (n_out > 0) {
      r = ncclSend(static_cast<const char*>(send) + at_out * per_row * bytes, n_out * per_row, type, q, comm_, s);
      if (r == ncclSuccess && send2)
        r = ncclSend(static_cast<const int32_t*>(send2) + at_out * per_row2, n_out * per_row2, ncclInt32, q, comm_, s);
    }
    if (r == ncclSuccess && n_in > 0) {
      r = ncclRecv(static_cast<char*>(recv) + at_in * per_row * bytes, n_in * per_row, type, q, comm_, s);
      if (r == ncclSuccess && recv2)
        r = ncclRecv(static_cast<int32_t*>(recv2) + at_in * per_row2, n_in * per_row2, ncclInt32, q, comm_, s);
    }
  }
  const ncclResult_t end = ncclGroupEnd();
  WEFT_NCCL_CHECK(r);
  WEFT_NCCL_CHECK(end);
  return Status::kOk;
}

Status MoeSequential::grow(int64_t pairs, cudaStream_t s) {
  if (pairs <= cap_pairs_) return Status::kOk;
  // Only this stream uses the rows, and it has just been waited for: nothing reads the old ones.
  WEFT_CHECK(sync_bounded(s, timeout_s_, "moe sequential baseline: before growing its rows", nullptr));
  for (bf16** p : {&xg_, &g_, &u_, &h_, &y_}) {
    if (*p) cudaFree(*p);
    *p = nullptr;
  }
  const size_t rows = size_t(pairs), H = size_t(sh_.hidden), F = size_t(sh_.ffn);
  WEFT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&xg_), rows * H * 2));
  WEFT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&g_), rows * F * 2));
  WEFT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&u_), rows * F * 2));
  WEFT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&h_), rows * F * 2));
  WEFT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&y_), rows * H * 2));
  cap_pairs_ = pairs;
  return Status::kOk;
}

// Per local expert with rows: gate and up GEMMs, then SiLU·up over every row, then the down GEMMs.
Status MoeSequential::experts(cudaStream_t s) {
  const int64_t H = sh_.hidden, F = sh_.ffn;
  for (int64_t l = 0; l < local_; ++l) {
    const int64_t m = expert_rows_[size_t(l)], at = expert_at_[size_t(l)];
    if (m == 0) continue;
    WEFT_CHECK(cublas_gemm_tn(blas_, m, F, H, xg_ + at * H, H, gate_ + l * F * H, H, g_ + at * F, F, s));
    WEFT_CHECK(cublas_gemm_tn(blas_, m, F, H, xg_ + at * H, H, up_ + l * F * H, H, u_ + at * F, F, s));
  }
  WEFT_CHECK(moe_seq::launch_silu_mul(g_, u_, pairs_ * F, h_, s));
  for (int64_t l = 0; l < local_; ++l) {
    const int64_t m = expert_rows_[size_t(l)], at = expert_at_[size_t(l)];
    if (m == 0) continue;
    WEFT_CHECK(cublas_gemm_tn(blas_, m, H, F, h_ + at * F, F, down_ + l * H * F, F, y_ + at * H, H, s));
  }
  return Status::kOk;
}

Status MoeSequential::run(bf16* out, cudaStream_t s) {
  const int W = sh_.world, me = sh_.rank;
  const int32_t T = int32_t(sh_.tokens), H = int32_t(sh_.hidden), K = int32_t(sh_.topk), L = int32_t(local_);
  // Dispatch: destinations, packing, the counts to the host, the rows (and their ids and weights).
  WEFT_CHECK(moe_seq::launch_destinations(ids_, T, K, L, W, tok_list_, pos_, counts_, s));
  WEFT_CHECK(moe_seq::launch_pack(x_, ids_, weights_, tok_list_, counts_, T, H, K, W, send_, send_meta_, s));
  WEFT_NCCL_CHECK(ncclAllGather(counts_, all_counts_, size_t(W), ncclInt32, comm_, s));
  WEFT_CUDA_CHECK(cudaMemcpyAsync(h_counts_, all_counts_, size_t(W * W) * 4, cudaMemcpyDeviceToHost, s));
  WEFT_CHECK(sync_bounded(s, timeout_s_, "moe sequential baseline: destination counts", nullptr));
  send_rows_.assign(size_t(W), 0), send_at_.assign(size_t(W), 0), recv_rows_.assign(size_t(W), 0);
  recv_at_.assign(size_t(W), 0);
  rows_out_ = rows_in_ = 0;
  for (int q = 0; q < W; ++q) {
    send_rows_[size_t(q)] = h_counts_[me * W + q], send_at_[size_t(q)] = rows_out_;
    recv_rows_[size_t(q)] = h_counts_[q * W + me], recv_at_[size_t(q)] = rows_in_;
    rows_out_ += send_rows_[size_t(q)], rows_in_ += recv_rows_[size_t(q)];
  }
  if (rows_in_ > max_in_ || rows_out_ > int64_t(W) * T) return fail("the counts exchanged are out of range");
  WEFT_CHECK(exchange(send_, send_rows_, send_at_, recv_, recv_rows_, recv_at_, size_t(H), ncclBfloat16, send_meta_,
                      recv_meta_, size_t(2 * K), s));
  // Experts: rows grouped by local expert, the counts to the host, the GEMMs.
  expert_rows_.assign(size_t(L), 0), expert_at_.assign(size_t(L), 0);
  pairs_ = 0;
  if (rows_in_ > 0) {
    WEFT_CHECK(moe_seq::launch_expert_rows(recv_meta_, int32_t(rows_in_), K, me * L, L, int32_t(max_in_), list_,
                                           pair_pos_, ecounts_, s));
    WEFT_CUDA_CHECK(cudaMemcpyAsync(h_ecounts_, ecounts_, size_t(L) * 4, cudaMemcpyDeviceToHost, s));
    WEFT_CHECK(sync_bounded(s, timeout_s_, "moe sequential baseline: expert counts", nullptr));
    for (int32_t l = 0; l < L; ++l) {
      h_offsets_[l] = int32_t(pairs_);
      expert_rows_[size_t(l)] = h_ecounts_[l], expert_at_[size_t(l)] = pairs_;
      pairs_ += h_ecounts_[l];
    }
    h_offsets_[L] = int32_t(pairs_);
    if (pairs_ > rows_in_ * std::min<int64_t>(K, L)) return fail("the expert counts are out of range");
    WEFT_CHECK(grow(pairs_, s));
    WEFT_CUDA_CHECK(cudaMemcpyAsync(offsets_, h_offsets_, size_t(L + 1) * 4, cudaMemcpyHostToDevice, s));
    WEFT_CHECK(moe_seq::launch_gather(recv_, list_, offsets_, L, int32_t(max_in_), pairs_, H, xg_, s));
    WEFT_CHECK(experts(s));
    WEFT_CHECK(
        moe_seq::launch_owner_combine(y_, recv_meta_, pair_pos_, offsets_, int32_t(rows_in_), K, me * L, H, part_, s));
  }
  // Combine: one row back per (token, destination), summed at home in rank order.
  WEFT_CHECK(exchange(part_, recv_rows_, recv_at_, back_, send_rows_, send_at_, size_t(H), ncclBfloat16, nullptr,
                      nullptr, 0, s));
  return moe_seq::launch_home_sum(back_, pos_, counts_, T, W, H, out, s);
}

Status MoeSequential::run_a2a(cudaStream_t s) {
  if (send_rows_.empty()) return fail("run_a2a before a run");
  const size_t H = size_t(sh_.hidden);
  WEFT_CHECK(
      exchange(send_, send_rows_, send_at_, recv_, recv_rows_, recv_at_, H, ncclBfloat16, nullptr, nullptr, 0, s));
  return exchange(part_, recv_rows_, recv_at_, back_, send_rows_, send_at_, H, ncclBfloat16, nullptr, nullptr, 0, s);
}

Status MoeSequential::run_experts(cudaStream_t s) {
  if (expert_rows_.empty()) return fail("run_experts before a run");
  return pairs_ > 0 ? experts(s) : Status::kOk;
}

}  // namespace weft::runtime::ops
