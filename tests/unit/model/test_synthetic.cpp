// Synthetic weights: deterministic, at the real shapes, and the router spreads tokens over experts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/numeric.h"
#include "kernels/cpu/cpu_kernels.h"
#include "model/archs/glm4_moe.h"
#include "model/config.h"
#include "model/layers/weight_loader.h"
#include "model/synthetic_weights.h"
#include "quant/mxfp4.h"
#include "quant/weight_format.h"
#include "backend/backend.h"

namespace mxserve::model {
namespace {

float synth_bf16(float x) { return kernels::synth_bf16_round(x); }


// A kNormal fill of [rows, cols] on the host: f32 values (bf16-rounded unless keep_f32).
std::vector<float> host_fill(kernels::SyntheticFill p) {
  std::vector<float> v(p.rows * p.cols);
  kernels::cpu::synthetic_fill(p, v.data(), false, nullptr);
  return v;
}

kernels::SyntheticFill params(uint64_t seed, const char* name, int64_t rows, int64_t cols, float stddev = 0.02f) {
  kernels::SyntheticFill p;
  p.stream = kernels::synthetic_stream(seed, name);
  p.stddev = stddev;
  p.rows = rows;
  p.cols = cols;
  p.src_cols = cols;
  return p;
}

void moments(const std::vector<float>& v, double* mean, double* sd) {
  double s = 0, s2 = 0;
  for (float x : v) s += x;
  *mean = s / v.size();
  for (float x : v) s2 += (x - *mean) * (x - *mean);
  *sd = std::sqrt(s2 / v.size());
}

TEST(SyntheticGenerator, DeterministicPerSeedNameAndIndex) {
  const auto a = host_fill(params(7, "model.layers.0.self_attn.q_proj.weight", 64, 96));
  const auto b = host_fill(params(7, "model.layers.0.self_attn.q_proj.weight", 64, 96));
  EXPECT_EQ(a, b);
  EXPECT_NE(a, host_fill(params(8, "model.layers.0.self_attn.q_proj.weight", 64, 96))) << "seed changes values";
  EXPECT_NE(a, host_fill(params(7, "model.layers.0.self_attn.k_proj.weight", 64, 96))) << "name changes values";
  // A column window is the same logical elements: element (r, c) of [begin, end) is (r, begin + c).
  auto w = params(7, "model.layers.0.self_attn.q_proj.weight", 64, 96);
  w.col_offset = 32;
  w.cols = 40;
  const auto win = host_fill(w);
  for (int64_t r = 0; r < 64; ++r)
    for (int64_t c = 0; c < 40; ++c) ASSERT_EQ(win[r * 40 + c], a[r * 96 + 32 + c]) << r << "," << c;
  // Values are bf16: the low 16 bits of every f32 are zero.
  for (float x : a) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    ASSERT_EQ(u & 0xffffu, 0u);
  }
  // Pinned values: a change of the generator changes every synthetic model (docs/cuda.md says what to update).
  auto pin = params(7, "model.layers.0.self_attn.q_proj.weight", 1, 4);
  const uint16_t want[4] = {0xbb68, 0x3bf5, 0xbc30, 0xbb3e};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(kernels::synth_bf16_bits(kernels::synth_normal_element(pin, 0, i)), want[i]) << i;
  EXPECT_EQ(kernels::synth_normal(0, 0), 0x1.143fap-1f);
}

TEST(SyntheticGenerator, DistributionsPerRole) {
  double mean = 0, sd = 0;
  moments(host_fill(params(3, "x.q_proj.weight", 1024, 1024)), &mean, &sd);
  EXPECT_NEAR(mean, 0.0, 2e-4);
  EXPECT_NEAR(sd, 0.02, 0.02 * 0.01);
  auto unit = params(3, "z", 1024, 1024, 1.f);
  const auto z = host_fill(unit);
  moments(z, &mean, &sd);
  EXPECT_NEAR(sd, 1.0, 0.01);
  float zmax = 0;
  int beyond2 = 0;
  for (float x : z) {
    zmax = std::max(zmax, std::fabs(x));
    beyond2 += std::fabs(x) > 2.f;
  }
  EXPECT_LE(zmax, 3.47f);
  EXPECT_NEAR(beyond2 / double(z.size()), 0.0455, 0.01) << "tails close to a normal's P(|z| > 2)";

  // Per-name rules through the source the loader uses.
  auto cfg = load_model_config(std::string(MXSERVE_SOURCE_DIR) + "/tests/data/configs/GLM-4.5-Air.json");
  ASSERT_TRUE(cfg.is_ok());
  cfg->n_layers = 2;
  const auto src = make_synthetic_source(glm4_moe_weight_table(*cfg, false), cfg->d_model, 0, SyntheticPlan{});
  const auto norm = synthetic_fill_params(src, "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(norm.mean, 1.0f);
  EXPECT_EQ(norm.stddev, 0.05f);
  const auto gate = synthetic_fill_params(src, "model.layers.1.mlp.gate.weight");
  EXPECT_FLOAT_EQ(gate.stddev, 1.0f / 64.0f);
  EXPECT_EQ(gate.rows, 128);
  EXPECT_EQ(gate.cols, 4096);
  const auto bias = synthetic_fill_params(src, "model.layers.1.mlp.gate.e_score_correction_bias");
  EXPECT_TRUE(bias.keep_f32);
  EXPECT_EQ(synthetic_host_tensor(src, "model.layers.1.mlp.gate.e_score_correction_bias").dtype(), DType::kF32);
  EXPECT_EQ(synthetic_fill_params(src, "model.layers.1.mlp.experts.3.down_proj.weight").stddev, 0.02f);
}

TEST(SyntheticGenerator, Mxfp4BytesAreQuarkEvenQuantizationOfTheBf16Values) {
  auto p = params(11, "model.layers.1.mlp.experts.0.gate_proj.weight", 48, 256);
  const auto values = host_fill(p);  // the bf16 weight
  p.kind = kernels::SyntheticKind::kMxfp4;
  std::vector<uint8_t> packed(48 * 128), scales(48 * 8);
  kernels::cpu::synthetic_fill(p, packed.data(), false, scales.data());
  std::vector<uint8_t> ref_packed(128), ref_scales(8);
  std::vector<float> deq(256);
  p.kind = kernels::SyntheticKind::kMxfp4Dequant;
  const auto dequant = host_fill(p);
  double s2 = 0;
  for (int64_t r = 0; r < 48; ++r) {
    quant::mxfp4_quantize_row(values.data() + r * 256, 256, quant::ScaleRule::kEven, ref_packed.data(),
                              ref_scales.data());
    ASSERT_EQ(std::memcmp(ref_packed.data(), packed.data() + r * 128, 128), 0) << "row " << r;
    ASSERT_EQ(std::memcmp(ref_scales.data(), scales.data() + r * 8, 8), 0) << "row " << r;
    quant::mxfp4_dequantize_row(packed.data() + r * 128, scales.data() + r * 8, 256, deq.data());
    for (int64_t i = 0; i < 256; ++i) {
      ASSERT_EQ(deq[i], dequant[r * 256 + i]) << r << "," << i;
      ASSERT_EQ(synth_bf16(deq[i]), deq[i]) << "exact in bf16";
      s2 += double(deq[i]) * deq[i];
    }
  }
  for (uint8_t s : scales) {
    EXPECT_GE(s, 127 - 12);  // 2^-12 .. 2^-4: blocks of std-0.02 values (amax ~0.05)
    EXPECT_LE(s, 127 - 4);
  }
  EXPECT_NEAR(std::sqrt(s2 / (48 * 256)), 0.02, 0.003) << "dequantized values keep the scale";
}

TEST(SyntheticGenerator, CpuBackendLoaderMatchesHostGeneration) {
  auto cfg = load_model_config(std::string(MXSERVE_SOURCE_DIR) + "/models/tiny-glm4-moe/config.json");
  ASSERT_TRUE(cfg.is_ok());
  std::vector<WeightSpec> table;  // the decoder layers (not the 39M-value embedding / head: test time)
  for (const auto& spec : glm4_moe_weight_table(*cfg, true))
    if (spec.name.find(".layers.") != std::string::npos) table.push_back(spec);
  auto be = backend::make_cpu_backend();
  for (const char* plan_text : {"", "mxfp4", "mxfp4:fp8-block"}) {
    auto plan = parse_synthetic_plan(plan_text);
    ASSERT_TRUE(plan.is_ok());
    const auto src = make_synthetic_source(table, cfg->d_model, 5, *plan);
    BoundWeights host = make_synthetic_weights(table, cfg->d_model, 5);
    ASSERT_TRUE(quantize_synthetic_experts(host, plan_text).is_ok());
    WeightLoader wl(*be, src);
    auto same = [&](const Tensor& got, const std::string& name) {
      const Tensor want = quant::to_host_f32(host.at(name).stored);
      ASSERT_EQ(got.numel(), want.numel()) << name;
      ASSERT_EQ(std::memcmp(got.raw(), want.raw(), 4 * want.numel()), 0) << name << " plan '" << plan_text << "'";
    };
    same(wl.get("model.layers.1.self_attn.q_proj.weight"), "model.layers.1.self_attn.q_proj.weight");
    same(wl.get("model.layers.2.post_attention_layernorm.weight"), "model.layers.2.post_attention_layernorm.weight");
    same(wl.get_f32("model.layers.1.mlp.gate.e_score_correction_bias"), "model.layers.1.mlp.gate.e_score_correction_bias");
    const auto ex = wl.experts({{"model.layers.1.mlp.experts.0.gate_proj.weight", "model.layers.1.mlp.experts.0.up_proj.weight"},
                                {"model.layers.1.mlp.experts.1.gate_proj.weight", "model.layers.1.mlp.experts.1.up_proj.weight"}},
                               {"model.layers.1.mlp.experts.0.down_proj.weight", "model.layers.1.mlp.experts.1.down_proj.weight"});
    EXPECT_EQ(ex.format, backend::ExpertFormat::kFloat) << "the CPU backend runs float experts";
    const int64_t I = cfg->moe_inter, H = cfg->d_model;
    same(ex.gate_up.reshape({2 * 2 * I, H}).slice_rows(2 * I + I, 4 * I), "model.layers.1.mlp.experts.1.up_proj.weight");
    same(ex.down.reshape({2 * H, I}).slice_rows(0, H), "model.layers.1.mlp.experts.0.down_proj.weight");
    const Tensor eh = wl.columns("model.layers.4.eh_proj.weight", H, 2 * H);
    const Tensor full = quant::to_host_f32(host.at("model.layers.4.eh_proj.weight").stored);
    for (int64_t r = 0; r < H; ++r)
      ASSERT_EQ(std::memcmp(eh.data<float>() + r * H, full.data<float>() + r * 2 * H + H, 4 * H), 0);
  }
}

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
