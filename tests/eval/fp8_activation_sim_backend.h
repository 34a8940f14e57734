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
#include "../model/forwarding_backend.h"

namespace mxserve::test {

class Fp8ActivationSimBackend final : public test::ForwardingBackend {
 public:
  explicit Fp8ActivationSimBackend(double error) : ForwardingBackend(backend::make_cpu_backend()), error_(error) {}

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

  void write_from_host(Tensor& dst, int64_t offset, const Tensor& host) override {
    inner_->write_from_host(dst, offset, host);
  }
  std::vector<kernels::SampledRow> sample_rows(const Tensor& logits, const kernels::SampleRowsInput& in) override {
    return inner_->sample_rows(logits, in);
  }

 private:
  double error_;
  backend::KernelOptions options_;
  int64_t fp8_moe_calls_ = 0;
};

}  // namespace mxserve::test
