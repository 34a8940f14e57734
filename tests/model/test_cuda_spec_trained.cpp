// Speculative vs plain greedy decoding on CUDA with the tiny trained GLM (models/tiny-glm-trained: an MTP layer whose
// drafts are accepted on real text), chain N=4 and tree (depth 3, topk 4, 8 draft tokens), label gpu. Greedy
// speculation is lossless in exact arithmetic; on bf16 the verify batch and the one-row decode round differently, so
// every prompt whose outputs differ is judged at its first differing token by the CPU fp32 reference's logit margin
// against the bf16 format bound (cli/spec_divergence.h): every divergence must be within it, and the drafts must be
// accepted (acceptance length > 1.5), or the test proves nothing. MXSERVE_REPO_ROOT overrides the source tree (the
// GPU machine runs from a copied tree).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "backend/backend.h"
#include "cli/eval_common.h"
#include "cli/spec_divergence.h"
#include "model/causal_lm.h"
#include "model/decisions.h"
#include "runtime/sequence_runner.h"

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
  auto div = cli::judge_spec_divergences(dir, **lm, **be, on, prompts, plain->outputs, spec->outputs, model::kBf16UnitRoundoff);
  ASSERT_TRUE(div.is_ok()) << div.status().to_string();
  int beyond = 0;
  for (const auto& d : *div) {
    std::printf("%s: %s\n", m.name, cli::describe(d).c_str());
    beyond += d.legitimate() ? 0 : 1;
  }
  std::printf("%s: acceptance length %.3f, %zu/%lld prompts diverge, %d beyond the bound\n", m.name, acc_len, div->size(),
              static_cast<long long>(n_prompts), beyond);
  EXPECT_GT(acc_len, 1.5) << "drafts are hardly accepted: the comparison would prove nothing";
  EXPECT_EQ(beyond, 0);
}

INSTANTIATE_TEST_SUITE_P(Modes, CudaSpecTrained,
                         ::testing::Values(Mode{"chain4", 4, 1, 0}, Mode{"tree3x4x8", 3, 4, 8}),
                         [](const auto& info) { return std::string(info.param.name); });

// Localizing the divergence: a speculative verify is one multi-row extend over a long context; plain decoding is
// one row a step. For context lengths c and row counts k, the logits of rows [c, c + k) from one k-row extend (A)
// and from k one-row steps (B) against the CPU reference's teacher-forced rows (R), on the default attention
// plan and with the attention kernel forced to "shared" (A_shared). A path whose error against R is far above the
// one-row path's at some shape is the bug.
double rel_l2(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

TEST(CudaSpecTrainedDiag, MultiRowExtendMatchesOneRowDecode) {
  auto be = backend::make_backend("cuda");
  if (!be.is_ok()) GTEST_SKIP() << "no CUDA device: run on the GPU machine (" << be.status().to_string() << ")";
  backend::BackendOptions so;
  so.kernels.attention_kernel = "shared";
  auto be_shared = backend::make_backend("cuda", so);
  ASSERT_TRUE(be_shared.is_ok()) << be_shared.status().to_string();
  auto cpu = backend::make_cpu_backend();
  const std::string dir = repo_root() + "/models/tiny-glm-trained";
  model::LoadOptions lo;
  lo.load_mtp = false;
  auto lm = model::load_causal_lm(dir, **be, lo), lm_shared = model::load_causal_lm(dir, **be_shared, lo);
  auto ref = model::load_causal_lm(dir, *cpu, lo);
  ASSERT_TRUE(lm.is_ok() && lm_shared.is_ok() && ref.is_ok());
  const int64_t V = (*ref)->config().vocab_size;
  auto ids = cli::text_file_ids(repo_root() + "/tests/data/tiny_glm/heldout_sample.txt", dir, 600, V);
  ASSERT_TRUE(ids.is_ok()) << ids.status().to_string();
  runtime::SequenceRunner ra(**lm, **be, 128, 16), rs(**lm_shared, **be_shared, 128, 16), rr(**ref, *cpu, 128, 16);
  auto extend_rows = [](runtime::SequenceRunner& r, const std::vector<int32_t>& t, int64_t c, int64_t k, bool one_by_one) {
    runtime::SequenceState st;
    std::vector<float> out;
    EXPECT_TRUE(r.extend({&st}, {std::vector<int32_t>(t.begin(), t.begin() + c)}, false, false).is_ok());
    for (int64_t i = 0; i < (one_by_one ? k : 1); ++i) {
      const int64_t b = c + i, e = one_by_one ? b + 1 : c + k;
      auto step = r.extend({&st}, {std::vector<int32_t>(t.begin() + b, t.begin() + e)}, true, false);
      EXPECT_TRUE(step.is_ok());
      if (step.is_ok()) out.insert(out.end(), step->logits.data<float>(), step->logits.data<float>() + (e - b) * step->logits.dim(1));
    }
    r.release(st);
    return out;
  };
  int worse = 0;
  for (int64_t c : {31, 64, 100, 127, 128, 129, 160, 192, 200, 217, 255, 256, 300, 383, 500}) {
    for (int64_t k : {2, 5, 8}) {
      if (c + k > static_cast<int64_t>(ids->size())) continue;
      runtime::SequenceState st;
      auto full = rr.extend({&st}, {std::vector<int32_t>(ids->begin(), ids->begin() + c + k)}, true, false);
      rr.release(st);
      ASSERT_TRUE(full.is_ok());
      const float* R = full->logits.data<float>() + c * V;
      const auto A = extend_rows(ra, *ids, c, k, false), B = extend_rows(ra, *ids, c, k, true);
      const auto S = extend_rows(rs, *ids, c, k, false);
      const double ea = rel_l2(A.data(), R, k * V), eb = rel_l2(B.data(), R, k * V), es = rel_l2(S.data(), R, k * V);
      int arg_a = 0, arg_b = 0;  // rows whose argmax differs from the reference's
      for (int64_t i = 0; i < k; ++i) {
        auto am = [&](const float* x) { return std::max_element(x, x + V) - x; };
        arg_a += am(A.data() + i * V) != am(R + i * V);
        arg_b += am(B.data() + i * V) != am(R + i * V);
      }
      const bool bad = ea > 3 * std::max(eb, 2e-3);
      worse += bad;
      std::printf("c=%-4lld k=%lld: extend rel_l2 %.3e (argmax diff %d), one-row %.3e (%d), extend[shared] %.3e%s\n",
                  static_cast<long long>(c), static_cast<long long>(k), ea, arg_a, eb, arg_b, es,
                  bad ? "  <-- extend far above one-row" : "");
    }
  }
  EXPECT_EQ(worse, 0);
}

}  // namespace
}  // namespace mxserve
