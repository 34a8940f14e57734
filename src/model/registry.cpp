#include "model/registry.h"

#include "model/archs/glm4_moe.h"
#include "model/archs/glm_moe_dsa.h"

namespace mxserve::model {

const std::vector<const ArchitectureDef*>& architectures() {
  static const std::vector<const ArchitectureDef*> kEntries = {
      &glm4_moe_architecture(),
      &glm_moe_dsa_architecture(),
  };
  return kEntries;
}

Result<const ArchitectureDef*> find_architecture(const std::string& name, const std::string& source) {
  std::string list;
  for (const ArchitectureDef* e : architectures()) {
    if (name == e->hf_name) return e;
    list += (list.empty() ? "" : ", ") + std::string(e->hf_name);
  }
  return unsupported(source + ": field 'architectures': '" + name + "' is not supported; supported: " + list);
}

std::string architectures_with(bool ArchitectureDef::Capabilities::*capability) {
  std::vector<std::string> names;
  for (const ArchitectureDef* e : architectures())
    if (e->capabilities.*capability) names.push_back(e->hf_name);
  std::string list;
  for (size_t i = 0; i < names.size(); ++i)
    list += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
  return list.empty() ? "no registered architecture" : list;
}

}  // namespace mxserve::model
