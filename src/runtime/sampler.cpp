#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "core/hash.h"

namespace mxserve::runtime {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return "none";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
  }
  return "?";
}

double counter_uniform(uint64_t seed, uint64_t counter) {
  const uint64_t r = mix64(mix64(seed) ^ (counter * 0xd1b54a32d192ed03ull));
  return static_cast<double>(r >> 11) * (1.0 / 9007199254740992.0);  // 53 bits
}

bool has_logit_processing(const SamplingParams& p) {
  return p.logit_mask != nullptr || !p.logit_bias.empty() || p.repetition_penalty != 1.f ||
         p.presence_penalty != 0.f || p.frequency_penalty != 0.f;
}

namespace {

std::vector<int32_t> sorted_copy(std::span<const int32_t> a, std::span<const int32_t> b = {}) {
  std::vector<int32_t> v(a.begin(), a.end());
  v.insert(v.end(), b.begin(), b.end());
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace

void process_logits(std::span<float> logits, const SamplingParams& p, const TokenContext& ctx) {
  const int64_t V = static_cast<int64_t>(logits.size());
  if (p.logit_mask) p.logit_mask->apply(ctx.generated, logits);
  for (const auto& [token, bias] : p.logit_bias)
    if (token >= 0 && token < V) logits[token] += bias;
  if (p.repetition_penalty != 1.f) {
    std::vector<int32_t> seen = sorted_copy(ctx.prompt, ctx.generated);
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (int32_t t : seen) {
      if (t < 0 || t >= V) continue;
      float& l = logits[t];
      l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
    }
  }
  if ((p.presence_penalty != 0.f || p.frequency_penalty != 0.f) && !ctx.generated.empty()) {
    const std::vector<int32_t> out = sorted_copy(ctx.generated);
    for (size_t i = 0; i < out.size();) {
      size_t j = i;
      while (j < out.size() && out[j] == out[i]) ++j;
      if (out[i] >= 0 && out[i] < V)
        logits[out[i]] -= p.presence_penalty + p.frequency_penalty * static_cast<float>(j - i);
      i = j;
    }
  }
}

Status check_logits(std::span<const float> logits) {
  bool any_allowed = false;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i]))
      return internal_error("the model produced a NaN logit (token id " + std::to_string(i) + " of " +
                            std::to_string(logits.size()) + "): refusing to sample from it");
    any_allowed |= logits[i] > -std::numeric_limits<float>::infinity();
  }
  if (!any_allowed)
    return invalid_argument("no token is allowed: every logit is -inf (the logit mask or logit_bias excluded the "
                            "whole vocabulary)");
  return Status::ok();
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
// Weights e_i = exp((l_i - max) / T) in double: no overflow for any T >= kGreedyTemperature, -inf -> 0;
// when some logits are +inf they alone share the mass.
TokenDistribution sampling_distribution(std::span<const float> logits, const SamplingParams& p) {
  TokenDistribution d;
  const int64_t V = static_cast<int64_t>(logits.size());
  if (is_greedy(p)) {
    d.ids = {argmax_of(logits)};
    d.probs = {1.0};
    return d;
  }
  std::vector<int32_t> cand(V);
  std::iota(cand.begin(), cand.end(), 0);
  if (p.top_k > 0 && p.top_k < V) {
    std::nth_element(cand.begin(), cand.begin() + p.top_k, cand.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    cand.resize(p.top_k);
    std::sort(cand.begin(), cand.end());  // keep candidates in token-id order
  }
  float mx = -INFINITY;
  for (int32_t t : cand) mx = std::max(mx, logits[t]);
  const double T = p.temperature;
  std::vector<double> e(cand.size());
  double total = 0;
  for (size_t i = 0; i < cand.size(); ++i) {
    const float l = logits[cand[i]];
    e[i] = std::isinf(mx) && mx > 0 ? (l == mx ? 1.0 : 0.0) : std::exp((static_cast<double>(l) - mx) / T);
    total += e[i];
  }
  std::vector<char> keep(cand.size(), 1);
  if (p.top_p < 1.f) {
    // The smallest set of most likely tokens whose mass reaches top_p (ties broken by token id).
    std::vector<int32_t> order(cand.size());
    std::iota(order.begin(), order.end(), 0);
    auto more_likely = [&](int32_t a, int32_t b) { return e[a] > e[b] || (e[a] == e[b] && cand[a] < cand[b]); };
    const double target = p.top_p * total;
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
  if (p.min_p > 0.f)  // relative to the most likely token, whose e is 1
    for (size_t i = 0; i < cand.size(); ++i)
      if (e[i] < p.min_p) keep[i] = 0;
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

Result<int32_t> pick_token(std::span<const float> processed, const SamplingParams& p, uint64_t seed, uint64_t step) {
  MX_RETURN_IF_ERROR(check_logits(processed));
  if (is_greedy(p)) return argmax_of(processed);
  return sampling_distribution(processed, p).draw(counter_uniform(seed, step));
}

void raw_logprobs(std::span<const float> raw, int32_t token, int32_t n_top, float* logprob,
                  std::vector<TopLogprob>* top) {
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
  for (size_t i = 0; i < k; ++i) top->push_back({idx[i], static_cast<float>(raw[idx[i]] - lse)});
}

Result<SampleResult> sample_token(std::span<float> logits, const SamplingParams& p, uint64_t request_seed,
                                  uint64_t step, const TokenContext& ctx) {
  SampleResult out;
  std::vector<float> raw;
  if (p.logprobs >= 0) raw.assign(logits.begin(), logits.end());
  process_logits(logits, p, ctx);
  MX_ASSIGN_OR_RETURN(out.token, pick_token(logits, p, sampling_seed(p, request_seed), step));
  if (p.logprobs >= 0) raw_logprobs(raw, out.token, p.logprobs, &out.logprob, &out.top_logprobs);
  return out;
}

}  // namespace mxserve::runtime
