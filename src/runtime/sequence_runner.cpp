#include "runtime/sequence_runner.h"

#include <algorithm>

#include "core/check.h"

namespace mxserve::runtime {

SequenceRunner::SequenceRunner(model::CausalLM& model, backend::Backend& be, int64_t n_blocks, int64_t block_size)
    : model_(model), be_(be), block_size_(block_size), blocks_(n_blocks) {
  kv_ = std::make_unique<kvcache::KvCache>(model.kv_spec(n_blocks, block_size),
                                           [&be](DType dt, Shape s) { return be.alloc(dt, std::move(s)); });
}

Status SequenceRunner::reserve(SequenceState& seq, int64_t new_len) {
  const int64_t need = (new_len + block_size_ - 1) / block_size_ - static_cast<int64_t>(seq.block_table.size());
  if (need > 0) MX_RETURN_IF_ERROR(blocks_.allocate(need, seq.block_table));
  return Status::ok();
}

void SequenceRunner::release(SequenceState& seq) {
  blocks_.unref_all(seq.block_table);
  seq.block_table.clear();
  seq.tokens.clear();
}

Result<SequenceRunner::StepResult> SequenceRunner::extend(std::vector<SequenceState*> seqs,
                                                          const std::vector<std::vector<int32_t>>& tokens,
                                                          bool all_logits, bool want_hidden) {
  MX_CHECK_EQ(seqs.size(), tokens.size());
  model::ForwardBatch batch;
  batch.want_hidden = want_hidden;
  for (size_t s = 0; s < seqs.size(); ++s) {
    SequenceState& seq = *seqs[s];
    const auto& add = tokens[s];
    const int64_t old_len = static_cast<int64_t>(seq.tokens.size());
    MX_RETURN_IF_ERROR(reserve(seq, old_len + static_cast<int64_t>(add.size())));
    model::SequenceSpan span;
    span.token_begin = batch.n_tokens();
    span.n_tokens = static_cast<int32_t>(add.size());
    span.kv_len = static_cast<int32_t>(old_len + add.size());
    span.block_table = seq.block_table;
    for (size_t i = 0; i < add.size(); ++i) {
      batch.token_ids.push_back(add[i]);
      batch.positions.push_back(static_cast<int32_t>(old_len + i));
      if (all_logits) batch.logit_rows.push_back(span.token_begin + static_cast<int32_t>(i));
    }
    if (!all_logits) batch.logit_rows.push_back(span.token_begin + span.n_tokens - 1);
    batch.seqs.push_back(std::move(span));
  }
  MX_ASSIGN_OR_RETURN(model::ForwardOutput out, model_.forward(batch, *kv_));
  for (size_t s = 0; s < seqs.size(); ++s)
    seqs[s]->tokens.insert(seqs[s]->tokens.end(), tokens[s].begin(), tokens[s].end());
  StepResult r;
  r.logits = be_.to_host(out.logits);
  r.hidden = out.hidden;
  return r;
}

Result<Tensor> SequenceRunner::mtp(SequenceState& seq, const std::vector<int32_t>& next_tokens,
                                   const Tensor& hidden_in, const std::vector<int32_t>& first_step_rows) {
  const int64_t old_len = static_cast<int64_t>(seq.tokens.size());
  const int64_t n = static_cast<int64_t>(next_tokens.size());
  MX_RETURN_IF_ERROR(reserve(seq, old_len + n));
  model::ForwardBatch batch;
  batch.token_ids = next_tokens;
  batch.mtp_step.first_step_rows = first_step_rows;
  model::SequenceSpan span;
  span.n_tokens = static_cast<int32_t>(n);
  span.kv_len = static_cast<int32_t>(old_len + n);
  span.block_table = seq.block_table;
  for (int64_t i = 0; i < n; ++i) {
    batch.positions.push_back(static_cast<int32_t>(old_len + i));
    batch.logit_rows.push_back(static_cast<int32_t>(i));
  }
  batch.seqs.push_back(std::move(span));
  MX_ASSIGN_OR_RETURN(model::ForwardOutput out, model_.forward_mtp(batch, hidden_in, *kv_));
  seq.tokens.insert(seq.tokens.end(), next_tokens.begin(), next_tokens.end());
  return be_.to_host(out.logits);
}

int32_t argmax_row(const Tensor& logits, int64_t row) {
  const int64_t V = logits.dim(1);
  const float* p = logits.data<float>() + row * V;
  return static_cast<int32_t>(std::max_element(p, p + V) - p);
}

Result<std::vector<int32_t>> SequenceRunner::greedy(const std::vector<int32_t>& prompt, int64_t max_new_tokens,
                                                    int64_t chunk_size, const std::vector<int64_t>& stop_ids) {
  if (prompt.empty()) return invalid_argument("greedy: empty prompt");
  SequenceState seq;
  std::vector<int32_t> generated;
  Tensor last;
  for (size_t begin = 0; begin < prompt.size(); begin += chunk_size) {
    const size_t end = std::min(prompt.size(), begin + static_cast<size_t>(chunk_size));
    auto step = extend({&seq}, {std::vector<int32_t>(prompt.begin() + begin, prompt.begin() + end)}, false, false);
    if (!step.is_ok()) {
      release(seq);
      return step.status();
    }
    last = step->logits;
  }
  for (int64_t i = 0; i < max_new_tokens; ++i) {
    const int32_t next = argmax_row(last, 0);
    generated.push_back(next);
    if (std::find(stop_ids.begin(), stop_ids.end(), next) != stop_ids.end() || i + 1 == max_new_tokens) break;
    auto step = extend({&seq}, {{next}}, false, false);
    if (!step.is_ok()) {
      release(seq);
      return step.status();
    }
    last = step->logits;
  }
  release(seq);
  return generated;
}

}  // namespace mxserve::runtime
