// ForwardBatch: the one batch descriptor both backends execute. Prefill chunks, decodes and (later)
// speculative verification are all rows of it. Host-side; the model uploads what kernels need.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"

namespace mxserve::model {

struct SequenceSpan {
  int32_t token_begin = 0;          // first row of this sequence in the batch
  int32_t n_tokens = 0;             // rows of this sequence in the batch
  int32_t kv_len = 0;               // tokens in the KV cache after this batch (cached before + n_tokens)
  std::vector<int32_t> block_table; // blocks covering KV indices [0, kv_len)
};

struct ForwardBatch {
  std::vector<int32_t> token_ids;   // [T]
  std::vector<int32_t> positions;   // [T] RoPE positions
  std::vector<SequenceSpan> seqs;   // contiguous, in row order, covering all T rows
  std::vector<int32_t> logit_rows;  // rows whose logits are wanted
  bool want_hidden = false;         // also return the post-final-norm hidden state of every row
  bool want_host_logits = true;     // copy the logit rows to the host (false: greedy ids only, see executor.h)

  int32_t n_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  // Checks row coverage, KV lengths, block tables against the cache geometry, ids against the vocab.
  Status validate(int64_t vocab_size, int64_t n_blocks, int64_t block_size) const;
};

// Uploads the batch's attention metadata (token->sequence, KV index, slots, block tables).
backend::AttentionMeta build_attention_meta(const ForwardBatch& batch, backend::Backend& be, int64_t block_size,
                                            const kernels::AttentionParams& shape);

}  // namespace mxserve::model
