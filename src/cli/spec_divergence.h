// Speculative vs plain greedy decoding, judged by the format bound (issue 31 item 2). Greedy speculation is lossless
// in exact arithmetic, but on a bf16 backend the verify forward (the drafted rows in one batch) and the plain decode
// (one row a step) round differently, so where the reference's two best tokens are closer than bf16 rounding can
// resolve the two runs may legitimately part. The judgement is the shared one of cli/greedy_divergence.h with
// A = plain and B = speculative decoding, each replayed one prompt at a time (batch 1) through a fresh engine.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cli/greedy_divergence.h"
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

// The shared judgement's result; a = plain, b = speculative.
using SpecDivergence = GreedyDivergence;

// The first divergence of every prompt whose plain and speculative outputs differ, judged on the model in dir
// loaded on the CPU backend (f32), with unit roundoff u (bf16: model::kBf16UnitRoundoff). A divergence beyond the
// token bound is replayed on (m, be): plain, and with spec_on for the speculative run (greedy_divergence.h).
Result<std::vector<SpecDivergence>> judge_spec_divergences(const std::string& dir, model::CausalLM& m,
                                                           backend::Backend& be, const runtime::SpecConfig& spec_on,
                                                           const std::vector<std::vector<int32_t>>& prompts,
                                                           const std::vector<std::vector<int32_t>>& plain,
                                                           const std::vector<std::vector<int32_t>>& spec, double u);

}  // namespace mxserve::cli
