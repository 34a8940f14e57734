// ForwardBatch: the one batch descriptor both backends execute. Prefill chunks, decodes and (later)
// speculative verification are all rows of it. Host-side; the model uploads what kernels need.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "kvcache/block_table_store.h"

namespace mxserve::model {

struct SequenceSpan {
  int32_t token_begin = 0;          // first row of this sequence in the batch
  int32_t n_tokens = 0;             // rows of this sequence in the batch
  int32_t kv_len = 0;               // tokens in the KV cache after this batch (cached before + n_tokens)
  // The blocks covering KV indices [0, kv_len), one of two ways:
  //   engine batches: table_row / table_lease name the sequence's row of the KV cache's persistent block-table
  //     store (kvcache/block_table_store.h) and host_table points at its host table (the engine's, not a
  //     copy; valid for the forward call). Only blocks appended since the last sync are uploaded.
  //   batches built by hand (tests, tools): block_table holds the blocks; a temporary table is uploaded.
  std::vector<int32_t> block_table;
  int32_t table_row = -1;
  uint64_t table_lease = 0;
  const std::vector<int32_t>* host_table = nullptr;
  const std::vector<int32_t>& blocks() const { return host_table != nullptr ? *host_table : block_table; }
  // Speculative trees (both optional; empty = the plain causal layout, zero cost):
  //   kv_indices[i]: the KV index of row i (default kv_len - n_tokens + i); kv_len must exceed them all.
  //   tree_mask[i]: row i attends to KV indices j <= its own with j < tree_base, or j = tree_base + b for
  //   each bit b set (its tree ancestors and itself). Rows with tree_mask 0 and kv index < tree_base are
  //   causal rows of the committed context. Every tree row's kv index is in [tree_base, tree_base + 64).
  std::vector<int32_t> kv_indices;
  std::vector<uint64_t> tree_mask;
  int32_t tree_base = 0;
  int32_t kv_index_of(int32_t i) const { return kv_indices.empty() ? kv_len - n_tokens + i : kv_indices[i]; }
};

// The MTP step context: where an MTP forward sits in a draft chain. The drafter (runtime/spec/drafter.cpp)
// fills it for chain steps >= 2; an architecture may reuse per-chain state through it (glm_moe_dsa with
// index_share_for_mtp_iteration reuses the first step's DSA top-k), others ignore it. Default (empty): not a
// continuation -- every MTP forward stands alone.
struct MtpStep {
  // [T] for a continuation: row i continues the chain whose first step was row first_step_rows[i] of the
  // latest MTP forward sent without a context (the extend). Errors name it mtp_first_step_rows.
  std::vector<int32_t> first_step_rows;

  bool continues_chain() const { return !first_step_rows.empty(); }
  // A continuation names one row per token (n_tokens), each a row of the first step (first_step_n_rows).
  Status validate(int64_t n_tokens, int64_t first_step_n_rows) const;
};

struct ForwardBatch {
  std::vector<int32_t> token_ids;   // [T]
  std::vector<int32_t> positions;   // [T] RoPE positions
  std::vector<SequenceSpan> seqs;   // contiguous, in row order, covering all T rows
  std::vector<int32_t> logit_rows;  // rows whose logits are wanted
  bool want_hidden = false;         // also return the post-final-norm hidden state of every row
  bool want_host_logits = true;     // copy the logit rows to the host (false: greedy ids only, see executor.h)
  MtpStep mtp_step;                 // MTP forwards only: where each row sits in its draft chain

  int32_t n_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  // Checks row coverage, KV lengths, block tables against the cache geometry, ids against the vocab.
  // Store-row spans: only the table's length and the blocks of the new rows here (BlockTableStore::sync
  // checks every block id it uploads), so validation costs O(rows), not O(context).
  Status validate(int64_t vocab_size, int64_t n_blocks, int64_t block_size) const;
};

// Rows before the first span that is not a plain decode row (one token, no tree mask): the spans are in
// row order, so these rows are [0, n) and belong to n distinct sequences (AttentionParams::n_leading_decode_rows).
int32_t leading_decode_rows(const ForwardBatch& batch);

// Prefix groups (kernels/cascade_attention.h) among the batch's leading plain decode rows [0, n_rows): rows
// whose block tables share >= options.min_shared_blocks leading blocks (the radix cache's shared prefix).
kernels::CascadeLayout cascade_groups(const ForwardBatch& batch, int32_t n_rows, int64_t block_size,
                                      const kernels::CascadeGroupOptions& options = {});
// Whether the GQA cascade kernels serve this head shape (head_dim <= 128, <= 16 q heads per kv head; MLA: none).
bool cascade_shape_served(int64_t n_heads, int64_t n_kv_heads, int64_t head_dim);
// K/V bytes per layer (bf16 keys, n_kv_heads x head_dim each for K and V) a layout's groups save.
int64_t cascade_saved_kv_bytes(const kernels::CascadeLayout& layout, int64_t block_size, int64_t n_kv_heads,
                               int64_t head_dim);
// The one rule the eager builder, the decode graphs and bench-model apply: groups exist and save at least
// be.cascade_attention_min_saved_bytes() per layer.
bool cascade_pays(const kernels::CascadeLayout& layout, int64_t block_size, int64_t n_kv_heads, int64_t head_dim,
                  const backend::Backend& be);

// Uploads the batch's attention metadata (token -> table row, KV index, slots) and syncs the block tables:
// spans with store rows (every span or none) sync `store` and point the kernels at it; otherwise a temporary
// [S, max_blocks] table is built from the spans' block_table. Errors: rows without a store, mixed spans.
// Where be.cascade_attention_enabled() and the leading decode rows' prefix groups save at least
// be.cascade_attention_min_saved_bytes() of K/V reads per layer (bf16 bytes), meta.cascade holds them.
Result<backend::AttentionMeta> build_attention_meta(const ForwardBatch& batch, backend::Backend& be,
                                                    int64_t block_size, const kernels::AttentionParams& shape,
                                                    kvcache::BlockTableStore* store = nullptr);

}  // namespace mxserve::model
