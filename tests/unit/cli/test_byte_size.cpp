// server::parse_byte_size (`--kv-cache-memory`): binary and decimal units, refusals for nonsense, overflow
// and sizes under one byte.
#include <gtest/gtest.h>

#include "server/serving_model.h"

namespace mxserve::server {
namespace {

TEST(CliByteSize, Units) {
  EXPECT_EQ(*parse_byte_size("1000000"), 1000000u);
  EXPECT_EQ(*parse_byte_size("512B"), 512u);
  EXPECT_EQ(*parse_byte_size("4K"), 4096u);
  EXPECT_EQ(*parse_byte_size("4KiB"), 4096u);
  EXPECT_EQ(*parse_byte_size("512MiB"), 512ull << 20);
  EXPECT_EQ(*parse_byte_size("2G"), 2ull << 30);
  EXPECT_EQ(*parse_byte_size("1.5GiB"), 3ull << 29);
  EXPECT_EQ(*parse_byte_size("3KB"), 3000u);
  EXPECT_EQ(*parse_byte_size("3MB"), 3000000u);
  EXPECT_EQ(*parse_byte_size("3GB"), 3000000000u);
}

TEST(CliByteSize, Refusals) {
  const std::pair<const char*, const char*> cases[] = {
      {"", "is not a size"},          {"GiB", "is not a size"},         {"4 GiB", "unknown size unit ' GiB'"},
      {"4gib", "unknown size unit"},   {"4TiB", "unknown size unit"},    {"0", "must be a positive size"},
      {"-1GiB", "must be a positive"}, {"nan", "must be a positive"},    {"inf", "must be a positive"},
      {"1e30GiB", "too large"},        {"0.5", "less than one byte"},    {" 4GiB", "is not a size"},
      {"1e999", "is not a size"},
  };
  for (const auto& [text, needle] : cases) {
    auto r = parse_byte_size(text);
    ASSERT_FALSE(r.is_ok()) << "'" << text << "' parsed as " << *r;
    EXPECT_NE(r.status().to_string().find(needle), std::string::npos) << text << ": " << r.status().to_string();
    EXPECT_NE(r.status().to_string().find(std::string("'") + text + "'"), std::string::npos)
        << "the error must quote the input: " << r.status().to_string();
  }
}

}  // namespace
}  // namespace mxserve::server
