// Post-load acceptance self-test for MTP speculative decoding (docs/speculative.md, "Self-test").
// A handful of built-in prompts (token ids, no tokenizer) are decoded greedily with the model's own MTP
// draft through a throwaway engine; the acceptance is logged, and a near-zero acceptance is reported
// loudly: a healthy MTP layer agrees with its target most of the time, one loaded with the wrong
// precision or under the wrong tensor names (e.g. a quantizer exclude-list naming mismatch) almost never.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "runtime/executor.h"
#include "runtime/spec/speculative.h"

namespace mxserve::runtime {

struct SpecSelfTestReport {
  int64_t prompts = 0;
  int64_t verify_steps = 0;    // steps that verified drafts
  int64_t drafted = 0;
  int64_t accepted = 0;
  int32_t num_steps = 0;       // N used (fixed, no adaptive policy)
  double seconds = 0;
  double acceptance_rate() const { return drafted > 0 ? static_cast<double>(accepted) / drafted : 0.0; }
  double acceptance_length() const {  // tokens per verify step, bonus included
    return verify_steps > 0 ? 1.0 + static_cast<double>(accepted) / verify_steps : 1.0;
  }
  bool healthy() const { return acceptance_rate() >= kMinHealthyRate; }
  // Below this per-draft acceptance rate the draft is presumed broken: a random draft over a large
  // vocabulary accepts ~0, while GLM's MTP layer accepts ~0.6-0.9 per draft on these repetitive prompts.
  static constexpr double kMinHealthyRate = 0.1;
};

// The built-in prompts for a vocabulary of `vocab` tokens: repeated patterns and progressions that a
// trained model continues confidently (so a healthy draft agrees with its target).
std::vector<std::vector<int32_t>> spec_self_test_prompts(int64_t vocab);

// Decodes `max_tokens` tokens greedily (EOS ignored) from each built-in prompt with N = spec.num_steps
// drafts per step on `executor` (a small KV pool of n_blocks x block_size; it is destroyed afterwards).
Result<SpecSelfTestReport> run_spec_self_test(std::unique_ptr<ModelExecutor> executor, const SpecConfig& spec,
                                              int64_t n_blocks, int64_t block_size, int32_t max_tokens = 32,
                                              int dp_ranks = 1);  // a DP model: the pool splits into dp ranges

// What the log says about the report: healthy -> one info line; unhealthy -> a loud multi-line warning naming
// the likely causes (the MTP layer's names / precision), except with synthetic weights, whose random drafts
// never agree: one info line saying so. `warn` tells the caller which level to log at.
struct SpecSelfTestMessage {
  bool warn = false;
  std::string text;
};
SpecSelfTestMessage spec_self_test_message(const SpecSelfTestReport& report, bool synthetic_weights);
void log_spec_self_test(const SpecSelfTestReport& report, bool synthetic_weights = false);

// After loading a model for speculative serving/generation: runs the self-test on a small private KV
// pool and logs the result, or logs why it is skipped (speculation off, --speculative-simulate-acceptance:
// synthetic weights never agree; --speculative-skip-self-test). Errors only when the test itself fails to run.
Status spec_self_test_after_load(model::CausalLM& model, backend::Backend& be, const SpecConfig& spec,
                                 int64_t block_size, bool synthetic_weights = false, int dp_ranks = 1);

}  // namespace mxserve::runtime
