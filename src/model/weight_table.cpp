#include "model/weight_table.h"

#include <algorithm>
#include <unordered_set>

#include "core/check.h"
#include "quant/detect.h"
#include "quant/fp8_release.h"
#include "quant/gpt_oss.h"
#include "quant/hf_fused_experts.h"

namespace mxserve::model {

BoundWeight::BoundWeight(Tensor host, Precision p) {
  MX_CHECK_MSG(quant::is_float(p), "BoundWeight(Tensor, Precision) takes plain float weights, got " << precision_name(p));
  stored.precision = p;
  stored.shape = host.shape();
  stored.data = host;
  this->host = std::move(host);
}

const BoundWeight* BoundWeights::find(const std::string& name) const {
  auto it = map_.find(name);
  return it == map_.end() ? nullptr : &it->second;
}

const BoundWeight& BoundWeights::at(const std::string& name) const {
  const BoundWeight* w = find(name);
  MX_CHECK_MSG(w != nullptr, "weight '" << name << "' was not bound");
  return *w;
}

namespace {

std::string allowed_list(const std::vector<Precision>& allowed) {
  std::string s;
  for (auto p : allowed) {
    if (!s.empty()) s += '|';
    s += precision_name(p);
  }
  return s;
}

std::string module_of(const std::string& name) {
  const std::string w = ".weight";
  if (name.size() > w.size() && name.compare(name.size() - w.size(), w.size(), w) == 0)
    return name.substr(0, name.size() - w.size());
  return name;
}

// Checks one detected weight against quantization_config; empty when they agree.
std::string config_disagreement(const quant::QuantizationConfig& qc, const WeightSpec& spec,
                                const quant::StoredWeight& sw, int64_t br, int64_t bc) {
  quant::Expectation x = qc.expect(module_of(spec.name), spec.role);
  // GLM-5.x FP8 releases keep two Linear weights bf16 outside their lists (quant/fp8_release.h).
  const quant::Fp8ReleaseRule rule = quant::fp8_release_rule(qc, module_of(spec.name));
  if (rule == quant::Fp8ReleaseRule::kEither) return "";
  if (rule == quant::Fp8ReleaseRule::kNeverQuantized) x = {false, Precision::kBF16, quant::fp8_release_reason(rule)};
  const bool found_quantized = quant::is_quantized(sw.precision);
  if (x.quantized == found_quantized && (!x.quantized || x.precision == sw.precision)) return "";
  const std::string expected = x.quantized ? quant::expected_storage(x.precision, spec.shape, br, bc)
                                           : "unquantized (bf16|f32|f16) " + shape_to_string(spec.shape);
  return spec.name + ": quantization_config (quant_method " + quant::quant_method_name(qc.method) + ", " + qc.source +
         ") expects " + expected + " because it is " + x.reason + ", but the checkpoint stores " + sw.describe();
}

}  // namespace

Result<BoundWeights> bind_weights(const io::Checkpoint& ckpt, const std::vector<WeightSpec>& table,
                                  const BindOptions& options) {
  std::vector<std::string> missing, mismatched, unexpected;
  BoundWeights bound;
  std::unordered_set<std::string> expected;
  quant::DetectOptions dopt;
  if (options.quant && options.quant->block_rows > 0) {
    dopt.fp8_block_rows = options.quant->block_rows;
    dopt.fp8_block_cols = options.quant->block_cols;
  }
  for (const auto& spec : table) {
    expected.insert(spec.name);
    const io::CheckpointTensor* t = ckpt.find(spec.name);
    Result<quant::StoredWeight> sw = internal_error("unset");
    if (t == nullptr) {
      // Routed experts may be stored fused, gpt-oss style (quant/gpt_oss.h).
      auto slice = quant::gpt_oss_expert_slice(ckpt, spec.name);
      if (!slice.is_ok()) {
        mismatched.push_back(slice.status().message());
        continue;
      }
      if (slice->has_value()) {
        for (const auto& n : (*slice)->consumed) expected.insert(n);
        sw = std::move((*slice)->weight);
      } else {  // or stacked, transformers 5.x style (quant/hf_fused_experts.h)
        auto hf = quant::hf_fused_expert_slice(ckpt, spec.name, dopt);
        if (!hf.is_ok()) {
          mismatched.push_back(hf.status().message());
          continue;
        }
        if (!hf->has_value()) {
          if (!spec.optional) missing.push_back(spec.name + " (expected " + shape_to_string(spec.shape) + ")");
          continue;
        }
        for (const auto& n : (*hf)->consumed) expected.insert(n);
        sw = std::move((*hf)->weight);
      }
    } else {
      for (const auto& s : quant::scale_names_for(spec.name))
        if (ckpt.find(s) != nullptr) expected.insert(s);  // consumed with the weight (or reported by detect)
      sw = quant::detect_weight(ckpt, spec.name, dopt);
    }
    if (!sw.is_ok()) {
      mismatched.push_back(sw.status().message());
      continue;
    }
    if (sw->shape != spec.shape) {
      std::string m = spec.name + ": expected shape " + shape_to_string(spec.shape) + ", found " +
                      shape_to_string(sw->shape);
      if (quant::is_quantized(sw->precision)) m += " (stored as " + sw->describe() + ")";
      mismatched.push_back(m);
      continue;
    }
    if (std::find(spec.allowed.begin(), spec.allowed.end(), sw->precision) == spec.allowed.end()) {
      mismatched.push_back(spec.name + ": expected precision " + allowed_list(spec.allowed) + ", found " +
                           sw->describe());
      continue;
    }
    if (options.quant) {
      const std::string d = config_disagreement(*options.quant, spec, *sw, dopt.fp8_block_rows, dopt.fp8_block_cols);
      if (!d.empty()) {
        mismatched.push_back(d);
        continue;
      }
    }
    bound.add(spec.name, BoundWeight{std::move(sw).value()});
  }
  for (const auto& name : ckpt.names()) {
    if (expected.count(name)) continue;
    if (std::find(options.ignored.begin(), options.ignored.end(), name) != options.ignored.end()) continue;
    bool by_prefix = false;
    for (const auto& p : options.ignored_prefixes) by_prefix |= name.rfind(p, 0) == 0;
    if (by_prefix) continue;
    if (quant::is_gpt_oss_blocks_name(name)) {
      auto g = quant::detect_gpt_oss_blocks(ckpt, name);
      unexpected.push_back(name + (g.is_ok() ? " (" + g->describe() + ": gpt-oss fused MXFP4 experts, which this " +
                                                   "architecture's weight table does not use)"
                                             : " (" + g.status().message() + ")"));
      continue;
    }
    unexpected.push_back(name);
  }
  if (missing.empty() && mismatched.empty() && unexpected.empty()) return bound;

  std::string msg = ckpt.path() + ": the checkpoint does not match the model's weight table:";
  auto list = [&msg](const char* what, const std::vector<std::string>& items) {
    if (items.empty()) return;
    msg += "\n  " + std::to_string(items.size()) + " " + what + ":";
    const size_t shown = std::min<size_t>(items.size(), 12);
    for (size_t i = 0; i < shown; ++i) msg += "\n    " + items[i];
    if (items.size() > shown) msg += "\n    ... and " + std::to_string(items.size() - shown) + " more";
  };
  list("missing", missing);
  list("mismatched", mismatched);
  list("unexpected", unexpected);
  return invalid_argument(msg);
}

Result<parallel::ShardSlice> shard_slice_of(const WeightSpec& spec, const parallel::RankLayout& rank) {
  return parallel::shard_slice(spec.name, spec.shape, spec.shard, rank, spec.expert, spec.n_experts, spec.expert_tp,
                               spec.shard_groups, spec.moe_group);
}

Result<std::vector<WeightSpec>> shard_weight_table(const std::vector<WeightSpec>& table,
                                                   const parallel::RankLayout& rank) {
  std::vector<WeightSpec> out;
  out.reserve(table.size());
  for (const WeightSpec& spec : table) {
    MX_ASSIGN_OR_RETURN(parallel::ShardSlice slice, shard_slice_of(spec, rank));
    if (!slice.held) continue;
    WeightSpec local = spec;
    local.shape = slice.local_shape;
    out.push_back(std::move(local));
  }
  return out;
}

}  // namespace mxserve::model
