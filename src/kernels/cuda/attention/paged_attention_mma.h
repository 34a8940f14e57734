// Internal seam between the attention planner (paged_attention.cu) and the tensor-core kernel
// (paged_attention_mma.cu). Not part of the backend-facing launcher API (cuda_kernels.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/op_params.h"

namespace mxserve::kernels::cuda {

// head_dim in {16, 32, 64, 128} and n_heads / n_kv_heads <= 16.
bool paged_attention_mma_supports(const AttentionParams& p);
void paged_attention_mma_bf16(const void* q, const void* k_cache, const void* v_cache, const int32_t* token_seq,
                              const int32_t* kv_index, const int32_t* block_tables, void* out,
                              const AttentionParams& p, int n_splits, int split_len, void* workspace,
                              cudaStream_t stream);

// Block-shared variant for prefill-like batches: grid (ceil(T / tokens_per_block), n_kv_heads, n_splits).
int paged_attention_shared_tokens_per_block();
void paged_attention_mma_shared_bf16(const void* q, const void* k_cache, const void* v_cache,
                                     const int32_t* token_seq, const int32_t* kv_index, const int32_t* block_tables,
                                     void* out, const AttentionParams& p, int n_splits, int split_len,
                                     void* workspace, cudaStream_t stream);

}  // namespace mxserve::kernels::cuda
