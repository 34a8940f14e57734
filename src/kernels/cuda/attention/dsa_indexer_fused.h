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
// tiles fit; bf16 keys or packed FP8 rows (p.fp8_keys).
bool dsa_indexer_fused_supported(const IndexerParams& p);
// The score kernel's ring of key loads: 2 stages (double buffering) unless kFusedDeepStages > 0, which large
// groups (>= 8 tiles an SM) use; clamped to 2..kFusedMaxStages and to kFusedMaxSmem. 0 = off: session 8 built
// the deeper ring for batch 64 (more keys in flight per SM), unmeasured until the lead's H100 run.
constexpr int kFusedDeepStages = 0;
constexpr int kFusedMaxStages = 4;
size_t dsa_indexer_fused_smem_bytes(const IndexerParams& p, int stages = 2);
// Stages for a group (pure host arithmetic); forced > 0 overrides the rule (still clamped).
int dsa_indexer_fused_stages(const IndexerParams& p, int64_t group_tokens, int64_t max_ctx, int sm_count,
                             int forced = 0);
// Tests and benchmarks: force every later fused launch to `stages` (0: the rule above). Process-wide.
void dsa_indexer_fused_force_stages(int stages);
// Workspace bytes per token of a group: codes [max_ctx] u32 + the first-digit histogram [4096] u32.
size_t dsa_indexer_fused_row_bytes(int64_t max_ctx);
// 128-key tiles per score block for a group of tokens of `tiles` tiles each when `resident_blocks` score
// blocks fit on the device at once: the fewest tile-times over the waves of blocks (pure host arithmetic).
int dsa_indexer_fused_tiles_per_block(int64_t group_tokens, int64_t tiles, int64_t resident_blocks);
// Same contract as dsa_indexer_topk; q and key_cache 16-byte aligned (p.fp8_keys: packed FP8 rows, 4-byte
// aligned). split_select: the cluster-split select (dsa_select_split.cu, kFusedSplit) instead of one select
// block per token.
void dsa_indexer_topk_fused(const void* q, const void* weights, const void* key_cache, const int32_t* token_seq,
                            const int32_t* kv_index, const int32_t* block_tables, int32_t* topk,
                            const IndexerParams& p, const AttentionParams& ap, int64_t max_ctx, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream, bool split_select = false);

// ---- dsa_select_split.cu: the select of one token split over a thread-block cluster (sm_90) --------------
constexpr int kDsaSplitMaxCtas = 8;  // the portable cluster size
// The split select is launched as a programmatic dependent of the score kernel (its launch latency overlaps the
// score kernel's tail; correctness does not depend on it: the select waits for the score grid's completion).
constexpr bool kDsaSplitPdl = true;
// The split select counts the first digit itself (each CTA over its range, merged through distributed shared
// memory like the other digits) instead of reading the score kernel's histogram: no memset node, no per-block
// histogram in the score kernel. false: the score kernel's histogram (hist not null), as kFused.
constexpr bool kDsaSplitOwnHist = true;
// CTAs per token for a group of group_tokens rows of at most max_ctx keys on sm_count SMs: a power of two in
// 1..kDsaSplitMaxCtas, the largest with group_tokens x ctas <= sm_count and >= 2048 keys a CTA (pure host
// arithmetic: 8 at batch 1 over 20k keys, 8 at 16, 2 at 64 on 132 SMs).
int dsa_select_split_ctas(int64_t group_tokens, int64_t max_ctx, int sm_count);
// The select of tokens [t0, t0 + tg) from codes [tg, stride] and hist [tg, 4096] (as the fused score kernel
// writes them; null: counted by the select itself) into topk rows t0..; ctas as dsa_select_split_ctas (lowered
// to the largest cluster the device schedules, once per device and size).
void dsa_select_split_launch(const uint32_t* codes, const uint32_t* hist, int64_t stride, int64_t t0, int64_t tg,
                             const int32_t* kv_index, const AttentionParams& ap, int32_t* topk, int K, int ctas,
                             cudaStream_t stream);

}  // namespace mxserve::kernels::cuda
