// The speculative-decoding flags shared by `mxserve generate` and `mxserve serve` (sglang spelling).
#pragma once

#include <set>
#include <string>

#include "cli/args.h"
#include "runtime/spec/speculative.h"

namespace mxserve::cli {

// --speculative-algorithm mtp, --speculative-num-steps N, --speculative-simulate-acceptance A
inline const std::set<std::string> kSpecValueFlags = {"--speculative-algorithm", "--speculative-num-steps",
                                                      "--speculative-simulate-acceptance"};
// --no-speculative-adaptive: keep N fixed (the adaptive policy is on by default)
// --speculative-skip-self-test: skip the post-load acceptance self-test
inline const std::set<std::string> kSpecBoolFlags = {"--no-speculative-adaptive", "--speculative-skip-self-test"};

Result<runtime::SpecConfig> parse_spec_flags(const Args& args);

}  // namespace mxserve::cli
