// MXFP4 against the spec: the 16 E2M1 codes, rounding ties, the three scale rules at their edges, and
// bit-exact agreement with an independent, deliberately naive implementation written here (brute-force
// nearest value in double precision, scale exponents from log2 in double instead of bit tricks).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "quant/mxfp4.h"

namespace mxserve::quant {
namespace {

// ---- independent reference ----
const double kE2M1[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};

uint8_t ref_encode(double v) {
  if (std::isnan(v)) return 0;
  const uint8_t sign = std::signbit(v) ? 8 : 0;
  const double m = std::min(std::fabs(v), 6.0);
  int best = 0;
  for (int c = 1; c < 8; ++c) {
    const double d = std::fabs(kE2M1[c] - m), db = std::fabs(kE2M1[best] - m);
    if (d < db || (d == db && c % 2 == 0)) best = c;  // tie -> even code
  }
  return sign | static_cast<uint8_t>(best);
}

int clamp_e(double e) { return static_cast<int>(std::max(-127.0, std::min(127.0, e))); }

// The scale exponent (unbiased) per rule, from the rule's mathematical definition.
int ref_scale_exp(float amax, ScaleRule rule) {
  if (amax == 0) return -127;
  const double a = amax;
  switch (rule) {
    case ScaleRule::kFloor: return clamp_e(std::floor(std::log2(a)) - 2);
    case ScaleRule::kEven: {
      // Round amax to 1 mantissa bit (E2M1 precision), ties away from zero as the +2^21 bit trick
      // does, then floor(log2(.)) - 2. Below the smallest normal float the rounding of the trick
      // works on the raw subnormal bits, which only changes exponents that clamp to -127 anyway.
      const int e = std::ilogb(a);
      const double mant = a / std::ldexp(1.0, e);  // [1, 2)
      const double rounded = mant >= 1.75 ? 2.0 : 1.0;
      if (e < -126) return -127;
      if (e == 127 && rounded == 2.0) return 127;  // rounds to +Inf in f32: log2 = inf, clamped (as Quark)
      return clamp_e(e + std::log2(rounded) - 2);
    }
    case ScaleRule::kCeil: {
      const float s = amax / 6.0f;  // the rule divides in f32
      // The bit trick rounds any nonzero subnormal quotient up to the smallest normal, 2^-126.
      if (s == 0.0f) return -127;
      if (s < std::numeric_limits<float>::min()) return -126;
      return clamp_e(std::ceil(std::log2(static_cast<double>(s))));
    }
  }
  return 0;
}

void ref_quantize_row(const std::vector<float>& x, ScaleRule rule, std::vector<uint8_t>& packed,
                      std::vector<uint8_t>& scales) {
  const size_t k = x.size();
  packed.assign(k / 2, 0);
  scales.assign((k + 31) / 32, 0);
  for (size_t b = 0; b < scales.size(); ++b) {
    float amax = 0;
    for (size_t i = b * 32; i < std::min(k, b * 32 + 32); ++i) amax = std::max(amax, std::fabs(x[i]));
    const int e = ref_scale_exp(amax, rule);
    scales[b] = static_cast<uint8_t>(e + 127);
    for (size_t i = b * 32; i < std::min(k, b * 32 + 32); ++i) {
      const uint8_t c = ref_encode(static_cast<double>(x[i]) / std::ldexp(1.0, e));
      packed[i / 2] |= (i % 2 == 0) ? c : static_cast<uint8_t>(c << 4);
    }
  }
}

// ---- tests ----

TEST(E2M1, AllSixteenCodesDecode) {
  const float expected[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(e2m1_decode(static_cast<uint8_t>(c)), expected[c]) << c;
    EXPECT_EQ(std::signbit(e2m1_decode(static_cast<uint8_t>(c))), c >= 8) << c;
    EXPECT_EQ(e2m1_encode(expected[c]), c) << "every code round-trips, -0 included";
  }
}

TEST(E2M1, TiesGoToEvenCodesAndLargeValuesSaturate) {
  const std::pair<float, uint8_t> cases[] = {
      {0.25f, 0x0}, {0.26f, 0x1}, {0.75f, 0x2}, {1.25f, 0x2}, {1.75f, 0x4}, {2.5f, 0x4}, {2.51f, 0x5},
      {3.5f, 0x6},  {5.0f, 0x6},  {5.01f, 0x7}, {6.5f, 0x7},  {1e30f, 0x7}, {INFINITY, 0x7},
      {-0.1f, 0x8}, {-2.5f, 0xC}, {-5.0f, 0xE}, {-7.f, 0xF},  {-INFINITY, 0xF}, {NAN, 0x0}};
  for (auto [v, code] : cases) EXPECT_EQ(e2m1_encode(v), code) << v;
}

TEST(E8M0, ScaleRulesAtTheirEdges) {
  // amax = 6: floor 2^(2-2) = 1, even: 6 = 1.5*4 stays below 1.75 -> 1, ceil 2^ceil(log2 1) = 1.
  EXPECT_EQ(e8m0_scale_for(6.0f, ScaleRule::kFloor), 127);
  EXPECT_EQ(e8m0_scale_for(6.0f, ScaleRule::kEven), 127);
  EXPECT_EQ(e8m0_scale_for(6.0f, ScaleRule::kCeil), 127);
  // amax = 7.9: floor keeps 1 (saturates 7.9 -> 6), even rounds 7.9 up to 8 -> 2, ceil -> 2.
  EXPECT_EQ(e8m0_scale_for(7.9f, ScaleRule::kFloor), 127);
  EXPECT_EQ(e8m0_scale_for(7.9f, ScaleRule::kEven), 128);
  EXPECT_EQ(e8m0_scale_for(7.9f, ScaleRule::kCeil), 128);
  // amax = 6.5: even keeps 1 (1.625 < 1.75, saturates to 6), ceil goes to 2 (never saturates).
  EXPECT_EQ(e8m0_scale_for(6.5f, ScaleRule::kEven), 127);
  EXPECT_EQ(e8m0_scale_for(6.5f, ScaleRule::kCeil), 128);
  // All-zero block: byte 0 (2^-127) under every rule; non-finite amax: the NaN scale.
  for (auto r : {ScaleRule::kEven, ScaleRule::kFloor, ScaleRule::kCeil}) {
    EXPECT_EQ(e8m0_scale_for(0.0f, r), 0);
    EXPECT_EQ(e8m0_scale_for(NAN, r), 0xff);
    EXPECT_EQ(e8m0_scale_for(INFINITY, r), 0xff);
    // Huge and subnormal magnitudes stay within [0, 254].
    EXPECT_LE(e8m0_scale_for(std::numeric_limits<float>::max(), r), 254);
    EXPECT_GE(e8m0_scale_for(std::numeric_limits<float>::max(), r), 252);
    EXPECT_EQ(e8m0_scale_for(std::numeric_limits<float>::denorm_min(), r), 0);  // 2^-149: exponent clamps to -127
    EXPECT_EQ(e8m0_scale_for(1e-39f, r), r == ScaleRule::kCeil ? 1 : 0);  // ceil: amax/6 subnormal -> 2^-126
  }
  EXPECT_EQ(e8m0_scale_for(std::numeric_limits<float>::max(), ScaleRule::kFloor), 127 + 125);
}

TEST(E8M0, AgreesWithLog2DefinitionsOnRandomMagnitudes) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> ex(-140, 127);
  for (int i = 0; i < 20000; ++i) {
    const float amax = std::ldexp(mant(rng), ex(rng));
    if (!std::isfinite(amax) || amax == 0) continue;
    for (auto r : {ScaleRule::kEven, ScaleRule::kFloor, ScaleRule::kCeil})
      ASSERT_EQ(e8m0_scale_for(amax, r), ref_scale_exp(amax, r) + 127) << amax << " " << scale_rule_name(r);
  }
}

TEST(Mxfp4, PackingPutsElement2iInTheLowNibble) {
  std::vector<float> x(32, 0.0f);
  x[0] = 1.0f;   // code 2
  x[1] = -6.0f;  // code F
  x[2] = 0.5f;   // code 1
  uint8_t packed[16], scale;
  mxfp4_quantize_row(x.data(), 32, ScaleRule::kFloor, packed, &scale);
  EXPECT_EQ(scale, 127 + 0);  // amax 6 -> 2^(2-2)
  EXPECT_EQ(packed[0], 0xF2);
  EXPECT_EQ(packed[1], 0x01);
}

TEST(Mxfp4, BitExactAgainstIndependentImplementation) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-30, 30);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t k = 2 * (1 + trial % 80);  // partial last blocks included
    std::vector<float> x(static_cast<size_t>(k));
    const int e = ex(rng);
    for (auto& v : x) v = std::ldexp(normal(rng), e);
    if (trial % 7 == 0) std::fill(x.begin(), x.begin() + std::min<int64_t>(k, 32), 0.0f);  // zero block
    if (trial % 5 == 0) x[0] = std::ldexp(7.0f, e);                                          // saturation edge
    for (auto r : {ScaleRule::kEven, ScaleRule::kFloor, ScaleRule::kCeil}) {
      std::vector<uint8_t> packed(k / 2), scales((k + 31) / 32), rp, rs;
      mxfp4_quantize_row(x.data(), k, r, packed.data(), scales.data());
      ref_quantize_row(x, r, rp, rs);
      ASSERT_EQ(scales, rs) << "trial " << trial << " rule " << scale_rule_name(r);
      ASSERT_EQ(packed, rp) << "trial " << trial << " rule " << scale_rule_name(r);
    }
  }
}

TEST(Mxfp4, DequantizeErrorBounds) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t k = 256;
  std::vector<float> x(k), y(k);
  for (auto& v : x) v = normal(rng);
  for (auto r : {ScaleRule::kEven, ScaleRule::kFloor, ScaleRule::kCeil}) {
    std::vector<uint8_t> packed(k / 2), scales(k / 32);
    mxfp4_quantize_row(x.data(), k, r, packed.data(), scales.data());
    mxfp4_dequantize_row(packed.data(), scales.data(), k, y.data());
    double num = 0, den = 0;
    for (int64_t i = 0; i < k; ++i) {
      const double s = std::ldexp(1.0, scales[i / 32] - 127);
      // Half the widest gap (4 -> 6) is 1 scale unit; saturation (floor/even) can cost up to 2.
      EXPECT_LE(std::fabs(x[i] - y[i]), (r == ScaleRule::kCeil ? 1.0 : 2.0) * s) << i;
      num += (x[i] - y[i]) * (x[i] - y[i]);
      den += x[i] * x[i];
    }
    EXPECT_LT(std::sqrt(num / den), 0.2) << scale_rule_name(r);
  }
}

TEST(Mxfp4, NonFiniteBlocksGetTheNanScale) {
  std::vector<float> x(64, 1.0f);
  x[40] = NAN;
  uint8_t packed[32], scales[2];
  mxfp4_quantize_row(x.data(), 64, ScaleRule::kEven, packed, scales);
  EXPECT_EQ(scales[0], 125);  // amax 1 -> 2^-2
  EXPECT_EQ(scales[1], 0xff);
  std::vector<float> y(64);
  mxfp4_dequantize_row(packed, scales, 64, y.data());
  EXPECT_EQ(y[0], 1.0f);
  for (int i = 32; i < 64; ++i) EXPECT_TRUE(std::isnan(y[i]));
}

TEST(Mxfp4, TensorApiShapesAndOddWidthError) {
  Tensor w = Tensor::zeros(DType::kF32, {3, 48});
  auto q = quantize_mxfp4(w, ScaleRule::kEven, "w");
  ASSERT_TRUE(q.is_ok());
  EXPECT_EQ(q->packed.shape(), (Shape{3, 24}));
  EXPECT_EQ(q->scales.shape(), (Shape{3, 2}));
  Tensor d = dequantize_mxfp4(q->packed, q->scales, 48);
  EXPECT_EQ(d.shape(), (Shape{3, 48}));
  auto bad = quantize_mxfp4(Tensor::zeros(DType::kF32, {3, 5}), ScaleRule::kEven, "odd.weight");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("odd.weight"), std::string::npos);
}

}  // namespace
}  // namespace mxserve::quant
