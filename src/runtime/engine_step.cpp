// Engine::run_plan: one forward of the target over the scheduled batch, then sampling (or, for
// speculative sequences, verification of their drafts), events, and the MTP draft stage.
#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"

namespace mxserve::runtime {

bool Engine::emit_token(Sequence* seq, int32_t token, float logprob, std::vector<TopLogprob> top) {
  seq->tokens.push_back(token);
  const auto now = Clock::now();
  if (!seq->times.first_token) seq->times.first_token = now;
  seq->times.last_token = now;
  TokenEvent ev;
  ev.id = seq->id;
  ev.token = token;
  ev.logprob = logprob;
  ev.top_logprobs = std::move(top);
  const auto& sp = seq->sampling;
  const bool is_eos = !sp.ignore_eos && std::find(config_.eos_token_ids.begin(), config_.eos_token_ids.end(),
                                                  static_cast<int64_t>(token)) != config_.eos_token_ids.end();
  const bool is_stop = std::find(sp.stop_token_ids.begin(), sp.stop_token_ids.end(), token) != sp.stop_token_ids.end();
  if (is_eos || is_stop) ev.finish = FinishReason::kStop;
  else if (seq->n_generated() >= sp.max_tokens || static_cast<int64_t>(seq->tokens.size()) >= config_.max_model_len)
    ev.finish = FinishReason::kLength;
  ev.usage = usage_of(*seq);  // so far on every event (cached_tokens is final from the first token)
  if (seq->on_event) seq->on_event(ev);
  return ev.finish != FinishReason::kNone;
}

// True when a request's next token is the plain argmax of its raw logits (no temperature, logprobs or
// penalties), so the device-side argmax is all the host needs.
bool greedy_ids_suffice(const SamplingParams& sp) {
  return sp.temperature <= 0.f && sp.logprobs < 0 && sp.presence_penalty == 0.f && sp.frequency_penalty == 0.f;
}

Status Engine::run_plan(const SchedulePlan& plan) {
  const auto step_t0 = Clock::now();
  const int32_t n_verified = spec_last_n_;  // the N the previous step drafted (the policy's choice)
  spec_extend_seconds_ = 0;
  model::ForwardBatch batch = build_forward_batch(plan);
  const bool spec = spec_enabled();
  batch.want_hidden = spec;
  batch.want_host_logits = false;
  for (const auto& c : plan.chunks)
    if ((c.n_drafts > 0 || c.needs_sample) && !greedy_ids_suffice(c.seq->sampling)) batch.want_host_logits = true;
  const auto scheduled_at = Clock::now();
  for (const auto& c : plan.chunks)
    if (!c.seq->times.first_scheduled) c.seq->times.first_scheduled = scheduled_at;
  MX_ASSIGN_OR_RETURN(ExecOutput out, executor_->execute(batch));
  scheduler_.commit(plan);
  const int64_t V = executor_->vocab_size();
  int64_t generated = 0, logit_row = 0, row = 0, n_decode = 0;
  std::vector<Sequence*> finished;
  std::vector<MtpRows> mtp_rows;
  SpecStats spec_delta;
  for (const auto& c : plan.chunks) {
    Sequence* seq = c.seq;
    bool done = false;
    if (c.needs_sample || c.n_drafts > 0) ++n_decode;
    if (c.n_drafts > 0) {
      // Verify: the target's rows p_0..p_N against drafts d_1..d_N.
      const auto& sp = seq->sampling;
      const bool greedy = sp.temperature <= 0.f;
      std::vector<TokenDistribution> p;  // sampled requests only: greedy ones need the argmax ids alone
      if (!greedy) {
        p.resize(c.n_tokens);
        for (int32_t i = 0; i < c.n_tokens; ++i) {
          std::span<const float> lr(out.logits.data<float>() + (logit_row + i) * V, V);
          p[i] = sampling_distribution(lr, sp);
        }
      }
      const uint64_t seed = sp.seed.value_or(seq->seed) ^ 0xA5A5A5A5ull;
      const uint64_t base = static_cast<uint64_t>(seq->n_generated()) * 64;
      ChainVerdict v;
      if (config_.spec.simulate_acceptance) {
        // Benchmark mode: accept a fixed expected number of drafts, whatever they are.
        const double want = *config_.spec.simulate_acceptance - 1.0 + counter_uniform(seed, base);
        v.n_accepted = std::clamp(static_cast<int32_t>(want), 0, c.n_drafts);
        v.next_token = greedy ? out.greedy_token(logit_row + v.n_accepted)
                              : p[v.n_accepted].draw(counter_uniform(seed, base + 1));
      } else if (greedy) {
        // Accept while d_{i+1} == argmax p_i; the next token is the argmax after the last accepted draft.
        while (v.n_accepted < c.n_drafts && seq->drafts[v.n_accepted] == out.greedy_token(logit_row + v.n_accepted))
          ++v.n_accepted;
        v.next_token = out.greedy_token(logit_row + v.n_accepted);
      } else {
        v = verify_chain(std::span<const int32_t>(seq->drafts.data(), c.n_drafts), seq->draft_q, p, greedy,
                         [&](size_t i) { return counter_uniform(seed, base + 2 + i); });
      }
      spec_delta.num_drafts += 1;
      spec_delta.num_draft_tokens += c.n_drafts;
      spec_delta.num_accepted_tokens += v.n_accepted;
      if (spec_delta.accepted_per_pos.size() < static_cast<size_t>(c.n_drafts))
        spec_delta.accepted_per_pos.resize(c.n_drafts, 0);
      for (int32_t i = 0; i < v.n_accepted; ++i) ++spec_delta.accepted_per_pos[i];
      spec_policy_.record(c.n_drafts, v.n_accepted);
      seq->spec_drafted += c.n_drafts;
      seq->spec_accepted += v.n_accepted;
      const std::vector<int32_t> accepted(seq->drafts.begin(), seq->drafts.begin() + v.n_accepted);
      seq->drafts.clear();
      seq->draft_q.clear();
      // Accepted drafts' K/V were written by the verify forward: they are computed tokens now.
      for (int32_t i = 0; i <= v.n_accepted && !done; ++i) {
        const int32_t token = i < v.n_accepted ? accepted[i] : v.next_token;
        float logprob = 0.f;
        if (sp.logprobs >= 0) {  // raw log-softmax, as sample_token reports it
          std::span<const float> lr(out.logits.data<float>() + (logit_row + i) * V, V);
          const float lmax = *std::max_element(lr.begin(), lr.end());
          double z = 0;
          for (float x : lr) z += std::exp(static_cast<double>(x - lmax));
          logprob = static_cast<float>(lr[token] - lmax - std::log(z));
        }
        if (i < v.n_accepted) ++seq->n_computed;
        done = emit_token(seq, token, logprob, {});
        ++generated;
      }
      logit_row += c.n_tokens;
    } else if (c.needs_sample) {
      if (greedy_ids_suffice(seq->sampling)) {
        done = emit_token(seq, out.greedy_token(logit_row), 0.f, {});
      } else {
        std::span<float> lr(out.logits.data<float>() + logit_row * V, V);
        std::span<const int32_t> gen(seq->tokens.data() + seq->prompt_len, seq->n_generated());
        SampleResult s = sample_token(lr, seq->sampling, seq->seed, seq->n_generated(), gen);
        done = emit_token(seq, s.token, s.logprob, std::move(s.top_logprobs));
      }
      ++generated;
      logit_row += 1;
    }
    if (done) {
      finished.push_back(seq);
    } else if (spec && seq->n_draft_computed == c.start) {
      // The MTP layer catches up over every position this forward computed for the sequence.
      mtp_rows.push_back({seq, c.start, seq->n_computed - 1, static_cast<int32_t>(row)});
    }
    row += c.n_tokens;
  }
  Status mtp_status = Status::ok();
  if (!mtp_rows.empty()) mtp_status = extend_and_draft(mtp_rows, out.hidden);
  if (spec && plan.n_prefill_tokens == 0 && n_decode > 0)  // a pure decode step: its cost teaches the policy
    spec_policy_.record_step(n_verified, n_decode, std::chrono::duration<double>(Clock::now() - step_t0).count(),
                             spec_extend_seconds_);
  for (Sequence* seq : finished) finish(seq, FinishReason::kStop);
  std::lock_guard<std::mutex> s(stats_mutex_);
  stats_.generated_tokens += generated;
  stats_.prompt_tokens += plan.n_prefill_tokens;
  stats_.spec.num_drafts += spec_delta.num_drafts;
  stats_.spec.num_draft_tokens += spec_delta.num_draft_tokens;
  stats_.spec.num_accepted_tokens += spec_delta.num_accepted_tokens;
  if (stats_.spec.accepted_per_pos.size() < spec_delta.accepted_per_pos.size())
    stats_.spec.accepted_per_pos.resize(spec_delta.accepted_per_pos.size(), 0);
  for (size_t i = 0; i < spec_delta.accepted_per_pos.size(); ++i)
    stats_.spec.accepted_per_pos[i] += spec_delta.accepted_per_pos[i];
  stats_.spec.acceptance_rate = spec_policy_.acceptance_rate();
  stats_.spec.expected_accepted = spec_policy_.expected_accepted(stats_.spec.current_steps);
  stats_.spec.estimated_gain = spec_policy_.estimated_gain();
  return mtp_status;
}

}  // namespace mxserve::runtime
