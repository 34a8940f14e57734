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

class KvPerturbingBackend final : public backend::Backend {
 public:
  KvPerturbingBackend(std::unique_ptr<backend::Backend> inner, KvPerturbation mode, uint64_t seed)
      : inner_(std::move(inner)), mode_(mode), rng_(seed) {}

  std::string name() const override { return inner_->name(); }
  Device device() const override { return inner_->device(); }
  DType activation_dtype() const override { return inner_->activation_dtype(); }
  DType weight_dtype() const override { return inner_->weight_dtype(); }
  bool supports_expert_format(backend::ExpertFormat f) const override { return inner_->supports_expert_format(f); }
  void prepare_moe(backend::ExpertWeights& e, int64_t top_k) override { inner_->prepare_moe(e, top_k); }
  Tensor alloc(DType dtype, Shape shape) override { return inner_->alloc(dtype, std::move(shape)); }
  void copy_weight(const Tensor& host, Tensor& dst) override { inner_->copy_weight(host, dst); }
  Tensor upload(const Tensor& host) override { return inner_->upload(host); }
  Tensor to_host(const Tensor& t) override { return inner_->to_host(t); }
  void synchronize() override { inner_->synchronize(); }
  void embedding(const Tensor& table, const Tensor& ids, Tensor& out) override { inner_->embedding(table, ids, out); }
  void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out) override { inner_->rmsnorm(x, w, eps, out); }
  void linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out) override {
    inner_->linear(x, w, bias, out);
  }
  void rope(Tensor& x, const Tensor& positions, const kernels::RopeParams& p) override { inner_->rope(x, positions, p); }
  void silu_mul(const Tensor& gate_up, Tensor& out) override { inner_->silu_mul(gate_up, out); }
  void add(Tensor& x, const Tensor& y) override { inner_->add(x, y); }
  void kv_copy(const Tensor& src, const Tensor& dst, const std::vector<Tensor*>& caches) override {
    inner_->kv_copy(src, dst, caches);
  }
  void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const backend::AttentionMeta& meta,
                 Tensor& out) override {
    inner_->attention(q, k_cache, v_cache, meta, out);
  }
  void router(const Tensor& x, const Tensor& gate_w, const Tensor& bias, const kernels::RouterParams& p,
              Tensor& topk_ids, Tensor& topk_weights) override {
    inner_->router(x, gate_w, bias, p, topk_ids, topk_weights);
  }
  void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const backend::ExpertWeights& experts,
                   Tensor& out) override {
    inner_->moe_experts(x, ids, weights, experts, out);
  }
  void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) override { inner_->gather_rows(x, rows, out); }
  void argmax_rows(const Tensor& logits, Tensor& out) override { inner_->argmax_rows(logits, out); }
  void fill_synthetic(const kernels::SyntheticFill& p, Tensor& dst, Tensor* scales) override {
    inner_->fill_synthetic(p, dst, scales);
  }

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

  std::unique_ptr<backend::Backend> inner_;
  KvPerturbation mode_;
  std::mt19937_64 rng_;
};

}  // namespace mxserve::test
