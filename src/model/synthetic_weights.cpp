#include "model/synthetic_weights.h"

#include <cmath>
#include <string>

#include "core/check.h"
#include "quant/fp8.h"
#include "quant/mxfp4.h"

namespace mxserve::model {
namespace {

bool ends_with(const std::string& s, const char* suffix) {
  const std::string x(suffix);
  return s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
}

bool valid_scheme(const std::string& s) { return s == "mxfp4" || s == "fp8-block" || s == "bf16"; }

bool is_bias_f32(const std::string& name) { return ends_with(name, "e_score_correction_bias"); }

}  // namespace

Result<SyntheticPlan> parse_synthetic_plan(const std::string& plan) {
  SyntheticPlan p;
  if (plan.empty()) return p;
  const size_t colon = plan.find(':');
  p.experts = plan.substr(0, colon);
  p.rest = colon == std::string::npos ? "bf16" : plan.substr(colon + 1);
  if (!valid_scheme(p.experts) || !valid_scheme(p.rest))
    return invalid_argument("--quantization '" + plan +
                            "': expected EXPERTS[:REST] with each of mxfp4, fp8-block or bf16 (e.g. mxfp4:fp8-block)");
  return p;
}

std::string synthetic_scheme(const SyntheticPlan& plan, const std::string& name) {
  if (!ends_with(name, "_proj.weight")) return "bf16";  // Linear weights only: no router, norms, embeddings, head
  if (name.find(".mlp.experts.") != std::string::npos) return plan.experts;
  if (ends_with(name, "eh_proj.weight")) return "bf16";  // the MTP eh_proj stays bf16 in published checkpoints
  return plan.rest;
}

SyntheticSource make_synthetic_source(const std::vector<WeightSpec>& table, int64_t d_model, uint64_t seed,
                                      const SyntheticPlan& plan) {
  SyntheticSource s;
  s.seed = seed;
  s.d_model = d_model;
  s.plan = plan;
  for (const auto& spec : table)
    if (!spec.optional) s.shapes[spec.name] = spec.shape;
  return s;
}

kernels::SyntheticFill synthetic_fill_params(const SyntheticSource& src, const std::string& name) {
  const auto it = src.shapes.find(name);
  MX_CHECK_MSG(it != src.shapes.end(), "synthetic weights: no tensor '" << name << "' in the weight table");
  const Shape& shape = it->second;
  kernels::SyntheticFill p;
  p.stream = kernels::synthetic_stream(src.seed, name.c_str());
  p.cols = shape.back();
  p.rows = shape_numel(shape) / p.cols;
  p.src_cols = p.cols;
  if (is_bias_f32(name)) {
    p.keep_f32 = true;
  } else if (ends_with(name, "norm.weight")) {
    p.mean = 1.0f;
    p.stddev = 0.05f;
  } else if (ends_with(name, "mlp.gate.weight")) {
    p.stddev = 1.0f / std::sqrt(static_cast<float>(src.d_model));
  }
  return p;
}

Tensor synthetic_host_tensor(const SyntheticSource& src, const std::string& name) {
  const kernels::SyntheticFill p = synthetic_fill_params(src, name);
  const bool f32 = is_bias_f32(name);
  Tensor t = Tensor::empty(f32 ? DType::kF32 : DType::kBF16, src.shapes.at(name));
  kernels::cpu::synthetic_fill(p, t.raw(), !f32, nullptr);
  return t;
}

uint64_t synthetic_weight_bytes(const std::vector<WeightSpec>& table) {
  uint64_t bytes = 0;
  for (const auto& s : table)
    if (!s.optional) bytes += (is_bias_f32(s.name) ? 4ull : 2ull) * static_cast<uint64_t>(shape_numel(s.shape));
  return bytes;
}

BoundWeights make_synthetic_weights(const std::vector<WeightSpec>& table, int64_t d_model, uint64_t seed) {
  const SyntheticSource src = make_synthetic_source(table, d_model, seed, SyntheticPlan{});
  BoundWeights out;
  for (const auto& spec : table) {
    if (spec.optional) continue;
    Tensor t = synthetic_host_tensor(src, spec.name);
    const Precision p = t.dtype() == DType::kF32 ? Precision::kF32 : Precision::kBF16;
    out.add(spec.name, BoundWeight{t, p});
  }
  return out;
}

namespace {

Status quantize_one(BoundWeights& weights, const std::string& name, const std::string& scheme) {
  const BoundWeight& w = weights.at(name);
  quant::StoredWeight s;
  s.name = name;
  s.shape = w.host.shape();
  if (scheme == "mxfp4") {
    MX_ASSIGN_OR_RETURN(quant::MxTensors q, quant::quantize_mxfp4(w.host, quant::ScaleRule::kEven, name));
    s.precision = quant::Precision::kMxfp4;
    s.data = q.packed;
    s.scale_name = name + "_scale";
    s.scale = q.scales;
  } else {
    MX_ASSIGN_OR_RETURN(quant::Fp8Tensors q, quant::quantize_fp8_block(w.host, quant::kFp8Block, quant::kFp8Block, name));
    s.precision = quant::Precision::kFp8Block;
    s.data = q.weight;
    s.scale_name = name + "_scale_inv";
    s.scale = q.scale;
    s.block_rows = quant::kFp8Block;
    s.block_cols = quant::kFp8Block;
  }
  weights.add(name, BoundWeight(std::move(s)));
  return Status::ok();
}

}  // namespace

Status quantize_synthetic_experts(BoundWeights& weights, const std::string& plan) {
  MX_ASSIGN_OR_RETURN(SyntheticPlan p, parse_synthetic_plan(plan));
  for (const std::string& name : weights.names()) {
    const std::string scheme = synthetic_scheme(p, name);
    if (scheme != "bf16") MX_RETURN_IF_ERROR(quantize_one(weights, name, scheme));
  }
  return Status::ok();
}

}  // namespace mxserve::model
