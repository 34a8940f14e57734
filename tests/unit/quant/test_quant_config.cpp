// quantization_config parsing and matching: Quark exclude (exact, "re:" anchored at the start like
// Python's re.match, glob), FP8 modules_to_not_convert (exact, dotted parent, glob), and the errors for
// what is not supported.
#include <gtest/gtest.h>

#include "quant/quant_config.h"

namespace mxserve::quant {
namespace {

nlohmann::json quark(const nlohmann::json& exclude) {
  return {{"quant_method", "quark"},
          {"global_quant_config",
           {{"weight", {{"dtype", "fp4"}, {"qscheme", "per_group"}, {"group_size", 32}, {"scale_format", "e8m0"}}},
            {"input_tensors", nullptr}}},
          {"exclude", exclude},
          {"layer_quant_config", nlohmann::json::object()}};
}

TEST(QuantConfig, QuarkExcludeMatching) {
  EXPECT_TRUE(quark_entry_matches("lm_head", "lm_head"));
  EXPECT_FALSE(quark_entry_matches("model.layers.3", "model.layers.3.eh_proj"));  // exact means exact
  EXPECT_TRUE(quark_entry_matches("re:.*mlp.gate$", "model.layers.1.mlp.gate"));
  EXPECT_FALSE(quark_entry_matches("re:.*mlp.gate$", "model.layers.1.mlp.gate_proj"));
  EXPECT_TRUE(quark_entry_matches("re:model.layers.3.*", "model.layers.3.mlp.experts.0.up_proj"));
  EXPECT_FALSE(quark_entry_matches("re:layers.3", "model.layers.3.eh_proj"));  // anchored at the start
  EXPECT_TRUE(quark_entry_matches("*.self_attn.*", "model.layers.0.self_attn.q_proj"));
}

TEST(QuantConfig, Fp8NotConvertMatching) {
  EXPECT_TRUE(fp8_entry_matches("lm_head", "lm_head"));
  EXPECT_TRUE(fp8_entry_matches("model.layers.3", "model.layers.3.eh_proj"));  // dotted parent
  EXPECT_FALSE(fp8_entry_matches("model.layers.3", "model.layers.31.eh_proj"));
  EXPECT_TRUE(fp8_entry_matches("model.layers.*.self_attn", "model.layers.7.self_attn.o_proj"));
}

TEST(QuantConfig, ExpectationsPerRole) {
  auto c = QuantizationConfig::parse(quark({"lm_head", "re:.*self_attn.*"}), "cfg.json");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_TRUE(c->expect("model.layers.1.mlp.experts.0.up_proj", WeightRole::kLinear).quantized);
  EXPECT_EQ(c->expect("model.layers.1.mlp.experts.0.up_proj", WeightRole::kLinear).precision, Precision::kMxfp4);
  EXPECT_FALSE(c->expect("lm_head", WeightRole::kLinear).quantized);
  EXPECT_NE(c->expect("lm_head", WeightRole::kLinear).reason.find("'lm_head'"), std::string::npos);
  EXPECT_FALSE(c->expect("model.layers.0.self_attn.q_proj", WeightRole::kLinear).quantized);
  EXPECT_TRUE(c->expect("model.layers.1.mlp.gate", WeightRole::kRouter).quantized);  // a Linear for Quark
  EXPECT_FALSE(c->expect("model.norm", WeightRole::kNone).quantized);

  auto f = QuantizationConfig::parse({{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {128, 128}},
                                      {"modules_to_not_convert", {"lm_head"}}},
                                     "cfg.json");
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ(f->expect("model.layers.1.mlp.experts.0.up_proj", WeightRole::kLinear).precision, Precision::kFp8Block);
  EXPECT_FALSE(f->expect("model.layers.1.mlp.gate", WeightRole::kRouter).quantized);  // not a Linear in HF

  // transformers' FineGrainedFP8Config as saved: no modules_to_not_convert, lm_head kept float all the same;
  // scale_fmt ue8m0 (power-of-two e8m0 scales) is not read by mxserve: a clear error.
  auto hf = QuantizationConfig::parse({{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}, {"dequantize", false},
                                       {"modules_to_not_convert", nullptr}, {"scale_fmt", "float"},
                                       {"weight_block_size", {32, 32}}},
                                      "cfg.json");
  ASSERT_TRUE(hf.is_ok()) << hf.status().to_string();
  EXPECT_EQ(hf->block_rows, 32);
  EXPECT_FALSE(hf->expect("lm_head", WeightRole::kLinear).quantized);
  EXPECT_NE(hf->expect("lm_head", WeightRole::kLinear).reason.find("never converts"), std::string::npos);
  EXPECT_FALSE(hf->expect("model.layers.3.shared_head.head", WeightRole::kLinear).quantized);
  EXPECT_TRUE(hf->expect("model.layers.3.eh_proj", WeightRole::kLinear).quantized);
  EXPECT_EQ(hf->expect("model.layers.0.mlp.down_proj", WeightRole::kLinear).precision, Precision::kFp8Block);
  auto ue8m0 = QuantizationConfig::parse({{"quant_method", "fp8"}, {"scale_fmt", "ue8m0"}, {"weight_block_size", {128, 128}}},
                                         "cfg.json");
  ASSERT_FALSE(ue8m0.is_ok());
  EXPECT_NE(ue8m0.status().message().find("scale_fmt"), std::string::npos) << ue8m0.status().message();
  EXPECT_NE(ue8m0.status().message().find("ue8m0"), std::string::npos) << ue8m0.status().message();
}

TEST(QuantConfig, CompressedTensorsFloatQuantized) {
  nlohmann::json ct = {{"quant_method", "compressed-tensors"},
                       {"format", "float-quantized"},
                       {"config_groups",
                        {{"group_0",
                          {{"targets", {"Linear"}},
                           {"weights", {{"num_bits", 8}, {"type", "float"}, {"strategy", "channel"}}},
                           {"input_activations", {{"num_bits", 8}, {"type", "float"}, {"dynamic", true}}}}}}},
                       {"ignore", {"lm_head", "re:.*mlp\\.gate$"}}};
  auto c = QuantizationConfig::parse(ct, "cfg.json");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_TRUE(c->activations_quantized);
  EXPECT_EQ(c->expect("model.layers.1.mlp.experts.3.up_proj", WeightRole::kLinear).precision, Precision::kFp8Channel);
  EXPECT_FALSE(c->expect("lm_head", WeightRole::kLinear).quantized);
  EXPECT_NE(c->expect("lm_head", WeightRole::kLinear).reason.find("listed in ignore"), std::string::npos);
  ct["config_groups"]["group_0"]["weights"]["strategy"] = "block";
  ct["config_groups"]["group_0"]["weights"]["block_structure"] = {128, 128};
  auto b = QuantizationConfig::parse(ct, "cfg.json");
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  EXPECT_EQ(b->expect("x", WeightRole::kLinear).precision, Precision::kFp8Block);
  EXPECT_EQ(b->block_rows, 128);
  ct["config_groups"]["group_0"]["weights"]["num_bits"] = 4;
  auto bad = QuantizationConfig::parse(ct, "cfg.json");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("config_groups.group_0.weights"), std::string::npos) << bad.status().message();
  ct["format"] = "pack-quantized";
  EXPECT_FALSE(QuantizationConfig::parse(ct, "cfg.json").is_ok());
}

TEST(QuantConfig, UnsupportedConfigsAreNamedErrors) {
  auto m = QuantizationConfig::parse({{"quant_method", "awq"}}, "cfg.json");
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("'awq'"), std::string::npos);
  nlohmann::json q = quark({});
  q["global_quant_config"]["weight"]["dtype"] = "int4";
  auto d = QuantizationConfig::parse(q, "cfg.json");
  ASSERT_FALSE(d.is_ok());
  EXPECT_NE(d.status().message().find("global_quant_config.weight.dtype"), std::string::npos) << d.status().message();
  q = quark({"re:("});
  auto r = QuantizationConfig::parse(q, "cfg.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("'re:('"), std::string::npos) << r.status().message();
  q = quark({});
  q["layer_quant_config"] = {{"*.mlp.*", {{"weight", nullptr}}}};
  EXPECT_FALSE(QuantizationConfig::parse(q, "cfg.json").is_ok());
}

}  // namespace
}  // namespace mxserve::quant
