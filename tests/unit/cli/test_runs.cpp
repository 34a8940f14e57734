// parse_runs (`mxserve generate --runs`): several engine runs in one string, each validated like the flags.
#include <gtest/gtest.h>

#include "cli/runs.h"

namespace mxserve::cli {
namespace {

void expect_error(const std::string& text, const std::string& needle, runtime::SpecConfig base = {}) {
  auto r = parse_runs(text, base);
  ASSERT_FALSE(r.is_ok()) << "'" << text << "' accepted; wanted an error containing: " << needle;
  EXPECT_NE(r.status().to_string().find(needle), std::string::npos) << r.status().to_string();
}

TEST(CliRuns, ParsesEveryKey) {
  auto r = parse_runs("b=1,n=0; b=3, n=2, a=2.0, adaptive=0, p=20 ;b=2,n=3,k=4,m=8", {});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_EQ(r->size(), 3u);
  EXPECT_EQ((*r)[0].batch, 1);
  EXPECT_EQ((*r)[0].spec.num_steps, 0);
  EXPECT_FALSE((*r)[0].spec.simulate_acceptance.has_value());
  EXPECT_EQ((*r)[1].batch, 3);
  EXPECT_EQ((*r)[1].spec.num_steps, 2);
  EXPECT_DOUBLE_EQ(*(*r)[1].spec.simulate_acceptance, 2.0);
  EXPECT_FALSE((*r)[1].spec.adaptive);
  EXPECT_EQ((*r)[1].prompt_len, 20);
  EXPECT_EQ((*r)[1].spec.num_draft_tokens, 0);  // chain mode
  EXPECT_TRUE((*r)[2].spec.tree());
  EXPECT_EQ((*r)[2].spec.num_draft_tokens, 8);
}

TEST(CliRuns, InheritsTheFlagsButNotSimulatedAcceptance) {
  runtime::SpecConfig base;
  base.num_steps = 4;
  base.adaptive = false;
  base.simulate_acceptance = 3.0;
  auto r = parse_runs("b=2", base);
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ((*r)[0].spec.num_steps, 4);
  EXPECT_FALSE((*r)[0].spec.adaptive);
  EXPECT_FALSE((*r)[0].spec.simulate_acceptance.has_value());
}

TEST(CliRuns, TreeDefaultDraftTokens) {
  auto r = parse_runs("n=3,k=4", {});
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ((*r)[0].spec.num_draft_tokens, 13);  // 1 + min(3 * 4, 4 + 2 * 16)
}

TEST(CliRuns, RefusesBadInput) {
  expect_error("", "--runs: no runs");
  expect_error(" ; ", "--runs: no runs");
  expect_error("b", "field 'b' is not key=value");
  expect_error("z=1", "unknown key 'z'");
  expect_error("b=0", "need b >= 1");
  expect_error("n=17", "n in [0, 16]");
  expect_error("n=-1", "n in [0, 16]");
  expect_error("p=-3", "p >= 0");
  expect_error("k=0", "k must be in [1, 16]");
  expect_error("n=1,k=2,m=8", "tree needs");
  expect_error("n=2,a=3.5", "a must be in [1, n + 1]");
  expect_error("n=2,a=0.5", "a must be in [1, n + 1]");
  // Strict numbers: trailing garbage, overflow and non-numbers are errors (std::stoll took "3x" as 3).
  expect_error("b=3x", "'b=3x': not an integer");
  expect_error("n=99999999999999999999", "not an integer");
  expect_error("n=4294967298", "n in [0, 16]");  // once wrapped to 2 by an int32 cast
  expect_error("a=2.5q,n=3", "not a number");
  expect_error("adaptive=yes", "not an integer");
  expect_error("adaptive=2", "adaptive is 0 or 1");
  expect_error("b=", "not an integer");
}

}  // namespace
}  // namespace mxserve::cli
