// PenaltyTokens: the distinct tokens a penalized request has seen (kernels::SamplePenaltyToken entries:
// in_prompt, output_count), kept per sequence and caught up incrementally -- O(1) per new token -- so that a
// decode step copies them instead of re-sorting prompt + output (O(P log P) per step per stream: ~0.5 ms of
// engine-thread time per step at 8 streams x 8k prompts with a repetition penalty). The entries are the set
// append_row_processing builds (same tokens, flags and counts) in first-seen order; order does not matter
// to the penalties (each distinct token is processed once).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "kernels/sampling_params.h"

namespace mxserve::runtime {

class PenaltyTokens {
 public:
  // Catches up with tokens[covered(), size) (the first prompt_len are the prompt). with_prompt: prompt tokens
  // are entries (the repetition penalty); otherwise only output tokens are. Fixed per request.
  void sync(std::span<const int32_t> tokens, int32_t prompt_len, bool with_prompt);
  const std::vector<kernels::SamplePenaltyToken>& entries() const { return entries_; }
  size_t covered() const { return covered_; }

 private:
  std::vector<kernels::SamplePenaltyToken> entries_;
  std::unordered_map<int32_t, int32_t> index_;  // token -> its entry
  size_t covered_ = 0;
};

}  // namespace mxserve::runtime
