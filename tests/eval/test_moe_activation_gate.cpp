// eval/moe_activation_gate: the W4A8 start-up gate's prompts, its comparison on a real (fixture) model on the CPU
// backend, the three log messages, the decision (keep FP8 or fall back to bf16) and its wiring (the options the
// backend runs afterwards, through a CPU backend that simulates the FP8 path). The FP8 path itself runs on the
// GPU only (dev/gpu/prefill_limits.sh serves synthetic GLM-4.5-Air with --moe-activation-dtype fp8_e4m3 and
// reads the gate line).
#include <gtest/gtest.h>

#include <set>
#include <sstream>

#include "backend/backend.h"
#include "eval/moe_activation_gate.h"
#include "fp8_activation_sim_backend.h"
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
      if (i >= 64) {
        EXPECT_EQ(p[i], p[i - 64]) << "the 64-token phrase repeats";
      }
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

namespace mxserve {
namespace {

// The decision as a pure function: the candidate only when healthy; the reference (bf16) otherwise, with the
// loud line naming the measured values, the bounds, what happens and what to do.
TEST(MoeActivationGateDecision, KeepsFp8OnlyWithinBoundsAndFallsBackToBf16Loudly) {
  backend::KernelOptions reference, candidate;
  reference.moe_activation_dtype = "bf16";
  candidate.moe_activation_dtype = "fp8_e4m3";
  const auto ok = report_of({4, 1, 0, -1}, {4.08f, 0.98f, 0.01f, -1.02f});
  auto d = eval::decide_moe_activation_gate(ok, reference, candidate);
  EXPECT_TRUE(d.keep_fp8);
  EXPECT_FALSE(d.warn);
  EXPECT_EQ(d.options.moe_activation_dtype, "fp8_e4m3");

  const auto bad = report_of({4, 1, 0, -1}, {-1, 1, 0, 4});
  d = eval::decide_moe_activation_gate(bad, reference, candidate);
  EXPECT_FALSE(d.keep_fp8);
  EXPECT_TRUE(d.warn);
  EXPECT_EQ(d.options.moe_activation_dtype, "bf16");
  for (const char* part : {"SERVING WITH BF16 MoE ACTIVATIONS INSTEAD", "rel-L2 <= 0.15", "mean KL <= 0.05",
                           "--moe-activation-dtype bf16", "top-1 agreement 0/1"})
    EXPECT_NE(d.message.find(part), std::string::npos) << part << " in:\n" << d.message;
  std::ostringstream measured;
  measured << "logits rel-L2 " << bad.cmp.rel_l2();
  EXPECT_NE(d.message.find(measured.str()), std::string::npos) << d.message;

  // Just past one bound: rel-L2 over 0.15 with agreeing argmax (a bound, not only a flipped top-1, decides).
  const auto edge = report_of({4, 1, 0, -1}, {4.8f, 1.2f, 0.f, -1.2f});  // +20% on every logit
  ASSERT_GT(edge.cmp.rel_l2(), eval::MoeActivationGateReport::kMaxRelL2);
  ASSERT_EQ(edge.cmp.top1_agree, 1);
  EXPECT_FALSE(eval::decide_moe_activation_gate(edge, reference, candidate).keep_fp8);

  const eval::MoeActivationGateReport same = report_of({4, 1, 0, -1}, {4, 1, 0, -1});
  d = eval::decide_moe_activation_gate(same, reference, candidate);
  EXPECT_FALSE(d.keep_fp8) << "the FP8 path did not run: nothing to keep";
  EXPECT_EQ(d.options.moe_activation_dtype, "bf16");
  EXPECT_NE(d.message.find("did not run"), std::string::npos) << d.message;
  EXPECT_NE(d.message.find("SERVING WITH BF16"), std::string::npos) << d.message;
}

// The wiring, end to end on the CPU: the real measurement (compare_kernel_options, small) on the fixture model
// through a backend that simulates the FP8 path; afterwards the backend runs the decided options.
struct SimGate {
  explicit SimGate(double error) : be(error) {
    model::LoadOptions o;
    o.load_mtp = false;
    auto r = model::load_causal_lm(kFixture, be, o);
    if (r.is_ok()) m = std::move(*r);
    else load_error = r.status().to_string();
  }
  Result<eval::MoeActivationGateDecision> run() {
    backend::KernelOptions requested;
    requested.moe_activation_dtype = "fp8_e4m3";
    return eval::apply_moe_activation_gate(
        *m, be, requested,
        [](model::CausalLM& mm, backend::Backend& b, const backend::KernelOptions& ref, const backend::KernelOptions& cand) {
          return eval::compare_kernel_options(mm, b, ref, cand, 2, 48);
        });
  }
  // MoE calls that run with FP8 "on" in one more forward after the gate.
  int64_t fp8_calls_in_a_forward() {
    const int64_t before = be.fp8_moe_calls();
    auto r = eval::compare_kernel_options(*m, be, be.options(), be.options(), 1, 8);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return be.fp8_moe_calls() - before;
  }
  test::Fp8ActivationSimBackend be;
  std::unique_ptr<model::CausalLM> m;
  std::string load_error;
};

TEST(MoeActivationGateWiring, HealthyFp8IsKept) {
  SimGate g(0.002);
  ASSERT_TRUE(g.m) << g.load_error;
  auto d = g.run();
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  EXPECT_TRUE(d->keep_fp8) << d->message;
  EXPECT_FALSE(d->warn);
  EXPECT_EQ(g.be.options().moe_activation_dtype, "fp8_e4m3");
  EXPECT_GT(g.fp8_calls_in_a_forward(), 0) << "FP8 activations are in effect after the gate";
}

TEST(MoeActivationGateWiring, BrokenFp8FallsBackToBf16) {
  SimGate g(3.0);  // every MoE output element off by 300%: a broken scale
  ASSERT_TRUE(g.m) << g.load_error;
  auto d = g.run();
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  EXPECT_FALSE(d->keep_fp8) << d->message;
  EXPECT_TRUE(d->warn);
  EXPECT_NE(d->message.find("ACCURACY GATE FAILED"), std::string::npos) << d->message;
  EXPECT_EQ(g.be.options().moe_activation_dtype, "bf16");
  EXPECT_EQ(g.fp8_calls_in_a_forward(), 0) << "bf16 activations are in effect after the gate";
}

TEST(MoeActivationGateWiring, Fp8PathThatNeverRunsFallsBackToBf16) {
  SimGate g(0.0);  // FP8 "on" changes nothing: no FP8 kernel in the plan
  ASSERT_TRUE(g.m) << g.load_error;
  auto d = g.run();
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  EXPECT_FALSE(d->keep_fp8);
  EXPECT_NE(d->message.find("did not run"), std::string::npos) << d->message;
  EXPECT_EQ(g.be.options().moe_activation_dtype, "bf16");
  EXPECT_EQ(g.fp8_calls_in_a_forward(), 0);
}

}  // namespace
}  // namespace mxserve
