// Engine::extend_and_draft: the MTP (NextN) draft stage of speculative decoding, chain mode.
//   1. extend: the MTP layer runs over every position p the target just computed, with token x_{p+1}
//      and the target's post-norm hidden state h_p (its own KV layer, the target's positions), so its
//      KV stays caught up; the last row of a decoding sequence proposes draft d_1;
//   2. draft: N-1 more MTP steps, each fed the previous draft token and the MTP layer's own output
//      hidden state, propose d_2..d_N. Their KV writes are tentative: the next extend rewrites them.
// The target verifies [x_last, d_1..d_N] in the next step (engine_step.cpp).
#include "core/check.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"

namespace mxserve::runtime {
namespace {

int32_t pick_draft(const TokenDistribution& q, const Sequence& seq, uint64_t counter) {
  if (seq.sampling.temperature <= 0.f) return q.argmax();
  const uint64_t seed = seq.sampling.seed.value_or(seq.seed) ^ 0xD1D1D1D1ull;
  return q.draw(counter_uniform(seed, counter));
}

}  // namespace

Status Engine::extend_and_draft(const std::vector<MtpRows>& all_rows, const Tensor& target_hidden) {
  // N for the next step first: with N = 0 (paused) the extend only keeps the draft KV caught up and
  // skips the MTP head (at GLM-4.5-Air a 1.2 GB read per step).
  int64_t n_decoding = 0;
  for (const MtpRows& r : all_rows) n_decoding += r.seq->n_remaining() == 1;
  const int64_t budget = config_.scheduler.max_num_batched_tokens;
  const int32_t n_steps = spec_policy_.steps_for(n_decoding, budget);
  spec_last_n_ = n_steps;
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    stats_.spec.current_steps = n_steps;
  }
  // Never slower: when the adaptive policy pauses speculation (not merely the token budget), decoding
  // sequences stop paying for the MTP layer at all. Their draft KV goes stale, so they decode plainly to the
  // end; prefilling sequences keep theirs current, so the policy can re-measure N > 0 on new requests.
  std::vector<MtpRows> kept;
  // (A re-measurement of N = 0 keeps the extend: the sequences must stay able to draft.)
  const bool paused = n_steps == 0 && config_.spec.adaptive && !spec_policy_.exploring() && n_decoding > 0 &&
                      2 * n_decoding <= budget;
  if (paused)
    for (const MtpRows& r : all_rows)
      if (r.seq->n_remaining() != 1) kept.push_back(r);
  const std::vector<MtpRows>& rows = paused ? kept : all_rows;
  if (rows.empty()) return Status::ok();
  model::ForwardBatch ext;
  ext.want_hidden = true;
  std::vector<int32_t> hidden_rows;
  std::vector<size_t> decoding;  // indices into rows whose sequence proposes drafts
  for (size_t i = 0; i < rows.size(); ++i) {
    const MtpRows& r = rows[i];
    Sequence* seq = r.seq;
    model::SequenceSpan span;
    span.token_begin = ext.n_tokens();
    span.n_tokens = r.last_pos - r.first_pos + 1;
    span.kv_len = r.last_pos + 1;
    span.block_table = seq->block_table;
    for (int32_t p = r.first_pos; p <= r.last_pos; ++p) {
      ext.token_ids.push_back(seq->tokens[p + 1]);
      ext.positions.push_back(p);
      hidden_rows.push_back(r.first_row + (p - r.first_pos));
    }
    if (seq->n_remaining() == 1 && n_steps > 0) {  // prefill done: propose drafts for the next step
      ext.logit_rows.push_back(span.token_begin + span.n_tokens - 1);
      decoding.push_back(i);
    }
    ext.seqs.push_back(std::move(span));
  }
  ext.want_host_logits = false;  // greedy drafts need only the device argmax
  for (size_t k : decoding)
    if (rows[k].seq->sampling.temperature > 0.f) ext.want_host_logits = true;
  // At N = 0 the extend only keeps the draft KV current: time it so the policy learns plain decoding's cost.
  const bool time_extend = n_steps == 0 && config_.spec.adaptive;
  if (time_extend) executor_->synchronize();  // the target's forward is not the extend's
  const auto ext_t1 = Clock::now();
  Tensor h_in = executor_->select_rows(target_hidden, hidden_rows);
  MX_ASSIGN_OR_RETURN(ExecOutput out, executor_->execute_mtp(ext, h_in));
  if (time_extend) {
    executor_->synchronize();
    spec_extend_seconds_ = std::chrono::duration<double>(Clock::now() - ext_t1).count();
  }
  for (const MtpRows& r : rows) r.seq->n_draft_computed = r.last_pos + 1;

  if (n_steps == 0 || decoding.empty()) return Status::ok();

  const int64_t V = executor_->vocab_size();
  struct Drafting {
    Sequence* seq;
    int32_t hidden_row;  // row of the sequence's latest MTP output in the latest hidden tensor
  };
  std::vector<Drafting> active;
  for (size_t k = 0; k < decoding.size(); ++k) {
    const MtpRows& r = rows[decoding[k]];
    Sequence* seq = r.seq;
    // Room for the drafts' KV now and for verifying them next step; no room -> plain decoding.
    if (!scheduler_.reserve(seq, static_cast<int64_t>(seq->tokens.size()) + n_steps)) continue;
    if (seq->sampling.temperature <= 0.f) {
      seq->drafts = {out.greedy_token(static_cast<int64_t>(k))};
    } else {
      std::span<const float> lr(out.logits.data<float>() + k * V, V);
      TokenDistribution q = sampling_distribution(lr, seq->sampling);
      seq->drafts = {pick_draft(q, *seq, static_cast<uint64_t>(seq->n_generated()) * 64)};
      seq->draft_q = {std::move(q)};
    }
    const auto& span = ext.seqs[decoding[k]];
    active.push_back({seq, span.token_begin + span.n_tokens - 1});
  }
  Tensor hidden = out.hidden;
  for (int32_t j = 2; j <= n_steps && !active.empty(); ++j) {
    model::ForwardBatch d;
    d.want_hidden = true;
    d.want_host_logits = false;
    for (const Drafting& a : active)
      if (a.seq->sampling.temperature > 0.f) d.want_host_logits = true;
    std::vector<int32_t> hrows;
    for (size_t a = 0; a < active.size(); ++a) {
      Sequence* seq = active[a].seq;
      const int32_t pos = static_cast<int32_t>(seq->tokens.size()) - 3 + j;  // draft d_{j-1} sits here
      model::SequenceSpan span;
      span.token_begin = static_cast<int32_t>(a);
      span.n_tokens = 1;
      span.kv_len = pos + 1;
      span.block_table = seq->block_table;
      d.seqs.push_back(std::move(span));
      d.token_ids.push_back(seq->drafts.back());
      d.positions.push_back(pos);
      d.logit_rows.push_back(static_cast<int32_t>(a));
      hrows.push_back(active[a].hidden_row);
    }
    Tensor hd = executor_->select_rows(hidden, hrows);
    MX_ASSIGN_OR_RETURN(ExecOutput step, executor_->execute_mtp(d, hd));
    for (size_t a = 0; a < active.size(); ++a) {
      Sequence* seq = active[a].seq;
      if (seq->sampling.temperature <= 0.f) {
        seq->drafts.push_back(step.greedy_token(static_cast<int64_t>(a)));
      } else {
        std::span<const float> lr(step.logits.data<float>() + a * V, V);
        TokenDistribution q = sampling_distribution(lr, seq->sampling);
        seq->drafts.push_back(pick_draft(q, *seq, static_cast<uint64_t>(seq->n_generated()) * 64 + j));
        seq->draft_q.push_back(std::move(q));
      }
      active[a].hidden_row = static_cast<int32_t>(a);
    }
    hidden = step.hidden;
  }
  return Status::ok();
}

}  // namespace mxserve::runtime
