#include "cli/spec_flags.h"

#include <nlohmann/json.hpp>

namespace mxserve::cli {

namespace {

// vLLM's --speculative-config '{"method": "mtp", "num_speculative_tokens": 3}' -> (algorithm, steps). The MTP
// methods vLLM names per model family are accepted as mtp; other methods and keys are refused, named.
Status parse_speculative_config(const std::string& text, std::string* algo, int64_t* steps) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return invalid_argument("--speculative-config must be a JSON object such as '{\"method\": \"mtp\", "
                            "\"num_speculative_tokens\": 3}', got '" + text + "'");
  for (const auto& [key, value] : j.items()) {
    if (key == "method") {
      if (!value.is_string()) return invalid_argument("--speculative-config: \"method\" must be a string");
      const std::string m = value.get<std::string>();
      if (m != "mtp" && m != "deepseek_mtp" && m != "glm4_moe_mtp" && m != "nextn")
        return invalid_argument("--speculative-config: method '" + m + "' is not supported (mtp, deepseek_mtp, "
                                "glm4_moe_mtp: the model's MTP layer)");
      *algo = "mtp";
    } else if (key == "num_speculative_tokens") {
      if (!value.is_number_integer()) return invalid_argument("--speculative-config: num_speculative_tokens must be an integer");
      *steps = value.get<int64_t>();
    } else {
      return invalid_argument("--speculative-config: key '" + key + "' is not supported (method, "
                              "num_speculative_tokens; the sglang flags --speculative-* cover the rest)");
    }
  }
  if (algo->empty()) return invalid_argument("--speculative-config needs \"method\" (mtp)");
  return Status::ok();
}

}  // namespace

Result<runtime::SpecConfig> parse_spec_flags(const Args& args) {
  runtime::SpecConfig spec;
  std::string algo = args.get_or("--speculative-algorithm", "");
  int64_t default_steps = 3;
  if (args.has("--speculative-config")) {  // vLLM's spelling of the same settings
    std::string config_algo;
    int64_t config_steps = 0;
    MX_RETURN_IF_ERROR(parse_speculative_config(args.get_or("--speculative-config", ""), &config_algo, &config_steps));
    if (!algo.empty() && algo != "mtp" && algo != "MTP" && algo != "nextn" && algo != "NEXTN" && algo != "EAGLE")
      return invalid_argument("--speculative-algorithm " + algo + " and --speculative-config disagree");
    if (config_steps > 0) {
      MX_ASSIGN_OR_RETURN(int64_t given, args.get_int("--speculative-num-steps", config_steps));
      if (given != config_steps)
        return invalid_argument("--speculative-num-steps " + std::to_string(given) +
                                " and --speculative-config num_speculative_tokens " + std::to_string(config_steps) +
                                " disagree (they are the same setting)");
      default_steps = config_steps;
    }
    algo = config_algo;
  }
  if (algo.empty()) {
    for (const auto& f : {"--speculative-num-steps", "--speculative-simulate-acceptance", "--speculative-skip-self-test",
                          "--speculative-eagle-topk", "--speculative-num-draft-tokens"})
      if (args.has(f)) return invalid_argument(std::string(f) + " needs --speculative-algorithm mtp");
    return spec;
  }
  if (algo != "mtp" && algo != "MTP" && algo != "nextn" && algo != "NEXTN" && algo != "EAGLE")
    return invalid_argument("--speculative-algorithm '" + algo + "': supported: mtp (aliases NEXTN, EAGLE)");
  MX_ASSIGN_OR_RETURN(int64_t steps, args.get_int("--speculative-num-steps", default_steps));
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
