// Whole-batch attention plans (cuda_kernels.h "attention/attention_batch.cpp"): one launch, or two on one
// stream for a mixed batch whose leading plain decode rows would otherwise ride in the block-shared
// prefill kernel (shared or wgmma: 8 decode rows of 8 sequences in one block walk their contexts serially, unsplit), or whose
// prefill rows would otherwise ride in the per-warp decode kernel (no K/V tile shared across rows).
// Either kernel is exact for any causal rows: the split changes speed, never results.
// Invariant: the parts cover rows [0, n_tokens) in order, and each part is a self-contained batch for
// paged_attention_bf16: pointers to per-row data (q, out, token_seq, kv_index, tree rows) are offset by
// row_begin; block tables, caches and FP8 scales are shared (rows name their table row via token_seq).
#include <algorithm>

#include "core/check.h"
#include "kernels/cuda/cuda_kernels.h"

namespace mxserve::kernels::cuda {

AttentionBatchPlan plan_paged_attention_batch(const AttentionParams& p, int n_sms, const AttentionPlanOptions& options) {
  AttentionBatchPlan plan;
  const AttentionLaunch whole = plan_paged_attention(p, n_sms, options);
  const int32_t lead = std::clamp(p.n_leading_decode_rows, 0, p.n_tokens);
  AttentionParams rest_params = p;
  rest_params.n_tokens = p.n_tokens - lead;
  rest_params.n_seqs = std::max(1, p.n_seqs - lead);
  rest_params.n_leading_decode_rows = 0;
  // Split when the whole batch would take the shared kernel (its blocks would serialize the decode rows), or
  // when the rows after the decode rows would take it on their own (a prefill chunk too short to make the whole
  // batch prefill-like, e.g. 30 decode rows + a 200-token chunk: one warp per chunk row re-reads every K/V tile).
  bool split = options.force == AttentionPlanOptions::Force::kAuto && p.tree_mask == nullptr && lead > 0 &&
               lead < p.n_tokens;
  AttentionLaunch rest_launch;
  if (split) {
    rest_launch = plan_paged_attention(rest_params, n_sms, options);
    auto block_shared = [](AttentionKernel k) {
      return k == AttentionKernel::kShared || k == AttentionKernel::kWgmmaWs;
    };
    split = block_shared(whole.kernel) || block_shared(rest_launch.kernel);
  }
  if (!split) {
    plan.parts[0].params = p;
    plan.parts[0].launch = whole;
    plan.n_parts = 1;
    plan.workspace_bytes = whole.workspace_bytes;
    return plan;
  }
  AttentionBatchPart& decode = plan.parts[0];
  decode.row_begin = 0;
  decode.params = p;
  decode.params.n_tokens = lead;
  decode.params.n_seqs = lead;  // one row per sequence
  decode.params.n_leading_decode_rows = lead;
  decode.launch = plan_paged_attention(decode.params, n_sms, options);
  AttentionBatchPart& rest = plan.parts[1];
  rest.row_begin = lead;
  rest.params = rest_params;
  rest.launch = rest_launch;
  plan.n_parts = 2;
  plan.workspace_bytes = std::max(decode.launch.workspace_bytes, rest.launch.workspace_bytes);
  return plan;
}

void paged_attention_batch(const void* q, const void* k_cache, const void* v_cache, const int32_t* token_seq,
                           const int32_t* kv_index, const int32_t* block_tables, void* out,
                           const AttentionBatchPlan& plan, void* workspace, cudaStream_t stream) {
  MX_CHECK_MSG(plan.n_parts >= 1 && plan.n_parts <= 2, "paged attention: batch plan with " << plan.n_parts << " parts");
  for (int i = 0; i < plan.n_parts; ++i) {
    const AttentionBatchPart& part = plan.parts[i];
    const AttentionParams& p = part.params;
    MX_CHECK_MSG(part.launch.workspace_bytes <= plan.workspace_bytes,
                 "paged attention: part " << i << " needs " << part.launch.workspace_bytes << " workspace bytes");
    const int64_t row_elems = static_cast<int64_t>(p.n_heads) * p.head_dim;  // bf16 per row of q / out
    const int64_t r = part.row_begin;
    AttentionParams rows = p;
    if (p.tree_mask != nullptr) {
      rows.tree_mask = p.tree_mask + r;
      rows.tree_base = p.tree_base + r;
    }
    paged_attention_bf16(static_cast<const uint16_t*>(q) + r * row_elems, k_cache, v_cache, token_seq + r,
                         kv_index + r, block_tables, static_cast<uint16_t*>(out) + r * row_elems, rows, part.launch,
                         workspace, stream);
  }
}

}  // namespace mxserve::kernels::cuda
