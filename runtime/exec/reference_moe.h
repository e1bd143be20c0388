// weft's own reference of the MoE layer's expert path (plain CUDA cores, fp32): what `weftrun run`
// validates the MoE op against, expert by expert, on sampled tokens, with the op's own routing.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"
#include "runtime/exec/device_data.h"

namespace weft::runtime {

// Expert e's weights from (seed, e) alone (gate and up: ffn x hidden, scale 1/sqrt(hidden); down:
// hidden x ffn, scale 1/sqrt(ffn)), so any rank can make any expert's again for a reference.
Status fill_moe_expert(uint64_t seed, int64_t e, int64_t hidden, int64_t ffn, __nv_bfloat16* gate, __nv_bfloat16* up,
                       __nv_bfloat16* down, cudaStream_t s);

// One rank's inputs of an MoE layer, as `weftrun run`, `weftrun bench` and `weftrun tune` make them,
// allocated in *buf: the router weight shared by every rank (hidden x experts, from seed + 2), this
// rank's L experts (e = rank L + i) by fill_moe_expert, so check_moe_sampled can make them again, and
// its T tokens (T x hidden, from seed + 1 and the rank).
struct MoeInputs {
  __nv_bfloat16 *router = nullptr, *gate = nullptr, *up = nullptr, *down = nullptr, *x = nullptr;
};
Status make_moe_inputs(DeviceBuffers* buf, uint64_t seed, int rank, int64_t tokens, int64_t hidden, int64_t ffn,
                       int64_t experts, int64_t local_experts, cudaStream_t s, MoeInputs* out);

// For each sampled token i (row rows[i] of x): acc[i] += Σ over its pairs j with ids[j] == expert of
// weights[j] · bf16(down · bf16(SiLU(gate · x) · (up · x))), the roundings where the op rounds (H and
// Y are bf16). gate, up: ffn x hidden; down: hidden x ffn (this expert's). acc: samples x hidden.
Status reference_moe_expert(const __nv_bfloat16* x, const int32_t* rows, int32_t samples, const int32_t* ids,
                            const float* weights, int32_t topk, int32_t expert, const __nv_bfloat16* gate,
                            const __nv_bfloat16* up, const __nv_bfloat16* down, int32_t hidden, int32_t ffn, float* acc,
                            cudaStream_t s);

// ref_out[i] = bf16(acc[i]) and got_out[i] = y[rows[i]] (bf16, samples x hidden): the sampled rows side by side
// for compare_bf16.
Status reference_moe_gather(const float* acc, const __nv_bfloat16* y, const int32_t* rows, int32_t samples,
                            int32_t hidden, __nv_bfloat16* ref_out, __nv_bfloat16* got_out, cudaStream_t s);

// An MoE layer's output y (T x hidden) of one call checked on `samples` evenly spaced tokens (token
// i * T / samples) against reference_moe_expert, expert by expert, with that call's routing (ids and
// weights: T x topk, device memory) and every expert's weights made again from (seed, e) by
// fill_moe_expert. What `weftrun run` and `weftrun bench` check.
Status check_moe_sampled(const int32_t* ids, const float* weights, uint64_t seed, const __nv_bfloat16* x,
                         const __nv_bfloat16* y, int64_t tokens, int64_t hidden, int64_t ffn, int64_t experts,
                         int64_t topk, int32_t samples, cudaStream_t s, Comparison* out);

}  // namespace weft::runtime
