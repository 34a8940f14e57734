// Speculative vs plain greedy decoding judged by the format bound (spec_divergence.h).
#include "cli/spec_divergence.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "cli/fixture_decisions.h"
#include "runtime/executor.h"
#include "runtime/sequence_runner.h"

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

Result<std::vector<SpecDivergence>> judge_spec_divergences(const std::string& dir,
                                                           const std::vector<std::vector<int32_t>>& prompts,
                                                           const std::vector<std::vector<int32_t>>& plain,
                                                           const std::vector<std::vector<int32_t>>& spec, double u) {
  std::vector<SpecDivergence> out;
  std::unique_ptr<backend::Backend> cpu;
  std::unique_ptr<model::CausalLM> ref;
  Tensor w;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (plain[i] == spec[i]) continue;
    if (!ref) {  // loaded on the first divergence only
      cpu = backend::make_cpu_backend();
      model::LoadOptions lo;
      lo.load_mtp = false;
      MX_ASSIGN_OR_RETURN(ref, model::load_causal_lm(dir, *cpu, lo));
      MX_ASSIGN_OR_RETURN(w, read_output_embedding(dir, ref->config()));
    }
    SpecDivergence d;
    d.prompt = i;
    const size_t n = std::min(plain[i].size(), spec[i].size());
    while (static_cast<size_t>(d.index) < n && plain[i][d.index] == spec[i][d.index]) ++d.index;
    if (static_cast<size_t>(d.index) == n)
      return internal_error("prompt " + std::to_string(i) + ": the plain and speculative outputs differ in length (" +
                            std::to_string(plain[i].size()) + " vs " + std::to_string(spec[i].size()) + " tokens)");
    d.plain = plain[i][d.index];
    d.spec = spec[i][d.index];
    std::vector<int32_t> prefix = prompts[i];
    prefix.insert(prefix.end(), plain[i].begin(), plain[i].begin() + d.index);
    const int64_t block = 16;
    runtime::SequenceRunner runner(*ref, *cpu, static_cast<int64_t>(prefix.size()) / block + 4, block);
    runtime::SequenceState st;
    auto step = runner.extend({&st}, {prefix}, /*all_logits=*/false, /*want_hidden=*/true);
    runner.release(st);
    MX_RETURN_IF_ERROR(step.status());
    const int64_t H = ref->config().d_model;
    const Tensor hidden = cpu->to_host(step->hidden);
    const float* l = step->logits.data<float>();
    const float* h = hidden.data<float>() + (hidden.dim(0) - 1) * H;
    d.reference = runtime::argmax_row(step->logits, 0);
    const bool plain_preferred = l[d.plain] >= l[d.spec];
    const GreedyJudgement g = judge_token_flip(l, h, w, plain_preferred ? d.spec : d.plain,
                                               plain_preferred ? d.plain : d.spec, u);
    d.margin = g.margin;
    d.bound = g.bound;
    out.push_back(d);
  }
  return out;
}

std::string describe(const SpecDivergence& d) {
  char buf[320];
  std::snprintf(buf, sizeof(buf),
                "prompt %zu: first difference at generated token %lld: plain %d, speculative %d (reference argmax %d); "
                "reference margin between them %.4g %s format bound %.4g: %s",
                d.prompt, static_cast<long long>(d.index), d.plain, d.spec, d.reference, d.margin,
                d.within_bound() ? "<=" : ">", d.bound,
                d.within_bound() ? "within bf16 rounding (a legitimate divergence)" : "BEYOND the bound (a bug)");
  return buf;
}

}  // namespace mxserve::cli
