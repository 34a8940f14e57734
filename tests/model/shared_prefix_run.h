// Requests that share a long prompt prefix, run through one engine so their decode rows share the prefix's
// physical blocks (the prefix cache hands them the same blocks): the first request is prefilled alone (its prompt
// enters the cache), then the rest join. Used by test_cuda_cascade_engine (gpu: cascade vs per-sequence attention)
// and test_greedy_divergence (cpu: the judge on a batched run with prefix-cache hits). Test-only.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "model/causal_lm.h"
#include "runtime/engine.h"

namespace mxserve::testing_support {

struct SharedPrefixRun {
  std::map<size_t, std::vector<int32_t>> tokens;
  std::map<size_t, std::vector<float>> top2_gap;  // logprob(top 1) - logprob(top 2) per token (logprobs >= 2)
  std::map<size_t, int32_t> cached;               // prompt tokens served from the prefix cache
  // Every request's tokens in submission order (empty for a request that produced none).
  std::vector<std::vector<int32_t>> outputs(size_t n) const {
    std::vector<std::vector<int32_t>> out(n);
    for (const auto& [i, t] : tokens)
      if (i < n) out[i] = t;
    return out;
  }
};

inline Result<SharedPrefixRun> run_shared_prefix(model::CausalLM& lm, backend::Backend& be,
                                                 const std::vector<runtime::RequestSpec>& specs, bool graphs) {
  runtime::EngineConfig cfg;
  cfg.scheduler.block_size = 16;
  cfg.scheduler.max_running = 16;
  cfg.max_model_len = 512;
  cfg.n_blocks = 512;
  cfg.cuda_graphs = graphs;
  runtime::Engine engine(cfg, runtime::make_model_executor(lm, be, cfg.n_blocks, cfg.scheduler.block_size));
  SharedPrefixRun r;
  std::map<runtime::RequestId, size_t> index;
  std::string error;
  auto submit = [&](size_t i) -> Status {
    auto id = engine.submit(specs[i], [&r, &index, &error](const runtime::TokenEvent& ev) {
      if (ev.finish == runtime::FinishReason::kError && error.empty()) error = ev.error;
      if (ev.token < 0) return;
      const size_t k = index.at(ev.id);
      r.tokens[k].push_back(ev.token);
      if (ev.top_logprobs.size() >= 2) r.top2_gap[k].push_back(ev.top_logprobs[0].logprob - ev.top_logprobs[1].logprob);
      r.cached[k] = ev.usage.cached_tokens;
    });
    if (!id.is_ok()) return id.status();
    index[*id] = i;
    return Status::ok();
  };
  MX_RETURN_IF_ERROR(submit(0));
  for (int s = 0; s < 64 && r.tokens[0].size() < 2; ++s) engine.step();
  for (size_t i = 1; i < specs.size(); ++i) MX_RETURN_IF_ERROR(submit(i));
  while (!engine.idle()) engine.step();
  if (!error.empty()) return internal_error("shared-prefix run: " + error);
  return r;
}

}  // namespace mxserve::testing_support
