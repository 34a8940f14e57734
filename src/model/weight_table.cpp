#include "model/weight_table.h"

#include <algorithm>
#include <unordered_set>

#include "core/check.h"

namespace mxserve::model {

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::kF32: return "f32";
    case Precision::kBF16: return "bf16";
    case Precision::kF16: return "f16";
  }
  return "?";
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

Result<Precision> detect_precision(DType dt, const std::string& name) {
  switch (dt) {
    case DType::kF32: return Precision::kF32;
    case DType::kBF16: return Precision::kBF16;
    case DType::kF16: return Precision::kF16;
    case DType::kU8:
      return unsupported("tensor '" + name + "' is u8 (a packed MXFP4 weight?): quantized weights are not " +
                         "supported by this build yet");
    case DType::kFP8E4M3:
      return unsupported("tensor '" + name + "' is fp8_e4m3: FP8 weights are not supported by this build yet");
    default:
      return unsupported("tensor '" + name + "' has dtype " + dtype_name(dt) + ", not a weight precision");
  }
}

namespace {
std::string allowed_list(const std::vector<Precision>& allowed) {
  std::string s;
  for (auto p : allowed) s += (s.empty() ? "" : "|") + std::string(precision_name(p));
  return s;
}
}  // namespace

Result<BoundWeights> bind_weights(const io::Checkpoint& ckpt, const std::vector<WeightSpec>& table,
                                  const BindOptions& options) {
  std::vector<std::string> missing, mismatched, unexpected;
  BoundWeights bound;
  std::unordered_set<std::string> expected;
  for (const auto& spec : table) {
    expected.insert(spec.name);
    const io::CheckpointTensor* t = ckpt.find(spec.name);
    if (t == nullptr) {
      if (!spec.optional) missing.push_back(spec.name + " (expected " + shape_to_string(spec.shape) + ")");
      continue;
    }
    if (t->info->shape != spec.shape) {
      mismatched.push_back(spec.name + ": expected shape " + shape_to_string(spec.shape) + ", found " +
                           shape_to_string(t->info->shape));
      continue;
    }
    auto prec = detect_precision(t->info->dtype, spec.name);
    if (!prec.is_ok()) {
      mismatched.push_back(prec.status().message());
      continue;
    }
    if (std::find(spec.allowed.begin(), spec.allowed.end(), *prec) == spec.allowed.end()) {
      mismatched.push_back(spec.name + ": expected precision " + allowed_list(spec.allowed) + ", found " +
                           precision_name(*prec));
      continue;
    }
    bound.add(spec.name, BoundWeight{ckpt.view(*t), *prec});
  }
  for (const auto& name : ckpt.names()) {
    if (expected.count(name)) continue;
    if (std::find(options.ignored.begin(), options.ignored.end(), name) != options.ignored.end()) continue;
    bool by_prefix = false;
    for (const auto& p : options.ignored_prefixes) by_prefix |= name.rfind(p, 0) == 0;
    if (!by_prefix) unexpected.push_back(name);
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

}  // namespace mxserve::model
