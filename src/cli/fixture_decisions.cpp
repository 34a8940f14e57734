// Decision-aware fixture checks (fixture_decisions.h).
#include "cli/fixture_decisions.h"

#include <algorithm>
#include <cmath>

#include "model/decisions.h"
#include "runtime/sequence_runner.h"

namespace mxserve::cli {
namespace {

struct Run {
  Tensor logits;  // host f32 [rows, V]
  Tensor hidden;  // backend [rows, H]
  std::vector<model::DecisionRows> decisions;  // what the model chose at each site (before any forcing)
};

// One teacher-forced pass over seq with `hook` installed (a recorder or a forcer); the runner is released.
Result<Run> run_with(runtime::SequenceRunner& runner, const std::vector<int32_t>& seq, model::DecisionHook& hook) {
  runtime::SequenceState st;
  Result<runtime::SequenceRunner::StepResult> step = [&] {
    model::ScopedDecisionHook scope(&hook);
    return runner.extend({&st}, {seq}, /*all_logits=*/true, /*want_hidden=*/true);
  }();
  runner.release(st);
  MX_RETURN_IF_ERROR(step.status());
  Run r;
  r.logits = step->logits;
  r.hidden = step->hidden;
  return r;
}

Result<Tensor> mtp_with(runtime::SequenceRunner& runner, const std::vector<int32_t>& next, const Tensor& hidden,
                        model::DecisionHook& hook) {
  runtime::SequenceState st;
  Result<Tensor> out = [&] {
    model::ScopedDecisionHook scope(&hook);
    return runner.mtp(st, next, hidden);
  }();
  runner.release(st);
  return out;
}

struct Margin {
  int64_t arg = 0;
  double margin = 0, scale = 0;  // top-1 minus top-2; 4 x rms of the row (the logits' noise per unit rel. error)
};
Margin top2(const float* row, int64_t V) {
  Margin m;
  double second = -INFINITY, sq = 0;
  for (int64_t v = 1; v < V; ++v)
    if (row[v] > row[m.arg]) m.arg = v;
  for (int64_t v = 0; v < V; ++v) {
    if (v != m.arg) second = std::max(second, static_cast<double>(row[v]));
    sq += static_cast<double>(row[v]) * row[v];
  }
  m.margin = row[m.arg] - second;
  m.scale = 4.0 * std::sqrt(sq / static_cast<double>(V));
  return m;
}

// Pairs reference decisions with the tested model's own choices; counts and prints disagreements.
Status compare_sites(const std::vector<model::DecisionRows>& ref, const std::vector<model::DecisionRows>& got,
                     const std::string& what, const DecisionCheckOptions& opt, CaseDecisions& cd, std::FILE* log) {
  if (ref.size() != got.size())
    return internal_error(what + ": the reference made " + std::to_string(ref.size()) + " decision calls, the model " +
                          std::to_string(got.size()));
  for (size_t i = 0; i < ref.size(); ++i) {
    const model::DecisionRows &r = ref[i], &g = got[i];
    ++cd.sites;
    for (int64_t row = 0; row < r.rows; ++row) {
      ++cd.rows;
      const double bound = 2.0 * opt.rel_error * r.scale[row];
      if (r.same_row(g, row)) {
        if (std::isfinite(r.margin[row]) && std::isfinite(g.margin[row]) && bound > 0)
          cd.max_bound_use = std::max(cd.max_bound_use, std::fabs(g.margin[row] - r.margin[row]) / bound);
        continue;
      }
      const bool flip = r.margin[row] <= bound;
      (flip ? cd.flips : cd.beyond_bound) += 1;
      const auto [kept, dropped] = r.margin_pair[row];
      const std::string between = kept >= 0 ? " (kept " + std::to_string(kept) + " vs dropped " + std::to_string(dropped) + ")"
                                            : std::string(" (group selection)");
      std::fprintf(log, "  %s %s layer %lld row %lld: model %s, reference %s, reference margin %.4g%s %s bound %.4g%s\n",
                   what.c_str(), model::decision_site_name(r.site), static_cast<long long>(r.layer),
                   static_cast<long long>(row), g.describe_row(row).c_str(), r.describe_row(row).c_str(), r.margin[row],
                   between.c_str(), flip ? "<=" : ">", bound, flip ? ": legitimate flip" : ": BEYOND THE BOUND (a bug)");
    }
  }
  return Status::ok();
}

int count_disagreements(const std::vector<model::DecisionRows>& ref, const std::vector<model::DecisionRows>& got) {
  int n = 0;
  for (size_t i = 0; i < std::min(ref.size(), got.size()); ++i)
    for (int64_t row = 0; row < std::min(ref[i].rows, got[i].rows); ++row) n += ref[i].same_row(got[i], row) ? 0 : 1;
  return n;
}

}  // namespace

Result<CaseDecisions> check_case_decisions(model::CausalLM& model, backend::Backend& be, model::CausalLM& reference,
                                           backend::Backend& ref_be, const FixtureCase& c,
                                           const DecisionCheckOptions& opt, std::FILE* log) {
  const int64_t V = model.config().vocab_size, T = static_cast<int64_t>(c.input_ids.size());
  const int64_t N = static_cast<int64_t>(c.greedy.size());
  std::vector<int32_t> seq = c.input_ids;
  if (N > 1) seq.insert(seq.end(), c.greedy.begin(), c.greedy.end() - 1);
  const int64_t n_blocks = 2 * (static_cast<int64_t>(seq.size()) / opt.block_size + 4);
  runtime::SequenceRunner test(model, be, n_blocks, opt.block_size), ref(reference, ref_be, n_blocks, opt.block_size);
  CaseDecisions cd;

  // 1. The reference's decisions and margins.
  model::DecisionRecorder ref_rec;
  MX_ASSIGN_OR_RETURN(Run r, run_with(ref, seq, ref_rec));
  // Information: the model left alone.
  model::DecisionRecorder free_rec;
  MX_ASSIGN_OR_RETURN(Run free, run_with(test, seq, free_rec));
  cd.unforced_disagreements = count_disagreements(ref_rec.records, free_rec.records);
  cd.unforced_rel_l2 = compare(free.logits.data<float>(), c.logits.data<float>(), T * V).rel_l2;
  // 2-3. The model with the reference's decisions forced; its own choices compared site by site.
  model::DecisionForcer forcer(ref_rec.records);
  MX_ASSIGN_OR_RETURN(Run f, run_with(test, seq, forcer));
  MX_RETURN_IF_ERROR(forcer.status());
  MX_RETURN_IF_ERROR(compare_sites(ref_rec.records, forcer.observed, "target", opt, cd, log));
  // 4. Forced logits against the fixture; greedy rows against the reference margins.
  cd.forced_rel_l2 = compare(f.logits.data<float>(), c.logits.data<float>(), T * V).rel_l2;
  cd.forced_ok = cd.forced_rel_l2 <= opt.max_rel_l2;
  for (int64_t i = 0; i < N; ++i) {
    const int64_t row = T - 1 + i;
    const Margin got = top2(f.logits.data<float>() + row * V, V), want = top2(r.logits.data<float>() + row * V, V);
    if (got.arg == c.greedy[i]) continue;
    const double bound = 2.0 * opt.rel_error * want.scale;
    const bool flip = want.margin <= bound;
    (flip ? cd.greedy_flips : cd.greedy_beyond_bound) += 1;
    std::fprintf(log, "  greedy step %lld: model %lld, reference %d, reference margin %.4g %s bound %.4g%s\n",
                 static_cast<long long>(i), static_cast<long long>(got.arg), c.greedy[i], want.margin,
                 flip ? "<=" : ">", bound, flip ? ": legitimate flip" : ": BEYOND THE BOUND (a bug)");
  }
  // MTP: the draft layer over the input rows, from each model's own (forced) target hidden states.
  if (c.has_mtp && T >= 2 && model.has_mtp() && reference.has_mtp()) {
    const std::vector<int32_t> next(c.input_ids.begin() + 1, c.input_ids.end());
    model::DecisionRecorder mtp_rec;
    MX_ASSIGN_OR_RETURN(Tensor ref_mtp, mtp_with(ref, next, r.hidden.slice_rows(0, T - 1), mtp_rec));
    (void)ref_mtp;
    model::DecisionForcer mtp_forcer(mtp_rec.records);
    MX_ASSIGN_OR_RETURN(Tensor got_mtp, mtp_with(test, next, f.hidden.slice_rows(0, T - 1), mtp_forcer));
    MX_RETURN_IF_ERROR(mtp_forcer.status());
    MX_RETURN_IF_ERROR(compare_sites(mtp_rec.records, mtp_forcer.observed, "mtp", opt, cd, log));
    cd.forced_mtp_rel_l2 = compare(got_mtp.data<float>(), c.mtp_logits.data<float>(), (T - 1) * V).rel_l2;
    cd.forced_ok = cd.forced_ok && cd.forced_mtp_rel_l2 <= opt.max_rel_l2;
  }
  return cd;
}

}  // namespace mxserve::cli
