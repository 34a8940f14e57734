#include "eval/logit_metrics.h"

#include <algorithm>
#include <cmath>

#include "runtime/sequence_runner.h"

namespace mxserve::eval {

std::vector<double> log_softmax(const float* x, int64_t n) {
  double mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(x[i]));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(x[i] - mx);
  std::vector<double> out(static_cast<size_t>(n));
  const double lse = mx + std::log(sum);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] - lse;
  return out;
}

Result<Tensor> all_logits(model::CausalLM& m, backend::Backend& be, const std::vector<int32_t>& ids) {
  if (ids.empty()) return invalid_argument("all_logits: no tokens");
  runtime::SequenceRunner runner(m, be, static_cast<int64_t>(ids.size()) / 16 + 2, 16);
  runtime::SequenceState s;
  MX_ASSIGN_OR_RETURN(auto step, runner.extend({&s}, {ids}, /*all_logits=*/true, /*want_hidden=*/false));
  return step.logits;
}

double Perplexity::value() const { return tokens ? std::exp(nll_sum / static_cast<double>(tokens)) : NAN; }

Result<Perplexity> sliding_perplexity(model::CausalLM& m, backend::Backend& be, const std::vector<int32_t>& ids,
                                      int64_t window, int64_t stride,
                                      const std::function<void(int64_t, int64_t)>& progress) {
  if (window < 2 || stride < 1 || stride > window)
    return invalid_argument("sliding_perplexity: need window >= 2 and 1 <= stride <= window (window " +
                            std::to_string(window) + ", stride " + std::to_string(stride) + ")");
  const int64_t N = static_cast<int64_t>(ids.size());
  if (N < 2) return invalid_argument("sliding_perplexity: the text has " + std::to_string(N) + " token(s); need 2");
  const int64_t V = m.config().vocab_size;
  Perplexity p;
  int64_t prev_end = 0;
  for (int64_t begin = 0; begin < N; begin += stride) {
    const int64_t end = std::min(begin + window, N);
    std::vector<int32_t> w(ids.begin() + begin, ids.begin() + end);
    MX_ASSIGN_OR_RETURN(Tensor logits, all_logits(m, be, w));
    for (int64_t j = std::max(prev_end, begin + 1); j < end; ++j) {
      const float* row = logits.data<float>() + (j - begin - 1) * V;
      p.nll_sum -= log_softmax(row, V)[ids[j]];
      ++p.tokens;
    }
    prev_end = end;
    if (progress) progress(end, N);
    if (end == N) break;
  }
  return p;
}

void LogitComparison::add_row(const float* a, const float* b, int64_t V) {
  const auto la = log_softmax(a, V), lb = log_softmax(b, V);
  double kl = 0, dot = 0, na = 0, nb = 0, d2 = 0;
  int64_t ia = 0, ib = 0;
  for (int64_t v = 0; v < V; ++v) {
    kl += std::exp(la[v]) * (la[v] - lb[v]);
    dot += static_cast<double>(a[v]) * b[v];
    na += static_cast<double>(a[v]) * a[v];
    nb += static_cast<double>(b[v]) * b[v];
    const double d = static_cast<double>(b[v]) - a[v];
    d2 += d * d;
    if (a[v] > a[ia]) ia = v;
    if (b[v] > b[ib]) ib = v;
  }
  kl_sum += kl;
  kl_max = std::max(kl_max, kl);
  cos_sum += dot / std::max(std::sqrt(na * nb), 1e-300);
  diff_sq += d2;
  ref_sq += na;
  top1_agree += ia == ib;
  ++tokens;
}

double LogitComparison::rel_l2() const { return ref_sq > 0 ? std::sqrt(diff_sq / ref_sq) : 0; }

}  // namespace mxserve::eval
