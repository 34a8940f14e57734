// Runs tools/independent_ckpt/dsa_formats.mjs (Node; a writer independent of mxserve) on a glm_moe_dsa fixture
// and returns the directory it wrote (under the temp directory; the caller removes it), or an error saying why
// it could not (no `node` on PATH: the caller skips, naming the command).
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/status.h"

namespace mxserve {

inline Result<std::string> write_dsa_checkpoint(const std::string& fx, const std::string& format, int block) {
  const std::string src = MXSERVE_SOURCE_DIR;
  const std::string out = (std::filesystem::temp_directory_path() /
                           ("mxserve_dsa_" + std::to_string(::getpid()) + "_" + fx + "_" + format + "_" + std::to_string(block)))
                              .string();
  std::filesystem::remove_all(out);
  const std::string cmd = "node " + src + "/tools/independent_ckpt/dsa_formats.mjs --fixture " + src + "/tests/fixtures/" +
                          fx + " --out " + out + " --format " + format + " --block " + std::to_string(block);
  if (std::system("node --version > /dev/null 2>&1") != 0)
    return unsupported("node is not on PATH: cannot run `" + cmd + "` (scripts/setup.sh installs nodejs)");
  if (std::system((cmd + " > /dev/null").c_str()) != 0) return internal_error("`" + cmd + "` failed");
  return out;
}

}  // namespace mxserve
