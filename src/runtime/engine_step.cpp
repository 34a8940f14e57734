// Engine::run_plan: one forward of the target over the scheduled batch, then per chunk the next token(s) --
// plain sampling (sampler.h) or the verification of the sequence's drafts (spec/verifier.h) -- events, and
// the draft stage for the next step (spec/drafter.h).
// Where rows are sampled: greedy rows without logit processing take the device argmax; other unconstrained
// rows without drafts are sampled on the device in one ModelExecutor::sample call right after the forward
// (ids + requested logprobs come back, never logits), or inside the forward itself when the executor can
// (execute_and_sample: a decode graph's sampling tail); constrained rows and speculative verification take
// host logits and the host sampler.
#include <algorithm>

#include "core/check.h"
#include "runtime/constrained_decoding.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"
#include "runtime/spec/verifier.h"

namespace mxserve::runtime {
namespace {

// Whether a request's next token needs the target's host logits (else the device argmax is all it needs).
bool needs_host_logits(const SamplingParams& sp) {
  return !is_greedy(sp) || sp.logprobs >= 0 || has_logit_processing(sp);
}

// Whether a chunk's next token is sampled by ModelExecutor::sample (no host logits for it).
bool device_sampled(const ScheduledChunk& c, bool device_sampling) {
  return device_sampling && c.needs_sample && c.n_drafts == 0 && c.seq->constraint == nullptr &&
         device_samplable(c.seq->sampling) && needs_host_logits(c.seq->sampling);
}

TokenContext context_of(const Sequence& seq) {
  return {std::span<const int32_t>(seq.tokens.data(), seq.prompt_len),
          std::span<const int32_t>(seq.tokens.data() + seq.prompt_len, seq.n_generated())};
}

}  // namespace

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
  else if (seq->constraint && !seq->constraint->accept(token)) {  // tokens come from masked rows: a bug
    ev.finish = FinishReason::kError;
    ev.error = "structured output: token " + std::to_string(token) + " is not allowed by the grammar (internal error)";
  } else if (seq->n_generated() >= sp.max_tokens || static_cast<int64_t>(seq->tokens.size()) >= config_.max_model_len)
    ev.finish = FinishReason::kLength;
  ev.usage = usage_of(*seq);  // so far on every event (cached_tokens is final from the first token)
  ev.first_scheduled = seq->times.first_scheduled.value_or(Clock::time_point{});
  if (seq->prompt_logprobs_pending) {  // the prefill is done: the first token's event carries them
    ev.prompt_logprobs = std::move(seq->prompt_lps);
    seq->prompt_lps = {};
    seq->prompt_logprobs_pending = false;
  }
  if (seq->on_event) seq->on_event(ev);
  return ev.finish != FinishReason::kNone;
}

void Engine::collect_prompt_logprobs(const ScheduledChunk& c, const ExecOutput& out, int64_t logit_row) {
  Sequence* seq = c.seq;
  const int64_t V = executor_->vocab_size();
  MX_CHECK_EQ(out.logits.ndim(), 2);
  for (int32_t i = 0; i < c.n_tokens; ++i) {
    // Row i predicts position start + i + 1; positions already collected (a recompute after preemption) are kept.
    const int32_t pos = c.start + i + 1;
    if (pos >= seq->prompt_len || pos != static_cast<int32_t>(seq->prompt_lps.size()) + 1) continue;
    std::span<const float> raw(out.logits.data<float>() + (logit_row + i) * V, V);
    PromptLogprob p;
    p.token = seq->tokens[pos];
    raw_logprobs(raw, p.token, seq->sampling.prompt_logprobs, &p.logprob, &p.top);
    const float x = raw[p.token];
    int32_t above = 0;
    for (float l : raw) above += l > x;
    p.rank = above + 1;
    seq->prompt_lps.push_back(std::move(p));
  }
}

// A constrained request whose constraint allows nothing more: complete with no terminator to end it
// (no EOS id known) ends as "stop"; anything else is an internal error. Returns true (finished).
bool Engine::end_unconstrainable(Sequence* seq) {
  TokenEvent ev;
  ev.id = seq->id;
  if (seq->constraint->complete()) {
    ev.finish = FinishReason::kStop;
  } else {
    ev.finish = FinishReason::kError;
    ev.error = "structured output: the grammar allows no token here (internal error)";
  }
  ev.usage = usage_of(*seq);
  if (seq->on_event) seq->on_event(ev);
  return true;
}

Status Engine::run_plan(const SchedulePlan& plan) {
  const auto step_t0 = Clock::now();
  const int32_t n_verified = drafter_.current_steps();  // the N the previous step drafted
  drafter_.begin_step();
  model::ForwardBatch batch = build_forward_batch(plan);
  batch.want_hidden = spec_enabled();
  batch.want_host_logits = false;
  // Structured output: constrained rows need host logits (never the device argmax), and the masks of
  // this step's constrained samples are computed on worker threads while the forward runs.
  MaskJobs masks;
  StepOutcome step;
  step.masks = &masks;
  for (const auto& c : plan.chunks) {
    const bool decodes = c.n_drafts > 0 || c.needs_sample;
    batch.want_host_logits |= decodes && !device_sampled(c, config_.device_sampling && !spec_enabled()) &&
                              (needs_host_logits(c.seq->sampling) || c.seq->constraint != nullptr);
    batch.want_host_logits |= wants_prompt_logprobs(c);
    if (c.needs_sample && c.n_drafts == 0 && c.seq->constraint) {
      masks.add(c.seq->constraint.get());
      step.masked_seqs.push_back(c.seq);
    }
    if (!c.seq->times.first_scheduled) c.seq->times.first_scheduled = step_t0;
  }
  masks.start(executor_->vocab_size());
  // Device sampling of this step's unconstrained, non-speculative sampled rows: built before the forward, so
  // an executor can sample them inside it (a decode graph's sampling tail); else one sample() call after it.
  kernels::SampleRowsInput in;
  {
    int64_t logit_row = 0;
    for (const auto& c : plan.chunks) {
      if (device_sampled(c, config_.device_sampling && !spec_enabled())) {
        Sequence& seq = *c.seq;
        const int64_t sample_row = logit_row + logit_rows_of(c) - 1;  // the chunk's last logit row
        kernels::SampleRowParams r =
            sample_row_params(seq.sampling, seq.seed, seq.n_generated(), static_cast<int32_t>(sample_row));
        if (has_penalties(seq.sampling))  // caught up incrementally, not rebuilt from the whole context
          seq.penalty_tokens.sync(seq.tokens, seq.prompt_len, seq.sampling.repetition_penalty != 1.f);
        append_row_processing(seq.sampling, seq.penalty_tokens, &r, &in);
        in.rows.push_back(r);
        step.device_seqs.push_back(c.seq);
      }
      logit_row += logit_rows_of(c);
    }
  }
  MX_ASSIGN_OR_RETURN(ExecOutput out, executor_->execute_and_sample(batch, in));
  scheduler_.commit(plan);
  if (out.sampled_in_forward) {
    step.device_rows = std::move(out.sampled);
    MX_CHECK_EQ(step.device_rows.size(), in.rows.size());
  } else if (!in.rows.empty()) {
    MX_ASSIGN_OR_RETURN(step.device_rows, executor_->sample(out, in));
    MX_CHECK_EQ(step.device_rows.size(), in.rows.size());
  }
  int64_t logit_row = 0;
  int32_t row = 0;
  for (const auto& c : plan.chunks) {
    const bool decodes = c.n_drafts > 0 || c.needs_sample;
    step.n_decode += decodes;
    std::vector<int32_t> path;  // accepted draft nodes of this chunk's verification
    const int32_t n_rows = logit_rows_of(c);
    if (wants_prompt_logprobs(c)) collect_prompt_logprobs(c, out, logit_row);  // before sampling edits its row
    Result<bool> done = c.n_drafts > 0 ? verify_chunk(c, out, logit_row, &step, &path)
                        : decodes      ? sample_chunk(c, out, logit_row + n_rows - 1, &step)
                                       : Result<bool>(false);
    logit_row += n_rows;
    if (!done.is_ok()) step.failed.emplace_back(c.seq, done.status().to_string());
    else if (*done) step.finished.push_back(c.seq);
    else if (spec_enabled() && c.seq->n_draft_computed == c.start) step.mtp_rows.push_back(mtp_rows_of(c, row, path));
    row += c.n_tokens;
  }
  if (!step.compact_src.empty()) MX_RETURN_IF_ERROR(executor_->copy_kv(step.compact_src, step.compact_dst));
  Status draft_status = Status::ok();
  if (!step.mtp_rows.empty()) draft_status = drafter_.extend_and_draft(step.mtp_rows, out.hidden);
  if (spec_enabled() && plan.n_prefill_tokens == 0 && step.n_decode > 0)  // a pure decode step teaches the policy
    drafter_.record_step(n_verified, step.n_decode, std::chrono::duration<double>(Clock::now() - step_t0).count());
  for (Sequence* seq : step.finished) finish(seq, FinishReason::kStop);
  for (const auto& [seq, error] : step.failed) finish(seq, FinishReason::kError, error);
  publish_step_stats(plan, step);
  return draft_status;
}

Result<bool> Engine::sample_chunk(const ScheduledChunk& c, ExecOutput& out, int64_t logit_row, StepOutcome* step) {
  Sequence* seq = c.seq;
  if (seq->constraint) {  // structured output: sample from the masked row (computed while the forward ran)
    const size_t k = std::find(step->masked_seqs.begin(), step->masked_seqs.end(), seq) - step->masked_seqs.begin();
    MX_CHECK(k < step->masked_seqs.size());
    const MaskJobs::Mask& m = step->masks->get(k);
    const int64_t V = executor_->vocab_size();
    std::span<float> lr(out.logits.data<float>() + logit_row * V, V);
    if (apply_token_mask(lr, m.allowed, m.complete, config_.eos_token_ids, seq->sampling.stop_token_ids) == 0)
      return end_unconstrainable(seq);
    MX_ASSIGN_OR_RETURN(SampleResult s, sample_token(lr, seq->sampling, seq->seed, seq->n_generated(), context_of(*seq)));
    ++step->generated;
    return emit_token(seq, s.token, s.logprob, std::move(s.top_logprobs));
  }
  if (!needs_host_logits(seq->sampling)) {
    ++step->generated;
    return emit_token(seq, out.greedy_token(logit_row), 0.f, {});
  }
  const auto dev = std::find(step->device_seqs.begin(), step->device_seqs.end(), seq);
  if (dev != step->device_seqs.end()) {  // sampled on the device right after the forward
    kernels::SampledRow& s = step->device_rows[dev - step->device_seqs.begin()];
    MX_RETURN_IF_ERROR(kernels::cpu::sample_error_status(s.error, s.error_token, executor_->vocab_size()));
    std::vector<TopLogprob> top;
    for (const auto& [id, lp] : s.top) top.push_back({id, lp});
    ++step->generated;
    return emit_token(seq, s.token, s.logprob, std::move(top));
  }
  const int64_t V = executor_->vocab_size();
  std::span<float> lr(out.logits.data<float>() + logit_row * V, V);
  MX_ASSIGN_OR_RETURN(SampleResult s, sample_token(lr, seq->sampling, seq->seed, seq->n_generated(), context_of(*seq)));
  ++step->generated;
  return emit_token(seq, s.token, s.logprob, std::move(s.top_logprobs));
}

Result<bool> Engine::verify_chunk(const ScheduledChunk& c, const ExecOutput& out, int64_t logit_row,
                                  StepOutcome* step, std::vector<int32_t>* path) {
  Sequence* seq = c.seq;
  const SamplingParams& sp = seq->sampling;
  const int64_t V = executor_->vocab_size(), n_rows = c.n_tokens;  // [last token, drafts]
  VerifyInput in;
  in.drafts = std::span<const int32_t>(seq->drafts.data(), c.n_drafts);
  in.parents = seq->draft_parents;
  in.proposals = seq->draft_q;
  in.sampling = &sp;
  in.context = context_of(*seq);
  in.seed = sampling_seed(sp, seq->seed);
  in.simulate_acceptance = config_.spec.simulate_acceptance;
  TargetRows target;
  target.vocab = V;
  if (out.logits.ndim() == 2)
    target.logits = {out.logits.data<float>() + logit_row * V, static_cast<size_t>(n_rows * V)};
  if (!out.argmax.empty()) target.argmax = {out.argmax.data() + logit_row, static_cast<size_t>(n_rows)};
  Result<Verdict> verdict = seq->constraint ? verify_under_constraint(c, target, logit_row) : verify_drafts(in, target);
  seq->clear_drafts();
  MX_RETURN_IF_ERROR(verdict.status());
  const Verdict& v = *verdict;
  if (v.tokens.empty()) return end_unconstrainable(seq);  // the constraint allows no token here
  const int32_t n_acc = v.n_accepted();
  SpecStats& s = step->spec;
  s.num_drafts += 1;
  s.num_draft_tokens += c.n_drafts;
  s.num_accepted_tokens += n_acc;
  if (s.accepted_per_pos.size() < static_cast<size_t>(v.depth)) s.accepted_per_pos.resize(v.depth, 0);
  for (int32_t i = 0; i < n_acc; ++i) ++s.accepted_per_pos[i];  // drafts accepted at position (tree: depth) i + 1
  drafter_.record_verdict(v.depth, n_acc);
  seq->spec_drafted += c.n_drafts;
  ++seq->spec_drafts;
  seq->spec_accepted += n_acc;
  // Tree paths: compact the accepted nodes' K/V into consecutive positions (pairs applied in order).
  const int64_t bs = config_.scheduler.block_size;
  auto slot = [&](int32_t j) { return static_cast<int32_t>(seq->block_table[j / bs] * bs + j % bs); };
  for (const auto& [from, to] : v.kv_moves) {
    step->compact_src.push_back(slot(c.start + from));
    step->compact_dst.push_back(slot(c.start + to));
  }
  // Accepted drafts' K/V were written by the verify forward: they are computed tokens now.
  bool done = false;
  for (size_t i = 0; i < v.tokens.size() && !done; ++i) {
    float logprob = 0.f;
    std::vector<TopLogprob> top;
    if (sp.logprobs >= 0)  // raw log-softmax of the row that predicted the token, as plain sampling reports it
      raw_logprobs(target.logits.subspan(v.rows[i] * V, V), v.tokens[i], sp.logprobs, &logprob, &top);
    if (static_cast<int32_t>(i) < n_acc) ++seq->n_computed;
    done = emit_token(seq, v.tokens[i], logprob, std::move(top));
    ++step->generated;
  }
  // Structured output: the grammar allows nothing after the accepted drafts (no next token): end here.
  if (!done && seq->constraint && static_cast<int32_t>(v.tokens.size()) == n_acc) done = end_unconstrainable(seq);
  *path = v.path;
  return done;
}

// Structured output: the drafts judged under the grammar (constrained_decoding.h), as a Verdict. An empty
// token list means the constraint allows no token after the accepted drafts (the request ends).
Result<Verdict> Engine::verify_under_constraint(const ScheduledChunk& c, const TargetRows& target, int64_t logit_row) {
  const Sequence& seq = *c.seq;
  const int64_t V = target.vocab;
  if (target.logits.empty()) return internal_error("structured output: constrained verification needs host logits");
  const uint64_t seed = sampling_seed(seq.sampling, seq.seed) ^ 0xA5A5A5A5ull;
  const uint64_t base = static_cast<uint64_t>(seq.n_generated()) * 64;
  ConstrainedVerdict cv = verify_constrained(seq, c.n_drafts, target.logits.data() - logit_row * V, logit_row, V,
                                             config_.eos_token_ids, seed, base);
  Verdict v;
  v.path = cv.path;
  v.depth = cv.depth;
  const bool tree = !seq.draft_parents.empty();
  for (size_t i = 0; i < cv.path.size(); ++i) {
    v.tokens.push_back(seq.drafts[cv.path[i]]);
    v.rows.push_back(i == 0 ? 0 : 1 + cv.path[i - 1]);  // the row that predicted the token
    const int32_t from = 1 + cv.path[i], to = 1 + static_cast<int32_t>(i);
    if (tree && from != to) v.kv_moves.emplace_back(from, to);
  }
  if (cv.next_token >= 0) {
    v.tokens.push_back(cv.next_token);
    v.rows.push_back(cv.path.empty() ? 0 : 1 + cv.path.back());
  } else if (v.tokens.empty()) {
    return v;
  }
  return v;
}

MtpRows Engine::mtp_rows_of(const ScheduledChunk& c, int32_t row, const std::vector<int32_t>& path) const {
  // The MTP layer catches up over every position this forward computed for the sequence.
  MtpRows m{c.seq, c.start, c.seq->n_computed - 1, row, {}};
  if (c.n_drafts > 0) {  // verified rows: x_last then the accepted drafts (tree: their rows in the batch)
    m.rows.push_back(row);
    for (int32_t a : path) m.rows.push_back(row + 1 + a);
    m.rows.resize(m.last_pos - m.first_pos + 1);
  }
  return m;
}

void Engine::publish_step_stats(const SchedulePlan& plan, const StepOutcome& step) {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  stats_.generated_tokens += step.generated;
  stats_.prompt_tokens += plan.n_prefill_tokens;
  {
    const int64_t n = plan.n_prefill_tokens + step.generated;
    size_t b = 0;
    while (b < kNumIterationTokenBuckets && n > kIterationTokenBuckets[b]) ++b;
    ++stats_.iteration_tokens.counts[b];
    stats_.iteration_tokens.sum += n;
    ++stats_.iteration_tokens.steps;
  }
  SpecStats& s = stats_.spec;
  s.num_drafts += step.spec.num_drafts;
  s.num_draft_tokens += step.spec.num_draft_tokens;
  s.num_accepted_tokens += step.spec.num_accepted_tokens;
  if (s.accepted_per_pos.size() < step.spec.accepted_per_pos.size())
    s.accepted_per_pos.resize(step.spec.accepted_per_pos.size(), 0);
  for (size_t i = 0; i < step.spec.accepted_per_pos.size(); ++i) s.accepted_per_pos[i] += step.spec.accepted_per_pos[i];
  if (step.masks && !step.masks->empty()) {
    stats_.grammar_masks += static_cast<int64_t>(step.masked_seqs.size());
    stats_.grammar_mask_seconds += step.masks->compute_seconds();
    stats_.grammar_wait_seconds += step.masks->wait_seconds();
  }
  if (!spec_enabled()) return;
  const SpecPolicy& policy = drafter_.policy();
  s.current_steps = std::max(drafter_.current_steps(), 0);
  s.acceptance_rate = policy.acceptance_rate();
  s.expected_accepted = policy.expected_accepted(s.current_steps);
  s.estimated_gain = policy.estimated_gain();
}

}  // namespace mxserve::runtime
