// eval/moe_activation_gate: the W4A8 start-up gate's prompts, its comparison on a real (fixture) model on the CPU
// backend, and the three log messages. The FP8 path itself runs on the GPU only (dev/gpu/prefill_limits.sh serves
// synthetic GLM-4.5-Air with --moe-activation-dtype fp8_e4m3 and reads the gate line).
#include <gtest/gtest.h>

#include <set>

#include "backend/backend.h"
#include "eval/moe_activation_gate.h"
#include "model/causal_lm.h"

namespace mxserve {
namespace {

const std::string kFixture = std::string(MXSERVE_SOURCE_DIR) + "/tests/fixtures/glm4_moe_tiny_a";

TEST(MoeActivationGate, PromptsAreDeterministicRepeatedPhrasesInsideTheVocabulary) {
  const auto a = eval::moe_activation_gate_prompts(1000, 3, 200);
  EXPECT_EQ(a, eval::moe_activation_gate_prompts(1000, 3, 200));
  ASSERT_EQ(a.size(), 3u);
  std::set<int32_t> first_phrases;
  for (const auto& p : a) {
    ASSERT_EQ(p.size(), 200u);
    for (size_t i = 0; i < p.size(); ++i) {
      EXPECT_GE(p[i], 1);
      EXPECT_LT(p[i], 1000);
      if (i >= 64) EXPECT_EQ(p[i], p[i - 64]) << "the 64-token phrase repeats";
    }
    first_phrases.insert(p[0]);
  }
  EXPECT_GT(first_phrases.size(), 1u) << "the prompts differ";
}

// The fixture model (no MTP layer) on the CPU backend.
struct FixtureModel {
  std::unique_ptr<backend::Backend> be = backend::make_cpu_backend();
  std::unique_ptr<model::CausalLM> m;
  std::string error;
  FixtureModel() {
    model::LoadOptions o;
    o.load_mtp = false;
    auto r = model::load_causal_lm(kFixture, *be, o);
    if (r.is_ok()) m = std::move(*r);
    else error = r.status().to_string();
  }
};

TEST(MoeActivationGate, SameOptionsCompareUnchangedAndTheMessageSaysTheFp8PathDidNotRun) {
  FixtureModel f;
  ASSERT_TRUE(f.m) << f.error;
  const backend::KernelOptions defaults;
  auto r = eval::compare_kernel_options(*f.m, *f.be, defaults, defaults, 2, 40);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->cmp.tokens, 2);
  EXPECT_TRUE(r->unchanged());
  EXPECT_EQ(r->cmp.top1_agree, 2);
  bool warn = false;
  const std::string text = eval::moe_activation_gate_message(*r, &warn);
  EXPECT_TRUE(warn);
  EXPECT_NE(text.find("did not run"), std::string::npos) << text;
}

TEST(MoeActivationGate, TheCpuBackendRefusesFp8ActivationsNamingTheOption) {
  FixtureModel f;
  ASSERT_TRUE(f.m) << f.error;
  backend::KernelOptions fp8;
  fp8.moe_activation_dtype = "fp8_e4m3";
  auto r = eval::compare_kernel_options(*f.m, *f.be, backend::KernelOptions{}, fp8, 1, 8);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().to_string().find("moe_activation_dtype 'fp8_e4m3'"), std::string::npos) << r.status().to_string();
}

// Reports built by hand: rows a (reference) and b (candidate) of a 4-token vocabulary.
eval::MoeActivationGateReport report_of(const std::vector<float>& a, const std::vector<float>& b) {
  eval::MoeActivationGateReport r;
  r.prompts = 1;
  r.prompt_len = 512;
  r.cmp.add_row(a.data(), b.data(), static_cast<int64_t>(a.size()));
  return r;
}

TEST(MoeActivationGate, MessagesAreInfoWithinBoundsAndLoudBeyond) {
  bool warn = true;
  const auto ok = report_of({4, 1, 0, -1}, {4.08f, 0.98f, 0.01f, -1.02f});  // ~2% relative error
  ASSERT_TRUE(ok.healthy());
  std::string text = eval::moe_activation_gate_message(ok, &warn);
  EXPECT_FALSE(warn);
  EXPECT_NE(text.find("W4A8 accuracy gate"), std::string::npos);
  EXPECT_NE(text.find("top-1 agreement 1/1"), std::string::npos) << text;

  const auto bad = report_of({4, 1, 0, -1}, {-1, 1, 0, 4});  // argmax moved, large KL
  ASSERT_FALSE(bad.healthy());
  text = eval::moe_activation_gate_message(bad, &warn);
  EXPECT_TRUE(warn);
  EXPECT_NE(text.find("ACCURACY GATE FAILED"), std::string::npos) << text;
  EXPECT_NE(text.find("--moe-activation-dtype bf16"), std::string::npos) << text;
}

}  // namespace
}  // namespace mxserve
