// Prompt logprobs (SamplingParams::prompt_logprobs) through the engine with the real tiny glm4_moe model: equal to
// the teacher-forced log-softmax of one whole-prompt forward (SequenceRunner, all rows) whether the prompt runs in
// one chunk or several, batched with other requests, after a request that filled the prefix cache with the same
// prompt (such a request skips the cache), and under preemption; delivered once, on the first token's event.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "backend/backend.h"
#include "model/causal_lm.h"
#include "runtime/engine.h"
#include "runtime/sequence_runner.h"

namespace mxserve::runtime {
namespace {

const std::string kModel = std::string(MXSERVE_SOURCE_DIR) + "/tests/fixtures/glm4_moe_tiny_a";

struct Loaded {
  std::unique_ptr<backend::Backend> be = backend::make_cpu_backend();
  std::unique_ptr<model::CausalLM> lm;
  Loaded() {
    auto m = model::load_causal_lm(kModel, *be, model::LoadOptions{.load_mtp = false});
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    lm = std::move(*m);
  }
};
Loaded& shared_model() {
  static Loaded loaded;
  return loaded;
}

std::vector<int32_t> prompt_of(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(static_cast<int32_t>((7 + 31 * i + 13 * salt) % 380 + 1));
  return p;
}

// log-softmax[t][token t+1] of one forward over the whole prompt.
std::vector<double> reference(const std::vector<int32_t>& prompt) {
  Loaded& m = shared_model();
  SequenceRunner runner(*m.lm, *m.be, 64, 4);
  SequenceState seq;
  auto r = runner.extend({&seq}, {prompt}, /*all_logits=*/true, false);
  EXPECT_TRUE(r.is_ok());
  const int64_t V = r->logits.dim(1);
  std::vector<double> out;
  for (size_t t = 0; t + 1 < prompt.size(); ++t) {
    const float* row = r->logits.data<float>() + t * V;
    const double mx = *std::max_element(row, row + V);
    double z = 0;
    for (int64_t v = 0; v < V; ++v) z += std::exp(static_cast<double>(row[v]) - mx);
    out.push_back(row[prompt[t + 1]] - mx - std::log(z));
  }
  return out;
}

struct EngineRun {
  std::map<size_t, std::vector<PromptLogprob>> prompt_lps;
  std::map<size_t, int> deliveries;
  std::map<size_t, Usage> usage;
  int64_t preemptions = 0;
};

EngineRun run_engine(const std::vector<RequestSpec>& specs, int64_t n_blocks, int64_t chunk) {
  Loaded& m = shared_model();
  EngineConfig cfg;
  cfg.scheduler.block_size = 4;
  cfg.scheduler.max_num_batched_tokens = 64;
  cfg.scheduler.chunked_prefill_size = chunk;
  cfg.scheduler.enable_prefix_cache = true;
  cfg.n_blocks = n_blocks;
  cfg.max_model_len = 512;
  Engine engine(cfg, make_model_executor(*m.lm, *m.be, n_blocks, 4));
  EngineRun out;
  for (size_t i = 0; i < specs.size(); ++i) {
    auto id = engine.submit(specs[i], [&out, i](const TokenEvent& ev) {
      if (!ev.prompt_logprobs.empty()) {
        out.prompt_lps[i] = ev.prompt_logprobs;
        ++out.deliveries[i];
      }
      if (ev.finish != FinishReason::kNone) out.usage[i] = ev.usage;
    });
    EXPECT_TRUE(id.is_ok()) << id.status().to_string();
    if (i == 0) while (!engine.idle()) engine.step();  // the first request fills the prefix cache alone
  }
  while (!engine.idle()) {
    engine.step();
    EXPECT_TRUE(engine.check_invariants().is_ok());
  }
  out.preemptions = engine.stats().scheduler.preemptions;
  return out;
}

std::vector<RequestSpec> specs() {
  std::vector<RequestSpec> v;
  for (int i = 0; i < 5; ++i) {
    RequestSpec s;
    s.prompt = prompt_of(i == 1 ? 40 : 18 + 5 * i, i == 1 ? 0 : i);  // request 1 repeats request 0's prompt
    s.sampling.temperature = 0;
    s.sampling.max_tokens = 6;
    s.sampling.ignore_eos = true;
    if (i % 2 == 1) s.sampling.prompt_logprobs = 2;
    v.push_back(s);
  }
  v[0].prompt = prompt_of(40, 0);
  return v;
}

void check(const EngineRun& r, const std::vector<RequestSpec>& s) {
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i].sampling.prompt_logprobs < 0) {
      EXPECT_EQ(r.deliveries.count(i), 0u) << i;
      continue;
    }
    ASSERT_EQ(r.deliveries.at(i), 1) << "delivered once, request " << i;
    const auto& lps = r.prompt_lps.at(i);
    const auto ref = reference(s[i].prompt);
    ASSERT_EQ(lps.size(), s[i].prompt.size() - 1);
    for (size_t t = 0; t < lps.size(); ++t) {
      EXPECT_EQ(lps[t].token, s[i].prompt[t + 1]);
      EXPECT_NEAR(lps[t].logprob, ref[t], 2e-4) << "request " << i << " position " << t + 1;
      ASSERT_EQ(lps[t].top.size(), 2u);
      EXPECT_GE(lps[t].top[0].logprob, lps[t].top[1].logprob);
      EXPECT_GE(lps[t].rank, 1);
      EXPECT_EQ(lps[t].rank == 1, lps[t].top[0].token == lps[t].token || lps[t].top[0].logprob == lps[t].logprob);
    }
  }
}

TEST(EnginePromptLogprobs, EqualTeacherForcedInOneChunkOrMany) {
  const auto s = specs();
  const EngineRun one = run_engine(s, 512, 64);
  check(one, s);
  EXPECT_EQ(one.usage.at(1).cached_tokens, 0) << "a prompt-logprobs request skips the prefix cache";
  const EngineRun many = run_engine(s, 512, 8);  // 40 tokens in 5 chunks
  check(many, s);
}

TEST(EnginePromptLogprobs, UnderPreemption) {
  const auto s = specs();
  const EngineRun tight = run_engine(s, 16, 8);  // 64 tokens of KV for five requests of 24-46 tokens
  EXPECT_GT(tight.preemptions, 0);
  check(tight, s);
}

TEST(EnginePromptLogprobs, BoundedByMaxLogprobs) {
  Loaded& m = shared_model();
  EngineConfig cfg;
  cfg.n_blocks = 64;
  cfg.scheduler.block_size = 4;
  Engine engine(cfg, make_model_executor(*m.lm, *m.be, 64, 4));
  RequestSpec spec;
  spec.prompt = prompt_of(8, 1);
  spec.sampling.prompt_logprobs = cfg.max_logprobs + 1;
  auto id = engine.submit(spec, [](const TokenEvent&) {});
  ASSERT_FALSE(id.is_ok());
  EXPECT_NE(id.status().message().find("prompt_logprobs"), std::string::npos);
}

}  // namespace
}  // namespace mxserve::runtime
