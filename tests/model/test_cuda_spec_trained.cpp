// Speculative vs plain greedy decoding on CUDA with the tiny trained GLM (models/tiny-glm-trained: an MTP layer whose
// drafts are accepted on real text), chain N=4 and tree (depth 3, topk 4, 8 draft tokens), label gpu. Greedy
// speculation is lossless in exact arithmetic; on bf16 the verify batch and the one-row decode round differently, so
// every prompt whose outputs differ is judged at its first differing token by the CPU fp32 reference's logit margin
// against the bf16 format bound (cli/spec_divergence.h): every divergence must be within it, and the drafts must be
// accepted (acceptance length > 1.5), or the test proves nothing. MXSERVE_REPO_ROOT overrides the source tree (the
// GPU machine runs from a copied tree).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "backend/backend.h"
#include "cli/eval_common.h"
#include "cli/spec_divergence.h"
#include "model/causal_lm.h"
#include "model/decisions.h"

namespace mxserve {
namespace {

std::string repo_root() {
  const char* env = std::getenv("MXSERVE_REPO_ROOT");
  return env ? std::string(env) : std::string(MXSERVE_SOURCE_DIR);
}

struct Mode {
  const char* name;
  int32_t steps, topk, draft_tokens;
};

class CudaSpecTrained : public ::testing::TestWithParam<Mode> {};

TEST_P(CudaSpecTrained, DivergencesAreWithinTheFormatBound) {
  auto be = backend::make_backend("cuda");
  if (!be.is_ok()) GTEST_SKIP() << "no CUDA device: run on the GPU machine (" << be.status().to_string() << ")";
  const std::string dir = repo_root() + "/models/tiny-glm-trained";
  model::LoadOptions lo;
  auto lm = model::load_causal_lm(dir, **be, lo);
  ASSERT_TRUE(lm.is_ok()) << lm.status().to_string();
  ASSERT_TRUE((*lm)->has_mtp());
  auto ids = cli::text_file_ids(repo_root() + "/tests/data/tiny_glm/heldout_sample.txt", dir, 0,
                                (*lm)->config().vocab_size);
  ASSERT_TRUE(ids.is_ok()) << ids.status().to_string();
  const int64_t n_prompts = 8, prompt_len = 128, gen = 256, N = static_cast<int64_t>(ids->size());
  ASSERT_GE(N, prompt_len);
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t i = 0; i < n_prompts; ++i) {
    const int64_t start = i * (N - prompt_len) / (n_prompts - 1);
    prompts.emplace_back(ids->begin() + start, ids->begin() + start + prompt_len);
  }
  const Mode m = GetParam();
  runtime::SpecConfig off, on;
  on.num_steps = m.steps;
  on.topk = m.topk;
  on.num_draft_tokens = m.draft_tokens;
  on.adaptive = false;
  auto plain = cli::generate_greedy_all(**lm, **be, prompts, off, gen);
  ASSERT_TRUE(plain.is_ok()) << plain.status().to_string();
  auto spec = cli::generate_greedy_all(**lm, **be, prompts, on, gen);
  ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
  const auto& s = spec->spec;
  const double acc_len = s.num_drafts > 0 ? 1.0 + static_cast<double>(s.num_accepted_tokens) / s.num_drafts : 1.0;
  auto div = cli::judge_spec_divergences(dir, prompts, plain->outputs, spec->outputs, model::kBf16UnitRoundoff);
  ASSERT_TRUE(div.is_ok()) << div.status().to_string();
  int beyond = 0;
  for (const auto& d : *div) {
    std::printf("%s: %s\n", m.name, cli::describe(d).c_str());
    beyond += d.within_bound() ? 0 : 1;
  }
  std::printf("%s: acceptance length %.3f, %zu/%lld prompts diverge, %d beyond the bound\n", m.name, acc_len, div->size(),
              static_cast<long long>(n_prompts), beyond);
  EXPECT_GT(acc_len, 1.5) << "drafts are hardly accepted: the comparison would prove nothing";
  EXPECT_EQ(beyond, 0);
}

INSTANTIATE_TEST_SUITE_P(Modes, CudaSpecTrained,
                         ::testing::Values(Mode{"chain4", 4, 1, 0}, Mode{"tree3x4x8", 3, 4, 8}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace mxserve
