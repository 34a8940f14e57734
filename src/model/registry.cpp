#include "model/registry.h"

namespace mxserve::model {

const std::vector<ArchitectureEntry>& supported_architectures() {
  static const std::vector<ArchitectureEntry> kEntries = {
      {"Glm4MoeForCausalLM", Architecture::kGlm4Moe, "glm4_moe"},
  };
  return kEntries;
}

Result<Architecture> architecture_from_hf_name(const std::string& name, const std::string& source) {
  std::string list;
  for (const auto& e : supported_architectures()) {
    if (name == e.hf_name) return e.arch;
    list += (list.empty() ? "" : ", ") + std::string(e.hf_name);
  }
  return unsupported(source + ": field 'architectures': '" + name + "' is not supported; supported: " + list);
}

const char* architecture_name(Architecture arch) {
  for (const auto& e : supported_architectures())
    if (e.arch == arch) return e.hf_name;
  return "unknown";
}

}  // namespace mxserve::model
