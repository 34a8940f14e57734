// `mxserve --version`: the version, the git commit it was built from, the build type, and the CUDA side (runtime
// and driver versions, compiled architectures) or "cpu only". The commit is baked in at build time by
// src/cli/build_info.cmake into a generated build_info.cpp that changes only when the commit does (a new commit
// recompiles that one file and relinks; nothing else rebuilds).
#pragma once

#include <string>

namespace mxserve::cli {

struct BuildInfo {
  const char* version;      // "0.1.0"
  const char* git_commit;   // 12 hex digits, "+dirty" when built with uncommitted changes; "unknown" without git
  const char* git_date;     // the commit's date (ISO 8601); "" without git
  const char* build_type;   // CMAKE_BUILD_TYPE
  const char* cuda_archs;   // CMAKE_CUDA_ARCHITECTURES, "" for a CPU-only build
  const char* cuda_toolkit; // the nvcc version built with, "" for a CPU-only build
};
const BuildInfo& build_info();  // defined in the generated build_info.cpp

std::string version_report();  // the lines `mxserve --version` prints

}  // namespace mxserve::cli
