// Engine::run_plan: one forward of the target over the scheduled batch, then sampling (or, for
// speculative sequences, verification of their drafts), events, and the MTP draft stage.
#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "runtime/constrained_decoding.h"
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
  else if (seq->constraint && !seq->constraint->accept(token)) {  // tokens come from masked rows: a bug
    ev.finish = FinishReason::kError;
    ev.error = "structured output: token " + std::to_string(token) + " is not allowed by the grammar (internal error)";
  } else if (seq->n_generated() >= sp.max_tokens || static_cast<int64_t>(seq->tokens.size()) >= config_.max_model_len)
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
  const int32_t n_verified = spec_last_n_;  // the N the previous step drafted (the policy's choice)
  spec_extend_seconds_ = 0;
  model::ForwardBatch batch = build_forward_batch(plan);
  const bool spec = spec_enabled();
  batch.want_hidden = spec;
  batch.want_host_logits = false;
  // Structured output: constrained rows need host logits (never the device argmax), and the masks of
  // this step's constrained samples are computed on worker threads while the forward runs.
  MaskJobs masks;
  std::vector<const Sequence*> masked_seqs;
  for (const auto& c : plan.chunks) {
    if ((c.n_drafts > 0 || c.needs_sample) && (!greedy_ids_suffice(c.seq->sampling) || c.seq->constraint))
      batch.want_host_logits = true;
    if (c.needs_sample && c.n_drafts == 0 && c.seq->constraint) {
      masks.add(c.seq->constraint.get());
      masked_seqs.push_back(c.seq);
    }
  }
  masks.start(executor_->vocab_size());
  const auto scheduled_at = Clock::now();
  for (const auto& c : plan.chunks)
    if (!c.seq->times.first_scheduled) c.seq->times.first_scheduled = scheduled_at;
  MX_ASSIGN_OR_RETURN(ExecOutput out, executor_->execute(batch));
  scheduler_.commit(plan);
  const int64_t V = executor_->vocab_size();
  int64_t generated = 0, logit_row = 0, row = 0, n_decode = 0;
  std::vector<Sequence*> finished;
  std::vector<MtpRows> mtp_rows;
  std::vector<int32_t> compact_src, compact_dst;  // tree mode: accepted paths' KV slots to compact
  SpecStats spec_delta;
  for (const auto& c : plan.chunks) {
    Sequence* seq = c.seq;
    bool done = false;
    std::vector<int32_t> verified_path;  // accepted drafts (node indices) of this chunk's verification
    if (c.needs_sample || c.n_drafts > 0) ++n_decode;
    if (c.n_drafts > 0) {
      // Verify: the target's rows p_0..p_N against drafts d_1..d_N.
      const auto& sp = seq->sampling;
      const bool greedy = sp.temperature <= 0.f;
      std::vector<TokenDistribution> p;  // sampled requests only: greedy ones need the argmax ids alone
      if (!greedy && !seq->constraint) {  // (constrained: verify_constrained masks the rows itself)
        p.resize(c.n_tokens);
        for (int32_t i = 0; i < c.n_tokens; ++i) {
          std::span<const float> lr(out.logits.data<float>() + (logit_row + i) * V, V);
          p[i] = sampling_distribution(lr, sp);
        }
      }
      const uint64_t seed = sp.seed.value_or(seq->seed) ^ 0xA5A5A5A5ull;
      const uint64_t base = static_cast<uint64_t>(seq->n_generated()) * 64;
      ChainVerdict v;
      std::vector<int32_t> path;  // tree mode: accepted nodes, root to leaf (chain: 0..n_accepted-1)
      const bool tree = !seq->draft_parents.empty();
      int32_t depth = c.n_drafts;  // positions judged (the policy's N): chain length or tree depth
      if (seq->constraint) {  // structured output: drafts judged under the grammar, masked target rows
        ConstrainedVerdict cv = verify_constrained(*seq, c.n_drafts, out.logits.data<float>(), logit_row, V,
                                                   config_.eos_token_ids, seed, base);
        path = std::move(cv.path);
        v.n_accepted = static_cast<int32_t>(path.size());
        v.next_token = cv.next_token;
        depth = cv.depth;
      } else if (tree) {
        std::vector<int32_t> node_depth(c.n_drafts);
        depth = 0;
        for (int32_t i = 0; i < c.n_drafts; ++i) {
          const int32_t par = seq->draft_parents[i];
          node_depth[i] = par < 0 ? 1 : node_depth[par] + 1;
          depth = std::max(depth, node_depth[i]);
        }
        auto first_child = [&](int32_t parent, int32_t token) {  // siblings carry distinct tokens
          for (int32_t i = parent + 1; i < c.n_drafts; ++i)
            if (seq->draft_parents[i] == parent && seq->drafts[i] == token) return i;
          return -1;
        };
        auto row_of = [&](int32_t node) { return logit_row + (node < 0 ? 0 : 1 + node); };
        if (config_.spec.simulate_acceptance) {
          // Benchmark mode: accept a path of the simulated length (at most the tree's depth): the path to
          // the first node, in the tree's (best-first, topological) order, at that depth.
          const double want = *config_.spec.simulate_acceptance - 1.0 + counter_uniform(seed, base);
          const int32_t n_acc = std::clamp(static_cast<int32_t>(want), 0, depth);
          int32_t cur = -1;
          for (int32_t i = 0; i < c.n_drafts && n_acc > 0; ++i)
            if (node_depth[i] == n_acc) {
              cur = i;
              break;
            }
          for (int32_t a = cur; a >= 0; a = seq->draft_parents[a]) path.push_back(a);
          std::reverse(path.begin(), path.end());
          v.next_token = greedy ? out.greedy_token(row_of(cur)) : p[row_of(cur) - logit_row].draw(counter_uniform(seed, base + 1));
        } else if (greedy) {
          // The longest root-to-node path whose every token is the target's argmax at its parent.
          int32_t cur = -1;
          for (;;) {
            const int32_t want = out.greedy_token(row_of(cur));
            const int32_t nxt = first_child(cur, want);
            if (nxt < 0) {
              v.next_token = want;
              break;
            }
            path.push_back(cur = nxt);
          }
        } else {
          DraftTree dt;
          dt.tokens.assign(seq->drafts.begin(), seq->drafts.begin() + c.n_drafts);
          dt.parents = seq->draft_parents;
          TreeVerdict tv = verify_tree(dt, {}, p, false, [&](size_t i) { return counter_uniform(seed, base + 2 + i); });
          path = std::move(tv.path);
          v.next_token = tv.next_token;
        }
        v.n_accepted = static_cast<int32_t>(path.size());
      } else if (config_.spec.simulate_acceptance) {
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
      if (!tree && !seq->constraint)
        for (int32_t i = 0; i < v.n_accepted; ++i) path.push_back(i);
      spec_delta.num_drafts += 1;
      spec_delta.num_draft_tokens += c.n_drafts;
      spec_delta.num_accepted_tokens += v.n_accepted;
      // accepted_per_pos[i]: drafts accepted at position (tree: depth) i + 1
      if (spec_delta.accepted_per_pos.size() < static_cast<size_t>(depth))
        spec_delta.accepted_per_pos.resize(depth, 0);
      for (int32_t i = 0; i < v.n_accepted; ++i) ++spec_delta.accepted_per_pos[i];
      spec_policy_.record(depth, v.n_accepted);
      seq->spec_drafted += c.n_drafts;
      seq->spec_accepted += v.n_accepted;
      std::vector<int32_t> accepted;
      for (int32_t a : path) accepted.push_back(seq->drafts[a]);
      if (tree) {
        // Compact the accepted path's K/V (written at KV index start + 1 + node) into the consecutive
        // positions start + 1 .. start + A. Pairs in path order never read a slot an earlier one wrote
        // (node >= depth - 1), and kv_copy applies them in order anyway.
        const int64_t bs = config_.scheduler.block_size;
        auto slot = [&](int32_t j) { return static_cast<int32_t>(seq->block_table[j / bs] * bs + j % bs); };
        for (int32_t i = 0; i < v.n_accepted; ++i) {
          const int32_t src = c.start + 1 + path[i], dst = c.start + 1 + i;
          if (src != dst) {
            compact_src.push_back(slot(src));
            compact_dst.push_back(slot(dst));
          }
        }
      }
      seq->clear_drafts();
      // Accepted drafts' K/V were written by the verify forward: they are computed tokens now.
      for (int32_t i = 0; i <= v.n_accepted && !done; ++i) {
        const int32_t token = i < v.n_accepted ? accepted[i] : v.next_token;
        if (token < 0) {  // the constraint allows no token after the accepted ones
          done = end_unconstrainable(seq);
          break;
        }
        float logprob = 0.f;
        if (sp.logprobs >= 0) {  // raw log-softmax, as sample_token reports it
          const int64_t r = logit_row + (i == 0 ? 0 : 1 + path[i - 1]);  // the row that predicted it
          std::span<const float> lr(out.logits.data<float>() + r * V, V);
          const float lmax = *std::max_element(lr.begin(), lr.end());
          double z = 0;
          for (float x : lr) z += std::exp(static_cast<double>(x - lmax));
          logprob = static_cast<float>(lr[token] - lmax - std::log(z));
        }
        if (i < v.n_accepted) ++seq->n_computed;
        done = emit_token(seq, token, logprob, {});
        ++generated;
      }
      verified_path = path;
      logit_row += c.n_tokens;
    } else if (c.needs_sample) {
      if (seq->constraint) {
        const size_t k = std::find(masked_seqs.begin(), masked_seqs.end(), seq) - masked_seqs.begin();
        const MaskJobs::Mask& m = masks.get(k);
        std::span<float> lr(out.logits.data<float>() + logit_row * V, V);
        if (apply_token_mask(lr, m.allowed, m.complete, config_.eos_token_ids, seq->sampling.stop_token_ids) == 0) {
          done = end_unconstrainable(seq);
        } else {
          std::span<const int32_t> gen(seq->tokens.data() + seq->prompt_len, seq->n_generated());
          SampleResult s = sample_token(lr, seq->sampling, seq->seed, seq->n_generated(), gen);
          done = emit_token(seq, s.token, s.logprob, std::move(s.top_logprobs));
        }
      } else if (greedy_ids_suffice(seq->sampling)) {
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
      MtpRows m{seq, c.start, seq->n_computed - 1, static_cast<int32_t>(row), {}};
      if (!verified_path.empty() || c.n_drafts > 0) {
        // Verified rows: x_last then the accepted drafts (tree: their rows in the batch).
        m.rows.push_back(static_cast<int32_t>(row));
        for (int32_t a : verified_path) m.rows.push_back(static_cast<int32_t>(row) + 1 + a);
        m.rows.resize(m.last_pos - m.first_pos + 1);
      }
      mtp_rows.push_back(std::move(m));
    }
    row += c.n_tokens;
  }
  if (!compact_src.empty()) MX_RETURN_IF_ERROR(executor_->copy_kv(compact_src, compact_dst));
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
  if (!masks.empty()) {
    stats_.grammar_masks += static_cast<int64_t>(masked_seqs.size());
    stats_.grammar_mask_seconds += masks.compute_seconds();
    stats_.grammar_wait_seconds += masks.wait_seconds();
  }
  return mtp_status;
}

}  // namespace mxserve::runtime
