#include "cli/spec_flags.h"

namespace mxserve::cli {

Result<runtime::SpecConfig> parse_spec_flags(const Args& args) {
  runtime::SpecConfig spec;
  const std::string algo = args.get_or("--speculative-algorithm", "");
  if (algo.empty()) {
    for (const auto& f : {"--speculative-num-steps", "--speculative-simulate-acceptance", "--speculative-skip-self-test",
                          "--speculative-eagle-topk", "--speculative-num-draft-tokens"})
      if (args.has(f)) return invalid_argument(std::string(f) + " needs --speculative-algorithm mtp");
    return spec;
  }
  if (algo != "mtp" && algo != "MTP" && algo != "nextn" && algo != "NEXTN" && algo != "EAGLE")
    return invalid_argument("--speculative-algorithm '" + algo + "': supported: mtp (aliases NEXTN, EAGLE)");
  MX_ASSIGN_OR_RETURN(int64_t steps, args.get_int("--speculative-num-steps", 3));
  if (steps < 1 || steps > 16) return invalid_argument("--speculative-num-steps must be in [1, 16]");
  spec.num_steps = static_cast<int32_t>(steps);
  // sglang's tree flags: topk 1 is chain mode, whose num_draft_tokens (sglang: the verified token plus
  // the drafts) must be N + 1. Tree mode (topk > 1) is not implemented yet: refuse rather than ignore.
  MX_ASSIGN_OR_RETURN(int64_t topk, args.get_int("--speculative-eagle-topk", 1));
  if (topk != 1)
    return invalid_argument("--speculative-eagle-topk " + std::to_string(topk) +
                            ": tree speculation (topk > 1) is not implemented yet; use 1 (chain mode)");
  MX_ASSIGN_OR_RETURN(int64_t draft_tokens, args.get_int("--speculative-num-draft-tokens", steps + 1));
  if (draft_tokens != steps + 1)
    return invalid_argument("--speculative-num-draft-tokens " + std::to_string(draft_tokens) +
                            ": with --speculative-eagle-topk 1 it must be --speculative-num-steps + 1 = " +
                            std::to_string(steps + 1));
  spec.adaptive = !args.has("--no-speculative-adaptive");
  spec.self_test = !args.has("--speculative-skip-self-test");
  if (args.has("--speculative-simulate-acceptance")) {
    MX_ASSIGN_OR_RETURN(double a, args.get_double("--speculative-simulate-acceptance", 1.0));
    if (!(a >= 1.0 && a <= steps + 1.0))
      return invalid_argument("--speculative-simulate-acceptance must be in [1, num_steps + 1] (tokens per step)");
    spec.simulate_acceptance = a;
  }
  return spec;
}

}  // namespace mxserve::cli
