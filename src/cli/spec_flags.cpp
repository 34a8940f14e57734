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
  // the drafts) must be N + 1. topk > 1 is tree mode: N is the tree depth, each step expands the topk
  // children of each of the (up to) topk best frontier nodes, and the best num_draft_tokens - 1 nodes by
  // cumulative draft log-probability are verified (docs/speculative.md "Tree mode").
  MX_ASSIGN_OR_RETURN(int64_t topk, args.get_int("--speculative-eagle-topk", 1));
  if (topk < 1 || topk > 16) return invalid_argument("--speculative-eagle-topk must be in [1, 16]");
  if (topk == 1) {
    MX_ASSIGN_OR_RETURN(int64_t draft_tokens, args.get_int("--speculative-num-draft-tokens", steps + 1));
    if (draft_tokens != steps + 1)
      return invalid_argument("--speculative-num-draft-tokens " + std::to_string(draft_tokens) +
                              ": with --speculative-eagle-topk 1 it must be --speculative-num-steps + 1 = " +
                              std::to_string(steps + 1));
  } else {
    spec.topk = static_cast<int32_t>(topk);
    const int64_t capacity = spec.tree_capacity(spec.num_steps);
    const int64_t dflt = std::min<int64_t>(capacity, steps * topk) + 1;
    MX_ASSIGN_OR_RETURN(int64_t draft_tokens, args.get_int("--speculative-num-draft-tokens", dflt));
    if (draft_tokens < 2 || draft_tokens - 1 > runtime::SpecConfig::kMaxTreeNodes)
      return invalid_argument("--speculative-num-draft-tokens " + std::to_string(draft_tokens) +
                              ": tree mode verifies num_draft_tokens - 1 draft nodes, in [1, " +
                              std::to_string(runtime::SpecConfig::kMaxTreeNodes) + "]");
    if (draft_tokens - 1 > capacity)
      return invalid_argument("--speculative-num-draft-tokens " + std::to_string(draft_tokens) +
                              ": a tree of depth " + std::to_string(steps) + " with topk " + std::to_string(topk) +
                              " holds at most " + std::to_string(capacity) + " nodes (num_draft_tokens <= " +
                              std::to_string(capacity + 1) + ")");
    if ((steps - 1) * topk > runtime::SpecConfig::kMaxTreeNodes)
      return invalid_argument("--speculative-num-steps " + std::to_string(steps) + " x --speculative-eagle-topk " +
                              std::to_string(topk) + ": the draft expands (steps - 1) * topk <= " +
                              std::to_string(runtime::SpecConfig::kMaxTreeNodes) + " nodes");
    spec.num_draft_tokens = static_cast<int32_t>(draft_tokens);
  }
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
