// The tuned MoE tables shipped in configs/moe/*.json are compiled into the product (mxserve_kernels_tuning):
// every file is embedded byte for byte, parses, and the process-wide set holds one table per file.
// Passes with zero shipped tables too (the embedded set is then empty).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/moe_tuning.h"

namespace mxserve::kernels {
namespace {

namespace fs = std::filesystem;

TEST(MoeTuningEmbedded, EveryShippedTableIsEmbeddedAndParses) {
  std::vector<std::string> shipped;
  const fs::path dir = fs::path(MXSERVE_SOURCE_DIR) / "configs/moe";
  if (fs::is_directory(dir))
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".json") shipped.push_back(e.path().filename().string());
  std::sort(shipped.begin(), shipped.end());
  const auto& embedded = embedded_moe_tables();
  ASSERT_EQ(embedded.size(), shipped.size()) << "rebuild: configs/moe changed since the last CMake run?";
  for (size_t i = 0; i < shipped.size(); ++i) {
    EXPECT_EQ(embedded[i].name, shipped[i]);
    std::ifstream in(dir / shipped[i], std::ios::binary);
    const std::string on_disk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(std::string(embedded[i].text, embedded[i].size), on_disk) << shipped[i];
    auto t = parse_moe_tuning_table(on_disk, shipped[i]);
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    EXPECT_EQ(t->key.file_name(), shipped[i]) << "name the file as `mxserve tune-moe` does";
  }
  EXPECT_EQ(global_moe_tuning().size(), shipped.size());
}

}  // namespace
}  // namespace mxserve::kernels
