#include "runtime/spec/self_test.h"

#include <algorithm>
#include <chrono>
#include <sstream>

#include "core/logging.h"
#include "runtime/engine.h"

namespace mxserve::runtime {

std::vector<std::vector<int32_t>> spec_self_test_prompts(int64_t vocab) {
  auto id = [vocab](int64_t x) { return static_cast<int32_t>((x % (vocab - 1)) + 1); };  // never token 0
  std::vector<std::vector<int32_t>> prompts(4);
  // A phrase of 8 tokens repeated 4 times: induction makes the continuation near-certain.
  for (int r = 0; r < 4; ++r)
    for (int i = 0; i < 8; ++i) prompts[0].push_back(id(1000 + 37 * i));
  // Two alternating tokens.
  for (int i = 0; i < 24; ++i) prompts[1].push_back(id(i % 2 ? 271 : 828));
  // A 5-token phrase repeated 5 times, different ids.
  for (int r = 0; r < 5; ++r)
    for (int i = 0; i < 5; ++i) prompts[2].push_back(id(3000 + 101 * i));
  // A progression of consecutive ids (digits / ordinals are often consecutive in BPE vocabularies).
  for (int i = 0; i < 24; ++i) prompts[3].push_back(id(15 + i));
  return prompts;
}

Result<SpecSelfTestReport> run_spec_self_test(std::unique_ptr<ModelExecutor> executor, const SpecConfig& spec,
                                              int64_t n_blocks, int64_t block_size, int32_t max_tokens,
                                              int dp_ranks) {
  if (spec.num_steps <= 0) return invalid_argument("the speculative self-test needs --speculative-num-steps >= 1");
  if (!executor->has_mtp()) return invalid_argument("the speculative self-test needs a model with an MTP layer");
  const auto prompts = spec_self_test_prompts(executor->vocab_size());
  EngineConfig cfg;
  cfg.scheduler.block_size = block_size;
  cfg.scheduler.dp_ranks = dp_ranks;  // each sequence's KV in one DP rank's block range (dp > 1)
  cfg.n_blocks = n_blocks;
  cfg.max_model_len = 64 + max_tokens + spec.num_steps + 1;
  cfg.spec = spec;
  cfg.spec.adaptive = false;              // measure the draft itself at a fixed N
  cfg.spec.topk = 1;                      // tree mode too: the MTP layer's health is measured as a chain
  cfg.spec.num_draft_tokens = 0;
  cfg.spec.simulate_acceptance.reset();
  SpecSelfTestReport rep;
  rep.num_steps = spec.num_steps;
  rep.prompts = static_cast<int64_t>(prompts.size());
  const auto t0 = std::chrono::steady_clock::now();
  Engine engine(cfg, std::move(executor));
  std::string error;
  for (const auto& p : prompts) {  // one at a time: a small pool is enough
    RequestSpec req;
    req.prompt = p;
    req.sampling.temperature = 0;
    req.sampling.max_tokens = max_tokens;
    req.sampling.ignore_eos = true;
    MX_ASSIGN_OR_RETURN(RequestId id, engine.submit(req, [&error](const TokenEvent& ev) {
      if (ev.finish == FinishReason::kError) error = ev.error;
    }));
    (void)id;
    while (!engine.idle()) engine.step();
    if (!error.empty()) return internal_error("speculative self-test: " + error);
  }
  const EngineStats s = engine.stats();
  rep.verify_steps = s.spec.num_drafts;
  rep.drafted = s.spec.num_draft_tokens;
  rep.accepted = s.spec.num_accepted_tokens;
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

SpecSelfTestMessage spec_self_test_message(const SpecSelfTestReport& r, bool synthetic_weights) {
  std::ostringstream o;
  const auto counts = [&] {
    o << r.accepted << "/" << r.drafted << " drafts accepted (rate " << r.acceptance_rate() << ", acceptance length "
      << r.acceptance_length() << " tokens/step)";
  };
  if (r.healthy()) {
    o << "speculative self-test: " << r.prompts << " prompts, N=" << r.num_steps << ": ";
    counts();
    o << " in " << r.seconds << " s";
    return {false, o.str()};
  }
  if (synthetic_weights) {  // random MTP weights: a low rate is the expected outcome, not a loading fault
    o << "speculative self-test: ";
    counts();
    o << " -- expected with --synthetic-weights (random drafts never agree); to see what MTP does to step time, "
         "benchmark with --speculative-simulate-acceptance";
    return {false, o.str()};
  }
  o << "\n"
    << "*********************************************************************************\n"
    << "* SPECULATIVE SELF-TEST FAILED: the MTP draft almost never agrees with the model.\n"
    << "*   ";
  counts();
  o << " < rate " << SpecSelfTestReport::kMinHealthyRate << " over " << r.prompts << " built-in prompts, N="
    << r.num_steps << ".\n"
    << "* Speculation will cost time and gain nothing (the adaptive policy will turn it off).\n"
    << "* Likely cause: the MTP/NextN layer (model.layers.<num_hidden_layers>.*) was loaded with the\n"
    << "* wrong precision or under the wrong tensor names - e.g. a quantized checkpoint whose\n"
    << "* quantizer exclude-list named the MTP layer differently, so it was quantized or skipped;\n"
    << "* also check eh_proj / enorm / hnorm / shared_head are present and not zero.\n"
    << "* Use --speculative-skip-self-test to skip this check.\n"
    << "*********************************************************************************";
  return {true, o.str()};
}

void log_spec_self_test(const SpecSelfTestReport& r, bool synthetic_weights) {
  const SpecSelfTestMessage m = spec_self_test_message(r, synthetic_weights);
  if (m.warn)
    MX_LOG(kWarn) << m.text;
  else
    MX_LOG(kInfo) << m.text;
}

Status spec_self_test_after_load(model::CausalLM& model, backend::Backend& be, const SpecConfig& spec,
                                 int64_t block_size, bool synthetic_weights, int dp_ranks) {
  if (spec.num_steps <= 0) return Status::ok();
  if (spec.simulate_acceptance) {
    MX_LOG(kInfo) << "speculative self-test skipped: --speculative-simulate-acceptance (benchmark mode; the "
                     "acceptance is simulated and synthetic drafts never agree)";
    return Status::ok();
  }
  if (!spec.self_test) {
    MX_LOG(kInfo) << "speculative self-test skipped: --speculative-skip-self-test";
    return Status::ok();
  }
  // One sequence's worth of blocks per DP rank's range (a DP model places each sequence in one range).
  const int64_t n_blocks = ((64 + 32 + spec.num_steps + 1) / block_size + 8) * std::max(1, dp_ranks);
  auto report = run_spec_self_test(make_model_executor(model, be, n_blocks, block_size), spec, n_blocks, block_size,
                                   32, dp_ranks);
  if (!report.is_ok()) return report.status().with_context("speculative self-test");
  log_spec_self_test(*report, synthetic_weights);
  return Status::ok();
}

}  // namespace mxserve::runtime
