// ForwardingBackend: a Backend that hands every operation to an inner backend -- the base of the test doubles that
// change one or two operations (KvPerturbingBackend, MlaPerturbingBackend, ReplayingBackend,
// Fp8ActivationSimBackend), so each states only what it changes. The optional hooks (set_kernel_options,
// write_from_host, sample_rows, capture_graph, moe_kernel_configs) keep Backend's defaults unless a double forwards
// them itself. ForwardingMlaBackend also forwards the MLA / DSA ops (backend/mla_dsa_ops.h) of the inner backend.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/mla_dsa_ops.h"

namespace mxserve::test {

class ForwardingBackend : public backend::Backend {
 public:
  explicit ForwardingBackend(std::unique_ptr<backend::Backend> inner) : inner_(std::move(inner)) {}

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
  // The inner backend picks attention's q / k / v path (CUDA keeps separate GEMMs until its fused RoPE + K/V write
  // is the default); rope_kv_write itself stays Backend's composed default over this double's own ops.
  bool one_qkv_gemm(int64_t rows) const override { return inner_->one_qkv_gemm(rows); }
  void silu_mul(const Tensor& gate_up, Tensor& out) override { inner_->silu_mul(gate_up, out); }
  void add(Tensor& x, const Tensor& y) override { inner_->add(x, y); }
  void add_rmsnorm(const Tensor& x, Tensor& residual, const Tensor& w, float eps, Tensor& out) override {
    inner_->add_rmsnorm(x, residual, w, eps, out);
  }
  void kv_write(const Tensor& k, const Tensor& v, const backend::AttentionMeta& meta, Tensor& k_cache,
                Tensor& v_cache) override {
    inner_->kv_write(k, v, meta, k_cache, v_cache);
  }
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

 protected:
  std::unique_ptr<backend::Backend> inner_;
};

class ForwardingMlaBackend : public ForwardingBackend, public backend::MlaDsaOps {
 public:
  explicit ForwardingMlaBackend(std::unique_ptr<backend::Backend> inner)
      : ForwardingBackend(std::move(inner)), ops_(backend::mla_dsa_ops(*inner_)) {}

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
    ops_->cache_write(rows, meta, cache, col_offset);
  }
  void indexer_topk(const Tensor& q, const Tensor& weights, const Tensor& key_cache, const backend::AttentionMeta& meta,
                    const kernels::IndexerParams& p, Tensor& topk) override {
    ops_->indexer_topk(q, weights, key_cache, meta, p, topk);
  }
  void mla_attention(const Tensor& q, const Tensor& latent_cache, const Tensor& kv_b, const Tensor* topk,
                     const backend::AttentionMeta& meta, const kernels::MlaParams& p, Tensor& out) override {
    ops_->mla_attention(q, latent_cache, kv_b, topk, meta, p, out);
  }

 protected:
  backend::MlaDsaOps* ops_;
};

}  // namespace mxserve::test
