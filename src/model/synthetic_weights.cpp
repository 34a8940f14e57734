#include "model/synthetic_weights.h"

#include <cmath>
#include <string>

#include "core/hash.h"
#include "core/numeric.h"
#include "quant/fp8.h"
#include "quant/mxfp4.h"

namespace mxserve::model {
namespace {

uint64_t name_hash(const std::string& s) { return fnv1a(s); }

bool ends_with(const std::string& s, const char* suffix) {
  const std::string x(suffix);
  return s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
}

// Standard normal from two counter-based uniforms (Box-Muller).
float normal(uint64_t stream, uint64_t i) {
  const uint64_t a = mix64(stream ^ (2 * i)), b = mix64(stream ^ (2 * i + 1));
  const double u1 = (static_cast<double>(a >> 11) + 1.0) * (1.0 / 9007199254740993.0);
  const double u2 = static_cast<double>(b >> 11) * (1.0 / 9007199254740992.0);
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

}  // namespace

uint64_t synthetic_weight_bytes(const std::vector<WeightSpec>& table) {
  uint64_t bytes = 0;
  for (const auto& s : table)
    if (!s.optional) bytes += 2ull * static_cast<uint64_t>(shape_numel(s.shape));
  return bytes;
}

BoundWeights make_synthetic_weights(const std::vector<WeightSpec>& table, int64_t d_model, uint64_t seed) {
  BoundWeights out;
  for (const auto& spec : table) {
    if (spec.optional) continue;
    const uint64_t stream = mix64(seed ^ name_hash(spec.name));
    const int64_t n = shape_numel(spec.shape);
    if (ends_with(spec.name, "e_score_correction_bias")) {
      Tensor t = Tensor::empty(DType::kF32, spec.shape);
      for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = 0.02f * normal(stream, i);
      out.add(spec.name, BoundWeight{t, Precision::kF32});
      continue;
    }
    float mean = 0.f, stddev = 0.02f;
    if (ends_with(spec.name, "norm.weight")) {
      mean = 1.0f;  // RMSNorm gains around 1
      stddev = 0.05f;
    } else if (ends_with(spec.name, "mlp.gate.weight")) {
      stddev = 1.0f / std::sqrt(static_cast<float>(d_model));  // router logits ~N(0, 1): spread routing
    } else if (ends_with(spec.name, ".bias")) {
      stddev = 0.02f;
    }
    Tensor t = Tensor::empty(DType::kBF16, spec.shape);
    uint16_t* p = t.data<uint16_t>();
#pragma omp parallel for if (n > (1 << 20))
    for (int64_t i = 0; i < n; ++i) p[i] = f32_to_bf16(mean + stddev * normal(stream, static_cast<uint64_t>(i)));
    out.add(spec.name, BoundWeight{t, Precision::kBF16});
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

bool valid_scheme(const std::string& s) { return s == "mxfp4" || s == "fp8-block" || s == "bf16"; }

}  // namespace

Status quantize_synthetic_experts(BoundWeights& weights, const std::string& plan) {
  if (plan.empty()) return Status::ok();
  // PLAN = EXPERTS[:REST], e.g. "mxfp4" or "mxfp4:fp8-block" (routed experts MXFP4, other projections FP8).
  const size_t colon = plan.find(':');
  const std::string experts = plan.substr(0, colon);
  const std::string rest = colon == std::string::npos ? "bf16" : plan.substr(colon + 1);
  if (!valid_scheme(experts) || !valid_scheme(rest))
    return invalid_argument("--quantization '" + plan +
                            "': expected EXPERTS[:REST] with each of mxfp4, fp8-block or bf16 (e.g. mxfp4:fp8-block)");
  for (const std::string& name : weights.names()) {
    if (!ends_with(name, "_proj.weight")) continue;  // Linear weights only: no router, norms, embeddings, head
    const bool routed = name.find(".mlp.experts.") != std::string::npos;
    // The MTP layer's eh_proj stays bf16, as in the published FP8 / MXFP4 GLM checkpoints.
    const std::string& scheme = routed ? experts : (ends_with(name, "eh_proj.weight") ? std::string("bf16") : rest);
    if (scheme != "bf16") MX_RETURN_IF_ERROR(quantize_one(weights, name, scheme));
  }
  return Status::ok();
}

}  // namespace mxserve::model
