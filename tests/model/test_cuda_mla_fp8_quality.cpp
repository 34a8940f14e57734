// glm_moe_dsa with --kv-cache-dtype fp8_e4m3 on CUDA (label gpu; skips without a CUDA device): decode logits
// (a 9-token prefill, then one token per step through the cache, teacher-forced) on both glm_moe_dsa fixtures.
// Bound: the CUDA FP8 model's logit rel L2 to the CPU f32 reference must stay within the CUDA bf16-cache
// model's own distance to that reference (bf16 activations) plus the FP8 format envelope measured on the CPU
// (mla_perturbing_backend.h: every latent / indexer-key element moved by the worst-case e4m3 error of its
// 128-block scale, the rope key by half a bf16 unit; the largest of four draws) -- the two error sources add
// at most. Prints every number. MXSERVE_FIXTURE_ROOT overrides the fixtures directory.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "backend/backend.h"
#include "kvcache/kv_cache.h"
#include "model/causal_lm.h"
#include "runtime/sequence_runner.h"
#include "mla_perturbing_backend.h"

namespace mxserve {
namespace {

namespace fs = std::filesystem;

// Teacher-forced logits f32 [T, V] of prompt ids: first 9 in one chunk, then one per step.
std::vector<float> decode_logits(const fs::path& dir, backend::Backend& be, kvcache::KvCacheDtype dt) {
  model::LoadOptions lo;
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

TEST(CudaMlaFp8Quality, DecodeLogitsWithinTheFormatBound) {
  auto gpu = backend::make_backend("cuda");
  if (!gpu.is_ok()) GTEST_SKIP() << "no CUDA device: run on the GPU machine (" << gpu.status().to_string() << ")";
  for (const char* name : {"glm_moe_dsa_tiny_a", "glm_moe_dsa_tiny_b"}) {
    SCOPED_TRACE(name);
    const char* root = std::getenv("MXSERVE_FIXTURE_ROOT");  // the GPU machine runs from a copied tree
    const fs::path dir = (root ? fs::path(root) : fs::path(MXSERVE_SOURCE_DIR) / "tests/fixtures") / name;
    auto cpu = backend::make_cpu_backend();
    const auto ref = decode_logits(dir, *cpu, kvcache::KvCacheDtype::kAuto);
    const auto cpu_fp8 = decode_logits(dir, *cpu, kvcache::KvCacheDtype::kFp8E4M3);
    const auto gpu_bf16 = decode_logits(dir, **gpu, kvcache::KvCacheDtype::kAuto);
    const auto gpu_fp8 = decode_logits(dir, **gpu, kvcache::KvCacheDtype::kFp8E4M3);
    ASSERT_FALSE(ref.empty() || gpu_fp8.empty());
    double env = 0;
    uint64_t seed = 0;
    for (auto mode : {test::KvPerturbation::kShrink, test::KvPerturbation::kGrow, test::KvPerturbation::kRandomSigns,
                      test::KvPerturbation::kRandomSigns}) {
      test::MlaPerturbingBackend pb(backend::make_cpu_backend(), mode, ++seed);
      env = std::max(env, rel_l2(decode_logits(dir, pb, kvcache::KvCacheDtype::kAuto), ref));
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

}  // namespace
}  // namespace mxserve
