// Arrival schedules: exact constant spacing; Poisson/gamma mean and dispersion; bounds.
#include <gtest/gtest.h>

#include <cmath>

#include "bench/arrivals.h"

namespace mxserve::bench {
namespace {

TEST(Arrivals, ConstantIsExact) {
  ArrivalConfig c;
  c.kind = ArrivalKind::kConstant;
  auto s = make_arrival_schedule(c, 4.0, 5, 0, 0);
  ASSERT_TRUE(s.is_ok());
  EXPECT_EQ(*s, (std::vector<double>{0, 0.25, 0.5, 0.75, 1.0}));
  auto d = make_arrival_schedule(c, 4.0, -1, 1.1, 0);
  EXPECT_EQ(d->size(), 5u);  // 0 .. 1.0 inside 1.1 s
}

double cv_of_gaps(const std::vector<double>& t, double* mean) {
  double s = 0, s2 = 0;
  const size_t n = t.size() - 1;
  for (size_t i = 1; i < t.size(); ++i) {
    const double g = t[i] - t[i - 1];
    s += g;
    s2 += g * g;
  }
  *mean = s / n;
  return std::sqrt(s2 / n - *mean * *mean) / *mean;
}

TEST(Arrivals, PoissonAndGammaDispersion) {
  ArrivalConfig c;
  c.seed = 3;
  auto p = make_arrival_schedule(c, 10.0, 20000, 0, 1);
  double mean = 0;
  EXPECT_NEAR(cv_of_gaps(*p, &mean), 1.0, 0.03);  // exponential: CV 1
  EXPECT_NEAR(mean, 0.1, 0.003);
  c.kind = ArrivalKind::kGamma;
  c.burstiness = 0.25;  // CV = 1/sqrt(k) = 2
  auto g = make_arrival_schedule(c, 10.0, 20000, 0, 1);
  EXPECT_NEAR(cv_of_gaps(*g, &mean), 2.0, 0.12);
  EXPECT_NEAR(mean, 0.1, 0.006);
  // Deterministic per (seed, stream), different across streams.
  EXPECT_EQ(*make_arrival_schedule(c, 10.0, 50, 0, 1), *make_arrival_schedule(c, 10.0, 50, 0, 1));
  EXPECT_NE(*make_arrival_schedule(c, 10.0, 50, 0, 1), *make_arrival_schedule(c, 10.0, 50, 0, 2));
}

TEST(Arrivals, BoundsAndErrors) {
  ArrivalConfig c;
  EXPECT_EQ(make_arrival_schedule(c, INFINITY, 7, 0, 0)->size(), 7u);
  EXPECT_FALSE(make_arrival_schedule(c, INFINITY, -1, 10, 0).is_ok());
  EXPECT_FALSE(make_arrival_schedule(c, 1, -1, 0, 0).is_ok());
  EXPECT_FALSE(make_arrival_schedule(c, 0, 5, 0, 0).is_ok());
}

}  // namespace
}  // namespace mxserve::bench
