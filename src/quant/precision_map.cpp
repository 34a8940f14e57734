#include "quant/precision_map.h"

#include <algorithm>
#include <regex>

#include "quant/host_float.h"

namespace mxserve::quant {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// "X.weight_scale" / "X.weight_scale_inv" whose "X.weight" exists.
std::string scale_owner(const io::Checkpoint& ckpt, const std::string& name) {
  for (const char* suffix : {".weight_scale", ".weight_scale_inv"}) {
    if (!ends_with(name, suffix)) continue;
    const std::string w = name.substr(0, name.size() - std::string(suffix).size()) + ".weight";
    if (ckpt.find(w) != nullptr) return w;
  }
  if (ends_with(name, "_scales")) {
    const std::string b = name.substr(0, name.size() - 7) + "_blocks";
    if (ckpt.find(b) != nullptr) return b;
  }
  return "";
}

// "self_attn.q_proj" -> "self_attn"; "mlp.experts.7.up_proj" -> "mlp.experts"; "eh_proj" -> "eh_proj".
std::string group_of(std::string module) {
  static const std::regex kExpert(R"(\.experts\.[0-9]+)");
  module = std::regex_replace(module, kExpert, ".experts");
  const size_t dot = module.rfind('.');
  if (dot != std::string::npos && (ends_with(module, "_proj") || ends_with(module, "_proj_blocks")))
    return module.substr(0, dot);
  return module;
}

}  // namespace

std::string tensor_precision_label(const io::Checkpoint& ckpt, const std::string& name, const DetectOptions& opts) {
  const std::string owner = scale_owner(ckpt, name);
  if (!owner.empty()) return "scale of " + owner;
  if (is_gpt_oss_blocks_name(name)) {
    auto g = detect_gpt_oss_blocks(ckpt, name);
    return g.is_ok() ? precision_name(g->precision) : "error";
  }
  const io::CheckpointTensor* t = ckpt.find(name);
  if (is_plain_float(t->info->dtype)) return dtype_name(t->info->dtype);
  auto w = detect_weight(ckpt, name, opts);
  return w.is_ok() ? precision_name(w->precision) : "error";
}

PrecisionMap precision_map(const io::Checkpoint& ckpt, int64_t n_layers, const DetectOptions& opts) {
  static const std::regex kLayer(R"(^model\.layers\.([0-9]+)\.(.*)$)");
  PrecisionMap map;
  std::map<int64_t, LayerPrecision> by_layer;
  for (const auto& name : ckpt.names()) {
    if (!scale_owner(ckpt, name).empty()) continue;
    const io::CheckpointTensor* t = ckpt.find(name);
    const bool blocks = is_gpt_oss_blocks_name(name);
    if (!blocks && (!ends_with(name, ".weight") || t->info->shape.size() != 2)) continue;
    auto w = blocks ? detect_gpt_oss_blocks(ckpt, name) : detect_weight(ckpt, name, opts);
    if (!w.is_ok()) {
      map.errors.push_back(w.status().message());
      continue;
    }
    std::string module = blocks ? name : name.substr(0, name.size() - 7);
    int64_t layer = -1;
    std::smatch m;
    if (std::regex_match(module, m, kLayer)) {
      layer = std::stoll(m[1].str());
      module = m[2].str();
    }
    LayerPrecision& lp = by_layer[layer];
    lp.layer = layer;
    lp.is_mtp = n_layers >= 0 && layer >= n_layers;
    const std::string g = layer < 0 ? module : group_of(module);
    auto it = std::find_if(lp.groups.begin(), lp.groups.end(), [&](const GroupPrecision& x) { return x.group == g; });
    if (it == lp.groups.end()) {
      lp.groups.push_back({g, {}});
      it = lp.groups.end() - 1;
    }
    ++it->count[precision_name(w->precision)];
  }
  for (auto& [_, lp] : by_layer) map.layers.push_back(std::move(lp));
  return map;
}

std::string format_precision_map(const PrecisionMap& map) {
  std::string out;
  for (const auto& lp : map.layers) {
    std::string head = lp.layer < 0 ? std::string("  (global)")
                                    : "  layer " + std::to_string(lp.layer) + (lp.is_mtp ? " (MTP)" : "") + ":";
    head.resize(std::max<size_t>(head.size() + 1, 20), ' ');
    out += head;
    for (size_t i = 0; i < lp.groups.size(); ++i) {
      if (i > 0) out += " | ";
      out += lp.groups[i].group;
      out += ' ';
      bool first = true;
      for (const auto& [p, n] : lp.groups[i].count) {
        if (!first) out += '+';
        out += p;
        if (n > 1) {
          out += 'x';
          out += std::to_string(n);
        }
        first = false;
      }
    }
    out += "\n";
  }
  for (const auto& e : map.errors) out += "  error: " + e + "\n";
  return out;
}

}  // namespace mxserve::quant
