// Two configurations' greedy outputs judged by the format bound (greedy_divergence.h).
#include "cli/greedy_divergence.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <set>

#include "cli/fixture_decisions.h"
#include "model/decisions.h"
#include "runtime/executor.h"
#include "runtime/sequence_runner.h"

namespace mxserve::cli {

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

int64_t CommittedPathTracker::cached_prefix(const model::SequenceSpan& s, int64_t n, int64_t bs) const {
  const std::vector<int32_t>& table = s.blocks();
  for (int64_t q = 0; q < n; ++q) {
    const int64_t lb = q / bs;
    if (lb >= static_cast<int64_t>(table.size())) return q;
    const auto it = blocks_.find(table[lb]);
    if (it == blocks_.end() || it->second.logical != lb || it->second.filled <= q % bs) return q;
  }
  return n;
}

void CommittedPathTracker::record_write(const model::SequenceSpan& s, int64_t kv, bool on_path, int64_t bs) {
  const std::vector<int32_t>& table = s.blocks();
  const int64_t lb = kv / bs, off = kv % bs;
  if (kv < 0 || lb >= static_cast<int64_t>(table.size())) return;
  BlockMark& m = blocks_[table[lb]];
  if (m.logical != lb) m = BlockMark{lb, 0};  // a block reused at another place of a sequence
  if (on_path && m.filled == off) ++m.filled;
  else if (!on_path && m.filled > off) m.filled = off;
}

std::vector<int32_t> CommittedPathTracker::rows(const model::ForwardBatch& b, int64_t bs) {
  std::vector<int32_t> pos = committed_path_positions(b, committed_);
  std::vector<std::pair<std::pair<int32_t, uint64_t>, int64_t>> updates;
  for (const model::SequenceSpan& s : b.seqs) {
    if (s.n_tokens <= 0) continue;
    const std::pair<int32_t, uint64_t> key{s.table_row, s.table_row >= 0 ? s.table_lease : 0};
    const int64_t ctx = s.kv_index_of(0);  // KV positions [0, ctx) come from earlier forwards or the prefix cache
    const auto it = path_len_.find(key);
    const int64_t known = it != path_len_.end() ? it->second : (ctx == 0 ? 0 : cached_prefix(s, ctx, bs));
    const bool context_ok = known >= ctx;
    std::set<int64_t> on_path;
    for (int32_t i = 0; i < s.n_tokens; ++i) {
      int32_t& p = pos[s.token_begin + i];
      if (!context_ok) p = -1;
      if (p >= 0) on_path.insert(p);
    }
    int64_t len = std::min(known, ctx);  // the span rewrites from ctx on
    while (on_path.count(len)) ++len;    // tree rows' positions: their KV is compacted there once accepted
    updates.push_back({key, len});
    for (int32_t i = 0; i < s.n_tokens; ++i) {
      const int32_t p = pos[s.token_begin + i];
      record_write(s, s.kv_index_of(i), p >= 0 && p == s.kv_index_of(i), bs);
    }
  }
  for (const auto& [key, len] : updates) path_len_[key] = len;
  return pos;
}

namespace {

// Compares (and, with force, replaces) the decisions of the committed path's rows with the reference's book.
class CommittedPathHook final : public model::DecisionHook {
 public:
  CommittedPathHook(const model::DecisionBook& book, const std::vector<int32_t>& committed, int64_t n_layers,
                    double u, bool force)
      : book_(book), tracker_(committed), n_layers_(n_layers), u_(u), force_(force) {}

  // Before each target forward.
  void set_batch(const model::ForwardBatch& b, int64_t block_size) {
    mtp_ = false;
    row_pos_ = tracker_.rows(b, block_size);
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
  CommittedPathTracker tracker_;
  int64_t n_layers_;
  double u_;
  bool force_;
  bool mtp_ = false;
  std::vector<int32_t> row_pos_;
  Status status_ = Status::ok();
};

// The model as the engine sees it, telling the hook each target forward's rows first (a diagnostic decorator).
// It has no device-input forward: a configuration with CUDA graphs runs its steps eagerly through it.
class RowTaggingModel final : public model::CausalLM {
 public:
  RowTaggingModel(model::CausalLM& inner, CommittedPathHook& hook) : inner_(inner), hook_(hook) {}
  const model::ModelConfig& config() const override { return inner_.config(); }
  kvcache::KvCacheSpec kv_spec(int64_t n_blocks, int64_t block_size) const override {
    return inner_.kv_spec(n_blocks, block_size);
  }
  kvcache::KvCacheDtype kv_cache_dtype() const override { return inner_.kv_cache_dtype(); }
  Result<model::ForwardOutput> forward(const model::ForwardBatch& batch, kvcache::KvCache& kv) override {
    hook_.set_batch(batch, kv.spec().block_size);
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

// Replays configuration `cfg` for request `request` as it ran and with the reference's decisions forced on the
// committed path; the token at `index` of each.
Result<DecisionReplay> replay_config(const GreedyConfig& cfg, size_t request, const std::vector<int32_t>& committed,
                                     int64_t index, const model::DecisionBook& book, const ReferenceRow& ref,
                                     int32_t reference, double u) {
  if (cfg.model == nullptr || !cfg.replay)
    return invalid_argument("configuration '" + cfg.name + "' has no model or replay to judge a divergence with");
  DecisionReplay out;
  for (bool force : {false, true}) {
    CommittedPathHook hook(book, committed, cfg.model->config().n_layers, u, force);
    RowTaggingModel tagged(*cfg.model, hook);
    Result<std::vector<int32_t>> r = [&] {
      model::ScopedDecisionHook scope(&hook);
      return cfg.replay(tagged, request);
    }();
    MX_RETURN_IF_ERROR(r.status());
    MX_RETURN_IF_ERROR(hook.status());
    if (static_cast<int64_t>(r->size()) <= index)
      return internal_error("the replay of '" + cfg.name + "' generated " + std::to_string(r->size()) +
                            " tokens for request " + std::to_string(request) + ", fewer than " +
                            std::to_string(index + 1));
    const int32_t token = (*r)[index];
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

Result<std::vector<GreedyDivergence>> judge_greedy_divergences(const std::string& dir,
                                                               const std::vector<std::vector<int32_t>>& prompts,
                                                               const std::vector<std::vector<int32_t>>& outputs_a,
                                                               const std::vector<std::vector<int32_t>>& outputs_b,
                                                               const GreedyConfig& a, const GreedyConfig& b,
                                                               double u) {
  if (outputs_a.size() != prompts.size() || outputs_b.size() != prompts.size())
    return invalid_argument("judge_greedy_divergences: " + std::to_string(prompts.size()) + " prompts but " +
                            std::to_string(outputs_a.size()) + " outputs of '" + a.name + "' and " +
                            std::to_string(outputs_b.size()) + " of '" + b.name + "'");
  std::vector<GreedyDivergence> out;
  std::unique_ptr<backend::Backend> cpu;
  std::unique_ptr<model::CausalLM> ref;
  Tensor w;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::vector<int32_t>& ta = outputs_a[i];
    const std::vector<int32_t>& tb = outputs_b[i];
    if (ta == tb) continue;
    if (!ref) {  // loaded on the first divergence only
      cpu = backend::make_cpu_backend();
      model::LoadOptions lo;
      lo.load_mtp = false;
      MX_ASSIGN_OR_RETURN(ref, model::load_causal_lm(dir, *cpu, lo));
      MX_ASSIGN_OR_RETURN(w, read_output_embedding(dir, ref->config()));
    }
    GreedyDivergence d;
    d.a_name = a.name;
    d.b_name = b.name;
    d.prompt = i;
    const size_t n = std::min(ta.size(), tb.size());
    while (static_cast<size_t>(d.index) < n && ta[d.index] == tb[d.index]) ++d.index;
    if (static_cast<size_t>(d.index) == n)
      return internal_error("request " + std::to_string(i) + ": the " + a.name + " and " + b.name +
                            " outputs differ in length (" + std::to_string(ta.size()) + " vs " +
                            std::to_string(tb.size()) + " tokens)");
    d.a = ta[d.index];
    d.b = tb[d.index];
    std::vector<int32_t> prefix = prompts[i];
    prefix.insert(prefix.end(), ta.begin(), ta.begin() + d.index);
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
    const bool a_preferred = l[d.a] >= l[d.b];
    const GreedyJudgement g = judge_token_flip(l, h, w, a_preferred ? d.b : d.a, a_preferred ? d.a : d.b, u);
    d.margin = g.margin;
    d.bound = g.bound;
    if (!d.within_bound()) {
      const ReferenceRow rr{l, h, &w};
      if (d.a != d.reference) {
        MX_ASSIGN_OR_RETURN(d.a_replay, replay_config(a, i, prefix, d.index, book, rr, d.reference, u));
      }
      if (d.b != d.reference) {
        MX_ASSIGN_OR_RETURN(d.b_replay, replay_config(b, i, prefix, d.index, book, rr, d.reference, u));
      }
      d.a_replay.reproduced = d.a_replay.ran && d.a_replay.token_as_ran == d.a;
      d.b_replay.reproduced = d.b_replay.ran && d.b_replay.token_as_ran == d.b;
    }
    out.push_back(d);
  }
  return out;
}

std::string describe(const GreedyDivergence& d) {
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "prompt %zu: first difference at generated token %lld: %s %d, %s %d (reference argmax %d); "
                "reference margin between them %.4g %s format bound %.4g (ratio %.3g)",
                d.prompt, static_cast<long long>(d.index), d.a_name.c_str(), d.a, d.b_name.c_str(), d.b, d.reference,
                d.margin, d.within_bound() ? "<=" : ">", d.bound, d.ratio());
  std::string s = buf;
  if (d.within_bound()) return s + ": within the format's rounding (a legitimate divergence)";
  for (const auto* r : {&d.a_replay, &d.b_replay}) {
    if (!r->ran) continue;
    std::snprintf(buf, sizeof(buf),
                  "; %s run replayed: token %d as it ran%s, %d with the reference's decisions forced (%s); %lld of %lld "
                  "committed-path decisions flipped, %lld beyond the format bound (worst %.3g of its bound)",
                  (r == &d.a_replay ? d.a_name : d.b_name).c_str(), r->token_as_ran,
                  r->reproduced ? "" : " (NOT the run's own token: the replay does not reproduce the run)",
                  r->token_forced,
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
