// src/MODULES is the one declaration of the module order; every quoted include under src/ must follow it
// (a module includes only itself and modules on lower floors). The checker is itself tested on synthetic
// trees: a planted upward include, a same-floor include and an undeclared directory must each be named.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "module_order.h"

namespace fs = std::filesystem;
using mxserve::structure::check_module_order;
using mxserve::structure::parse_module_order;

namespace {

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + "\n";
  return s;
}

// A small tree: core (floor 1), io and kvcache (floor 2), model (floor 3); every include allowed.
class SyntheticTree : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("mxserve_module_order_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    write("MODULES", "# floors, lowest first\ncore\nio kvcache  # one floor\n\nmodel\n");
    write("core/status.h", "#pragma once\n#include <string>\n#include \"core/check.h\"\n");
    write("core/check.h", "#pragma once\n");
    write("io/reader.cpp", "#include \"io/reader.h\"\n#include \"core/status.h\"\n#include \"local.h\"\n");
    write("io/reader.h", "#pragma once\n#include \"nlohmann/json.hpp\"  // external: not a module\n");
    write("kvcache/cache.h", "#pragma once\n#include \"core/status.h\"\n");
    write("model/deep/arch.cu", "#include \"kvcache/cache.h\"\n#include \"io/reader.h\"\n#include \"model/x.h\"\n");
  }
  void TearDown() override { fs::remove_all(root_); }
  void write(const std::string& rel, const std::string& text) {
    fs::create_directories((root_ / rel).parent_path());
    std::ofstream(root_ / rel) << text;
  }
  fs::path root_;
};

}  // namespace

TEST(ModuleOrder, TheSourceTreeFollowsSrcModules) {
  const auto report = check_module_order(fs::path(MXSERVE_SOURCE_DIR) / "src");
  EXPECT_TRUE(report.problems.empty()) << joined(report.problems);
  EXPECT_GT(report.files, 300) << "the walk must reach every module's files";
  EXPECT_GT(report.includes_checked, 1000) << "the checker must see the tree's module includes";
}

TEST_F(SyntheticTree, AllowedIncludesPass) {
  const auto report = check_module_order(root_);
  EXPECT_TRUE(report.problems.empty()) << joined(report.problems);
  EXPECT_EQ(report.files, 6);
  EXPECT_EQ(report.includes_checked, 7);  // own-module and lower-floor includes; local and external skipped
}

TEST_F(SyntheticTree, APlantedUpwardIncludeIsNamed) {
  write("core/bad.cpp", "#include \"core/status.h\"\n  #  include \"model/deep/arch.h\"\n");
  const auto report = check_module_order(root_);
  ASSERT_EQ(report.problems.size(), 1u) << joined(report.problems);
  const std::string& p = report.problems[0];
  EXPECT_NE(p.find("src/core/bad.cpp:2 includes \"model/deep/arch.h\""), std::string::npos) << p;
  EXPECT_NE(p.find("module core (floor 1"), std::string::npos) << p;
  EXPECT_NE(p.find("model is on floor 3"), std::string::npos) << p;
}

TEST_F(SyntheticTree, ASameFloorIncludeIsNamed) {
  write("io/peer.h", "#pragma once\n#include \"kvcache/cache.h\"\n");
  const auto report = check_module_order(root_);
  ASSERT_EQ(report.problems.size(), 1u) << joined(report.problems);
  EXPECT_NE(report.problems[0].find("src/io/peer.h:2 includes \"kvcache/cache.h\""), std::string::npos);
  EXPECT_NE(report.problems[0].find("kvcache is on the same floor"), std::string::npos) << report.problems[0];
}

TEST_F(SyntheticTree, AnUndeclaredModuleIsNamed) {
  write("extra/tool.cpp", "#include \"model/deep/arch.h\"\n");
  const auto report = check_module_order(root_);
  ASSERT_EQ(report.problems.size(), 1u) << joined(report.problems);
  EXPECT_NE(report.problems[0].find("src/extra/ is a directory of src/ but no module"), std::string::npos)
      << report.problems[0];
}

TEST(ModuleOrder, MalformedDeclarationsAreNamed) {
  const auto twice = parse_module_order("core\nio core\n");
  ASSERT_EQ(twice.errors.size(), 1u);
  EXPECT_NE(twice.errors[0].find("MODULES:2: module 'core' is declared twice"), std::string::npos);
  const auto bad = parse_module_order("core\nmodel/archs\n");
  ASSERT_EQ(bad.errors.size(), 1u);
  EXPECT_NE(bad.errors[0].find("'model/archs' is not a module name"), std::string::npos);
  EXPECT_EQ(parse_module_order("# nothing\n").errors.size(), 1u);
  const auto ok = parse_module_order("core # base\n\nio kvcache\nmodel\n");
  EXPECT_TRUE(ok.errors.empty());
  EXPECT_EQ(ok.floor.at("core"), 1);
  EXPECT_EQ(ok.floor.at("kvcache"), 2);
  EXPECT_EQ(ok.floor.at("model"), 3);
}
