// Internal to the DSA indexer (dsa_indexer.cu dispatches here for IndexerScoreKernel::kFused): the fused
// score + histogram + select path of dsa_indexer_fused.cu. Public entry: dsa_indexer_topk (mla_dsa.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/mla_params.h"
#include "kernels/op_params.h"

namespace mxserve::kernels::cuda {

// Dynamic shared memory the fused score kernel may opt into (below the sm_90 227 KiB per block).
constexpr int kFusedMaxSmem = 200 * 1024;
// Shapes the fused path runs: 1..64 index heads (padded to a multiple of 16), head_dim a multiple of 16 whose
// tiles fit.
bool dsa_indexer_fused_supported(const IndexerParams& p);
size_t dsa_indexer_fused_smem_bytes(const IndexerParams& p);
// Workspace bytes per token of a group: codes [max_ctx] u32 + the first-digit histogram [4096] u32.
size_t dsa_indexer_fused_row_bytes(int64_t max_ctx);
// 128-key tiles per score block for a group of tokens of `tiles` tiles each when `resident_blocks` score
// blocks fit on the device at once: the fewest tile-times over the waves of blocks (pure host arithmetic).
int dsa_indexer_fused_tiles_per_block(int64_t group_tokens, int64_t tiles, int64_t resident_blocks);
// Same contract as dsa_indexer_topk; q and key_cache 16-byte aligned.
void dsa_indexer_topk_fused(const void* q, const void* weights, const void* key_cache, const int32_t* token_seq,
                            const int32_t* kv_index, const int32_t* block_tables, int32_t* topk,
                            const IndexerParams& p, const AttentionParams& ap, int64_t max_ctx, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream);

}  // namespace mxserve::kernels::cuda
