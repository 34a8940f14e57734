#include "kernels/cpu/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/hash.h"

namespace mxserve::kernels::cpu {

double counter_uniform(uint64_t seed, uint64_t counter) {
  const uint64_t r = mix64(mix64(seed) ^ (counter * 0xd1b54a32d192ed03ull));
  return static_cast<double>(r >> 11) * (1.0 / 9007199254740992.0);  // 53 bits
}

int32_t check_row(std::span<const float> logits, int32_t* culprit) {
  bool any_allowed = false;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i])) {
      *culprit = static_cast<int32_t>(i);
      return kSampleNanLogit;
    }
    any_allowed |= logits[i] > -std::numeric_limits<float>::infinity();
  }
  return any_allowed ? kSampleOk : kSampleNoAllowedToken;
}

Status sample_error_status(int32_t code, int32_t culprit, int64_t vocab) {
  switch (code) {
    case kSampleOk: return Status::ok();
    case kSampleNanLogit:
      return internal_error("the model produced a NaN logit (token id " + std::to_string(culprit) + " of " +
                            std::to_string(vocab) + "): refusing to sample from it");
    case kSampleNoAllowedToken:
      return invalid_argument("no token is allowed: every logit is -inf (the logit mask or logit_bias excluded the "
                              "whole vocabulary)");
    case kSampleBadRow:
      return internal_error("sampling: logit row " + std::to_string(culprit) + " is outside the logits");
  }
  return internal_error("sampling: unknown per-row error code " + std::to_string(code));
}

int32_t argmax_of(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

double TokenDistribution::prob_of(int32_t token) const {
  auto it = std::lower_bound(ids.begin(), ids.end(), token);  // ids are sorted
  return it != ids.end() && *it == token ? probs[it - ids.begin()] : 0.0;
}

int32_t TokenDistribution::argmax() const {
  return ids[std::max_element(probs.begin(), probs.end()) - probs.begin()];
}

int32_t TokenDistribution::draw(double u) const {
  double acc = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    acc += probs[i];
    if (u < acc) return ids[i];
  }
  return ids.back();
}

// O(V) on the common paths: top-k by selection, top-p by growing selections instead of a full sort.
// NOTE: at a 150k vocabulary a full sort per row cost ~5 ms per sampled token on one core.
TokenDistribution sampling_distribution(std::span<const float> logits, float temperature, int32_t top_k, float top_p,
                                        float min_p) {
  TokenDistribution d;
  const int64_t V = static_cast<int64_t>(logits.size());
  if (temperature < kGreedyTemperature) {
    d.ids = {argmax_of(logits)};
    d.probs = {1.0};
    return d;
  }
  std::vector<int32_t> cand(V);
  std::iota(cand.begin(), cand.end(), 0);
  if (top_k > 0 && top_k < V) {
    std::nth_element(cand.begin(), cand.begin() + top_k, cand.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    cand.resize(top_k);
    std::sort(cand.begin(), cand.end());  // keep candidates in token-id order
  }
  float mx = -INFINITY;
  for (int32_t t : cand) mx = std::max(mx, logits[t]);
  const double T = temperature;
  std::vector<double> e(cand.size());
  double total = 0;
  for (size_t i = 0; i < cand.size(); ++i) {
    const float l = logits[cand[i]];
    e[i] = std::isinf(mx) && mx > 0 ? (l == mx ? 1.0 : 0.0) : std::exp((static_cast<double>(l) - mx) / T);
    total += e[i];
  }
  std::vector<char> keep(cand.size(), 1);
  if (top_p < 1.f) {
    // The smallest set of most likely tokens whose mass reaches top_p (ties broken by token id).
    std::vector<int32_t> order(cand.size());
    std::iota(order.begin(), order.end(), 0);
    auto more_likely = [&](int32_t a, int32_t b) { return e[a] > e[b] || (e[a] == e[b] && cand[a] < cand[b]); };
    const double target = top_p * total;
    size_t k = std::min<size_t>(64, order.size());
    for (;;) {
      if (k < order.size()) std::nth_element(order.begin(), order.begin() + k, order.end(), more_likely);
      double head = 0;
      for (size_t i = 0; i < k; ++i) head += e[order[i]];
      if (head >= target || k == order.size()) break;
      k = std::min(order.size(), k * 8);
    }
    std::sort(order.begin(), order.begin() + k, more_likely);
    std::fill(keep.begin(), keep.end(), 0);
    double cum = 0;
    for (size_t i = 0; i < k && (i == 0 || cum < target); ++i) {
      keep[order[i]] = 1;
      cum += e[order[i]];
    }
  }
  if (min_p > 0.f)  // relative to the most likely token, whose e is 1
    for (size_t i = 0; i < cand.size(); ++i)
      if (e[i] < min_p) keep[i] = 0;
  // Candidates are in token-id order, so the kept ids are sorted (prob_of uses binary search).
  double kept_total = 0;
  for (size_t i = 0; i < cand.size(); ++i)
    if (keep[i] && e[i] > 0) {
      d.ids.push_back(cand[i]);
      d.probs.push_back(e[i]);
      kept_total += e[i];
    }
  for (double& q : d.probs) q /= kept_total;
  return d;
}

void apply_bias_and_penalties(std::span<float> logits, const SampleRowParams& p, std::span<const SampleBias> biases,
                              std::span<const SamplePenaltyToken> penalties) {
  const int64_t V = static_cast<int64_t>(logits.size());
  for (const SampleBias& b : biases)
    if (b.token >= 0 && b.token < V) logits[b.token] += b.bias;
  for (const SamplePenaltyToken& t : penalties) {
    if (t.token < 0 || t.token >= V) continue;
    float& l = logits[t.token];
    if (p.repetition_penalty != 1.f && (t.in_prompt || t.output_count > 0))
      l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
    if (t.output_count > 0 && (p.presence_penalty != 0.f || p.frequency_penalty != 0.f))
      l -= p.presence_penalty + p.frequency_penalty * static_cast<float>(t.output_count);
  }
}

void raw_logprobs(std::span<const float> raw, int32_t token, int32_t n_top, float* logprob,
                  std::vector<std::pair<int32_t, float>>* top) {
  const float mx = *std::max_element(raw.begin(), raw.end());
  double z = 0;
  for (float l : raw) z += std::exp(static_cast<double>(l) - mx);
  const double lse = mx + std::log(z);
  if (logprob) *logprob = static_cast<float>(raw[token] - lse);
  if (!top || n_top <= 0) return;
  std::vector<int32_t> idx(raw.size());
  std::iota(idx.begin(), idx.end(), 0);
  const size_t k = std::min<size_t>(n_top, idx.size());
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int32_t a, int32_t b) { return raw[a] > raw[b] || (raw[a] == raw[b] && a < b); });
  top->clear();
  for (size_t i = 0; i < k; ++i) top->emplace_back(idx[i], static_cast<float>(raw[idx[i]] - lse));
}

std::vector<SampledRow> sample_rows_f32(const float* logits, int64_t n_rows, int64_t vocab, const SampleRowsInput& in) {
  std::vector<SampledRow> out(in.rows.size());
  std::vector<float> row(vocab);
  for (size_t i = 0; i < in.rows.size(); ++i) {
    const SampleRowParams& p = in.rows[i];
    SampledRow& o = out[i];
    if (p.logit_row < 0 || p.logit_row >= n_rows) {  // a caller bug: an error on that row, not a crash
      o.error = kSampleBadRow;
      o.error_token = p.logit_row;
      continue;
    }
    const std::span<const float> raw(logits + p.logit_row * vocab, vocab);
    std::copy(raw.begin(), raw.end(), row.begin());
    apply_bias_and_penalties(row, p, std::span(in.biases).subspan(p.bias_begin, p.bias_count),
                             std::span(in.penalties).subspan(p.penalty_begin, p.penalty_count));
    o.error = check_row(row, &o.error_token);
    if (o.error != kSampleOk) continue;
    o.token = p.temperature < kGreedyTemperature
                  ? argmax_of(row)
                  : sampling_distribution(row, p.temperature, p.top_k, p.top_p, p.min_p)
                        .draw(counter_uniform(p.seed, p.step));
    if (p.n_top >= 0) raw_logprobs(raw, o.token, p.n_top, &o.logprob, &o.top);
  }
  return out;
}

}  // namespace mxserve::kernels::cpu
