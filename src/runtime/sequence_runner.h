// SequenceRunner: drives one or more sequences through a CausalLM step by step against a paged KV cache
// -- prefill (in chunks), greedy decode, MTP draft forwards. The minimal driver the CLI and the fixture
// checker use; the continuous-batching engine (scheduler, prefix cache) builds on the same calls.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kvcache/block_pool.h"
#include "kvcache/kv_cache.h"
#include "model/causal_lm.h"

namespace mxserve::runtime {

struct SequenceState {
  std::vector<int32_t> tokens;       // every token whose K/V is in the cache, in order
  std::vector<int32_t> block_table;  // blocks holding them
};

class SequenceRunner {
 public:
  SequenceRunner(model::CausalLM& model, backend::Backend& be, int64_t n_blocks, int64_t block_size);

  // Appends `tokens` to each sequence in one batch; returns host f32 logits [sum rows, V] for every
  // appended row when all_logits, else for the last appended row of each sequence; hidden [T,H] if asked.
  struct StepResult {
    Tensor logits;  // host f32
    Tensor hidden;  // device, post-norm, all rows (when want_hidden)
  };
  Result<StepResult> extend(std::vector<SequenceState*> seqs, const std::vector<std::vector<int32_t>>& tokens,
                            bool all_logits, bool want_hidden);
  // MTP draft over rows: next_tokens[t] with hidden_in[t] at positions[t] (one sequence's KV in layer L).
  // first_step_rows: a draft-chain continuation (model::MtpStep::first_step_rows); empty: a first step.
  Result<Tensor> mtp(SequenceState& mtp_seq, const std::vector<int32_t>& next_tokens, const Tensor& hidden_in,
                     const std::vector<int32_t>& first_step_rows = {});
  // Greedy continuation of a prompt: prefill in chunks of chunk_size, then one token per step.
  Result<std::vector<int32_t>> greedy(const std::vector<int32_t>& prompt, int64_t max_new_tokens,
                                      int64_t chunk_size, const std::vector<int64_t>& stop_ids);
  void release(SequenceState& seq);
  kvcache::KvCache& kv() { return *kv_; }

 private:
  Status reserve(SequenceState& seq, int64_t new_len);
  model::CausalLM& model_;
  backend::Backend& be_;
  int64_t block_size_;
  std::unique_ptr<kvcache::KvCache> kv_;
  kvcache::BlockPool blocks_;
};

int32_t argmax_row(const Tensor& host_logits, int64_t row);

}  // namespace mxserve::runtime
