// Speculative vs plain greedy decoding judged by the format bound (spec_divergence.h).
#include "cli/spec_divergence.h"

#include <chrono>
#include <utility>

#include "runtime/executor.h"

namespace mxserve::cli {

Result<GreedyRuns> generate_greedy_all(model::CausalLM& m, backend::Backend& be,
                                       const std::vector<std::vector<int32_t>>& prompts, const runtime::SpecConfig& spec,
                                       int64_t gen_tokens) {
  runtime::EngineConfig ec;
  const int64_t block = 16;
  ec.scheduler.block_size = block;
  const int64_t per_seq =
      static_cast<int64_t>(prompts[0].size()) + gen_tokens + 2 * runtime::SpecConfig::kMaxTreeNodes + spec.num_steps;
  ec.n_blocks = (per_seq + block - 1) / block + 8;
  ec.max_model_len = static_cast<int64_t>(prompts[0].size()) + gen_tokens + 1;
  ec.spec = spec;
  ec.spec.self_test = false;
  runtime::Engine engine(ec, runtime::make_model_executor(m, be, ec.n_blocks, block));
  GreedyRuns run;
  for (const auto& p : prompts) {
    std::vector<int32_t> out;
    std::string error;
    std::chrono::steady_clock::time_point first;
    runtime::RequestSpec req;
    req.prompt = p;
    req.sampling.temperature = 0;
    req.sampling.max_tokens = static_cast<int32_t>(gen_tokens);
    req.sampling.ignore_eos = true;
    auto id = engine.submit(req, [&](const runtime::TokenEvent& ev) {
      if (ev.token >= 0) {
        if (out.empty()) first = std::chrono::steady_clock::now();
        out.push_back(ev.token);
      }
      if (ev.finish == runtime::FinishReason::kError) error = ev.error;
    });
    if (!id.is_ok()) return id.status();
    while (!engine.idle()) engine.step();
    if (!error.empty()) return internal_error(error);
    run.decode_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - first).count();
    run.decode_tokens += static_cast<int64_t>(out.size()) - 1;
    run.outputs.push_back(std::move(out));
  }
  run.spec = engine.stats().spec;
  return run;
}

Result<std::vector<SpecDivergence>> judge_spec_divergences(const std::string& dir, model::CausalLM& m,
                                                           backend::Backend& be, const runtime::SpecConfig& spec_on,
                                                           const std::vector<std::vector<int32_t>>& prompts,
                                                           const std::vector<std::vector<int32_t>>& plain,
                                                           const std::vector<std::vector<int32_t>>& spec, double u) {
  if (plain.size() != prompts.size())
    return invalid_argument("judge_spec_divergences: " + std::to_string(prompts.size()) + " prompts but " +
                            std::to_string(plain.size()) + " plain outputs");
  // Each run is replayed for its one prompt through a fresh engine, as generate_greedy_all ran it.
  auto replay_with = [&be, &prompts, &plain](const runtime::SpecConfig& cfg) -> GreedyReplay {
    return [&be, &prompts, &plain, cfg](model::CausalLM& tagged, size_t i) -> Result<std::vector<int32_t>> {
      MX_ASSIGN_OR_RETURN(GreedyRuns r, generate_greedy_all(tagged, be, {prompts[i]}, cfg,
                                                            static_cast<int64_t>(plain[i].size())));
      return std::move(r.outputs[0]);
    };
  };
  const GreedyConfig a{"plain", &m, replay_with(runtime::SpecConfig{})};
  const GreedyConfig b{"speculative", &m, replay_with(spec_on)};
  return judge_greedy_divergences(dir, prompts, plain, spec, a, b, u);
}

}  // namespace mxserve::cli
