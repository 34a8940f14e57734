// Synthetic weights: deterministic, at the real shapes, and the router spreads tokens over experts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/numeric.h"
#include "kernels/cpu/cpu_kernels.h"
#include "model/archs/glm4_moe.h"
#include "model/config.h"
#include "model/synthetic_weights.h"

namespace mxserve::model {
namespace {

TEST(SyntheticWeights, DeterministicRealShapesAndSpreadRouting) {
  auto cfg = load_model_config(std::string(MXSERVE_SOURCE_DIR) + "/tests/data/configs/GLM-4.5-Air.json");
  ASSERT_TRUE(cfg.is_ok());
  cfg->n_layers = 2;  // keep the test small: layer 0 dense, layer 1 MoE
  cfg->vocab_size = 1024;
  // Generate only the router and one expert of the MoE layer (the whole Air layer is ~2e9 values).
  std::vector<WeightSpec> table;
  for (const auto& s : glm4_moe_weight_table(*cfg, false))
    if (s.name.find("layers.1.mlp.gate.") != std::string::npos || s.name.find("experts.127.") != std::string::npos)
      table.push_back(s);
  ASSERT_EQ(table.size(), 5u);
  BoundWeights a = make_synthetic_weights(table, cfg->d_model, 7);
  BoundWeights b = make_synthetic_weights(table, cfg->d_model, 7);
  const auto& gate = a.at("model.layers.1.mlp.gate.weight").host;
  EXPECT_EQ(gate.shape(), (Shape{128, 4096}));
  EXPECT_EQ(std::memcmp(gate.raw(), b.at("model.layers.1.mlp.gate.weight").host.raw(), gate.nbytes()), 0);
  EXPECT_EQ(a.at("model.layers.1.mlp.experts.127.down_proj.weight").host.shape(), (Shape{4096, 1408}));
  EXPECT_EQ(a.at("model.layers.1.mlp.gate.e_score_correction_bias").host.dtype(), DType::kF32);

  // Route 512 random unit-RMS tokens: every expert used, none hogging.
  const int64_t T = 512, H = cfg->d_model, E = cfg->n_experts, K = cfg->top_k;
  std::vector<float> w(E * H), x(T * H), logits(T * E), weights(T * K);
  for (int64_t i = 0; i < E * H; ++i) w[i] = bf16_to_f32(gate.data<uint16_t>()[i]);
  std::mt19937 rng(1);
  std::normal_distribution<float> n(0.f, 1.f);
  for (auto& v : x) v = n(rng);
  kernels::cpu::linear_f32(x.data(), w.data(), nullptr, logits.data(), T, E, H);
  std::vector<int32_t> ids(T * K);
  kernels::RouterParams p{.n_experts = static_cast<int32_t>(E), .top_k = static_cast<int32_t>(K), .n_group = 1,
                          .topk_group = 1, .norm_topk_prob = true, .routed_scaling_factor = 1.f};
  kernels::cpu::moe_router_f32(logits.data(), a.at("model.layers.1.mlp.gate.e_score_correction_bias").host.data<float>(),
                               ids.data(), weights.data(), T, p);
  std::vector<int> count(E, 0);
  for (int32_t id : ids) ++count[id];
  const double uniform = static_cast<double>(T * K) / E;
  int used = 0, max_count = 0;
  for (int c : count) {
    used += c > 0;
    max_count = std::max(max_count, c);
  }
  EXPECT_EQ(used, E);
  EXPECT_LT(max_count, 3 * uniform);
}

}  // namespace
}  // namespace mxserve::model

namespace mxserve::model {
namespace {

TEST(SyntheticWeights, PrecisionPlanQuantizesRoutedExpertsOnly) {
  auto cfg = load_model_config(std::string(MXSERVE_SOURCE_DIR) + "/tests/fixtures/glm4_moe_tiny_a");
  ASSERT_TRUE(cfg.is_ok());
  const auto table = glm4_moe_weight_table(*cfg, true);
  for (const char* scheme : {"mxfp4", "fp8-block"}) {
    BoundWeights w = make_synthetic_weights(table, cfg->d_model, 3);
    ASSERT_TRUE(quantize_synthetic_experts(w, scheme).is_ok());
    const auto expected = std::string(scheme) == "mxfp4" ? quant::Precision::kMxfp4 : quant::Precision::kFp8Block;
    EXPECT_EQ(w.at("model.layers.1.mlp.experts.5.up_proj.weight").precision(), expected);
    EXPECT_EQ(w.at("model.layers.3.mlp.experts.0.down_proj.weight").precision(), expected) << "MTP layer too";
    EXPECT_EQ(w.at("model.layers.1.mlp.experts.5.up_proj.weight").shape(), (Shape{32, 64}));
    EXPECT_EQ(w.at("model.layers.1.mlp.shared_experts.up_proj.weight").precision(), quant::Precision::kBF16);
    EXPECT_EQ(w.at("model.layers.1.self_attn.q_proj.weight").precision(), quant::Precision::kBF16);
    EXPECT_EQ(w.at("model.layers.1.mlp.gate.weight").precision(), quant::Precision::kBF16);
  }
  BoundWeights w = make_synthetic_weights(table, cfg->d_model, 3);
  ASSERT_TRUE(quantize_synthetic_experts(w, "mxfp4:fp8-block").is_ok());
  EXPECT_EQ(w.at("model.layers.1.mlp.experts.5.up_proj.weight").precision(), quant::Precision::kMxfp4);
  EXPECT_EQ(w.at("model.layers.1.self_attn.q_proj.weight").precision(), quant::Precision::kFp8Block);
  EXPECT_EQ(w.at("model.layers.0.mlp.down_proj.weight").precision(), quant::Precision::kFp8Block);
  EXPECT_EQ(w.at("model.layers.3.eh_proj.weight").precision(), quant::Precision::kBF16);
  EXPECT_EQ(w.at("model.layers.1.mlp.gate.weight").precision(), quant::Precision::kBF16);
  EXPECT_EQ(w.at("lm_head.weight").precision(), quant::Precision::kBF16);
  Status bad = quantize_synthetic_experts(w, "int3");
  EXPECT_NE(bad.message().find("'int3'"), std::string::npos);
}

}  // namespace
}  // namespace mxserve::model
