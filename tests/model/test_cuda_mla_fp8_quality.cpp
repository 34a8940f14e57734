// glm_moe_dsa with --kv-cache-dtype fp8_e4m3 on CUDA (label gpu; skips without a CUDA device): decode logits
// (a 9-token prefill, then one token per step through the cache, teacher-forced) on both glm_moe_dsa fixtures.
// Bound: the CUDA FP8 model's logit rel L2 to the CPU f32 reference must stay within the CUDA bf16-cache
// model's own distance to that reference (bf16 activations) plus the FP8 format envelope measured on the CPU
// (mla_perturbing_backend.h: every latent / indexer-key element moved by the worst-case e4m3 error of its
// 128-block scale, the rope key by half a bf16 unit; the largest of four draws) -- the two error sources add
// at most. Prints every number. MXSERVE_FIXTURE_ROOT overrides the fixtures directory.
// The fixtures' tiny latent (kv_lora_rank 32 / 24) runs the SIMT attend; a second case builds a 2-layer model with
// GLM-5.x's attention geometry (kv_lora_rank 512, rope 64, 16 heads, 32 index heads x 128) and small everything
// else, synthetic weights (the CPU and CUDA generate the same bits), so CUDA's attend is the tensor-core one:
// the Hopper wgmma kernel (kAuto on sm_90) reading the FP8 rows, under the same bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include <unistd.h>

#include "backend/backend.h"
#include "kvcache/kv_cache.h"
#include "model/causal_lm.h"
#include "runtime/sequence_runner.h"
#include "mla_perturbing_backend.h"

namespace mxserve {
namespace {

namespace fs = std::filesystem;

// Teacher-forced logits f32 [T, V] of prompt ids: first 9 in one chunk, then one per step.
// base: synthetic-weight options for a config path (default: a checkpoint directory).
std::vector<float> decode_logits(const fs::path& dir, backend::Backend& be, kvcache::KvCacheDtype dt,
                                 const model::LoadOptions& base = {}) {
  model::LoadOptions lo = base;
  lo.load_mtp = false;
  lo.kv_cache_dtype = dt;
  auto m = model::load_causal_lm(dir.string(), be, lo);
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  if (!m.is_ok()) return {};
  const int64_t V = (*m)->config().vocab_size;
  std::vector<int32_t> ids;
  for (int i = 0; i < 48; ++i) ids.push_back(static_cast<int32_t>((i * 37 + 11) % V));
  runtime::SequenceRunner runner(**m, be, 64, 16);
  runtime::SequenceState seq;
  std::vector<float> out;
  for (size_t b = 0; b < ids.size();) {
    const size_t e = b == 0 ? 9 : b + 1;
    auto step = runner.extend({&seq}, {std::vector<int32_t>(ids.begin() + b, ids.begin() + e)}, true, false);
    EXPECT_TRUE(step.is_ok()) << step.status().to_string();
    if (!step.is_ok()) return {};
    Tensor h = be.to_host(step->logits);
    out.insert(out.end(), h.data<float>(), h.data<float>() + h.numel());
    b = e;
  }
  runner.release(seq);
  return out;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < ref.size(); ++i) {
    num += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return a.size() == ref.size() && den > 0 ? std::sqrt(num / den) : INFINITY;
}

// The quality check of one model (a fixture directory, or a config with synthetic weights).
void check_within_bound(backend::Backend& gpu, const fs::path& dir, const char* name,
                        const model::LoadOptions& base = {}) {
  SCOPED_TRACE(name);
  {
    auto cpu = backend::make_cpu_backend();
    const auto ref = decode_logits(dir, *cpu, kvcache::KvCacheDtype::kAuto, base);
    const auto cpu_fp8 = decode_logits(dir, *cpu, kvcache::KvCacheDtype::kFp8E4M3, base);
    const auto gpu_bf16 = decode_logits(dir, gpu, kvcache::KvCacheDtype::kAuto, base);
    const auto gpu_fp8 = decode_logits(dir, gpu, kvcache::KvCacheDtype::kFp8E4M3, base);
    ASSERT_FALSE(ref.empty() || gpu_fp8.empty());
    double env = 0;
    uint64_t seed = 0;
    for (auto mode : {test::KvPerturbation::kShrink, test::KvPerturbation::kGrow, test::KvPerturbation::kRandomSigns,
                      test::KvPerturbation::kRandomSigns}) {
      test::MlaPerturbingBackend pb(backend::make_cpu_backend(), mode, ++seed);
      env = std::max(env, rel_l2(decode_logits(dir, pb, kvcache::KvCacheDtype::kAuto, base), ref));
    }
    const double e_cpu8 = rel_l2(cpu_fp8, ref), e_gbf = rel_l2(gpu_bf16, ref), e_g8 = rel_l2(gpu_fp8, ref);
    const double e_g8_cpu8 = rel_l2(gpu_fp8, cpu_fp8);
    std::printf("[ mla fp8  ] %-20s rel_l2 vs CPU f32: cpu fp8 %.3e, cuda bf16 %.3e, cuda fp8 %.3e (bound %.3e = "
                "cuda bf16 + envelope %.3e); cuda fp8 vs cpu fp8 %.3e\n",
                name, e_cpu8, e_gbf, e_g8, e_gbf + env, env, e_g8_cpu8);
    EXPECT_LE(e_cpu8, env);
    EXPECT_LE(e_g8, e_gbf + env);
    EXPECT_GT(e_g8_cpu8, 0.0);  // sanity: the two backends did run different arithmetic
  }
}

TEST(CudaMlaFp8Quality, DecodeLogitsWithinTheFormatBound) {
  auto gpu = backend::make_backend("cuda");
  if (!gpu.is_ok()) GTEST_SKIP() << "no CUDA device: run on the GPU machine (" << gpu.status().to_string() << ")";
  for (const char* name : {"glm_moe_dsa_tiny_a", "glm_moe_dsa_tiny_b"}) {
    const char* root = std::getenv("MXSERVE_FIXTURE_ROOT");  // the GPU machine runs from a copied tree
    const fs::path dir = (root ? fs::path(root) : fs::path(MXSERVE_SOURCE_DIR) / "tests/fixtures") / name;
    check_within_bound(**gpu, dir, name);
  }
}

// GLM-5.x attention geometry (the tensor-core attend: wgmma on sm_90), 2 dense layers, index_topk 32 so the
// 48-token decode runs dense then sparse.
TEST(CudaMlaFp8Quality, DecodeLogitsWithinTheFormatBoundOnTheGlm5AttendShape) {
  auto gpu = backend::make_backend("cuda");
  if (!gpu.is_ok()) GTEST_SKIP() << "no CUDA device: run on the GPU machine (" << gpu.status().to_string() << ")";
  const fs::path dir = fs::temp_directory_path() / ("mxserve_glm5_attend_fp8_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    std::ofstream f(dir / "config.json");
    f << R"({"architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa", "attention_bias": false,
  "attention_dropout": 0.0, "dtype": "bfloat16", "eos_token_id": [4095], "pad_token_id": 4095, "ep_size": 1,
  "first_k_dense_replace": 2, "head_dim": 192, "hidden_act": "silu", "hidden_size": 1024, "index_head_dim": 128,
  "index_n_heads": 32, "index_share_for_mtp_iteration": false, "index_skip_topk_offset": 3, "index_topk": 32,
  "index_topk_freq": 1, "index_topk_pattern": null, "indexer_rope_interleave": true,
  "indexer_types": ["full", "full"], "initializer_range": 0.02, "intermediate_size": 2048, "kv_lora_rank": 512,
  "max_position_embeddings": 4096, "mlp_layer_types": ["dense", "dense"], "moe_intermediate_size": 256,
  "moe_layer_freq": 1, "moe_router_dtype": "float32", "n_group": 1, "n_routed_experts": 8, "n_shared_experts": 1,
  "norm_topk_prob": true, "num_attention_heads": 16, "num_experts_per_tok": 2, "num_hidden_layers": 2,
  "num_key_value_heads": 16, "num_nextn_predict_layers": 0, "pretraining_tp": 1, "q_lora_rank": 512,
  "qk_head_dim": 256, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-05,
  "rope_interleave": true, "rope_parameters": {"rope_theta": 8000000, "rope_type": "default"},
  "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": false, "topk_group": 1,
  "topk_method": "noaux_tc", "use_cache": true, "v_head_dim": 256, "vocab_size": 4096})";
  }
  // Which attend kernel reads the FP8 rows is logged once by the CUDA op ("mla_attention: FP8 latent cache ...
  // runs the Hopper wgmma kernel" on sm_90).
  model::LoadOptions lo;
  lo.synthetic = true;
  lo.seed = 11;
  check_within_bound(**gpu, dir / "config.json", "glm5 attend shape (2 layers, synthetic)", lo);
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace
}  // namespace mxserve
