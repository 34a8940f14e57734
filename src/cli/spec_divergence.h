// Speculative vs plain greedy decoding, judged by the format bound (issue 31 item 2). Greedy speculation is lossless
// in exact arithmetic, but on a bf16 backend the verify forward (the drafted rows in one batch) and the plain decode
// (one row a step) round differently, so where the reference's two best tokens are closer than bf16 rounding can
// resolve the two runs may legitimately part. For each prompt whose outputs differ, the first differing token is
// judged on the CPU fp32 reference: its logit margin between the two tokens against u x (sum_i |h_i W_ai| +
// sum_i |h_i W_bi|) (cli/fixture_decisions.h judge_token_flip); beyond that bound the divergence is a bug.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "model/causal_lm.h"
#include "runtime/engine.h"

namespace mxserve::cli {

// Greedy continuations of every prompt, one request at a time (batch 1) through the engine.
struct GreedyRuns {
  std::vector<std::vector<int32_t>> outputs;
  double decode_seconds = 0;  // after each request's first token
  int64_t decode_tokens = 0;
  runtime::SpecStats spec;
};
Result<GreedyRuns> generate_greedy_all(model::CausalLM& m, backend::Backend& be,
                                       const std::vector<std::vector<int32_t>>& prompts, const runtime::SpecConfig& spec,
                                       int64_t gen_tokens);

struct SpecDivergence {
  size_t prompt = 0;
  int64_t index = 0;         // first generated token that differs
  int32_t plain = -1, spec = -1;
  int32_t reference = -1;    // the reference's argmax at that point
  double margin = 0, bound = 0;  // the reference's logit margin between the two tokens, and the format bound
  bool within_bound() const { return margin <= bound; }
};

// The first divergence of every prompt whose plain and speculative outputs differ, judged on the model in dir
// loaded on the CPU backend (f32), with unit roundoff u (bf16: model::kBf16UnitRoundoff).
Result<std::vector<SpecDivergence>> judge_spec_divergences(const std::string& dir,
                                                           const std::vector<std::vector<int32_t>>& prompts,
                                                           const std::vector<std::vector<int32_t>>& plain,
                                                           const std::vector<std::vector<int32_t>>& spec, double u);

// One line per divergence.
std::string describe(const SpecDivergence& d);

}  // namespace mxserve::cli
