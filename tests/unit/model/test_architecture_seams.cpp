// The architecture seams (issue 31 item 6): what the launch and bench-model ask of an architecture comes
// from its registry entry (capabilities, attention cost model), and the MTP step context validates itself.
#include <gtest/gtest.h>

#include <string>

#include "model/config.h"
#include "model/forward_batch.h"
#include "model/registry.h"

namespace mxserve::model {
namespace {

ModelConfig load(const std::string& rel) {
  auto cfg = load_model_config(std::string(MXSERVE_SOURCE_DIR) + "/" + rel);
  EXPECT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  return cfg.is_ok() ? *cfg : ModelConfig{};
}

CostUnits units(bool fp8_kv = false) {
  CostUnits u;
  u.weight_bytes = 2;
  u.act_bytes = 2;
  u.fp8_kv = fp8_kv;
  u.attn_dense_params = 1000;
  u.attn_matmul_params = 900;
  return u;
}

TEST(ArchitectureSeams, EveryEntryDeclaresItsCapabilitiesAndCostModel) {
  ASSERT_EQ(architectures().size(), 2u);
  for (const ArchitectureDef* a : architectures()) {
    EXPECT_NE(a->build, nullptr) << a->hf_name;
    EXPECT_NE(a->attention_cost, nullptr) << a->hf_name;
    EXPECT_TRUE(a->capabilities.tensor_parallel && a->capabilities.expert_parallel && a->capabilities.dp_attention)
        << a->hf_name;
  }
  EXPECT_EQ(architectures_with(&ArchitectureDef::Capabilities::tensor_parallel),
            "Glm4MoeForCausalLM and GlmMoeDsaForCausalLM");
  EXPECT_EQ(architectures_with(&ArchitectureDef::Capabilities::dp_attention),
            "Glm4MoeForCausalLM and GlmMoeDsaForCausalLM");
}

// GQA (glm4_moe): H 256, 4 heads x 64 (qd 256), 2 KV heads (kvd 128). The numbers are the formula in
// glm4_moe.cpp worked by hand.
TEST(ArchitectureSeams, GqaCostIsTheDocumentedFormula) {
  const ModelConfig c = load("models/tiny-glm4-moe/config.json");
  ASSERT_NE(c.arch, nullptr);
  const AttentionCost cost = c.arch->attention_cost(c, units());
  // decode 2 rows at context 10: w + 2 kvd a (20 cached + 2 new) + a T (4 H + 4 qd + 4 kvd)
  EXPECT_DOUBLE_EQ(cost.decode(2, 10).bytes, 2000 + 10240 + 1024 + 10240);
  EXPECT_DOUBLE_EQ(cost.decode(2, 10).flops, 3600 + 4 * 256 * 20);
  EXPECT_DOUBLE_EQ(cost.prefill(10).bytes, 2000 + 5120 + 5120 + 51200);
  EXPECT_DOUBLE_EQ(cost.prefill(10).flops, 18000 + 4 * 256 * 55);
  // FP8 cache: 1 byte + one f32 scale per head_dim elements.
  const AttentionCost fp8 = c.arch->attention_cost(c, units(true));
  EXPECT_DOUBLE_EQ(fp8.decode(2, 10).bytes, 2000 + 2 * 128 * 1.0625 * 22 + 10240);
}

// MLA + DSA (glm_moe_dsa): cache row L = 32 + 8, indexer key 16, kv_lora_rank 32, top-k 6, 4 heads of
// qk 24 / v 24, 4 indexer heads. The numbers are the formula in glm_moe_dsa.cpp worked by hand.
TEST(ArchitectureSeams, MlaCostIsTheDocumentedFormula) {
  const ModelConfig c = load("tests/fixtures/glm_moe_dsa_tiny_a/config.json");
  ASSERT_NE(c.arch, nullptr);
  const AttentionCost cost = c.arch->attention_cost(c, units());
  // decode 2 rows at context 10: each attends min(10, 6) latent rows and scores 10 indexer keys.
  EXPECT_DOUBLE_EQ(cost.decode(2, 10).bytes, 2000 + 2 * (40 * 12 + 16 * 20) + 2 * 2 * 56 + 2 * 2 * (256 + 768));
  EXPECT_DOUBLE_EQ(cost.decode(2, 10).flops, 3600 + 2 * 4 * 72 * 12 + 2 * 64 * 20);
  // prefill 10 tokens: attended = sum over t of min(t + 1, 6) = 21 + 4 x 6; indexed = 55.
  EXPECT_DOUBLE_EQ(cost.prefill(10).bytes, 2000 + 2 * (400 + 160) + 2 * 10 * 56 + 2 * 10 * 1024);
  EXPECT_DOUBLE_EQ(cost.prefill(10).flops, 18000 + 2 * 4 * 72 * 45 + 2 * 64 * 55);
  EXPECT_DOUBLE_EQ(cost.prefill(4).flops, 7200 + 2 * 4 * 72 * 10 + 2 * 64 * 10);  // p <= top-k: all keys
}

TEST(ArchitectureSeams, MtpStepNamesBadContinuationRows) {
  MtpStep none;
  EXPECT_FALSE(none.continues_chain());
  MtpStep step;
  step.first_step_rows = {0, 2};
  EXPECT_TRUE(step.continues_chain());
  EXPECT_TRUE(step.validate(2, 3).is_ok());
  EXPECT_NE(step.validate(3, 3).to_string().find("mtp_first_step_rows has 2 rows for 3 tokens"), std::string::npos);
  EXPECT_NE(step.validate(2, 2).to_string().find("mtp_first_step_rows names row 2 of a first draft step with 2 rows"),
            std::string::npos);
}

}  // namespace
}  // namespace mxserve::model
