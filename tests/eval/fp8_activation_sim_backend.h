// Test double for the W4A8 gate's wiring on the CPU: the CPU reference backend that ACCEPTS
// moe_activation_dtype "fp8_e4m3" (the real CPU backend refuses it) and, while it is set, moves every MoE expert
// output element by a chosen relative error (alternating signs, deterministic): `error` ~ 1e-2 stands for
// healthy FP8 rounding, a large one for a broken kernel or scale, 0 for an FP8 path that never runs. It records
// the options in effect and how many MoE calls ran with FP8 "on". Every other op forwards to the CPU backend.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace mxserve::test {

class Fp8ActivationSimBackend final : public backend::Backend {
 public:
  explicit Fp8ActivationSimBackend(double error) : inner_(backend::make_cpu_backend()), error_(error) {}

  const backend::KernelOptions& options() const { return options_; }
  int64_t fp8_moe_calls() const { return fp8_moe_calls_; }

  Status set_kernel_options(const backend::KernelOptions& o) override {
    backend::KernelOptions rest = o;
    if (o.fp8_moe_activations()) rest.moe_activation_dtype = "bf16";  // simulated here, not by the CPU backend
    MX_RETURN_IF_ERROR(inner_->set_kernel_options(rest));
    options_ = o;
    return Status::ok();
  }
  void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const backend::ExpertWeights& experts,
                   Tensor& out) override {
    inner_->moe_experts(x, ids, weights, experts, out);
    if (!options_.fp8_moe_activations()) return;
    ++fp8_moe_calls_;
    float* d = out.data<float>();  // host f32 on the CPU backend
    for (int64_t i = 0; i < out.numel(); ++i) d[i] *= static_cast<float>(1.0 + ((i & 1) ? error_ : -error_));
  }

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
  void write_from_host(Tensor& dst, int64_t offset, const Tensor& host) override {
    inner_->write_from_host(dst, offset, host);
  }
  void synchronize() override { inner_->synchronize(); }
  void embedding(const Tensor& table, const Tensor& ids, Tensor& out) override { inner_->embedding(table, ids, out); }
  void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out) override { inner_->rmsnorm(x, w, eps, out); }
  void linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out) override {
    inner_->linear(x, w, bias, out);
  }
  void rope(Tensor& x, const Tensor& positions, const kernels::RopeParams& p) override { inner_->rope(x, positions, p); }
  void silu_mul(const Tensor& gate_up, Tensor& out) override { inner_->silu_mul(gate_up, out); }
  void add(Tensor& x, const Tensor& y) override { inner_->add(x, y); }
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
  void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) override { inner_->gather_rows(x, rows, out); }
  void argmax_rows(const Tensor& logits, Tensor& out) override { inner_->argmax_rows(logits, out); }
  std::vector<kernels::SampledRow> sample_rows(const Tensor& logits, const kernels::SampleRowsInput& in) override {
    return inner_->sample_rows(logits, in);
  }
  void fill_synthetic(const kernels::SyntheticFill& p, Tensor& dst, Tensor* scales) override {
    inner_->fill_synthetic(p, dst, scales);
  }

 private:
  std::unique_ptr<backend::Backend> inner_;
  double error_;
  backend::KernelOptions options_;
  int64_t fp8_moe_calls_ = 0;
};

}  // namespace mxserve::test
