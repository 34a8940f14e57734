// Test double: the CPU reference backend with every K/V element written to the cache moved by the FP8 E4M3
// KV scheme's worst-case error (docs/kv-cache.md): per (token, kv head) s = amax / 448, y = x / s; for
// |y| in [2^k, 2^(k+1)), k >= -6, e = 2^(k-4) s; for |y| < 2^-6, e = 2^-10 s. The error is computed here from
// the format definition (not with kernels/kv_fp8.h). Every other op forwards to the wrapped backend.
#pragma once

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "forwarding_backend.h"

namespace mxserve::test {

enum class KvPerturbation { kShrink, kGrow, kRandomSigns };

// The worst-case |dequant(quant(x)) - x| of one element under scale s (s > 0).
inline float fp8_kv_worst_error(float x, float s) {
  const float y = std::fabs(x) / s;
  if (y < std::ldexp(1.f, -6)) return std::ldexp(s, -10);
  int k = 0;
  std::frexp(y, &k);  // y = m * 2^k, m in [0.5, 1): |y| in [2^(k-1), 2^k)
  return std::ldexp(s, (k - 1) - 4);
}

class KvPerturbingBackend final : public ForwardingBackend {
 public:
  KvPerturbingBackend(std::unique_ptr<backend::Backend> inner, KvPerturbation mode, uint64_t seed)
      : ForwardingBackend(std::move(inner)), mode_(mode), rng_(seed) {}

  // K and V rows (host f32 on the CPU backend) moved per element by the worst-case error, then written.
  void kv_write(const Tensor& k, const Tensor& v, const backend::AttentionMeta& meta, Tensor& k_cache,
                Tensor& v_cache) override {
    Tensor kp = perturbed(k, meta.params.head_dim);
    Tensor vp = perturbed(v, meta.params.head_dim);
    inner_->kv_write(kp, vp, meta, k_cache, v_cache);
  }

 private:
  Tensor perturbed(const Tensor& x, int64_t head_dim) {
    Tensor out = inner_->to_host(x);
    float* d = out.data<float>();
    const int64_t rows = out.numel() / head_dim;  // (token, kv head) rows
    std::bernoulli_distribution coin(0.5);
    for (int64_t r = 0; r < rows; ++r) {
      float* h = d + r * head_dim;
      float amax = 0.f;
      for (int64_t i = 0; i < head_dim; ++i) amax = std::fmax(amax, std::fabs(h[i]));
      if (amax == 0.f) continue;
      const float s = amax / 448.f;
      for (int64_t i = 0; i < head_dim; ++i) {
        const float e = fp8_kv_worst_error(h[i], s);
        const float toward = h[i] >= 0.f ? 1.f : -1.f;
        switch (mode_) {
          case KvPerturbation::kShrink: h[i] -= toward * std::fmin(e, std::fabs(h[i])); break;
          case KvPerturbation::kGrow: h[i] += toward * e; break;
          case KvPerturbation::kRandomSigns: h[i] += coin(rng_) ? e : -e; break;
        }
      }
    }
    return inner_->upload(out);
  }

  KvPerturbation mode_;
  std::mt19937_64 rng_;
};

}  // namespace mxserve::test
