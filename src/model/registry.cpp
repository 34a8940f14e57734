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

}  // namespace mxserve::model
