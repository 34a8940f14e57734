// FP8 E4M3 KV cache quality on every committed fixture (CPU reference): logits with the FP8 cache against
// the f32 cache, teacher-forced through the cache in chunks (each chunk attends to the FP8 prefix written by
// the earlier ones). Reported: logit relative L2, KL(f32 || fp8) per token (mean, max), top-1 agreement.
// The bound comes from the format, not from this implementation: the same f32 model is run with every K/V
// element it writes moved by the format's worst-case error under the scheme (docs/kv-cache.md):
//   s = amax / 448 per (token, kv head); y = x / s; |y| in [2^k, 2^(k+1)), k >= -6: e = 2^(k-4) s (half a unit
//   of the 3-bit mantissa); |y| < 2^-6 (subnormal): e = 2^-10 s.
// Draws: every element shrunk toward zero by e, every element grown by e, and two random-sign draws; the
// envelope is the largest error of those (as tests/model/quant_bound.h does for weights: an envelope, not a
// proof). The real FP8 cache must stay inside it; a broken quantizer (wrong scale, byte order, sign) moves
// elements by far more than e and fails.
// glm_moe_dsa (packed FP8 latent + indexer-key rows, kernels/mla_fp8.h): the same with s per 128-value block
// of the latent / indexer key, and the rope key moved by half a bf16 unit (mla_perturbing_backend.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>

#include "backend/backend.h"
#include "kvcache/kv_cache.h"
#include "model/causal_lm.h"
#include "runtime/sequence_runner.h"
#include "kv_perturbing_backend.h"
#include "mla_perturbing_backend.h"

namespace mxserve {
namespace {

namespace fs = std::filesystem;

struct Logits {
  std::vector<Tensor> per_case;  // host f32 [T, V]
};

struct Quality {
  double rel_l2 = 0, kl_mean = 0, kl_max = 0, top1 = 0;
};

constexpr int64_t kBlockSize = 16;
constexpr int64_t kChunk = 7;

std::vector<fs::path> fixture_dirs() {
  std::vector<fs::path> dirs;
  for (const auto& e : fs::directory_iterator(fs::path(MXSERVE_SOURCE_DIR) / "tests/fixtures"))
    if (fs::exists(e.path() / "reference.safetensors")) dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

// Prompts: 3 deterministic random-id sequences of 23, 40 and 64 tokens.
std::vector<std::vector<int32_t>> prompts(int64_t vocab) {
  std::vector<std::vector<int32_t>> out;
  std::mt19937 rng(11);
  for (int64_t len : {23, 40, 64}) {
    std::vector<int32_t> p(len);
    for (auto& id : p) id = static_cast<int32_t>(rng() % vocab);
    out.push_back(p);
  }
  return out;
}

// Teacher-forced logits of every row, prefilled in chunks of kChunk through the model's own cache layout.
Logits run(const fs::path& dir, backend::Backend& be, kvcache::KvCacheDtype kv_dtype) {
  model::LoadOptions lo;
  lo.load_mtp = false;
  lo.kv_cache_dtype = kv_dtype;
  auto m = model::load_causal_lm(dir.string(), be, lo);
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  Logits out;
  if (!m.is_ok()) return out;
  const int64_t V = (*m)->config().vocab_size;
  runtime::SequenceRunner runner(**m, be, 64, kBlockSize);
  for (const auto& p : prompts(V)) {
    const int64_t T = static_cast<int64_t>(p.size());
    Tensor logits = Tensor::empty(DType::kF32, {T, V});
    runtime::SequenceState seq;
    for (int64_t b = 0; b < T; b += kChunk) {
      const int64_t e = std::min(T, b + kChunk);
      auto step = runner.extend({&seq}, {std::vector<int32_t>(p.begin() + b, p.begin() + e)}, true, false);
      EXPECT_TRUE(step.is_ok()) << step.status().to_string();
      if (!step.is_ok()) return out;
      std::copy_n(step->logits.data<float>(), (e - b) * V, logits.data<float>() + b * V);
    }
    runner.release(seq);
    out.per_case.push_back(logits);
  }
  return out;
}

Quality compare(const Logits& ref, const Logits& got) {
  Quality q;
  double num = 0, den = 0, kl_sum = 0;
  int64_t rows = 0, agree = 0;
  for (size_t c = 0; c < ref.per_case.size() && c < got.per_case.size(); ++c) {
    const Tensor& a = ref.per_case[c];
    const Tensor& b = got.per_case[c];
    const int64_t T = a.dim(0), V = a.dim(1);
    for (int64_t t = 0; t < T; ++t) {
      const float* za = a.data<float>() + t * V;
      const float* zb = b.data<float>() + t * V;
      double ma = -INFINITY, mb = -INFINITY;
      for (int64_t i = 0; i < V; ++i) {
        num += (static_cast<double>(za[i]) - zb[i]) * (static_cast<double>(za[i]) - zb[i]);
        den += static_cast<double>(za[i]) * za[i];
        ma = std::max(ma, static_cast<double>(za[i]));
        mb = std::max(mb, static_cast<double>(zb[i]));
      }
      double sa = 0, sb = 0;
      for (int64_t i = 0; i < V; ++i) sa += std::exp(za[i] - ma), sb += std::exp(zb[i] - mb);
      const double lsa = ma + std::log(sa), lsb = mb + std::log(sb);
      double kl = 0;
      for (int64_t i = 0; i < V; ++i) {
        const double lpa = za[i] - lsa, lpb = zb[i] - lsb;
        kl += std::exp(lpa) * (lpa - lpb);
      }
      kl_sum += kl;
      q.kl_max = std::max(q.kl_max, kl);
      agree += (std::max_element(za, za + V) - za) == (std::max_element(zb, zb + V) - zb) ? 1 : 0;
      ++rows;
    }
  }
  q.rel_l2 = std::sqrt(num / std::max(den, 1e-30));
  q.kl_mean = rows > 0 ? kl_sum / rows : 0;
  q.top1 = rows > 0 ? static_cast<double>(agree) / rows : 0;
  return q;
}

void print(const char* what, const fs::path& dir, const Quality& q) {
  std::printf("[ kv fp8   ] %-16s %-11s logits rel_l2 %.3e  KL mean %.3e max %.3e  top-1 %.2f%%\n",
              dir.filename().c_str(), what, q.rel_l2, q.kl_mean, q.kl_max, 100.0 * q.top1);
}

TEST(KvFp8Quality, WithinTheFormatEnvelopeOnEveryFixture) {
  const auto dirs = fixture_dirs();
  ASSERT_GE(dirs.size(), 2u);
  for (const fs::path& dir : dirs) {
    SCOPED_TRACE(dir.string());
    const bool mla = dir.filename().string().rfind("glm_moe_dsa", 0) == 0;  // packed FP8 latent rows
    auto cpu = backend::make_cpu_backend();
    const Logits ref = run(dir, *cpu, kvcache::KvCacheDtype::kAuto);
    const Logits fp8 = run(dir, *cpu, kvcache::KvCacheDtype::kFp8E4M3);
    ASSERT_EQ(ref.per_case.size(), 3u);
    ASSERT_EQ(fp8.per_case.size(), 3u);
    const Quality got = compare(ref, fp8);
    print("fp8_e4m3", dir, got);
    Quality env;
    env.top1 = 1.0;
    uint64_t seed = 0;
    for (auto mode : {test::KvPerturbation::kShrink, test::KvPerturbation::kGrow, test::KvPerturbation::kRandomSigns,
                      test::KvPerturbation::kRandomSigns}) {
      std::unique_ptr<backend::Backend> pb;
      if (mla) pb = std::make_unique<test::MlaPerturbingBackend>(backend::make_cpu_backend(), mode, ++seed);
      else pb = std::make_unique<test::KvPerturbingBackend>(backend::make_cpu_backend(), mode, ++seed);
      const Quality e = compare(ref, run(dir, *pb, kvcache::KvCacheDtype::kAuto));
      env.rel_l2 = std::max(env.rel_l2, e.rel_l2);
      env.kl_mean = std::max(env.kl_mean, e.kl_mean);
      env.kl_max = std::max(env.kl_max, e.kl_max);
      env.top1 = std::min(env.top1, e.top1);
    }
    print("envelope", dir, env);
    EXPECT_GT(got.rel_l2, 0.0) << "the FP8 cache changed nothing: is it in use?";
    EXPECT_LE(got.rel_l2, env.rel_l2);
    EXPECT_LE(got.kl_mean, env.kl_mean);
  }
}

}  // namespace
}  // namespace mxserve
