#include <gtest/gtest.h>

#include "core/status.h"

namespace mxserve {
namespace {

Result<int> parse_positive(int v) {
  if (v <= 0) return invalid_argument("value " + std::to_string(v) + " is not positive");
  return v;
}

Result<int> doubled(int v) {
  MX_ASSIGN_OR_RETURN(int x, parse_positive(v));
  return 2 * x;
}

TEST(Status, OkAndError) {
  EXPECT_TRUE(Status::ok().is_ok());
  Status s = not_found("tensor 'a.b' missing");
  EXPECT_FALSE(s.is_ok());
  EXPECT_EQ(s.to_string(), "not_found: tensor 'a.b' missing");
  EXPECT_EQ(s.with_context("file x").message(), "file x: tensor 'a.b' missing");
}

TEST(Result, PropagatesErrors) {
  EXPECT_EQ(doubled(3).value(), 6);
  auto r = doubled(-1);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("-1"), std::string::npos);
}

}  // namespace
}  // namespace mxserve
