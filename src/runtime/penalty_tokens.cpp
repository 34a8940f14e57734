#include "runtime/penalty_tokens.h"

namespace mxserve::runtime {

void PenaltyTokens::sync(std::span<const int32_t> tokens, int32_t prompt_len, bool with_prompt) {
  if (covered_ == 0) index_.reserve(with_prompt ? tokens.size() : 64);
  for (; covered_ < tokens.size(); ++covered_) {
    const bool output = covered_ >= static_cast<size_t>(prompt_len);
    if (!output && !with_prompt) continue;
    const int32_t t = tokens[covered_];
    auto [it, fresh] = index_.try_emplace(t, static_cast<int32_t>(entries_.size()));
    if (fresh) entries_.push_back({t, 0, 0});
    kernels::SamplePenaltyToken& e = entries_[it->second];
    if (output) ++e.output_count;
    else e.in_prompt = 1;
  }
}

}  // namespace mxserve::runtime
