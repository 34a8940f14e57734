// `mxserve memory` (cli/memory_plan.h) against a hand computation on a tiny glm4_moe config: per-GPU weight
// bytes at tp 1 / tp 2 / tp 2 + ep 2 / dp 2 + DP attention, bf16 and MXFP4 experts; KV bytes per token and
// the tokens that fit; link bytes per token. The hand numbers are written from the config's fields here,
// not from the weight table, so a slicing or byte-count drift shows.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "cli/memory_plan.h"
#include "model/causal_lm.h"

namespace mxserve::cli {
namespace {

// H 64, 4 heads x 16 (2 KV heads), dense inter 96 (layer 0), MoE layer 1: 4 experts x 32 + 1 shared, top 2,
// vocab 128, untied head, no MTP, no biases, no qk norm.
constexpr int64_t H = 64, NH = 4, NKV = 2, HD = 16, DI = 96, MI = 32, E = 4, V = 128, L = 2;

model::ModelConfig tiny_config() {
  const std::string dir = ::testing::TempDir() + "/mxserve_memory_plan_tiny";
  std::remove((dir + "/config.json").c_str());
  std::string mk = "mkdir -p " + dir;
  EXPECT_EQ(std::system(mk.c_str()), 0);
  std::ofstream(dir + "/config.json") << R"({
    "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "hidden_size": 64,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96,
    "moe_intermediate_size": 32, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
    "n_group": 1, "topk_group": 1, "norm_topk_prob": true, "first_k_dense_replace": 1, "num_hidden_layers": 2,
    "vocab_size": 128, "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000,
    "partial_rotary_factor": 0.5, "attention_bias": false, "use_qk_norm": false, "tie_word_embeddings": false,
    "num_nextn_predict_layers": 0, "routed_scaling_factor": 1.0, "hidden_act": "silu"})";
  model::LoadOptions lo;
  lo.synthetic = true;
  auto cfg = model::resolve_model_config(dir + "/config.json", lo);
  EXPECT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  return *cfg;
}

parallel::ParallelConfig layout(int tp, int dp = 1, int ep = 1, bool dp_attention = false) {
  parallel::ParallelConfig p;
  p.tp = tp, p.dp = dp, p.ep = ep, p.dp_attention = dp_attention;
  return p;
}

// MXFP4 bytes of a [rows, cols] weight: 4-bit codes + one e8m0 scale per 32 columns.
int64_t mxfp4(int64_t rows, int64_t cols) { return rows * cols / 2 + rows * ((cols + 31) / 32); }

// Hand count of one rank's bytes. attn_tp: the attention / dense / embedding split; moe_tp: the MoE width
// split (shared experts, routed experts when ep == 1); experts_here: routed experts this rank holds.
int64_t hand_bytes(int attn_tp, int moe_tp, int64_t experts_here, int expert_width_split, bool mxfp4_experts) {
  int64_t b = 0;
  b += 2 * (V / attn_tp) * H * 2;                         // embed_tokens + lm_head rows
  b += 2 * H;                                             // final norm
  b += L * 2 * H * 2;                                     // input / post-attention norms
  const int64_t kv_local = std::max<int64_t>(1, NKV / attn_tp);
  b += L * 2 * ((NH / attn_tp) * HD * H * 2);             // q_proj + o_proj
  b += L * 2 * (kv_local * HD * H * 2);                   // k_proj + v_proj
  b += 3 * (DI / attn_tp) * H * 2;                        // layer 0: dense gate / up / down
  b += E * H * 2 + E * 4;                                 // layer 1: router (bf16) + e_score_correction_bias (f32)
  b += 3 * (MI / moe_tp) * H * 2;                         // shared expert
  const int64_t w = MI / expert_width_split;
  b += experts_here * (mxfp4_experts ? 2 * mxfp4(w, H) + mxfp4(H, w) : 3 * w * H * 2);  // gate, up [w, H]; down [H, w]
  return b;
}

TEST(MemoryPlan, WeightBytesMatchTheHandCount) {
  const model::ModelConfig cfg = tiny_config();
  const model::SyntheticPlan bf16, fp4{"mxfp4", "bf16"};
  MemoryOptions o;
  struct Case {
    parallel::ParallelConfig p;
    const model::SyntheticPlan* plan;
    int64_t want;
  } cases[] = {
      {layout(1), &bf16, hand_bytes(1, 1, E, 1, false)},
      {layout(2), &bf16, hand_bytes(2, 2, E, 2, false)},
      {layout(2, 1, 2), &bf16, hand_bytes(2, 2, E / 2, 1, false)},
      {layout(1, 2, 1, true), &bf16, hand_bytes(1, 2, E, 2, false)},   // DP attention: MoE over both ranks
      {layout(2), &fp4, hand_bytes(2, 2, E, 2, true)},
      {layout(2, 1, 2), &fp4, hand_bytes(2, 2, E / 2, 1, true)},
  };
  for (const Case& c : cases) {
    auto m = plan_memory(cfg, c.p, *c.plan, o);
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    EXPECT_EQ(static_cast<int64_t>(m->weight_bytes_max), c.want) << m->layout << " " << c.plan->experts;
    EXPECT_EQ(m->weight_bytes_min, m->weight_bytes_max) << m->layout;  // this config splits evenly
    EXPECT_EQ(static_cast<int64_t>(m->weight_bytes_total), hand_bytes(1, 1, E, 1, c.plan == &fp4)) << m->layout;
  }
}

TEST(MemoryPlan, KvTokensThatFit) {
  const model::ModelConfig cfg = tiny_config();
  MemoryOptions o;
  o.gpu_bytes = 1 << 20;
  o.gpu_utilization = 1.0;
  auto m = plan_memory(cfg, layout(2), model::SyntheticPlan{}, o);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  const int64_t per_token = L * 2 * 1 * HD * 2;  // K and V, one KV head per rank at tp 2, bf16
  EXPECT_EQ(static_cast<int64_t>(m->kv_bytes_per_token), per_token);
  const int64_t weights = hand_bytes(2, 2, E, 2, false);
  EXPECT_EQ(m->kv_tokens_per_rank, ((1 << 20) - weights) / per_token);
  EXPECT_EQ(m->kv_tokens_total, m->kv_tokens_per_rank);
  auto dp = plan_memory(cfg, layout(1, 2, 1, true), model::SyntheticPlan{}, o);
  ASSERT_TRUE(dp.is_ok());
  EXPECT_EQ(static_cast<int64_t>(dp->kv_bytes_per_token), L * 2 * NKV * HD * 2);
  EXPECT_EQ(dp->kv_tokens_total, 2 * dp->kv_tokens_per_rank);  // each DP group caches its own requests
  o.kv_dtype = kvcache::KvCacheDtype::kFp8E4M3;  // codes + one f32 scale per (slot, KV head)
  auto f8 = plan_memory(cfg, layout(2), model::SyntheticPlan{}, o);
  ASSERT_TRUE(f8.is_ok());
  EXPECT_EQ(static_cast<int64_t>(f8->kv_bytes_per_token), L * 2 * (1 * HD + 1 * 4));
  o.gpu_bytes = 1000;  // smaller than the weights
  auto tiny = plan_memory(cfg, layout(2), model::SyntheticPlan{}, o);
  ASSERT_TRUE(tiny.is_ok());
  EXPECT_FALSE(tiny->fits);
  EXPECT_EQ(tiny->kv_tokens_per_rank, 0);
}

TEST(MemoryPlan, LinkBytesPerToken) {
  const model::ModelConfig cfg = tiny_config();
  MemoryOptions o;
  auto tp = plan_memory(cfg, layout(2), model::SyntheticPlan{}, o);
  ASSERT_TRUE(tp.is_ok());
  // embedding + 2 o_proj + 1 dense MLP + 1 MoE block = 5 all-reduces of H x 2 B; a ring sends 2 (2-1)/2 x that.
  EXPECT_EQ(tp->links.tp_all_reduces, 5);
  EXPECT_DOUBLE_EQ(tp->links.tp_all_reduce_bytes, 5 * 1.0 * H * 2);
  EXPECT_DOUBLE_EQ(tp->links.logits_bytes, 0.5 * V * 4);
  EXPECT_DOUBLE_EQ(tp->links.moe_exchange_bytes, 0);
  auto dpa = plan_memory(cfg, layout(1, 2, 2, true), model::SyntheticPlan{}, o);
  ASSERT_TRUE(dpa.is_ok()) << dpa.status().to_string();
  EXPECT_EQ(dpa->links.tp_all_reduces, 0);
  EXPECT_DOUBLE_EQ(dpa->links.moe_exchange_bytes, 1 * 2.0 * 1 / 2 * H * 2);  // one MoE layer, W = 2
  // all-to-all alternative: 2 x (ep - 1) x P(a rank is hit by top 2 of 2 ranks' experts) x H x 2 per MoE layer
  EXPECT_DOUBLE_EQ(dpa->links.all_to_all_bytes, 2.0 * 1 * (1 - 0.25) * H * 2);
}

}  // namespace
}  // namespace mxserve::cli
