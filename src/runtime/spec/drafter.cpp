#include "runtime/spec/drafter.h"

#include <algorithm>
#include <chrono>

#include "core/check.h"
#include "runtime/sampler.h"
#include "runtime/spec/verifier.h"

namespace mxserve::runtime {
namespace {

constexpr uint64_t kDraftStream = 0xD1D1D1D1ull;  // unseeded drafts' RNG stream (the verifier's is another)
constexpr uint64_t kCountersPerStep = 256;

// Draft j (1-based) of `seq` from its draft logit row, in the verifier's mode; nullopt ends the chain.
// row: the host logits (empty when the device argmax suffices); q receives the proposal (unseeded only).
std::optional<int32_t> pick_draft(const Sequence& seq, std::span<const float> row, int32_t device_argmax, int32_t j,
                                  TokenDistribution* q) {
  const SamplingParams& sp = seq.sampling;
  const VerifyMode mode = verify_mode(sp);
  if (mode == VerifyMode::kGreedy && !has_logit_processing(sp)) return device_argmax;
  auto processed = processed_draft_row(seq, row, seq.drafts);
  if (!processed) return std::nullopt;
  if (mode == VerifyMode::kGreedy) return argmax_of(*processed);
  TokenDistribution d = sampling_distribution(*processed, sp);
  const uint64_t step = static_cast<uint64_t>(seq.n_generated());
  const uint64_t seed = sampling_seed(sp, seq.seed);
  if (mode == VerifyMode::kSeeded) return d.draw(counter_uniform(seed, step + j - 1));  // the target's own counter
  const int32_t token = d.draw(counter_uniform(seed ^ kDraftStream, step * kCountersPerStep + j));
  *q = std::move(d);
  return token;
}

bool needs_host_draft_logits(const Sequence& seq) {
  return !is_greedy(seq.sampling) || has_logit_processing(seq.sampling);
}

}  // namespace

std::optional<std::vector<float>> processed_draft_row(const Sequence& seq, std::span<const float> row,
                                                      std::span<const int32_t> extra) {
  std::vector<float> out(row.begin(), row.end());
  if (has_logit_processing(seq.sampling)) {
    std::vector<int32_t> generated(seq.tokens.begin() + seq.prompt_len, seq.tokens.end());
    generated.insert(generated.end(), extra.begin(), extra.end());
    const std::span<const int32_t> prompt(seq.tokens.data(), seq.prompt_len);
    process_logits(out, seq.sampling, TokenContext{prompt, generated});
  }
  if (!check_logits(out).is_ok()) return std::nullopt;
  return out;
}

Drafter::Drafter(const SpecConfig& config, int64_t token_budget, ModelExecutor& executor, Scheduler& scheduler)
    : config_(config), token_budget_(token_budget), executor_(executor), scheduler_(scheduler), policy_(config) {}

Status Drafter::extend_and_draft(const std::vector<MtpRows>& all_rows, const Tensor& target_hidden) {
  // N for the next step first: with N = 0 (paused) the extend only keeps the draft KV caught up and
  // skips the MTP head (at GLM-4.5-Air a 1.2 GB read per step).
  int64_t n_decoding = 0;
  for (const MtpRows& r : all_rows) n_decoding += r.seq->n_remaining() == 1;
  const int32_t n_steps = policy_.steps_for(n_decoding, token_budget_);
  last_n_ = n_steps;
  // Never slower: when the adaptive policy pauses speculation (not merely the token budget), decoding
  // sequences stop paying for the MTP layer at all. Their draft KV goes stale, so they decode plainly to the
  // end; prefilling sequences keep theirs current, so the policy can re-measure N > 0 on new requests.
  // (A re-measurement of N = 0 keeps the extend: the sequences must stay able to draft.)
  std::vector<MtpRows> kept;
  const bool paused = n_steps == 0 && config_.adaptive && !policy_.exploring() && n_decoding > 0 &&
                      2 * n_decoding <= token_budget_;
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
    model::SequenceSpan span = table_span(*seq);
    span.token_begin = ext.n_tokens();
    span.n_tokens = r.last_pos - r.first_pos + 1;
    span.kv_len = r.last_pos + 1;
    for (int32_t p = r.first_pos; p <= r.last_pos; ++p) {
      ext.token_ids.push_back(seq->tokens[p + 1]);
      ext.positions.push_back(p);
      hidden_rows.push_back(r.rows.empty() ? r.first_row + (p - r.first_pos) : r.rows[p - r.first_pos]);
    }
    if (seq->n_remaining() == 1 && n_steps > 0) {  // prefill done: propose drafts for the next step
      ext.logit_rows.push_back(span.token_begin + span.n_tokens - 1);
      decoding.push_back(i);
    }
    ext.seqs.push_back(std::move(span));
  }
  ext.want_host_logits = config_.tree() && !decoding.empty();  // trees rank top-k candidates on the host
  for (size_t k : decoding) ext.want_host_logits |= needs_host_draft_logits(*rows[k].seq);
  // At N = 0 the extend only keeps the draft KV current: time it so the policy learns plain decoding's cost.
  const bool time_extend = n_steps == 0 && config_.adaptive;
  if (time_extend) executor_.synchronize();  // the target's forward is not the extend's
  const auto ext_t1 = Clock::now();
  Tensor h_in = executor_.select_rows(target_hidden, hidden_rows);
  MX_ASSIGN_OR_RETURN(ExecOutput out, executor_.execute_mtp(ext, h_in));
  if (time_extend) {
    executor_.synchronize();
    extend_seconds_ = std::chrono::duration<double>(Clock::now() - ext_t1).count();
  }
  for (const MtpRows& r : rows) r.seq->n_draft_computed = r.last_pos + 1;
  if (n_steps == 0 || decoding.empty()) return Status::ok();

  // Room for the drafts' KV now and for verifying them next step (tree: target x_last + nodes, MTP layer one
  // slot per expansion); no room -> that sequence decodes plainly.
  const int64_t room = config_.tree()
                           ? std::max(config_.draft_rows(n_steps), (n_steps - 1) * config_.topk - 1)
                           : n_steps;
  std::vector<Sequence*> seqs;
  std::vector<int32_t> root_rows, root_hidden;
  for (size_t k = 0; k < decoding.size(); ++k) {
    Sequence* seq = rows[decoding[k]].seq;
    if (!scheduler_.reserve(seq, static_cast<int64_t>(seq->tokens.size()) + room)) continue;
    seqs.push_back(seq);
    root_rows.push_back(static_cast<int32_t>(k));
    const auto& span = ext.seqs[decoding[k]];
    root_hidden.push_back(span.token_begin + span.n_tokens - 1);
  }
  if (seqs.empty()) return Status::ok();
  if (config_.tree()) return draft_tree(seqs, root_rows, root_hidden, out, n_steps);
  return draft_chain(seqs, root_rows, root_hidden, out, n_steps);
}

Status Drafter::draft_chain(const std::vector<Sequence*>& seqs, const std::vector<int32_t>& root_rows,
                            const std::vector<int32_t>& root_hidden, const ExecOutput& extend, int32_t n_steps) {
  const int64_t V = executor_.vocab_size();
  struct Active {
    Sequence* seq;
    int32_t hidden_row;  // row of the sequence's latest MTP output in the latest hidden tensor
    int32_t first_row;   // the sequence's row in the extend (its first draft step: ForwardBatch::mtp_step)
  };
  // Draft j of every active sequence from logit row r of `out`; a sequence whose row is unusable stops.
  auto propose = [&](std::vector<Active>& active, const ExecOutput& out, const std::vector<int32_t>& rows,
                     int32_t j) {
    std::vector<Active> still;
    for (size_t a = 0; a < active.size(); ++a) {
      Sequence* seq = active[a].seq;
      std::span<const float> row;
      if (out.logits.ndim() == 2)
        row = {out.logits.data<float>() + static_cast<int64_t>(rows[a]) * V, static_cast<size_t>(V)};
      TokenDistribution q;
      const bool host = needs_host_draft_logits(*seq);
      auto token = pick_draft(*seq, row, host ? -1 : out.greedy_token(rows[a]), j, &q);
      if (!token) continue;
      seq->drafts.push_back(*token);
      if (verify_mode(seq->sampling) == VerifyMode::kRejection) seq->draft_q.push_back(std::move(q));
      still.push_back(active[a]);
    }
    active = std::move(still);
  };
  std::vector<Active> active;
  for (size_t i = 0; i < seqs.size(); ++i) {
    seqs[i]->clear_drafts();
    active.push_back({seqs[i], root_hidden[i], root_hidden[i]});
  }
  propose(active, extend, root_rows, 1);
  Tensor hidden = extend.hidden;
  for (int32_t j = 2; j <= n_steps && !active.empty(); ++j) {
    model::ForwardBatch d;
    d.want_hidden = true;
    d.want_host_logits = false;
    std::vector<int32_t> hrows, lrows;
    for (size_t a = 0; a < active.size(); ++a) {
      Sequence* seq = active[a].seq;
      d.want_host_logits |= needs_host_draft_logits(*seq);
      const int32_t pos = static_cast<int32_t>(seq->tokens.size()) - 3 + j;  // draft d_{j-1} sits here
      model::SequenceSpan span = table_span(*seq);
      span.token_begin = static_cast<int32_t>(a);
      span.n_tokens = 1;
      span.kv_len = pos + 1;
      d.seqs.push_back(std::move(span));
      d.token_ids.push_back(seq->drafts.back());
      d.positions.push_back(pos);
      d.logit_rows.push_back(static_cast<int32_t>(a));
      hrows.push_back(active[a].hidden_row);
      d.mtp_step.first_step_rows.push_back(active[a].first_row);
      lrows.push_back(static_cast<int32_t>(a));
    }
    Tensor hd = executor_.select_rows(hidden, hrows);
    MX_ASSIGN_OR_RETURN(ExecOutput step, executor_.execute_mtp(d, hd));
    for (size_t a = 0; a < active.size(); ++a) active[a].hidden_row = static_cast<int32_t>(a);
    propose(active, step, lrows, j);
    hidden = step.hidden;
  }
  return Status::ok();
}

}  // namespace mxserve::runtime
