// Runs tools/independent_ckpt/dsa_formats.mjs (Node; a writer independent of mxserve) on a glm_moe_dsa fixture
// and returns the directory it wrote (under the temp directory; the caller removes it), or an error saying why
// it could not. Only "no `node` on PATH" (kUnsupported) may skip a test, and never in CI (env CI set): a writer
// that runs and fails is a test failure whose message carries the writer's output (write_dsa_checkpoint_or_skip).
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
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
  const std::string log = out + ".log";
  const int rc = std::system((cmd + " > " + log + " 2>&1").c_str());
  std::ostringstream text;
  text << std::ifstream(log).rdbuf();
  std::filesystem::remove(log);
  if (rc != 0)
    return internal_error("`" + cmd + "` failed (status " + std::to_string(rc) + "); its output:\n" + text.str());
  return out;
}

// Whether a write_dsa_checkpoint error may skip the test: node is absent, outside CI.
inline bool dsa_writer_may_skip(const Status& s) {
  return s.code() == StatusCode::kUnsupported && std::getenv("CI") == nullptr;
}

// In a test body: `const std::string var` = the written directory; skips (node absent, outside CI) or fails
// with the writer's output otherwise.
#define WRITE_DSA_CHECKPOINT_OR_FAIL(var, fx, format, block)                                    \
  auto var##_r = write_dsa_checkpoint(fx, format, block);                                         \
  if (!var##_r.is_ok() && dsa_writer_may_skip(var##_r.status())) GTEST_SKIP() << var##_r.status().to_string(); \
  ASSERT_TRUE(var##_r.is_ok()) << var##_r.status().to_string();                                   \
  const std::string var = *var##_r

}  // namespace mxserve
