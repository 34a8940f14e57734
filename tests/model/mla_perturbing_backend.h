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
#include "kv_perturbing_backend.h"

namespace mxserve::test {

class MlaPerturbingBackend final : public backend::Backend, public backend::MlaDsaOps {
 public:
  MlaPerturbingBackend(std::unique_ptr<backend::Backend> inner, KvPerturbation mode, uint64_t seed)
      : inner_(std::move(inner)), ops_(backend::mla_dsa_ops(*inner_)), mode_(mode), rng_(seed) {}

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

  void kv_write(const Tensor& k, const Tensor& v, const backend::AttentionMeta& meta, Tensor& k_cache,
                Tensor& v_cache) override {
    inner_->kv_write(k, v, meta, k_cache, v_cache);
  }

  // ---- MlaDsaOps: forwarded, cache rows perturbed ----
  void layernorm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor& out) override {
    ops_->layernorm(x, w, b, eps, out);
  }
  void rope_interleaved(Tensor& x, const Tensor& positions, const kernels::InterleavedRopeParams& p) override {
    ops_->rope_interleaved(x, positions, p);
  }
  void copy_columns(const Tensor& x, int64_t begin, int64_t end, Tensor& out) override {
    ops_->copy_columns(x, begin, end, out);
  }
  void cache_write(const Tensor& rows, const backend::AttentionMeta& meta, Tensor& cache, int64_t col_offset) override {
    ops_->cache_write(perturbed(rows, col_offset > 0), meta, cache, col_offset);
  }
  void indexer_topk(const Tensor& q, const Tensor& weights, const Tensor& key_cache, const backend::AttentionMeta& meta,
                    const kernels::IndexerParams& p, Tensor& topk) override {
    ops_->indexer_topk(q, weights, key_cache, meta, p, topk);
  }
  void mla_attention(const Tensor& q, const Tensor& latent_cache, const Tensor& kv_b, const Tensor* topk,
                     const backend::AttentionMeta& meta, const kernels::MlaParams& p, Tensor& out) override {
    ops_->mla_attention(q, latent_cache, kv_b, topk, meta, p, out);
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

  std::unique_ptr<backend::Backend> inner_;
  backend::MlaDsaOps* ops_;
  KvPerturbation mode_;
  std::mt19937_64 rng_;
  std::bernoulli_distribution coin_{0.5};
};

}  // namespace mxserve::test
