#include "runtime/sampler.h"

#include "core/hash.h"
#include "runtime/spec/speculative.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>

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

SampleResult sample_token(std::span<float> logits, const SamplingParams& p, uint64_t request_seed, uint64_t step,
                          std::span<const int32_t> generated) {
  const int64_t V = static_cast<int64_t>(logits.size());
  SampleResult out;
  // Raw log-softmax for reported logprobs.
  // Raw log-softmax for reported logprobs: only when asked (an O(V) pass of exp).
  double raw_lse = 0;
  if (p.logprobs >= 0) {
    const float raw_max = *std::max_element(logits.begin(), logits.end());
    double raw_sum = 0;
    for (float l : logits) raw_sum += std::exp(static_cast<double>(l - raw_max));
    raw_lse = raw_max + std::log(raw_sum);
  }

  std::vector<float> raw;
  if (p.logprobs >= 0) raw.assign(logits.begin(), logits.end());
  if ((p.presence_penalty != 0.f || p.frequency_penalty != 0.f) && !generated.empty()) {
    std::unordered_map<int32_t, int32_t> counts;
    for (int32_t t : generated) ++counts[t];
    for (const auto& [t, c] : counts) logits[t] -= p.presence_penalty + p.frequency_penalty * static_cast<float>(c);
  }

  if (p.temperature <= 0.f) {
    out.token = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  } else {
    // The same processed distribution speculative verification uses (spec/speculative.h).
    const TokenDistribution d = sampling_distribution(logits, p);
    out.token = d.draw(counter_uniform(p.seed.value_or(request_seed), step));
  }
  if (p.logprobs >= 0) out.logprob = static_cast<float>(raw[out.token] - raw_lse);
  if (p.logprobs > 0) {
    std::vector<int32_t> idx(V);
    std::iota(idx.begin(), idx.end(), 0);
    const int64_t k = std::min<int64_t>(p.logprobs, V);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) { return raw[a] > raw[b]; });
    for (int64_t i = 0; i < k; ++i) out.top_logprobs.push_back({idx[i], static_cast<float>(raw[idx[i]] - raw_lse)});
  }
  return out;
}

}  // namespace mxserve::runtime
