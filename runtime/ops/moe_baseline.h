// The sequential MoE layer `weftrun bench` times against weft's MoE op (runtime/ops/moe_op.cpp): the
// same math as the op, on weft's routing of the call, with NCCL and cuBLAS, one step after another:
//
//   home rank r (tokens t, weft's top-k ids and weights)
//     destinations: token t goes once to every rank that owns one of its k experts (token order)
//     pack those rows (and the token's ids and weights) by destination; counts all-gathered and
//     copied to the host (a host sync, as PyTorch's .tolist() of the counts)
//     ncclSend / ncclRecv in one group: rows and their ids/weights, once per (token, destination)
//   owner rank d
//     received rows grouped by local expert (row order inside an expert); counts to the host (sync)
//     per local expert with cuBLAS: G = X·gateᵀ, U = X·upᵀ; one kernel H = SiLU(G)·U; Y = H·downᵀ
//     per received row: Σ weight·Y over its local experts in expert order (fp32, rounded once)
//     ncclSend / ncclRecv in one group: one row back per (token, destination)
//   home: out[t] = Σ over t's destination ranks, in rank order (fp32, rounded once)
//
// Buffers for the exchange are sized for the worst case (every token to every rank); the grouped
// rows grow to the routing's on the first run (not a timed one), so the timed runs allocate nothing.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <vector>

#include "base/status.h"

namespace weft::runtime::ops {

struct MoeSequentialShape {
  int rank = 0, world = 1;
  int64_t tokens = 0;  // per rank
  int64_t hidden = 0, ffn = 0, experts = 0, topk = 0;
};

class MoeSequential {
 public:
  using bf16 = __nv_bfloat16;
  MoeSequential() = default;
  ~MoeSequential();
  MoeSequential(const MoeSequential&) = delete;
  MoeSequential& operator=(const MoeSequential&) = delete;

  // x: tokens x hidden (this rank's); gate, up: local experts x ffn x hidden; down: local experts x
  // hidden x ffn (this rank's experts, the op's layout). Not owned; they must outlive this object.
  // `timeout_s` bounds each host wait of a run.
  Status create(const MoeSequentialShape& shape, const bf16* x, const bf16* gate, const bf16* up, const bf16* down,
                ncclComm_t comm, cublasHandle_t blas, double timeout_s);
  // The routing the layer runs with: tokens x topk expert ids and weights (device), copied on `s`.
  Status set_routing(const int32_t* ids, const float* weights, cudaStream_t s);
  // The whole layer into out (tokens x hidden); two bounded host waits (destination counts, expert counts).
  Status run(bf16* out, cudaStream_t s);
  // After a run, on its sizes: the rows out and back with NCCL alone (no ids, counts or syncs).
  Status run_a2a(cudaStream_t s);
  // After a run, on its grouped rows: the expert FFN alone (cuBLAS GEMMs and the SiLU·up kernel).
  Status run_experts(cudaStream_t s);

  int64_t rows_out() const { return rows_out_; }  // the last run's rows sent (and received back)
  int64_t rows_in() const { return rows_in_; }    // ... received (and sent back)
  int64_t pairs() const { return pairs_; }        // ... (row, local expert) pairs computed here

 private:
  Status exchange(const void* send, const std::vector<int64_t>& send_rows, const std::vector<int64_t>& send_at,
                  void* recv, const std::vector<int64_t>& recv_rows, const std::vector<int64_t>& recv_at,
                  size_t per_row, ncclDataType_t type, const void* send2, void* recv2, size_t per_row2, cudaStream_t s);
  Status experts(cudaStream_t s);
  Status grow(int64_t pairs, cudaStream_t s);
  Status fail(const char* what) const;

  MoeSequentialShape sh_;
  int64_t local_ = 0, max_in_ = 0;  // local experts; received rows at most (world x tokens)
  const bf16 *x_ = nullptr, *gate_ = nullptr, *up_ = nullptr, *down_ = nullptr;
  ncclComm_t comm_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  double timeout_s_ = 10;
  std::vector<void*> owned_;
  int32_t *ids_ = nullptr, *tok_list_ = nullptr, *pos_ = nullptr, *counts_ = nullptr, *all_counts_ = nullptr;
  float* weights_ = nullptr;
  bf16 *send_ = nullptr, *recv_ = nullptr, *part_ = nullptr, *back_ = nullptr;
  int32_t *send_meta_ = nullptr, *recv_meta_ = nullptr;
  int32_t *list_ = nullptr, *pair_pos_ = nullptr, *ecounts_ = nullptr, *offsets_ = nullptr;
  int32_t *h_counts_ = nullptr, *h_ecounts_ = nullptr, *h_offsets_ = nullptr;       // pinned
  bf16 *xg_ = nullptr, *g_ = nullptr, *u_ = nullptr, *h_ = nullptr, *y_ = nullptr;  // grouped rows (grown)
  int64_t cap_pairs_ = 0;
  // The last run's sizes, in rows: per destination (sent) and per source (received), and offsets.
  std::vector<int64_t> send_rows_, send_at_, recv_rows_, recv_at_, expert_rows_, expert_at_;
  int64_t rows_out_ = 0, rows_in_ = 0, pairs_ = 0;
};

// The kernels of the sequential layer (moe_baseline_kernels.cu). tokens, hidden: this rank's; every
// buffer device memory; hidden a multiple of 8, ffn elements a multiple of 8.
namespace moe_seq {
using bf16 = __nv_bfloat16;
// Per destination q (one block each): the tokens with an expert on q, in token order, at
// tok_list[q·tokens + i]; pos[t·world + q] = i or -1; counts[q].
Status launch_destinations(const int32_t* ids, int32_t tokens, int32_t topk, int32_t local, int32_t world,
                           int32_t* tok_list, int32_t* pos, int32_t* counts, cudaStream_t s);
// Rows packed by destination (offsets: the prefix of counts): rows[at + i] = x[tok_list[q·tokens + i]],
// meta[at + i] = the token's topk ids, then its topk weights' bits.
Status launch_pack(const bf16* x, const int32_t* ids, const float* weights, const int32_t* tok_list,
                   const int32_t* counts, int32_t tokens, int32_t hidden, int32_t topk, int32_t world, bf16* rows,
                   int32_t* meta, cudaStream_t s);
// Per local expert l (one block each): the received rows that chose expert first + l, in row order,
// at list[l·stride + i]; pair_pos[row·topk + j] = i (slot j of the row) or -1; counts[l].
Status launch_expert_rows(const int32_t* meta, int32_t rows, int32_t topk, int32_t first, int32_t local, int32_t stride,
                          int32_t* list, int32_t* pair_pos, int32_t* counts, cudaStream_t s);
// xg[offsets[l] + i] = recv[list[l·stride + i]] for every pair (offsets: local + 1 entries).
Status launch_gather(const bf16* recv, const int32_t* list, const int32_t* offsets, int32_t local, int32_t stride,
                     int64_t pairs, int32_t hidden, bf16* xg, cudaStream_t s);
// h = bf16(SiLU(g) · u), n elements.
Status launch_silu_mul(const bf16* g, const bf16* u, int64_t n, bf16* h, cudaStream_t s);
// part[row] = Σ over the row's local experts in expert order of weight · y[offsets[l] + pair_pos].
Status launch_owner_combine(const bf16* y, const int32_t* meta, const int32_t* pair_pos, const int32_t* offsets,
                            int32_t rows, int32_t topk, int32_t first, int32_t hidden, bf16* part, cudaStream_t s);
// out[t] = Σ over q in rank order with pos[t·world + q] >= 0 of back[prefix(counts)[q] + pos].
Status launch_home_sum(const bf16* back, const int32_t* pos, const int32_t* counts, int32_t tokens, int32_t world,
                       int32_t hidden, bf16* out, cudaStream_t s);
}  // namespace moe_seq

}  // namespace weft::runtime::ops
