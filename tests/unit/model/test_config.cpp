#include <gtest/gtest.h>

#include <functional>

#include "model/config.h"

namespace mxserve::model {
namespace {

using nlohmann::json;

json tiny() {
  return json::parse(R"({
    "architectures": ["Glm4MoeForCausalLM"], "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 96,
    "moe_intermediate_size": 16, "n_routed_experts": 8, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
    "rope_theta": 10000.0, "partial_rotary_factor": 0.5, "torch_dtype": "bfloat16", "eos_token_id": [1, 2]})");
}

Status parse_error(const json& j) { return parse_model_config(j, "cfg.json").status(); }

TEST(ModelConfig, RealGlmConfigsParse) {
  for (const char* name : {"GLM-4.5", "GLM-4.5-Air", "GLM-4.6", "GLM-4.7"}) {
    auto cfg = load_model_config(std::string(MXSERVE_SOURCE_DIR) + "/tests/data/configs/" + name + ".json");
    ASSERT_TRUE(cfg.is_ok()) << name << ": " << cfg.status().to_string();
    EXPECT_EQ(cfg->head_dim, 128);
    EXPECT_EQ(cfg->rotary_dim, 64);
    EXPECT_EQ(cfg->rope_theta, 1e6);
    EXPECT_EQ(cfg->n_mtp_layers, 1);
    EXPECT_EQ(cfg->eos_token_ids.size(), 3u);
  }
  auto air = load_model_config(std::string(MXSERVE_SOURCE_DIR) + "/tests/data/configs/GLM-4.5-Air.json");
  EXPECT_EQ(air->d_model, 4096);
  EXPECT_EQ(air->n_experts, 128);
  EXPECT_EQ(air->moe_inter, 1408);
  EXPECT_FALSE(air->use_qk_norm);
  EXPECT_EQ(air->first_k_dense, 1);
}

TEST(ModelConfig, BothRopeSpellings) {
  json legacy = tiny();
  auto a = parse_model_config(legacy, "cfg.json");
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  json v5 = tiny();
  v5.erase("rope_theta");
  v5.erase("partial_rotary_factor");
  v5["rope_parameters"] = {{"rope_theta", 10000.0}, {"partial_rotary_factor", 0.5}, {"rope_type", "default"}};
  v5.erase("torch_dtype");
  v5["dtype"] = "bfloat16";
  auto b = parse_model_config(v5, "cfg.json");
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  EXPECT_EQ(a->rope_theta, b->rope_theta);
  EXPECT_EQ(a->rotary_dim, b->rotary_dim);
  EXPECT_EQ(b->rotary_dim, 16);
  json both = tiny();  // both spellings at once, agreeing
  both["rope_parameters"] = {{"rope_theta", 10000.0}, {"rope_type", "default"}};
  EXPECT_TRUE(parse_model_config(both, "cfg.json").is_ok());
  json no_partial = tiny();  // glm4_moe defaults partial_rotary_factor to 0.5, like transformers
  no_partial.erase("partial_rotary_factor");
  EXPECT_EQ(parse_model_config(no_partial, "cfg.json")->rotary_dim, 16);
}

TEST(ModelConfig, ContradictionsAndMissingFieldsAreNamed) {
  struct Case {
    const char* what;
    std::function<void(json&)> edit;
    const char* must_mention;
  };
  const std::vector<Case> cases = {
      {"theta contradiction", [](json& j) { j["rope_parameters"] = {{"rope_theta", 5.0}}; }, "rope_theta vs rope_parameters.rope_theta"},
      {"dtype contradiction", [](json& j) { j["dtype"] = "float32"; }, "torch_dtype vs dtype"},
      {"missing hidden", [](json& j) { j.erase("hidden_size"); }, "field 'hidden_size': expected an integer, found nothing"},
      {"string number", [](json& j) { j["vocab_size"] = "100"; }, "field 'vocab_size': expected an integer, found \"100\""},
      {"no rope", [](json& j) { j.erase("rope_theta"); }, "no RoPE base"},
      {"gqa", [](json& j) { j["num_key_value_heads"] = 3; }, "not a multiple of num_key_value_heads 3"},
      {"groups", [](json& j) { j["n_group"] = 3; }, "not divisible by n_group 3"},
      {"topk_group", [](json& j) { j["n_group"] = 2; j["topk_group"] = 3; }, "topk_group 3 exceeds n_group 2"},
      {"top_k", [](json& j) { j["num_experts_per_tok"] = 9; }, "num_experts_per_tok 9 exceeds"},
      {"eos", [](json& j) { j["eos_token_id"] = 100; }, "eos_token_id': 100 is outside"},
      {"rope type", [](json& j) { j["rope_parameters"] = {{"rope_type", "yarn"}}; }, "'yarn' is not supported"},
      {"act", [](json& j) { j["hidden_act"] = "gelu"; }, "hidden_act"},
      {"mtp layers", [](json& j) { j["num_nextn_predict_layers"] = 2; }, "num_nextn_predict_layers"},
      {"odd rotary", [](json& j) { j["partial_rotary_factor"] = 0.1; }, "rotary dim 3"},
      {"negative", [](json& j) { j["num_hidden_layers"] = -2; }, "num_hidden_layers"},
  };
  for (const auto& c : cases) {
    json j = tiny();
    c.edit(j);
    Status s = parse_error(j);
    ASSERT_FALSE(s.is_ok()) << c.what;
    EXPECT_NE(s.message().find("cfg.json"), std::string::npos) << c.what << ": " << s.message();
    EXPECT_NE(s.message().find(c.must_mention), std::string::npos) << c.what << ": " << s.message();
  }
}

TEST(ModelConfig, UnknownArchitectureListsSupported) {
  json j = tiny();
  j["architectures"] = {"LlamaForCausalLM"};
  Status s = parse_error(j);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("'LlamaForCausalLM' is not supported; supported: Glm4MoeForCausalLM"), std::string::npos)
      << s.message();
}

}  // namespace
}  // namespace mxserve::model
