#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "io/checkpoint.h"
#include "io/safetensors_writer.h"
#include "model/archs/glm4_moe.h"
#include "model/mtp_presence.h"
#include "model/weight_table.h"

namespace mxserve::model {
namespace {

namespace fs = std::filesystem;

class Binder : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (fs::temp_directory_path() / ("mxserve_binder_" + std::to_string(::getpid()) + ".safetensors")).string();
  }
  void TearDown() override { fs::remove(path_); }

  Status bind(const io::NamedTensors& tensors, const std::vector<WeightSpec>& table) {
    EXPECT_TRUE(io::write_safetensors(path_, tensors).is_ok());
    auto ck = io::Checkpoint::open(path_);
    EXPECT_TRUE(ck.is_ok());
    return bind_weights(**ck, table, BindOptions{}).status();
  }
  std::string path_;
};

const std::vector<Precision> kF = {Precision::kBF16, Precision::kF32};

TEST_F(Binder, ReportsEveryProblemAtOnceByName) {
  std::vector<WeightSpec> table = {
      {"a.weight", {4, 8}, kF}, {"b.weight", {8}, kF}, {"c.weight", {2, 2}, {Precision::kF32}}, {"opt", {1}, kF, true}};
  io::NamedTensors tensors = {{"a.weight", Tensor::zeros(DType::kBF16, {8, 4})},   // transposed
                              {"c.weight", Tensor::zeros(DType::kBF16, {2, 2})},   // wrong precision
                              {"extra.weight", Tensor::zeros(DType::kBF16, {1})}};  // unexpected; b missing
  Status s = bind(tensors, table);
  ASSERT_FALSE(s.is_ok());
  const std::string& m = s.message();
  EXPECT_NE(m.find(path_), std::string::npos);
  EXPECT_NE(m.find("1 missing:\n    b.weight (expected [8])"), std::string::npos) << m;
  EXPECT_NE(m.find("a.weight: expected shape [4, 8], found [8, 4]"), std::string::npos) << m;
  EXPECT_NE(m.find("c.weight: expected precision f32, found bf16"), std::string::npos) << m;
  EXPECT_NE(m.find("1 unexpected:\n    extra.weight"), std::string::npos) << m;
  EXPECT_EQ(m.find("opt"), std::string::npos) << "optional tensors are not missing";
}

TEST_F(Binder, QuantizedTensorIsNamedNotGuessed) {
  std::vector<WeightSpec> table = {{"e.weight", {4, 64}, kF}};
  Status s = bind({{"e.weight", Tensor::zeros(DType::kU8, {4, 64})}}, table);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("tensor 'e.weight' is u8"), std::string::npos) << s.message();
}

TEST_F(Binder, Glm4MoeTableCoversMtpAndTying) {
  nlohmann::json j = nlohmann::json::parse(R"({
    "architectures": ["Glm4MoeForCausalLM"], "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4, "intermediate_size": 12,
    "moe_intermediate_size": 4, "n_routed_experts": 4, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
    "rope_theta": 10000.0, "use_qk_norm": true, "attention_bias": true, "n_shared_experts": 2,
    "tie_word_embeddings": true, "num_nextn_predict_layers": 1})");
  auto cfg = parse_model_config(j, "cfg.json");
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  auto with_mtp = glm4_moe_weight_table(*cfg, true);
  auto without = glm4_moe_weight_table(*cfg, false);
  auto find = [](const std::vector<WeightSpec>& t, const std::string& n) -> const WeightSpec* {
    for (const auto& s : t)
      if (s.name == n) return &s;
    return nullptr;
  };
  ASSERT_NE(find(with_mtp, "model.layers.2.eh_proj.weight"), nullptr);
  EXPECT_EQ(find(with_mtp, "model.layers.2.eh_proj.weight")->shape, (Shape{8, 16}));
  EXPECT_NE(find(with_mtp, "model.layers.2.mlp.experts.3.down_proj.weight"), nullptr);  // MTP block is MoE
  EXPECT_EQ(find(without, "model.layers.2.enorm.weight"), nullptr);
  EXPECT_TRUE(find(with_mtp, "lm_head.weight")->optional);                              // tied
  EXPECT_NE(find(with_mtp, "model.layers.0.mlp.gate_proj.weight"), nullptr);           // dense first layer
  EXPECT_EQ(find(with_mtp, "model.layers.1.mlp.shared_experts.up_proj.weight")->shape, (Shape{8, 8}));
  EXPECT_EQ(find(with_mtp, "model.layers.1.self_attn.q_norm.weight")->shape, (Shape{4}));
  auto opts = glm4_moe_bind_options(*cfg, false);
  EXPECT_EQ(opts.ignored_prefixes, (std::vector<std::string>{"model.layers.2."}));
}

// A checkpoint without the MTP layer its config declares (what transformers' save_pretrained writes): plain
// decoding loads without it, MTP speculation is an error naming the missing tensors; a partial layer is
// left to the binder (which names each missing tensor).
TEST_F(Binder, MissingMtpLayerIsAWarningForPlainDecodingAndAnErrorForSpeculation) {
  nlohmann::json j = nlohmann::json::parse(R"({
    "architectures": ["Glm4MoeForCausalLM"], "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4, "intermediate_size": 12,
    "moe_intermediate_size": 4, "n_routed_experts": 4, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
    "rope_theta": 10000.0, "use_qk_norm": true, "attention_bias": true, "n_shared_experts": 2,
    "num_nextn_predict_layers": 1})");
  auto cfg = parse_model_config(j, "cfg.json");
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  io::NamedTensors plain;
  for (const auto& s : glm4_moe_weight_table(*cfg, false)) plain.push_back({s.name, Tensor::zeros(DType::kBF16, s.shape)});
  auto present = [&](const io::NamedTensors& tensors, bool want, bool require) -> Result<bool> {
    EXPECT_TRUE(io::write_safetensors(path_, tensors).is_ok());
    auto ck = io::Checkpoint::open(path_);
    EXPECT_TRUE(ck.is_ok());
    return mtp_layer_present(**ck, *cfg->arch, *cfg, want, require);
  };
  auto plain_decoding = present(plain, true, false);
  ASSERT_TRUE(plain_decoding.is_ok()) << plain_decoding.status().to_string();
  EXPECT_FALSE(*plain_decoding);
  auto speculation = present(plain, true, true);
  ASSERT_FALSE(speculation.is_ok());
  for (const char* needle : {"num_nextn_predict_layers", "model.layers.2.*", "model.layers.2.enorm.weight",
                             "MTP speculative decoding"})
    EXPECT_NE(speculation.status().message().find(needle), std::string::npos) << speculation.status().message();
  auto not_asked = present(plain, false, false);
  ASSERT_TRUE(not_asked.is_ok());
  EXPECT_FALSE(*not_asked);

  io::NamedTensors partial = plain;
  partial.push_back({"model.layers.2.enorm.weight", Tensor::zeros(DType::kBF16, {8})});
  auto some = present(partial, true, true);
  ASSERT_TRUE(some.is_ok()) << some.status().to_string();
  EXPECT_TRUE(*some);  // the binder then reports the rest of the layer missing
}

// Routed experts stored the transformers 5.x way (mlp.experts.gate_up_proj [E, 2I, H] + down_proj [E, H, I])
// bind like per-expert tensors, with nothing left over; a stack with the wrong expert count is named.
TEST_F(Binder, TransformersFusedExpertStacksBindPerExpert) {
  nlohmann::json j = nlohmann::json::parse(R"({
    "architectures": ["Glm4MoeForCausalLM"], "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4, "intermediate_size": 12,
    "moe_intermediate_size": 4, "n_routed_experts": 4, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
    "rope_theta": 10000.0, "use_qk_norm": true, "attention_bias": true, "n_shared_experts": 2,
    "num_nextn_predict_layers": 0})");
  auto cfg = parse_model_config(j, "cfg.json");
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  const auto table = glm4_moe_weight_table(*cfg, false);
  auto with_stacks = [&](int64_t experts) {
    io::NamedTensors t;
    for (const auto& s : table)
      if (s.name.find(".mlp.experts.") == std::string::npos) t.push_back({s.name, Tensor::zeros(DType::kBF16, s.shape)});
    t.push_back({"model.layers.1.mlp.experts.gate_up_proj", Tensor::zeros(DType::kBF16, {experts, 8, 8})});
    t.push_back({"model.layers.1.mlp.experts.down_proj", Tensor::zeros(DType::kBF16, {experts, 8, 4})});
    return t;
  };
  Status ok = bind(with_stacks(4), table);
  EXPECT_TRUE(ok.is_ok()) << ok.to_string();
  Status short_stack = bind(with_stacks(3), table);
  ASSERT_FALSE(short_stack.is_ok());
  EXPECT_NE(short_stack.message().find("expert 3 is outside 'model.layers.1.mlp.experts.gate_up_proj' (3 experts)"),
            std::string::npos)
      << short_stack.message();
}

}  // namespace
}  // namespace mxserve::model
