// CPU reference of cascade (shared-prefix) decode attention (kernels/cascade_attention.h): the oracle the
// CUDA cascade kernels are checked against, and itself checked against paged_attention_f32.
#pragma once

#include <cstdint>

#include "kernels/cascade_attention.h"
#include "kernels/op_params.h"

namespace mxserve::kernels::cpu {

// Rows [0, p.n_tokens) are plain decode rows (p.n_tokens <= shape.cap_rows); `cascade` is the encoded buffer
// (encode_cascade). Three passes, as the CUDA path: (1) each work item's prefix keys [0, prefix_keys) for all
// of its group's query rows, read through the first member's block table, giving (o, lse) per row; (2) each
// row's suffix [prefix_keys, kv_index]; (3) the log-sum-exp merge. Caches as paged_attention_f32 (f32, or FP8
// codes with p.k_scales / p.v_scales). out: [T, n_heads, head_dim].
void cascade_attention_f32(const float* q, const void* k_cache, const void* v_cache, const int32_t* token_seq,
                           const int32_t* kv_index, const int32_t* block_tables, const int32_t* cascade,
                           const CascadeShape& shape, float* out, const AttentionParams& p);

}  // namespace mxserve::kernels::cpu
