// Cascade (shared-prefix) decode attention on CUDA (kernels/cascade_attention.h describes the groups and the
// device buffer): the prefix pass attends each group's shared blocks once for all of its query rows, the
// suffix pass each row's own keys, and a merge kernel combines every partial by the log-sum-exp rule.
// Part of the backend-facing launcher API next to cuda_kernels.h (the backend, tests, dev/kernels).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cascade_attention.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/op_params.h"

namespace mxserve::kernels::cuda {

// Split counts: each work item's prefix and each grouped row's suffix is cut into that many equal parts on the
// device (64- / 16-key aligned), so one plan (a graph's) serves any prefix / suffix lengths; a row in no group
// is split exactly as the per-warp decode kernel splits it (suffix_split_len).
struct CascadeLaunch {
  int prefix_splits = 1;       // parts of the shared prefix per (work item, kv head)
  int suffix_splits = 1;       // parts of each row's suffix per (row, kv head): the decode planner's count
  int suffix_split_len = 1 << 30;  // keys per split of a row in no group (the decode planner's, as its kernel)
  AttentionSplitSource suffix_split_source = AttentionSplitSource::kHeuristic;
  size_t workspace_bytes = 0;  // partials of both passes (always used: the merge reads them)
};

// Whether the cascade kernels serve p: tensor-core shapes (head_dim 16..128, G <= 16), no tree mask.
// Else false and *why (a static string) names the first reason.
bool cascade_attention_supports(const AttentionParams& p, const char** why);

// p: the decode rows [0, p.n_tokens) (p.n_tokens <= shape.cap_rows). The suffix split is the per-warp decode
// planner's for contexts up to shape.max_suffix_keys (else p.max_kv_len); the prefix split aims at ~2 blocks
// per SM over shape.n_work_hint work items x kv heads, at least 256 keys per split.
CascadeLaunch plan_cascade_attention(const AttentionParams& p, const CascadeShape& shape, int n_sms,
                                     const AttentionPlanOptions& options = {});

// Three launches on `stream`, graph-capturable (device inputs only): prefix pass (grid cap_work x kv heads x
// prefix splits; empty work items exit), suffix pass (one warp per (row, kv head, split)), merge into `out`
// (bf16 [T, n_heads, head_dim]). cascade: the encoded i32 buffer on the device (shape.n_ints()).
void cascade_attention_bf16(const void* q, const void* k_cache, const void* v_cache, const int32_t* token_seq,
                            const int32_t* kv_index, const int32_t* block_tables, const int32_t* cascade, void* out,
                            const AttentionParams& p, const CascadeShape& shape, const CascadeLaunch& plan,
                            void* workspace, cudaStream_t stream);

// Host calls of cascade_attention_bf16 so far in this process (a graph capture counts once, its replays not):
// tests check that the path they mean to exercise ran.
int64_t cascade_attention_launches();

// A whole batch with cascade rows: rows [0, n_cascade) (the leading plain decode rows) through the cascade
// kernels, rows [n_cascade, n_tokens) through plan_paged_attention_batch (one workspace: the parts run in turn).
struct CascadeBatchPlan {
  int32_t n_cascade = 0;
  AttentionParams cascade_params;
  CascadeLaunch cascade;
  AttentionBatchPlan rest;  // n_parts 0: no rows after the decode rows
  size_t workspace_bytes = 0;
};
CascadeBatchPlan plan_cascade_batch(const AttentionParams& p, const CascadeShape& shape, int n_sms,
                                    const AttentionPlanOptions& options = {});
void cascade_attention_batch(const void* q, const void* k_cache, const void* v_cache, const int32_t* token_seq,
                             const int32_t* kv_index, const int32_t* block_tables, const int32_t* cascade, void* out,
                             const CascadeShape& shape, const CascadeBatchPlan& plan, void* workspace,
                             cudaStream_t stream);

}  // namespace mxserve::kernels::cuda
