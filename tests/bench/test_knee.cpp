// Knee search on a synthetic pass function (no server): trials and answer computed by hand.
#include <gtest/gtest.h>

#include "bench/knee.h"

namespace mxserve::bench {
namespace {

RateEval threshold(double max_ok, std::vector<double>* seen) {
  return [=](double r) -> Result<Verdict> {
    seen->push_back(r);
    Verdict v;
    v.pass = r <= max_ok;
    v.reason = v.pass ? "ok" : "too fast";
    return v;
  };
}

TEST(FindKnee, GridThenBisection) {
  std::vector<double> seen;
  KneeSearchConfig c{{0.5, 1, 1.5, 2, 2.5}, 0.05, 8};
  auto k = find_knee(c, threshold(1.73, &seen));
  ASSERT_TRUE(k.is_ok());
  // grid 0.5 1 1.5 pass, 2 fail; bisect [1.5,2]: 1.75 F, 1.625 P, 1.6875 P, 1.71875 P; width 0.03125 stop
  const std::vector<double> want = {0.5, 1, 1.5, 2, 1.75, 1.625, 1.6875, 1.71875};
  EXPECT_EQ(seen, want);
  EXPECT_TRUE(k->found);
  EXPECT_TRUE(k->bracketed);
  EXPECT_DOUBLE_EQ(k->knee_rate, 1.71875);
  EXPECT_DOUBLE_EQ(k->first_fail, 1.75);
  EXPECT_EQ(k->trials[4].phase, "bisect");
}

TEST(FindKnee, AllPassAndNonePass) {
  std::vector<double> seen;
  auto all = find_knee({{1, 2}, 0.05, 8}, threshold(10, &seen));
  ASSERT_TRUE(all.is_ok());
  EXPECT_FALSE(all->bracketed);
  EXPECT_DOUBLE_EQ(all->knee_rate, 2);
  EXPECT_FALSE(all->note.empty());
  seen.clear();
  auto none = find_knee({{1, 2}, 0.3, 8}, threshold(0.1, &seen));
  ASSERT_TRUE(none.is_ok());
  // 1 fails; bisect [0,1]: 0.5 F, 0.25 F; width 0.25 <= 0.3 stop
  EXPECT_EQ(seen, (std::vector<double>{1, 0.5, 0.25}));
  EXPECT_FALSE(none->found);
  EXPECT_DOUBLE_EQ(none->knee_rate, 0);
}

TEST(FindKnee, RejectsBadGrid) {
  std::vector<double> seen;
  EXPECT_FALSE(find_knee({{2, 1}, 0.05, 8}, threshold(1, &seen)).is_ok());
  EXPECT_FALSE(find_knee({{}, 0.05, 8}, threshold(1, &seen)).is_ok());
}

}  // namespace
}  // namespace mxserve::bench
