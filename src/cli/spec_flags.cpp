#include "cli/spec_flags.h"

namespace mxserve::cli {

Result<runtime::SpecConfig> parse_spec_flags(const Args& args) {
  runtime::SpecConfig spec;
  const std::string algo = args.get_or("--speculative-algorithm", "");
  if (algo.empty()) {
    for (const auto& f : {"--speculative-num-steps", "--speculative-simulate-acceptance", "--speculative-skip-self-test"})
      if (args.has(f)) return invalid_argument(std::string(f) + " needs --speculative-algorithm mtp");
    return spec;
  }
  if (algo != "mtp" && algo != "MTP" && algo != "nextn" && algo != "NEXTN" && algo != "EAGLE")
    return invalid_argument("--speculative-algorithm '" + algo + "': supported: mtp (aliases NEXTN, EAGLE)");
  MX_ASSIGN_OR_RETURN(int64_t steps, args.get_int("--speculative-num-steps", 3));
  if (steps < 1 || steps > 16) return invalid_argument("--speculative-num-steps must be in [1, 16]");
  spec.num_steps = static_cast<int32_t>(steps);
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
