// Cascade (shared-prefix) decode attention through the engine (label gpu; skips without a CUDA device): on the
// glm4_moe fixtures, requests sharing a long prompt prefix (> 4 blocks, served from the prefix cache, so their
// block tables share the physical blocks) give the same greedy tokens with the cascade path off, on in eager
// steps (every group pays: cascade_min_saved_bytes 0) and on inside CUDA graphs; the cascade kernels must have
// run (kernels::cuda::cascade_attention_launches). MXSERVE_FIXTURE_ROOT overrides the fixtures directory.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <map>

#include "backend/backend.h"
#include "cli/fixture.h"
#include "kernels/cuda/attention/cascade_attention.h"
#include "model/causal_lm.h"
#include "runtime/engine.h"

namespace mxserve::runtime {
namespace {

std::string fixture_dir(const std::string& name) {
  const char* env = std::getenv("MXSERVE_FIXTURE_ROOT");
  return (env ? std::string(env) : std::string(MXSERVE_SOURCE_DIR) + "/tests/fixtures") + "/" + name;
}

struct EngineRun {
  std::map<size_t, std::vector<int32_t>> tokens;
  std::map<size_t, std::vector<float>> top2_gap;  // logprob(top 1) - logprob(top 2) per token (logprobs >= 1)
  std::map<size_t, int32_t> cached;
};

// The first request is prefilled alone (its prompt enters the prefix cache), then the rest join: their prompts
// hit the cache, so the decode batch holds rows whose block tables share the prefix blocks.
EngineRun run(model::CausalLM& lm, backend::Backend& be, const std::vector<RequestSpec>& specs, bool graphs) {
  EngineConfig cfg;
  cfg.scheduler.block_size = 16;
  cfg.scheduler.max_running = 16;
  cfg.max_model_len = 512;
  cfg.n_blocks = 512;
  cfg.cuda_graphs = graphs;
  Engine engine(cfg, make_model_executor(lm, be, cfg.n_blocks, cfg.scheduler.block_size));
  EngineRun r;
  std::map<RequestId, size_t> index;
  auto submit = [&](size_t i) {
    auto id = engine.submit(specs[i], [&r, &index](const TokenEvent& ev) {
      if (ev.token < 0) return;
      r.tokens[index.at(ev.id)].push_back(ev.token);
      if (ev.top_logprobs.size() >= 2)
        r.top2_gap[index.at(ev.id)].push_back(ev.top_logprobs[0].logprob - ev.top_logprobs[1].logprob);
      r.cached[index.at(ev.id)] = ev.usage.cached_tokens;
    });
    EXPECT_TRUE(id.is_ok()) << id.status().to_string();
    index[*id] = i;
  };
  submit(0);
  for (int s = 0; s < 64 && r.tokens[0].size() < 2; ++s) engine.step();
  for (size_t i = 1; i < specs.size(); ++i) submit(i);
  while (!engine.idle()) engine.step();
  return r;
}

class CudaCascadeEngine : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaCascadeEngine, GreedyTokensEqualWithAndWithoutCascade) {
  const std::string dir = fixture_dir(GetParam());
  backend::BackendOptions off, on;
  off.kernels.cascade_attention = false;
  on.kernels.cascade_min_saved_bytes = 0;  // the fixtures are tiny: every group pays
  auto be_off = backend::make_backend("cuda", off);
  if (!be_off.is_ok()) GTEST_SKIP() << "no CUDA device: run on the GPU machine (" << be_off.status().to_string() << ")";
  auto be_on = backend::make_backend("cuda", on);
  ASSERT_TRUE(be_on.is_ok()) << be_on.status().to_string();
  auto lm_off = model::load_causal_lm(dir, **be_off, model::LoadOptions{});
  auto lm_on = model::load_causal_lm(dir, **be_on, model::LoadOptions{});
  ASSERT_TRUE(lm_off.is_ok() && lm_on.is_ok());
  auto cases = cli::read_fixture_cases(dir, (*lm_off)->config().vocab_size);
  ASSERT_TRUE(cases.is_ok() && !cases->empty());
  // A shared prefix of 100 tokens (6 whole blocks of 16 + 4), then 1..3 distinct tokens per request.
  std::vector<int32_t> prefix;
  for (size_t c = 0; prefix.size() < 100; c = (c + 1) % cases->size())
    for (int32_t t : (*cases)[c].input_ids)
      if (prefix.size() < 100) prefix.push_back(t);
  std::vector<RequestSpec> specs;
  for (size_t i = 0; i < 6; ++i) {
    RequestSpec s;
    s.prompt = prefix;
    for (size_t j = 0; j <= i % 3; ++j) s.prompt.push_back(static_cast<int32_t>(1 + i + 7 * j));
    s.sampling.temperature = 0;
    s.sampling.max_tokens = 24;
    s.sampling.ignore_eos = true;
    specs.push_back(s);
  }
  // The reference run also reports the top-2 logprobs, so a divergence prints the reference's margin there.
  std::vector<RequestSpec> specs_lp = specs;
  for (auto& s : specs_lp) s.sampling.logprobs = 2;
  const EngineRun base = run(**lm_off, **be_off, specs_lp, false);
  const int64_t before = kernels::cuda::cascade_attention_launches();
  const EngineRun eager = run(**lm_on, **be_on, specs, false);
  const int64_t eager_launches = kernels::cuda::cascade_attention_launches() - before;
  const EngineRun graphs = run(**lm_on, **be_on, specs, true);
  const int64_t graph_launches = kernels::cuda::cascade_attention_launches() - before - eager_launches;
  std::printf("%s: cascade launches eager %lld, graphs (captures + eager steps) %lld\n", GetParam().c_str(),
              static_cast<long long>(eager_launches), static_cast<long long>(graph_launches));
  EXPECT_GT(eager_launches, 0) << "the eager cascade path never ran";
  EXPECT_GT(graph_launches, 0) << "no cascade graph was captured";
  for (size_t i = 0; i < specs.size(); ++i) {
    ASSERT_EQ(base.tokens.at(i).size(), 24u);
    if (i > 0) {
      EXPECT_GE(eager.cached.at(i), 96) << "request " << i << " did not hit the shared prefix";
    }
    for (size_t k = 0; k < base.tokens.at(i).size() && k < eager.tokens.at(i).size(); ++k)
      if (eager.tokens.at(i)[k] != base.tokens.at(i)[k]) {
        const auto it = base.top2_gap.find(i);
        const std::vector<float> gaps = it != base.top2_gap.end() ? it->second : std::vector<float>{};
        std::printf("[ diverge ] %s request %zu token %zu: reference %d, cascade %d, reference top-2 logprob gap %.6g\n",
                    GetParam().c_str(), i, k, base.tokens.at(i)[k], eager.tokens.at(i)[k],
                    k < gaps.size() ? gaps[k] : -1.0);
        break;
      }
    EXPECT_EQ(eager.tokens.at(i), base.tokens.at(i)) << GetParam() << " eager cascade, request " << i;
    EXPECT_EQ(graphs.tokens.at(i), base.tokens.at(i)) << GetParam() << " cascade in graphs, request " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaCascadeEngine, ::testing::Values("glm4_moe_tiny_a", "glm4_moe_tiny_b"));

}  // namespace
}  // namespace mxserve::runtime
