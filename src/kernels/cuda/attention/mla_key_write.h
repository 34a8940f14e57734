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

// The MLA latent cache row (backend/mla_dsa_ops.h try_latent_cache_write): kv bf16 [T, N] (row stride N),
// latent at columns [col0, col0 + L), k_rope at [col0 + L, col0 + L + R) with R = p.head_stride = p.rotary_dim;
// cache bf16 [n_slots, L + R] row slot_mapping[t] = [rmsnorm(latent) * norm_w | rope(k_rope)]. One block of 256
// threads per token: the latent in rmsnorm_block_kernel's chunk layout and reduction order (elementwise.cu), so
// the row equals rmsnorm_bf16 + rope_interleaved_bf16 + two cache writes. col0, N, L multiples of 8;
// L <= latent_cache_write_max_latent(); R / 2 <= 256.
void latent_cache_write_bf16(const void* kv, int64_t n_cols, int64_t col0, const void* norm_w, int64_t latent,
                             float eps, const int32_t* positions, const InterleavedRopeParams& p,
                             const int32_t* slot_mapping, void* cache, int64_t n_tokens, cudaStream_t stream);
int64_t latent_cache_write_max_latent();

}  // namespace mxserve::kernels::cuda
