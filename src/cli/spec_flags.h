// The speculative-decoding flags shared by `mxserve generate` and `mxserve serve` (sglang spelling).
#pragma once

#include <set>
#include <string>

#include "cli/args.h"
#include "runtime/spec/speculative.h"

namespace mxserve::cli {

// --speculative-algorithm mtp, --speculative-num-steps N, --speculative-simulate-acceptance A
// --speculative-eagle-topk 1, --speculative-num-draft-tokens N+1: sglang's spelling of chain mode;
// --speculative-eagle-topk k > 1 [--speculative-num-draft-tokens M]: tree mode (depth N, M - 1 nodes)
// --speculative-config '{"method": "mtp", "num_speculative_tokens": N}': vLLM's spelling (= mtp, N steps)
inline const std::set<std::string> kSpecValueFlags = {"--speculative-algorithm", "--speculative-config", "--speculative-num-steps",
                                                      "--speculative-simulate-acceptance", "--speculative-eagle-topk",
                                                      "--speculative-num-draft-tokens"};
// --no-speculative-adaptive: keep N fixed (the adaptive policy is on by default)
// --speculative-skip-self-test: skip the post-load acceptance self-test
inline const std::set<std::string> kSpecBoolFlags = {"--no-speculative-adaptive", "--speculative-skip-self-test"};

Result<runtime::SpecConfig> parse_spec_flags(const Args& args);

}  // namespace mxserve::cli
