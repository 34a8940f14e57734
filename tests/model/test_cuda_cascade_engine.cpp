// Cascade (shared-prefix) decode attention through the engine (label gpu; skips without a CUDA device): on the
// glm4_moe fixtures, requests sharing a long prompt prefix (> 4 blocks, served from the prefix cache, so their
// block tables share the physical blocks) run with the cascade path off (A: per-sequence attention), on in eager
// steps (every group pays: cascade_min_saved_bytes 0) and on inside CUDA graphs; the cascade kernels must have
// run (kernels::cuda::cascade_attention_launches). Greedy tokens must be equal, or each request's first differing
// token judged legitimate by the shared judge (cli/greedy_divergence.h): the CPU fp32 reference's margin between
// the two tokens within the bf16 format bound (printed: margin, bound, ratio), or beyond it explained by router
// decisions that flip within their own bound (replayed eagerly with the reference's decisions forced). A
// divergence beyond the bound fails. MXSERVE_FIXTURE_ROOT overrides the fixtures directory.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <map>

#include "backend/backend.h"
#include "cli/fixture.h"
#include "cli/greedy_divergence.h"
#include "kernels/cuda/attention/cascade_attention.h"
#include "model/causal_lm.h"
#include "model/decisions.h"
#include "runtime/engine.h"
#include "shared_prefix_run.h"

namespace mxserve::runtime {
namespace {

using testing_support::run_shared_prefix;
using testing_support::SharedPrefixRun;

std::string fixture_dir(const std::string& name) {
  const char* env = std::getenv("MXSERVE_FIXTURE_ROOT");
  return (env ? std::string(env) : std::string(MXSERVE_SOURCE_DIR) + "/tests/fixtures") + "/" + name;
}

class CudaCascadeEngine : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaCascadeEngine, GreedyTokensEqualOrFirstDivergenceWithinTheBound) {
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
  auto base = run_shared_prefix(**lm_off, **be_off, specs_lp, false);
  ASSERT_TRUE(base.is_ok()) << base.status().to_string();
  const int64_t before = kernels::cuda::cascade_attention_launches();
  auto eager = run_shared_prefix(**lm_on, **be_on, specs, false);
  ASSERT_TRUE(eager.is_ok()) << eager.status().to_string();
  const int64_t eager_launches = kernels::cuda::cascade_attention_launches() - before;
  auto graphs = run_shared_prefix(**lm_on, **be_on, specs, true);
  ASSERT_TRUE(graphs.is_ok()) << graphs.status().to_string();
  const int64_t graph_launches = kernels::cuda::cascade_attention_launches() - before - eager_launches;
  std::printf("%s: cascade launches eager %lld, graphs (captures + eager steps) %lld\n", GetParam().c_str(),
              static_cast<long long>(eager_launches), static_cast<long long>(graph_launches));
  EXPECT_GT(eager_launches, 0) << "the eager cascade path never ran";
  EXPECT_GT(graph_launches, 0) << "no cascade graph was captured";
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& s : specs) prompts.push_back(s.prompt);
  for (size_t i = 0; i < specs.size(); ++i) {
    ASSERT_EQ(base->tokens.at(i).size(), 24u);
    if (i > 0) {
      EXPECT_GE(eager->cached.at(i), 96) << "request " << i << " did not hit the shared prefix";
    }
  }
  // The judge's replays: the same requests through a fresh engine, eagerly (decisions are observed only in eager
  // forwards; a graph run's divergence is replayed through the eager cascade path, and `reproduced` says whether
  // that replay still makes the graph run's choice).
  auto replay = [&](backend::Backend& be, const std::vector<RequestSpec>& s) -> cli::GreedyReplay {
    return [&be, &s](model::CausalLM& m, size_t i) -> Result<std::vector<int32_t>> {
      MX_ASSIGN_OR_RETURN(SharedPrefixRun r, run_shared_prefix(m, be, s, false));
      return r.tokens[i];
    };
  };
  const cli::GreedyConfig per_seq{"per-sequence", lm_off->get(), replay(**be_off, specs_lp)};
  const cli::GreedyConfig cascade{"cascade", lm_on->get(), replay(**be_on, specs)};
  const cli::GreedyConfig cascade_graphs{"cascade in graphs", lm_on->get(), replay(**be_on, specs)};
  const auto a_out = base->outputs(specs.size());
  for (const auto& [b_cfg, run] : {std::pair{&cascade, &*eager}, std::pair{&cascade_graphs, &*graphs}}) {
    auto div = cli::judge_greedy_divergences(dir, prompts, a_out, run->outputs(specs.size()), per_seq, *b_cfg,
                                             model::kBf16UnitRoundoff);
    ASSERT_TRUE(div.is_ok()) << b_cfg->name << ": " << div.status().to_string();
    int beyond = 0;
    for (const cli::GreedyDivergence& d : *div) {
      const auto it = base->top2_gap.find(d.prompt);
      const float gap = it != base->top2_gap.end() && d.index < static_cast<int64_t>(it->second.size())
                            ? it->second[d.index]
                            : -1.0f;
      std::printf("[ judged  ] %s %s (per-sequence top-2 logprob gap there %.4g): margin %.4g, bound %.4g, ratio %.3g "
                  "-> %s\n  %s\n",
                  GetParam().c_str(), b_cfg->name.c_str(), gap, d.margin, d.bound, d.ratio(),
                  d.legitimate() ? "legitimate" : "A BUG", cli::describe(d).c_str());
      beyond += d.legitimate() ? 0 : 1;
      EXPECT_TRUE(d.legitimate()) << GetParam() << " " << b_cfg->name << ": " << cli::describe(d);
    }
    std::printf("%s %s: %zu/%zu requests diverge, %d beyond the bf16 bound\n", GetParam().c_str(),
                b_cfg->name.c_str(), div->size(), specs.size(), beyond);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaCascadeEngine, ::testing::Values("glm4_moe_tiny_a", "glm4_moe_tiny_b"));

}  // namespace
}  // namespace mxserve::runtime
