#include "cli/fixture.h"

#include <cmath>
#include <cstdio>
#include <cstring>

#include "cli/fixture_decisions.h"
#include "io/safetensors.h"
#include "model/causal_lm.h"
#include "runtime/sequence_runner.h"

namespace mxserve::cli {
namespace {

Result<Tensor> copy_tensor(const io::SafetensorsFile& f, const std::string& name, DType dtype, const Shape& shape) {
  const io::TensorInfo* info = f.find(name);
  if (info == nullptr) return not_found(f.path() + ": tensor '" + name + "' is missing");
  if (info->dtype != dtype)
    return invalid_argument(f.path() + ": tensor '" + name + "' is " + dtype_name(info->dtype) + ", expected " +
                            dtype_name(dtype));
  if (!shape.empty() && info->shape != shape)
    return invalid_argument(f.path() + ": tensor '" + name + "' has shape " + shape_to_string(info->shape) +
                            ", expected " + shape_to_string(shape));
  Tensor view = f.view(*info);
  Tensor t = Tensor::empty(dtype, info->shape);
  std::memcpy(t.raw(), view.raw(), view.nbytes());
  return t;
}

Result<std::vector<int32_t>> read_ids(const io::SafetensorsFile& f, const std::string& name, int64_t vocab) {
  const io::TensorInfo* info = f.find(name);
  if (info == nullptr) return not_found(f.path() + ": tensor '" + name + "' is missing");
  if (info->shape.size() != 1)
    return invalid_argument(f.path() + ": tensor '" + name + "' must be 1-D, found " + shape_to_string(info->shape));
  MX_ASSIGN_OR_RETURN(Tensor t, copy_tensor(f, name, DType::kI64, {}));
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const int64_t v = t.data<int64_t>()[i];
    if (v < 0 || v >= vocab)
      return invalid_argument(f.path() + ": tensor '" + name + "'[" + std::to_string(i) + "] = " + std::to_string(v) +
                              " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

const char* verdict(bool ok) { return ok ? "ok" : "MISS"; }

}  // namespace

ErrorStats compare(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0, mx = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
    mx = std::max(mx, std::fabs(d));
  }
  ErrorStats s;
  s.rel_l2 = std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
  s.max_abs = mx;
  if (std::isnan(num)) s.rel_l2 = s.max_abs = INFINITY;
  return s;
}

Result<std::vector<FixtureCase>> read_fixture_cases(const std::string& dir, int64_t vocab) {
  MX_ASSIGN_OR_RETURN(auto f, io::SafetensorsFile::open(dir + "/reference.safetensors"));
  std::vector<FixtureCase> cases;
  for (int i = 0;; ++i) {
    const std::string p = "case." + std::to_string(i) + ".";
    if (f->find(p + "input_ids") == nullptr) break;
    FixtureCase c;
    MX_ASSIGN_OR_RETURN(c.input_ids, read_ids(*f, p + "input_ids", vocab));
    const int64_t T = static_cast<int64_t>(c.input_ids.size());
    if (T == 0) return invalid_argument(f->path() + ": " + p + "input_ids is empty");
    MX_ASSIGN_OR_RETURN(c.logits, copy_tensor(*f, p + "logits", DType::kF32, {T, vocab}));
    MX_ASSIGN_OR_RETURN(c.greedy, read_ids(*f, p + "greedy", vocab));
    if (f->find(p + "mtp_logits") != nullptr) {
      MX_ASSIGN_OR_RETURN(c.mtp_logits, copy_tensor(*f, p + "mtp_logits", DType::kF32, {T - 1, vocab}));
      c.has_mtp = true;
    }
    cases.push_back(std::move(c));
  }
  if (cases.empty()) return invalid_argument(f->path() + ": no 'case.0.input_ids' tensor: not a fixture");
  return cases;
}

Result<FixtureReport> verify_fixture(const std::string& dir, backend::Backend& be, const FixtureOptions& opt) {
  MX_ASSIGN_OR_RETURN(auto model, model::load_causal_lm(dir, be, model::LoadOptions{}));
  return verify_fixture_model(dir, *model, be, opt);
}

namespace {

// The paths a case runs, labels of the forced forwards' observations.
enum Path : int { kBatched = 1, kChunked, kStepwise, kDecode, kMtp };
using Rows = std::vector<std::pair<int32_t, int64_t>>;  // (case, position) of every batch row

Rows positions(int32_t c, int64_t begin, int64_t end) {
  Rows r;
  for (int64_t p = begin; p < end; ++p) r.push_back({c, p});
  return r;
}

}  // namespace

Result<FixtureReport> verify_fixture_model(const std::string& dir, model::CausalLM& loaded, backend::Backend& be,
                                           const FixtureOptions& opt) {
  model::CausalLM* model = &loaded;
  const auto& cfg = model->config();
  MX_ASSIGN_OR_RETURN(auto cases, read_fixture_cases(dir, cfg.vocab_size));
  int64_t total_tokens = 0;
  for (const auto& c : cases) total_tokens += static_cast<int64_t>(c.input_ids.size() + c.greedy.size()) + 1;
  const int64_t n_blocks = 2 * (total_tokens / opt.block_size + 2 * static_cast<int64_t>(cases.size()) + 4);
  runtime::SequenceRunner runner(*model, be, n_blocks, opt.block_size);
  const int64_t V = cfg.vocab_size;
  const double u = opt.unit_roundoff;
  FixtureReport report;
  // Decision-aware mode: the reference's decisions, forced in every path below (fixture_decisions.h).
  std::unique_ptr<DecisionReference> dref;
  std::unique_ptr<model::PositionalForcer> forcer;
  if (opt.decision_aware) {
    if (opt.reference == nullptr || opt.reference_backend == nullptr)
      return invalid_argument("decision-aware fixture checks need the fixture loaded on the CPU backend as reference");
    MX_ASSIGN_OR_RETURN(auto r, DecisionReference::make(dir, *opt.reference, *opt.reference_backend, cases,
                                                        opt.block_size));
    dref = std::make_unique<DecisionReference>(std::move(r));
    forcer = std::make_unique<model::PositionalForcer>(dref->book());
  }
  // Forces the reference's decisions on the forwards run while the returned scope lives (none in plain mode).
  auto force = [&](Rows rows, Path path) -> std::unique_ptr<model::ScopedDecisionHook> {
    if (!forcer) return nullptr;
    forcer->set_rows(std::move(rows), path);
    return std::make_unique<model::ScopedDecisionHook>(forcer.get());
  };
  // The decisions of `path` for case c: the tally (counted into the report) and the text for the check's line.
  auto decisions = [&](Path path, size_t c, const char* label, DecisionTally* out) -> std::string {
    if (!dref) return "";
    const DecisionTally t = dref->judge(forcer->observed, path, static_cast<int32_t>(c), u, label, stdout);
    report.decision_rows += t.rows;
    report.decision_flips += t.flips;
    report.decision_beyond_bound += t.beyond_bound;
    report.max_bound_use = std::max(report.max_bound_use, t.max_bound_use);
    *out = t;
    char buf[160];
    std::snprintf(buf, sizeof(buf), "; decisions %lld rows, %d flips, %d beyond the bound, bound use %.3f",
                  static_cast<long long>(t.rows), t.flips, t.beyond_bound, t.max_bound_use);
    return buf;
  };
  auto check = [&](bool ok) {
    report.failures += ok ? 0 : 1;
    return verdict(ok);
  };

  // 1) All cases at once as one ragged batch: teacher-forced logits of every row.
  {
    std::vector<runtime::SequenceState> states(cases.size());
    std::vector<runtime::SequenceState*> ptrs;
    std::vector<std::vector<int32_t>> toks;
    Rows rows;
    for (size_t i = 0; i < cases.size(); ++i) {
      ptrs.push_back(&states[i]);
      toks.push_back(cases[i].input_ids);
      const Rows r = positions(static_cast<int32_t>(i), 0, static_cast<int64_t>(cases[i].input_ids.size()));
      rows.insert(rows.end(), r.begin(), r.end());
    }
    Result<runtime::SequenceRunner::StepResult> step = [&] {
      auto scope = force(rows, kBatched);
      return runner.extend(ptrs, toks, /*all_logits=*/true, /*want_hidden=*/false);
    }();
    MX_RETURN_IF_ERROR(step.status());
    int64_t row = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
      const int64_t T = static_cast<int64_t>(cases[i].input_ids.size());
      ErrorStats e = compare(step->logits.data<float>() + row * V, cases[i].logits.data<float>(), T * V);
      DecisionTally t;
      const std::string d = decisions(kBatched, i, "batched", &t);
      std::printf("case %zu: T=%-4lld batched logits       rel_l2 %.3e  max_abs %.3e%s  %s\n", i,
                  static_cast<long long>(T), e.rel_l2, e.max_abs, d.c_str(),
                  check(e.rel_l2 <= opt.max_rel_l2 && t.beyond_bound == 0));
      row += T;
    }
    for (auto& s : states) runner.release(s);
  }

  for (size_t i = 0; i < cases.size(); ++i) {
    const FixtureCase& c = cases[i];
    const int32_t ci = static_cast<int32_t>(i);
    const int64_t T = static_cast<int64_t>(c.input_ids.size()), N = static_cast<int64_t>(c.greedy.size());
    // 2) Teacher-forced through the KV cache: prefill in chunks, every row's logits.
    runtime::SequenceState seq;
    Tensor logits = Tensor::empty(DType::kF32, {T, V});
    Tensor hidden_all;
    bool single_chunk = T <= opt.chunk_size;
    for (int64_t b = 0; b < T; b += opt.chunk_size) {
      const int64_t e = std::min(T, b + opt.chunk_size);
      Result<runtime::SequenceRunner::StepResult> step = [&] {
        auto scope = force(positions(ci, b, e), kChunked);
        return runner.extend({&seq}, {std::vector<int32_t>(c.input_ids.begin() + b, c.input_ids.begin() + e)}, true,
                             single_chunk);
      }();
      MX_RETURN_IF_ERROR(step.status());
      std::memcpy(logits.data<float>() + b * V, step->logits.raw(), sizeof(float) * (e - b) * V);
      if (single_chunk) hidden_all = step->hidden;
    }
    runner.release(seq);
    {
      ErrorStats e = compare(logits.data<float>(), c.logits.data<float>(), T * V);
      DecisionTally t;
      const std::string d = decisions(kChunked, i, "chunked", &t);
      std::printf("case %zu: T=%-4lld chunked-cache logits rel_l2 %.3e  max_abs %.3e%s  %s\n", i,
                  static_cast<long long>(T), e.rel_l2, e.max_abs, d.c_str(),
                  check(e.rel_l2 <= opt.max_rel_l2 && t.beyond_bound == 0));
    }

    // 3) Decode-path logits: the first token, then every later input token as a one-row decode step through the
    // paged cache, each row's logits against the fixture's (the decode path's own oracle, in both modes).
    {
      runtime::SequenceState ss;
      Tensor step_logits = Tensor::empty(DType::kF32, {T, V});
      for (int64_t p = 0; p < T; ++p) {
        Result<runtime::SequenceRunner::StepResult> step = [&] {
          auto scope = force(positions(ci, p, p + 1), kStepwise);
          return runner.extend({&ss}, {{c.input_ids[p]}}, true, false);
        }();
        MX_RETURN_IF_ERROR(step.status());
        std::memcpy(step_logits.data<float>() + p * V, step->logits.raw(), sizeof(float) * V);
      }
      runner.release(ss);
      ErrorStats e = compare(step_logits.data<float>(), c.logits.data<float>(), T * V);
      DecisionTally t;
      const std::string d = decisions(kStepwise, i, "decode steps", &t);
      std::printf("case %zu: T=%-4lld decode-step logits  rel_l2 %.3e  max_abs %.3e%s  %s\n", i,
                  static_cast<long long>(T), e.rel_l2, e.max_abs, d.c_str(),
                  check(e.rel_l2 <= opt.max_rel_l2 && t.beyond_bound == 0));
    }

    // 4) Greedy decode step by step through the cache. Decision-aware: every step with the reference's decisions
    // forced, a differing token judged by the format bound and replaced by the fixture's, so every later step is
    // still checked; plain: the model's own continuation must equal the fixture's.
    if (!dref) {
      MX_ASSIGN_OR_RETURN(auto greedy, runner.greedy(c.input_ids, N, opt.chunk_size, {}));
      const bool same = greedy == c.greedy;
      std::printf("case %zu: greedy %zu tokens %s\n", i, c.greedy.size(), check(same));
      if (!same) {
        std::printf("  expected:");
        for (int32_t t : c.greedy) std::printf(" %d", t);
        std::printf("\n  got:     ");
        for (int32_t t : greedy) std::printf(" %d", t);
        std::printf("\n");
      }
    } else if (N > 0) {
      runtime::SequenceState gs;
      Tensor last;
      for (int64_t b = 0; b < T; b += opt.chunk_size) {
        const int64_t e = std::min(T, b + opt.chunk_size);
        Result<runtime::SequenceRunner::StepResult> step = [&] {
          auto scope = force(positions(ci, b, e), kDecode);
          return runner.extend({&gs}, {std::vector<int32_t>(c.input_ids.begin() + b, c.input_ids.begin() + e)},
                               false, false);
        }();
        MX_RETURN_IF_ERROR(step.status());
        last = step->logits;
      }
      int flips = 0, beyond = 0;
      Tensor decode_logits = Tensor::empty(DType::kF32, {N, V});  // the rows T-1 .. T+N-2 of the reference's
      for (int64_t k = 0; k < N; ++k) {
        std::memcpy(decode_logits.data<float>() + k * V, last.raw(), sizeof(float) * V);
        const int32_t got = runtime::argmax_row(last, 0);
        if (got != c.greedy[k]) {
          const GreedyJudgement g = dref->judge_greedy(i, T - 1 + k, got, c.greedy[k], u);
          (g.within_bound() ? flips : beyond) += 1;
          std::printf("  greedy step %lld: model %d, fixture %d, reference margin %.4g %s bound %.4g: %s\n",
                      static_cast<long long>(k), got, c.greedy[k], g.margin, g.within_bound() ? "<=" : ">", g.bound,
                      g.within_bound() ? "legitimate flip, decoding goes on with the fixture's token"
                                       : "BEYOND THE FORMAT BOUND (a bug)");
        }
        if (k + 1 == N) break;
        Result<runtime::SequenceRunner::StepResult> step = [&] {
          auto scope = force(positions(ci, T + k, T + k + 1), kDecode);
          return runner.extend({&gs}, {{c.greedy[k]}}, false, false);
        }();
        MX_RETURN_IF_ERROR(step.status());
        last = step->logits;
      }
      runner.release(gs);
      report.greedy_flips += flips;
      report.greedy_beyond_bound += beyond;
      // The teacher-forced decode's logits against the reference's rows (the fixture stores input rows only).
      const ErrorStats e =
          compare(decode_logits.data<float>(), dref->logits(i).data<float>() + (T - 1) * V, N * V);
      DecisionTally t;
      const std::string d = decisions(kDecode, i, "decode", &t);
      std::printf("case %zu: greedy %zu tokens, %d flips within the bound, %d beyond; logits vs the reference rel_l2 "
                  "%.3e%s  %s\n",
                  i, c.greedy.size(), flips, beyond, e.rel_l2, d.c_str(),
                  check(beyond == 0 && t.beyond_bound == 0 && e.rel_l2 <= opt.max_rel_l2));
    }

    // 5) MTP logits: row t from h_t (target post-norm hidden) and embed(x_{t+1}), causal over rows.
    if (c.has_mtp && T >= 2) {
      if (!model->has_mtp()) return invalid_argument(dir + ": the fixture has mtp_logits but the model has no MTP layer");
      if (!hidden_all.defined() || hidden_all.numel() == 0) {
        runtime::SequenceState full;
        Result<runtime::SequenceRunner::StepResult> step = [&] {
          auto scope = force(positions(ci, 0, T), kMtp);
          return runner.extend({&full}, {c.input_ids}, false, true);
        }();
        MX_RETURN_IF_ERROR(step.status());
        hidden_all = step->hidden;
        runner.release(full);
      }
      Tensor h_prev = hidden_all.slice_rows(0, T - 1);
      runtime::SequenceState mtp_seq;
      std::vector<int32_t> next(c.input_ids.begin() + 1, c.input_ids.end());
      Result<Tensor> mtp_logits = [&] {
        auto scope = force(positions(ci, 0, T - 1), kMtp);
        return runner.mtp(mtp_seq, next, h_prev);
      }();
      runner.release(mtp_seq);
      MX_RETURN_IF_ERROR(mtp_logits.status());
      ErrorStats m = compare(mtp_logits->data<float>(), c.mtp_logits.data<float>(), (T - 1) * V);
      DecisionTally t;
      const std::string d = decisions(kMtp, i, "mtp", &t);
      std::printf("case %zu: mtp logits            rel_l2 %.3e  max_abs %.3e%s  %s\n", i, m.rel_l2, m.max_abs,
                  d.c_str(), check(m.rel_l2 <= opt.max_rel_l2 && t.beyond_bound == 0));
    }
    ++report.cases;
  }
  if (forcer) MX_RETURN_IF_ERROR(forcer->status());
  if (dref)
    std::printf("decisions, every path: %lld rows, %d flips within the format bound (u = %.8g), %d beyond; greedy %d "
                "flips, %d beyond; bound use %.3f\n",
                static_cast<long long>(report.decision_rows), report.decision_flips, u, report.decision_beyond_bound,
                report.greedy_flips, report.greedy_beyond_bound, report.max_bound_use);
  return report;
}

}  // namespace mxserve::cli
