// Test double: the CPU reference backend with every MLA latent / DSA indexer-key row written to the cache
// (MlaDsaOps::cache_write) moved by the worst-case error of the packed FP8 cache (kernels/mla_fp8.h,
// docs/kv-cache.md), computed here from the format definitions (not with kernels/mla_fp8.h or kv_fp8.h):
//   the quantized part (a write at column 0): per 128-value block s = amax / 448, y = x / s; for |y| in
//   [2^k, 2^(k+1)), k >= -6, e = 2^(k-4) s; for |y| < 2^-6, e = 2^-10 s (fp8_kv_worst_error);
//   the bf16 tail (a write at column > 0, the rope key): half a bf16 unit, e = 2^(k-8) for |x| in [2^k, 2^(k+1)).
// Every other op forwards to the wrapped backend.
#pragma once

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/mla_dsa_ops.h"
#include "forwarding_backend.h"
#include "kv_perturbing_backend.h"

namespace mxserve::test {

class MlaPerturbingBackend final : public ForwardingMlaBackend {
 public:
  MlaPerturbingBackend(std::unique_ptr<backend::Backend> inner, KvPerturbation mode, uint64_t seed)
      : ForwardingMlaBackend(std::move(inner)), mode_(mode), rng_(seed) {}

  // MlaDsaOps: the cache rows perturbed before the inner backend writes them (everything else forwarded)
  void cache_write(const Tensor& rows, const backend::AttentionMeta& meta, Tensor& cache, int64_t col_offset) override {
    ops_->cache_write(perturbed(rows, col_offset > 0), meta, cache, col_offset);
  }

 private:
  float moved(float x, float e) {
    const float toward = x >= 0.f ? 1.f : -1.f;
    switch (mode_) {
      case KvPerturbation::kShrink: return x - toward * std::fmin(e, std::fabs(x));
      case KvPerturbation::kGrow: return x + toward * e;
      case KvPerturbation::kRandomSigns: return x + (coin_(rng_) ? e : -e);
    }
    return x;
  }
  // rows [T, W] (host f32 on the CPU backend): W values per token row.
  Tensor perturbed(const Tensor& x, bool bf16_tail) {
    Tensor out = inner_->to_host(x);
    float* d = out.data<float>();
    const int64_t W = out.dim(out.ndim() - 1), rows = out.numel() / std::max<int64_t>(W, 1);
    for (int64_t r = 0; r < rows; ++r) {
      float* h = d + r * W;
      if (bf16_tail) {
        for (int64_t i = 0; i < W; ++i) {
          if (h[i] == 0.f) continue;
          int k = 0;
          std::frexp(h[i], &k);  // |x| in [2^(k-1), 2^k): a bf16 unit there is 2^(k-8), half of it 2^(k-9)
          h[i] = moved(h[i], std::ldexp(1.f, k - 9));
        }
        continue;
      }
      for (int64_t b0 = 0; b0 < W; b0 += 128) {
        const int64_t e = std::min<int64_t>(W, b0 + 128);
        float amax = 0.f;
        for (int64_t i = b0; i < e; ++i) amax = std::fmax(amax, std::fabs(h[i]));
        if (amax == 0.f) continue;
        const float s = amax / 448.f;
        for (int64_t i = b0; i < e; ++i) h[i] = moved(h[i], fp8_kv_worst_error(h[i], s));
      }
    }
    return inner_->upload(out);
  }

  KvPerturbation mode_;
  std::mt19937_64 rng_;
  std::bernoulli_distribution coin_{0.5};
};

}  // namespace mxserve::test
