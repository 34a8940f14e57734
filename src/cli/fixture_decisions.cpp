// Decision-aware fixture checks: the reference's book and the judgements (fixture_decisions.h).
#include "cli/fixture_decisions.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "io/checkpoint.h"
#include "runtime/sequence_runner.h"

namespace mxserve::cli {
Result<Tensor> read_output_embedding(const std::string& dir, const model::ModelConfig& cfg) {
  MX_ASSIGN_OR_RETURN(auto ckpt, io::Checkpoint::open(dir));
  const io::CheckpointTensor* t = ckpt->find("lm_head.weight");
  if (t == nullptr) t = ckpt->find("model.embed_tokens.weight");
  if (t == nullptr)
    return not_found(dir + ": decision-aware checks need lm_head.weight (or a tied model.embed_tokens.weight)");
  const Tensor v = ckpt->view(*t);
  if (v.dim(0) != cfg.vocab_size || v.dim(1) != cfg.d_model)
    return invalid_argument(dir + ": the output embedding has shape " + shape_to_string(v.shape()) + ", expected [" +
                            std::to_string(cfg.vocab_size) + ", " + std::to_string(cfg.d_model) + "]");
  Tensor out = Tensor::empty(DType::kF32, v.shape());
  float* o = out.data<float>();
  if (v.dtype() == DType::kF32) {
    std::memcpy(o, v.raw(), v.nbytes());
  } else if (v.dtype() == DType::kBF16) {
    for (int64_t i = 0; i < v.numel(); ++i) {
      const uint32_t bits = static_cast<uint32_t>(v.data<uint16_t>()[i]) << 16;
      std::memcpy(&o[i], &bits, 4);
    }
  } else {
    return invalid_argument(dir + ": decision-aware checks need a bf16 or f32 output embedding, found " +
                            dtype_name(v.dtype()));
  }
  return out;
}

GreedyJudgement judge_token_flip(const float* l, const float* h, const Tensor& w, int32_t got, int32_t want,
                                 double u) {
  const int64_t H = w.dim(1);
  auto sens = [&](int32_t v) {
    double s = 0;
    for (int64_t i = 0; i < H; ++i) s += std::fabs(static_cast<double>(h[i]) * w.data<float>()[v * H + i]);
    return s;
  };
  GreedyJudgement g;
  g.margin = static_cast<double>(l[want]) - l[got];
  g.bound = u * (sens(want) + sens(got));
  return g;
}

void DecisionTally::add(const DecisionTally& o) {
  rows += o.rows;
  flips += o.flips;
  beyond_bound += o.beyond_bound;
  max_bound_use = std::max(max_bound_use, o.max_bound_use);
}

Result<DecisionReference> DecisionReference::make(const std::string& dir, model::CausalLM& reference,
                                                  backend::Backend& ref_be, const std::vector<FixtureCase>& cases,
                                                  int64_t block_size) {
  DecisionReference r;
  r.book_ = std::make_unique<model::DecisionBook>();
  MX_ASSIGN_OR_RETURN(r.out_embed_, read_output_embedding(dir, reference.config()));
  int64_t longest = 0;
  for (const auto& c : cases) longest = std::max<int64_t>(longest, c.input_ids.size() + c.greedy.size());
  runtime::SequenceRunner runner(reference, ref_be, 2 * (longest / block_size + 4), block_size);
  for (size_t i = 0; i < cases.size(); ++i) {
    const FixtureCase& c = cases[i];
    std::vector<int32_t> seq = c.input_ids;
    if (c.greedy.size() > 1) seq.insert(seq.end(), c.greedy.begin(), c.greedy.end() - 1);
    model::DecisionRecorder rec;
    runtime::SequenceState st;
    Result<runtime::SequenceRunner::StepResult> step = [&] {
      model::ScopedDecisionHook scope(&rec);
      return runner.extend({&st}, {seq}, /*all_logits=*/true, /*want_hidden=*/true);
    }();
    runner.release(st);
    MX_RETURN_IF_ERROR(step.status());
    r.book_->add(rec.records, static_cast<int32_t>(i));
    r.logits_.push_back(step->logits);
    r.hidden_.push_back(ref_be.to_host(step->hidden));
    const int64_t T = static_cast<int64_t>(c.input_ids.size());
    if (c.has_mtp && T >= 2 && reference.has_mtp()) {  // the MTP layer's decisions over rows 0..T-2
      model::DecisionRecorder mrec;
      runtime::SequenceState ms;
      const std::vector<int32_t> next(c.input_ids.begin() + 1, c.input_ids.end());
      Result<Tensor> mtp = [&] {
        model::ScopedDecisionHook scope(&mrec);
        return runner.mtp(ms, next, step->hidden.slice_rows(0, T - 1));
      }();
      runner.release(ms);
      MX_RETURN_IF_ERROR(mtp.status());
      r.book_->add(mrec.records, static_cast<int32_t>(i));
    }
  }
  return r;
}

GreedyJudgement DecisionReference::judge_greedy(size_t c, int64_t row, int32_t got, int32_t want, double u) const {
  const int64_t V = logits_[c].dim(1), H = hidden_[c].dim(1);
  return judge_token_flip(logits_[c].data<float>() + row * V, hidden_[c].data<float>() + row * H, out_embed_, got,
                          want, u);
}

DecisionTally DecisionReference::judge(const std::vector<model::ObservedDecision>& observed, int path, int32_t c,
                                       double u, const char* label, std::FILE* log) const {
  DecisionTally t;
  for (const model::ObservedDecision& o : observed) {
    if (o.path != path || (c >= 0 && o.seq != c)) continue;
    const model::DecisionBook::Entry e = book_->find(o.site, o.layer, o.seq, o.pos);
    if (e.rows == nullptr) continue;  // reported by the forcer's status
    ++t.rows;
    if (!o.scores.empty()) t.max_bound_use = std::max(t.max_bound_use, model::bound_use(*e.rows, e.row, o.scores, u));
    const model::RowJudgement j = model::judge_row(*e.rows, e.row, o.ids.data(), u);
    if (j.same) continue;
    (j.within_bound ? t.flips : t.beyond_bound) += 1;
    model::DecisionRows mine;
    mine.width = e.rows->width;
    mine.ids = o.ids;
    std::fprintf(log, "  %s: %s layer %lld case %d position %lld: model %s, reference %s:%s %s\n", label,
                 model::decision_site_name(o.site), static_cast<long long>(o.layer), o.seq,
                 static_cast<long long>(o.pos), mine.describe_row(0).c_str(), e.rows->describe_row(e.row).c_str(),
                 j.detail.c_str(), j.within_bound ? "legitimate flip" : "BEYOND THE FORMAT BOUND (a bug)");
  }
  return t;
}

}  // namespace mxserve::cli
