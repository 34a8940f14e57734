// The DSA indexer key's three row ops in one pass (backend/mla_dsa_ops.h norm_rope_cache_write): LayerNorm with
// bias, GPT-J interleaved RoPE of one head, the paged cache write. Invariant: bit for bit layernorm_bf16, then
// rope_interleaved_bf16, then cache_write_columns_bf16 (mla_rows.cu): the same reduction order (one warp per
// row, lanes striding by 32), the same bf16 roundings between the steps, the same angle arithmetic.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/mla_params.h"

namespace mxserve::kernels::cuda {

// k bf16 [T, C] in place; w, b bf16 [C]; positions, slot_mapping i32 [T] (slot < 0: not written); cache bf16
// [n_slots, C]. p: one head, head_stride C, rot_offset and rotary_dim even.
void norm_rope_cache_write_bf16(void* k, const void* w, const void* b, float eps, const int32_t* positions,
                                const InterleavedRopeParams& p, const int32_t* slot_mapping, void* cache,
                                int64_t n_tokens, int64_t cols, cudaStream_t stream);

}  // namespace mxserve::kernels::cuda
