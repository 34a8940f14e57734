// `mxserve eval acceptance`: MTP speculative decoding measured on real text. Prompts are windows of the text;
// each is continued greedily (one request at a time: batch 1) twice through the engine, once without and once
// with speculation at a FIXED draft length (the adaptive policy off), and the command reports the acceptance
// length (1 + accepted / verify steps, the tokens a step emits), acceptance per draft position, the decode
// speed of both runs and their ratio, and whether both runs produced the same tokens. Greedy speculation is
// lossless in exact arithmetic; on a bf16 backend a prompt whose outputs differ is judged at its first differing
// token by the CPU fp32 reference's margin against the format bound (cli/spec_divergence.h): within it the
// divergence is legitimate (reported), beyond it a defect (exit code 1).
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/eval_common.h"
#include "cli/spec_divergence.h"
#include "cli/spec_flags.h"
#include "model/decisions.h"
#include "runtime/engine.h"
#include "runtime/executor.h"

namespace mxserve::cli {
int eval_acceptance(int argc, char** argv) {
  std::set<std::string> value_flags = {"--model", "--text", "--tokenizer", "--backend", "--prompts", "--prompt-len",
                                       "--gen-tokens", "--json"};
  std::set<std::string> bool_flags = {};
  value_flags.insert(kSpecValueFlags.begin(), kSpecValueFlags.end());
  bool_flags.insert(kSpecBoolFlags.begin(), kSpecBoolFlags.end());
  std::vector<char*> av(argv, argv + argc);
  bool has_algo = false;
  for (int i = 0; i < argc; ++i) has_algo |= std::string(argv[i]).rfind("--speculative-algorithm", 0) == 0;
  std::string algo_flag = "--speculative-algorithm", algo = "mtp";
  if (!has_algo) {  // the MTP layer is the only draft model: default the algorithm
    av.push_back(algo_flag.data());
    av.push_back(algo.data());
  }
  auto args = Args::parse(static_cast<int>(av.size()), av.data(), value_flags, bool_flags);
  if (!args.is_ok()) return eval_fail(args.status());
  if (!args->has("--model") || !args->has("--text") || !args->has("--speculative-num-steps"))
    return eval_fail(invalid_argument("usage: mxserve eval acceptance --model DIR --text FILE --speculative-num-steps N "
                                      "[--speculative-eagle-topk K --speculative-num-draft-tokens M] [--prompts P] "
                                      "[--prompt-len L] [--gen-tokens G] [--backend cpu|cuda] [--json FILE]"));
  auto spec = parse_spec_flags(*args);
  if (!spec.is_ok()) return eval_fail(spec.status());
  if (spec->simulate_acceptance) return eval_fail(invalid_argument("--speculative-simulate-acceptance makes no sense here"));
  spec->adaptive = false;  // measure the acceptance of exactly N drafts per step
  auto n_prompts = args->get_int("--prompts", 8);
  auto prompt_len = args->get_int("--prompt-len", 128);
  auto gen = args->get_int("--gen-tokens", 128);
  for (auto* r : {&n_prompts, &prompt_len, &gen})
    if (!r->is_ok()) return eval_fail(r->status());
  if (*n_prompts < 1 || *prompt_len < 1 || *gen < 2)
    return eval_fail(invalid_argument("--prompts and --prompt-len must be >= 1, --gen-tokens >= 2"));
  const std::string dir = *args->get("--model");
  auto be = backend::make_backend(args->get_or("--backend", "cpu"));
  if (!be.is_ok()) return eval_fail(be.status());
  auto m = load_eval_model(dir, "", **be, /*load_mtp=*/true);
  if (!m.is_ok()) return eval_fail(m.status());
  model::CausalLM& model = *(*m)->model;
  if (!model.has_mtp()) return eval_fail(invalid_argument(dir + ": the model has no MTP layer (num_nextn_predict_layers)"));
  auto ids = text_file_ids(*args->get("--text"), args->get_or("--tokenizer", dir), 0, model.config().vocab_size);
  if (!ids.is_ok()) return eval_fail(ids.status());
  const int64_t N = static_cast<int64_t>(ids->size());
  if (N < *prompt_len) return eval_fail(invalid_argument("--text has " + std::to_string(N) + " tokens, fewer than --prompt-len"));
  std::vector<std::vector<int32_t>> prompts;  // evenly spaced windows of the text
  for (int64_t i = 0; i < *n_prompts; ++i) {
    const int64_t start = (*n_prompts == 1) ? 0 : i * (N - *prompt_len) / (*n_prompts - 1);
    prompts.emplace_back(ids->begin() + start, ids->begin() + start + *prompt_len);
  }
  runtime::SpecConfig off;
  auto base = generate_greedy_all(model, **be, prompts, off, *gen);
  if (!base.is_ok()) return eval_fail(base.status());
  auto sp = generate_greedy_all(model, **be, prompts, *spec, *gen);
  if (!sp.is_ok()) return eval_fail(sp.status());
  int64_t mismatched = 0;
  for (size_t i = 0; i < prompts.size(); ++i) mismatched += base->outputs[i] != sp->outputs[i];
  auto divergences = judge_spec_divergences(dir, model, **be, *spec, prompts, base->outputs, sp->outputs, model::kBf16UnitRoundoff);
  if (!divergences.is_ok()) return eval_fail(divergences.status());
  int64_t beyond = 0;
  nlohmann::ordered_json div_json = nlohmann::ordered_json::array();
  for (const SpecDivergence& d : *divergences) {
    beyond += d.legitimate() ? 0 : 1;
    auto replay = [](const DecisionReplay& r) -> nlohmann::ordered_json {
      if (!r.ran) return nullptr;
      return {{"token_as_ran", r.token_as_ran}, {"reproduced", r.reproduced}, {"token_forced", r.token_forced},
              {"forced_within_token_bound", r.forced_within_token_bound}, {"rows_compared", r.rows_compared},
              {"flips", r.flips}, {"flips_beyond_bound", r.flips_beyond}, {"worst_ratio", r.worst_ratio},
              {"worst_flip", r.worst_flip}};
    };
    div_json.push_back({{"prompt", d.prompt}, {"index", d.index}, {"plain", d.a}, {"spec", d.b},
                        {"reference", d.reference}, {"reference_margin", d.margin}, {"bound", d.bound},
                        {"within_bound", d.within_bound()}, {"plain_replay", replay(d.a_replay)},
                        {"spec_replay", replay(d.b_replay)}, {"legitimate", d.legitimate()}});
  }
  const auto& s = sp->spec;
  const double acc_len = s.num_drafts > 0 ? 1.0 + static_cast<double>(s.num_accepted_tokens) / s.num_drafts : 1.0;
  const double tps_base = base->decode_tokens / std::max(base->decode_seconds, 1e-9);
  const double tps_spec = sp->decode_tokens / std::max(sp->decode_seconds, 1e-9);
  const std::string mode = spec->tree() ? "tree (topk " + std::to_string(spec->topk) + ", " +
                                              std::to_string(spec->num_draft_tokens) + " draft tokens)"
                                        : "chain";
  std::printf("model %s, backend %s, %s, %d draft steps; %lld prompts x %lld tokens of %s, %lld generated each\n",
              dir.c_str(), (*be)->name().c_str(), mode.c_str(), spec->num_steps, static_cast<long long>(*n_prompts),
              static_cast<long long>(*prompt_len), args->get_or("--text", "").c_str(), static_cast<long long>(*gen));
  std::printf("acceptance length %.3f tokens per verify step (%lld steps, %lld drafted, %lld accepted)\n", acc_len,
              static_cast<long long>(s.num_drafts), static_cast<long long>(s.num_draft_tokens),
              static_cast<long long>(s.num_accepted_tokens));
  nlohmann::ordered_json per_pos = nlohmann::ordered_json::array();
  for (size_t i = 0; i < s.accepted_per_pos.size(); ++i) {
    const double r = s.num_drafts ? static_cast<double>(s.accepted_per_pos[i]) / s.num_drafts : 0;
    per_pos.push_back(r);
    std::printf("  position %zu: accepted in %.1f%% of steps\n", i + 1, 100 * r);
  }
  std::printf("decode: %.1f tok/s without speculation, %.1f tok/s with (x%.2f)\n", tps_base, tps_spec, tps_spec / tps_base);
  std::printf("outputs identical to plain greedy decoding: %lld/%zu; divergences within the bf16 bound %lld, beyond "
              "it %lld%s\n",
              static_cast<long long>(prompts.size() - mismatched), prompts.size(),
              static_cast<long long>(mismatched - beyond), static_cast<long long>(beyond),
              beyond ? "  MISMATCH: speculation changed greedy outputs beyond rounding" : "");
  for (const SpecDivergence& d : *divergences) std::printf("  %s\n", describe(d).c_str());
  nlohmann::ordered_json j = {{"model", dir}, {"backend", (*be)->name()}, {"mode", spec->tree() ? "tree" : "chain"},
                              {"num_steps", spec->num_steps}, {"topk", spec->topk},
                              {"num_draft_tokens", spec->tree() ? spec->num_draft_tokens : spec->num_steps + 1},
                              {"prompts", *n_prompts}, {"prompt_len", *prompt_len}, {"gen_tokens", *gen},
                              {"acceptance_length", acc_len}, {"verify_steps", s.num_drafts},
                              {"drafted", s.num_draft_tokens}, {"accepted", s.num_accepted_tokens},
                              {"accepted_per_position", per_pos}, {"decode_tok_s_plain", tps_base},
                              {"decode_tok_s_spec", tps_spec}, {"speedup", tps_spec / tps_base},
                              {"mismatched_outputs", mismatched}, {"divergences_beyond_bound", beyond},
                              {"divergences", div_json}};
  if (args->has("--json")) {
    std::FILE* f = std::fopen(args->get_or("--json", "").c_str(), "w");
    if (!f) return eval_fail(invalid_argument("--json: cannot write " + args->get_or("--json", "")));
    std::fprintf(f, "%s\n", j.dump(1).c_str());
    std::fclose(f);
  }
  return beyond ? 1 : 0;
}

}  // namespace mxserve::cli
