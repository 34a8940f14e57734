// Teacher-forced quality measures of a model over token ids: every row's logits in one pass, token-level
// perplexity with sliding windows, and the per-token comparison of two models' logits (KL, top-1 agreement,
// cosine, relative L2). Shared by `mxserve compare` and `mxserve eval`. Owns no model: callers load them.
// Invariant (sliding_perplexity): every token from index 1 on is scored exactly once, with the longest
// context its window gives (windows of `window` tokens starting every `stride`); token 0 has no context.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "core/tensor.h"
#include "model/causal_lm.h"

namespace mxserve::eval {

// log-softmax of one row, in double.
std::vector<double> log_softmax(const float* x, int64_t n);

// Host f32 logits [T, V] of every position of `ids`, teacher-forced through a private paged KV cache.
Result<Tensor> all_logits(model::CausalLM& m, backend::Backend& be, const std::vector<int32_t>& ids);

struct Perplexity {
  double nll_sum = 0;  // natural log
  int64_t tokens = 0;  // tokens scored
  double value() const;
};
// progress(done_tokens, total_tokens) after each window (may be empty).
Result<Perplexity> sliding_perplexity(model::CausalLM& m, backend::Backend& be, const std::vector<int32_t>& ids,
                                      int64_t window, int64_t stride,
                                      const std::function<void(int64_t, int64_t)>& progress = {});

// Accumulates the comparison of reference rows a and candidate rows b (same V).
struct LogitComparison {
  int64_t tokens = 0, top1_agree = 0;
  double kl_sum = 0, kl_max = 0, cos_sum = 0;
  double diff_sq = 0, ref_sq = 0;  // for the relative L2 error ||b - a|| / ||a|| over all rows
  void add_row(const float* a, const float* b, int64_t V);
  double mean_kl() const { return tokens ? kl_sum / tokens : 0; }
  double top1() const { return tokens ? static_cast<double>(top1_agree) / tokens : 0; }
  double mean_cos() const { return tokens ? cos_sum / tokens : 0; }
  double rel_l2() const;
};

}  // namespace mxserve::eval
