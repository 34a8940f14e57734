// MTP layer presence (mtp_presence.h).
#include "model/mtp_presence.h"

#include <algorithm>
#include <set>

#include "core/logging.h"
#include "model/causal_lm.h"

namespace mxserve::model {

namespace {

// The weights only the MTP layer declares (the table with it minus the table without it).
std::vector<std::string> mtp_only_weights(const ArchitectureDef& arch, const ModelConfig& cfg) {
  std::set<std::string> plain;
  for (const auto& s : record_weights(arch, cfg, false).table) plain.insert(s.name);
  std::vector<std::string> out;
  for (const auto& s : record_weights(arch, cfg, true).table)
    if (!plain.count(s.name) && !s.optional) out.push_back(s.name);
  return out;
}

// The longest common prefix of names, cut after its last '.' ("model.layers.3.").
std::string common_prefix(const std::vector<std::string>& names) {
  std::string p = names.front();
  for (const auto& n : names) p.resize(std::mismatch(p.begin(), p.end(), n.begin(), n.end()).first - p.begin());
  return p.substr(0, p.rfind('.') + 1);
}

}  // namespace

Result<bool> mtp_layer_present(const io::Checkpoint& ckpt, const ArchitectureDef& arch, const ModelConfig& cfg,
                               bool want_mtp, bool require_mtp) {
  if (!want_mtp || cfg.n_mtp_layers == 0) return want_mtp && cfg.n_mtp_layers > 0;
  const std::vector<std::string> names = mtp_only_weights(arch, cfg);
  if (names.empty()) return true;
  for (const auto& n : names)
    if (ckpt.find(n) != nullptr) return true;  // present (a partial layer is reported by the binder)
  const std::string prefix = common_prefix(names);
  const std::string what = cfg.source + " declares " + std::to_string(cfg.n_mtp_layers) +
                           " MTP layer(s) (num_nextn_predict_layers) but " + ckpt.path() + " holds none of its " +
                           std::to_string(names.size()) + " tensors (" + prefix + "*, e.g. " + names.front() + ")";
  if (require_mtp) return invalid_argument(what + ": MTP speculative decoding drafts with that layer");
  MX_LOG(kWarn) << what << ": loading without it; MTP speculative decoding is unavailable for this checkpoint";
  return false;
}

}  // namespace mxserve::model
