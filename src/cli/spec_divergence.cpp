// Speculative vs plain greedy decoding judged by the format bound (spec_divergence.h).
#include "cli/spec_divergence.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "cli/fixture_decisions.h"
#include "model/decisions.h"
#include "runtime/executor.h"
#include "runtime/sequence_runner.h"

namespace mxserve::cli {

Result<GreedyRuns> generate_greedy_all(model::CausalLM& m, backend::Backend& be,
                                       const std::vector<std::vector<int32_t>>& prompts, const runtime::SpecConfig& spec,
                                       int64_t gen_tokens) {
  runtime::EngineConfig ec;
  const int64_t block = 16;
  ec.scheduler.block_size = block;
  const int64_t per_seq =
      static_cast<int64_t>(prompts[0].size()) + gen_tokens + 2 * runtime::SpecConfig::kMaxTreeNodes + spec.num_steps;
  ec.n_blocks = (per_seq + block - 1) / block + 8;
  ec.max_model_len = static_cast<int64_t>(prompts[0].size()) + gen_tokens + 1;
  ec.spec = spec;
  ec.spec.self_test = false;
  runtime::Engine engine(ec, runtime::make_model_executor(m, be, ec.n_blocks, block));
  GreedyRuns run;
  for (const auto& p : prompts) {
    std::vector<int32_t> out;
    std::string error;
    std::chrono::steady_clock::time_point first;
    runtime::RequestSpec req;
    req.prompt = p;
    req.sampling.temperature = 0;
    req.sampling.max_tokens = static_cast<int32_t>(gen_tokens);
    req.sampling.ignore_eos = true;
    auto id = engine.submit(req, [&](const runtime::TokenEvent& ev) {
      if (ev.token >= 0) {
        if (out.empty()) first = std::chrono::steady_clock::now();
        out.push_back(ev.token);
      }
      if (ev.finish == runtime::FinishReason::kError) error = ev.error;
    });
    if (!id.is_ok()) return id.status();
    while (!engine.idle()) engine.step();
    if (!error.empty()) return internal_error(error);
    run.decode_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - first).count();
    run.decode_tokens += static_cast<int64_t>(out.size()) - 1;
    run.outputs.push_back(std::move(out));
  }
  run.spec = engine.stats().spec;
  return run;
}

std::vector<int32_t> committed_path_positions(const model::ForwardBatch& b, const std::vector<int32_t>& committed) {
  const int32_t T = b.n_tokens();
  std::vector<int32_t> row_pos(T, -1);
  std::vector<char> tok_ok(T, 0);
  for (int32_t i = 0; i < T; ++i) {
    const int32_t p = b.positions[i];
    tok_ok[i] = p >= 0 && p < static_cast<int32_t>(committed.size()) && committed[p] == b.token_ids[i];
  }
  for (const model::SequenceSpan& s : b.seqs) {
    bool context_ok = true;  // every causal (non-tree) row of the span so far
    for (int32_t i = 0; i < s.n_tokens; ++i) {
      const int32_t row = s.token_begin + i;
      const uint64_t mask = s.tree_mask.empty() ? 0 : s.tree_mask[i];
      if (mask == 0) {
        context_ok = context_ok && tok_ok[row];
        if (context_ok) row_pos[row] = b.positions[row];
        continue;
      }
      bool ok = context_ok;
      for (int32_t j = 0; j < s.n_tokens && ok; ++j) {  // the tree ancestors the mask names (itself included)
        const int32_t bit = s.kv_index_of(j) - s.tree_base;
        if (bit >= 0 && bit < 64 && ((mask >> bit) & 1u)) ok = tok_ok[s.token_begin + j];
      }
      if (ok) row_pos[row] = b.positions[row];
    }
  }
  return row_pos;
}

namespace {

// Rows of the committed path: a row whose token is the committed token at its position and whose ancestors in
// the batch (earlier rows of a causal span; the tree mask's ancestors of a tree row) are too. Only these rows'
// decisions have a reference: a rejected draft's row carries another token. One sequence per engine (batch 1).
class CommittedPathHook final : public model::DecisionHook {
 public:
  CommittedPathHook(const model::DecisionBook& book, const std::vector<int32_t>& committed, int64_t n_layers,
                    double u, bool force)
      : book_(book), committed_(committed), n_layers_(n_layers), u_(u), force_(force) {}

  // Before each target forward: each row's position when it is on the committed path, else -1.
  void set_batch(const model::ForwardBatch& b) {
    mtp_ = false;
    row_pos_ = committed_path_positions(b, committed_);
  }
  void set_mtp() { mtp_ = true; }

  void on_decision(model::DecisionRows& d) override {
    if (mtp_ || d.layer >= n_layers_) return;  // the draft layer: its decisions never change the output
    if (d.rows != static_cast<int64_t>(row_pos_.size())) {
      if (status_.is_ok())
        status_ = internal_error(std::string(model::decision_site_name(d.site)) + " at layer " +
                                 std::to_string(d.layer) + " over " + std::to_string(d.rows) + " rows, the batch has " +
                                 std::to_string(row_pos_.size()));
      return;
    }
    bool changed = false;
    for (int64_t r = 0; r < d.rows; ++r) {
      if (row_pos_[r] < 0) continue;
      const model::DecisionBook::Entry e = book_.find(d.site, d.layer, 0, row_pos_[r]);
      if (e.rows == nullptr || e.rows->width != d.width) continue;
      ++result.rows_compared;
      const model::RowJudgement j = model::judge_row(*e.rows, e.row, d.row(r), u_);
      if (j.same) continue;
      ++result.flips;
      if (!j.within_bound) ++result.flips_beyond;
      if (result.worst_flip.empty() || j.worst_ratio > result.worst_ratio)
        result.worst_flip = std::string(model::decision_site_name(d.site)) + " layer " + std::to_string(d.layer) +
                            " position " + std::to_string(row_pos_[r]) + ": " + d.describe_row(r) + " vs reference " +
                            e.rows->describe_row(e.row) + ";" + j.detail;
      result.worst_ratio = std::max(result.worst_ratio, j.worst_ratio);
      if (force_) {
        std::copy(e.rows->row(e.row), e.rows->row(e.row) + d.width, d.ids.begin() + r * d.width);
        changed = true;
      }
    }
    if (changed) d.forced = true;
  }

  DecisionReplay result;
  Status status() const { return status_; }

 private:
  const model::DecisionBook& book_;
  const std::vector<int32_t>& committed_;
  int64_t n_layers_;
  double u_;
  bool force_;
  bool mtp_ = false;
  std::vector<int32_t> row_pos_;
  Status status_ = Status::ok();
};

// The model as the engine sees it, telling the hook each target forward's rows first (a diagnostic decorator).
class RowTaggingModel final : public model::CausalLM {
 public:
  RowTaggingModel(model::CausalLM& inner, CommittedPathHook& hook) : inner_(inner), hook_(hook) {}
  const model::ModelConfig& config() const override { return inner_.config(); }
  kvcache::KvCacheSpec kv_spec(int64_t n_blocks, int64_t block_size) const override {
    return inner_.kv_spec(n_blocks, block_size);
  }
  kvcache::KvCacheDtype kv_cache_dtype() const override { return inner_.kv_cache_dtype(); }
  Result<model::ForwardOutput> forward(const model::ForwardBatch& batch, kvcache::KvCache& kv) override {
    hook_.set_batch(batch);
    return inner_.forward(batch, kv);
  }
  bool has_mtp() const override { return inner_.has_mtp(); }
  Result<model::ForwardOutput> forward_mtp(const model::ForwardBatch& batch, const Tensor& hidden_in,
                                           kvcache::KvCache& kv) override {
    hook_.set_mtp();
    return inner_.forward_mtp(batch, hidden_in, kv);
  }
  void copy_kv_slots(backend::Backend& be, const Tensor& src, const Tensor& dst, kvcache::KvCache& kv) override {
    inner_.copy_kv_slots(be, src, dst, kv);
  }

 private:
  model::CausalLM& inner_;
  CommittedPathHook& hook_;
};

struct ReferenceRow {
  const float* logits = nullptr;  // [V]
  const float* hidden = nullptr;  // [H]
  const Tensor* out_embed = nullptr;
};

// Replays one run of `prompt` (spec: its speculation config) through a fresh engine as it ran and with the
// reference's decisions forced on the committed path; the token at `index` of each.
Result<DecisionReplay> replay_run(model::CausalLM& m, backend::Backend& be, const runtime::SpecConfig& spec,
                                  const std::vector<int32_t>& prompt, const std::vector<int32_t>& committed,
                                  int64_t index, int64_t gen_tokens, const model::DecisionBook& book,
                                  const ReferenceRow& ref, int32_t reference, double u) {
  DecisionReplay out;
  for (bool force : {false, true}) {
    CommittedPathHook hook(book, committed, m.config().n_layers, u, force);
    RowTaggingModel tagged(m, hook);
    Result<GreedyRuns> r = [&] {
      model::ScopedDecisionHook scope(&hook);
      return generate_greedy_all(tagged, be, {prompt}, spec, gen_tokens);
    }();
    MX_RETURN_IF_ERROR(r.status());
    MX_RETURN_IF_ERROR(hook.status());
    if (static_cast<int64_t>(r->outputs[0].size()) <= index)
      return internal_error("the replay generated " + std::to_string(r->outputs[0].size()) + " tokens, fewer than " +
                            std::to_string(index + 1));
    const int32_t token = r->outputs[0][index];
    if (!force) {
      out.token_as_ran = token;
      continue;
    }
    const int32_t keep = out.token_as_ran;
    out = hook.result;
    out.token_as_ran = keep;
    out.token_forced = token;
    out.forced_within_token_bound =
        token == reference ||
        judge_token_flip(ref.logits, ref.hidden, *ref.out_embed, token, reference, u).within_bound();
  }
  out.ran = true;
  return out;
}

}  // namespace

Result<std::vector<SpecDivergence>> judge_spec_divergences(const std::string& dir, model::CausalLM& m,
                                                           backend::Backend& be, const runtime::SpecConfig& spec_on,
                                                           const std::vector<std::vector<int32_t>>& prompts,
                                                           const std::vector<std::vector<int32_t>>& plain,
                                                           const std::vector<std::vector<int32_t>>& spec, double u) {
  std::vector<SpecDivergence> out;
  std::unique_ptr<backend::Backend> cpu;
  std::unique_ptr<model::CausalLM> ref;
  Tensor w;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (plain[i] == spec[i]) continue;
    if (!ref) {  // loaded on the first divergence only
      cpu = backend::make_cpu_backend();
      model::LoadOptions lo;
      lo.load_mtp = false;
      MX_ASSIGN_OR_RETURN(ref, model::load_causal_lm(dir, *cpu, lo));
      MX_ASSIGN_OR_RETURN(w, read_output_embedding(dir, ref->config()));
    }
    SpecDivergence d;
    d.prompt = i;
    const size_t n = std::min(plain[i].size(), spec[i].size());
    while (static_cast<size_t>(d.index) < n && plain[i][d.index] == spec[i][d.index]) ++d.index;
    if (static_cast<size_t>(d.index) == n)
      return internal_error("prompt " + std::to_string(i) + ": the plain and speculative outputs differ in length (" +
                            std::to_string(plain[i].size()) + " vs " + std::to_string(spec[i].size()) + " tokens)");
    d.plain = plain[i][d.index];
    d.spec = spec[i][d.index];
    std::vector<int32_t> prefix = prompts[i];
    prefix.insert(prefix.end(), plain[i].begin(), plain[i].begin() + d.index);
    // The reference's teacher-forced pass over the committed tokens, its decisions recorded by position.
    const int64_t block = 16;
    runtime::SequenceRunner runner(*ref, *cpu, static_cast<int64_t>(prefix.size()) / block + 4, block);
    runtime::SequenceState st;
    model::DecisionRecorder recorder;
    auto step = [&] {
      model::ScopedDecisionHook scope(&recorder);
      return runner.extend({&st}, {prefix}, /*all_logits=*/false, /*want_hidden=*/true);
    }();
    runner.release(st);
    MX_RETURN_IF_ERROR(step.status());
    model::DecisionBook book;
    book.add(recorder.records, 0, 0);
    const int64_t H = ref->config().d_model;
    const Tensor hidden = cpu->to_host(step->hidden);
    const float* l = step->logits.data<float>();
    const float* h = hidden.data<float>() + (hidden.dim(0) - 1) * H;
    d.reference = runtime::argmax_row(step->logits, 0);
    const bool plain_preferred = l[d.plain] >= l[d.spec];
    const GreedyJudgement g = judge_token_flip(l, h, w, plain_preferred ? d.spec : d.plain,
                                               plain_preferred ? d.plain : d.spec, u);
    d.margin = g.margin;
    d.bound = g.bound;
    if (!d.within_bound()) {
      const ReferenceRow rr{l, h, &w};
      const int64_t gen = static_cast<int64_t>(plain[i].size());
      runtime::SpecConfig off;
      if (d.plain != d.reference) {
        MX_ASSIGN_OR_RETURN(d.plain_replay, replay_run(m, be, off, prompts[i], prefix, d.index, gen, book, rr,
                                                       d.reference, u));
      }
      if (d.spec != d.reference) {
        MX_ASSIGN_OR_RETURN(d.spec_replay, replay_run(m, be, spec_on, prompts[i], prefix, d.index, gen, book, rr,
                                                      d.reference, u));
      }
      d.plain_replay.reproduced = d.plain_replay.ran && d.plain_replay.token_as_ran == d.plain;
      d.spec_replay.reproduced = d.spec_replay.ran && d.spec_replay.token_as_ran == d.spec;
    }
    out.push_back(d);
  }
  return out;
}

std::string describe(const SpecDivergence& d) {
  char buf[400];
  std::snprintf(buf, sizeof(buf),
                "prompt %zu: first difference at generated token %lld: plain %d, speculative %d (reference argmax %d); "
                "reference margin between them %.4g %s format bound %.4g",
                d.prompt, static_cast<long long>(d.index), d.plain, d.spec, d.reference, d.margin,
                d.within_bound() ? "<=" : ">", d.bound);
  std::string s = buf;
  if (d.within_bound()) return s + ": within bf16 rounding (a legitimate divergence)";
  for (const auto* r : {&d.plain_replay, &d.spec_replay}) {
    if (!r->ran) continue;
    std::snprintf(buf, sizeof(buf),
                  "; %s run replayed: token %d as it ran%s, %d with the reference's decisions forced (%s); %lld of %lld "
                  "committed-path decisions flipped, %lld beyond the format bound (worst %.3g of its bound)",
                  r == &d.plain_replay ? "plain" : "speculative", r->token_as_ran,
                  r->reproduced ? "" : " (NOT the run's own token: the engine is not deterministic)", r->token_forced,
                  r->forced_within_token_bound ? "the reference's token or within its bound" : "STILL BEYOND",
                  static_cast<long long>(r->flips), static_cast<long long>(r->rows_compared),
                  static_cast<long long>(r->flips_beyond), r->worst_ratio);
    s += buf;
    if (!r->worst_flip.empty()) s += " [worst: " + r->worst_flip + "]";
  }
  return s + (d.legitimate() ? ": explained by decision flips within the format bound (legitimate)"
                             : ": BEYOND the bound (a bug)");
}

}  // namespace mxserve::cli
