// The architecture registry: the one place where an HF `architectures` string becomes a type.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace mxserve::model {

enum class Architecture { kGlm4Moe };

struct ArchitectureEntry {
  const char* hf_name;  // config.json "architectures"[0]
  Architecture arch;
  const char* short_name;  // model_type
};

const std::vector<ArchitectureEntry>& supported_architectures();
// Error lists the supported names.
Result<Architecture> architecture_from_hf_name(const std::string& name, const std::string& source);
const char* architecture_name(Architecture arch);

}  // namespace mxserve::model
