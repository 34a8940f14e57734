// Test helpers shared by the tokenizer tests: locating npm test data, running node, reading the
// corpus. Missing node_modules is a hard failure telling the user to run scripts/setup.sh.
#pragma once

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace mxserve::tokenizer::testing {

inline std::string source_dir() { return MXSERVE_SOURCE_DIR; }
inline std::string node_modules() { return source_dir() + "/tests/data/node_modules"; }

// Returns false (and records a gtest failure) when the npm test data is not installed.
inline bool require_node_modules() {
  if (!std::filesystem::exists(node_modules() + "/@lenml/tokenizers")) {
    ADD_FAILURE() << "npm test data missing under " << node_modules()
                  << " -- run scripts/setup.sh (it installs tests/data/package.json)";
    return false;
  }
  return true;
}

inline std::string tokenizer_json_path(const std::string& pkg) {
  return node_modules() + "/@lenml/tokenizer-" + pkg + "/models/tokenizer.json";
}
inline std::string tokenizer_config_path(const std::string& pkg) {
  return node_modules() + "/@lenml/tokenizer-" + pkg + "/models/tokenizer_config.json";
}

// Runs a shell command; returns its stdout. Fails the test when it exits non-zero.
inline std::string run_command(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    ADD_FAILURE() << "cannot run: " << cmd;
    return out;
  }
  char buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  int rc = pclose(p);
  EXPECT_EQ(rc, 0) << "command failed: " << cmd;
  return out;
}

inline std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < s.size()) {
    size_t e = s.find('\n', start);
    if (e == std::string::npos) e = s.size();
    if (e > start) lines.push_back(s.substr(start, e - start));
    start = e + 1;
  }
  return lines;
}

inline std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// The corpus: one JSON string per line.
inline std::vector<std::string> load_corpus(const std::string& path) {
  std::vector<std::string> out;
  for (const auto& line : split_lines(read_text(path))) out.push_back(nlohmann::json::parse(line).get<std::string>());
  return out;
}

inline std::string corpus_path() { return source_dir() + "/tests/data/tokenizer/corpus.jsonl"; }

}  // namespace mxserve::tokenizer::testing
