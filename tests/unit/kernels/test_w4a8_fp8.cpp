// W4A8 number formats (kernels/w4a8_fp8.h), shared by the CUDA design-8 kernels and their CPU oracle: the
// per-row activation quantization, the exact E2M1 -> e4m3 weight codes with the E8M0 distance folded in
// (d <= 11 exact, beyond rounded through the e4m3 encoder), and the byte-permute table conversion the
// kernel runs (host emulation of prmt) equal to the per-element codes for every nibble, position and d.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>

#include "core/numeric.h"
#include "kernels/kv_fp8.h"
#include "kernels/w4a8_fp8.h"

namespace mxserve::kernels {
namespace {

float e2m1_value(uint32_t code) {
  static const float kMag[8] = {0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  return (code & 8) ? -kMag[code & 7] : kMag[code & 7];
}

TEST(W4a8Fp8, WeightCodesExactUpToDistance11) {
  for (int d = 0; d <= kW4a8ExactMaxD; ++d)
    for (uint32_t c = 0; c < 16; ++c) {
      const float want = std::ldexp(e2m1_value(c), 6 - d);
      const uint8_t code = w4a8_weight_code(c, d);
      EXPECT_EQ(fp8_e4m3_to_f32(code), want) << "code " << c << " d " << d;
      if ((c & 7) != 0) {
        EXPECT_EQ(code, f32_to_fp8_e4m3(want)) << "code " << c << " d " << d;
      }
    }
}

TEST(W4a8Fp8, WeightCodesBeyond11RoundThroughTheEncoder) {
  int inexact = 0;
  for (int d = kW4a8ExactMaxD + 1; d <= 40; ++d)
    for (uint32_t c = 0; c < 16; ++c) {
      const float exact = std::ldexp(e2m1_value(c), 6 - d);
      const uint8_t code = w4a8_weight_code(c, d);
      if ((c & 7) != 0) {
        EXPECT_EQ(code, f32_to_fp8_e4m3(exact)) << "code " << c << " d " << d;
      }
      // Within half an e4m3 subnormal step (2^-10) of the exact value.
      EXPECT_LE(std::fabs(fp8_e4m3_to_f32(code) - exact), std::ldexp(1.f, -10)) << "code " << c << " d " << d;
      inexact += fp8_e4m3_to_f32(code) != exact ? 1 : 0;
    }
  EXPECT_GT(inexact, 0);  // the slow path really is needed past 11
  EXPECT_EQ(fp8_e4m3_to_f32(w4a8_weight_code(1, 12)), std::ldexp(1.f, -7));  // 0.5 * 2^-6: an exact subnormal
  EXPECT_EQ(fp8_e4m3_to_f32(w4a8_weight_code(1, 16)), 0.f);                  // 2^-11: below half of 2^-9
}

TEST(W4a8Fp8, TableConversionMatchesPerElementCodes) {
  std::mt19937 rng(3);
  for (int d = 0; d <= kW4a8ExactMaxD; ++d) {
    const W4a8Table t = w4a8_table(d);
    for (int trial = 0; trial < 4000; ++trial) {
      // Every nibble value at every position (the first 16 x 8 trials), then random words.
      uint32_t w = rng();
      if (trial < 128) w = (trial % 16u) << (4 * (trial / 16));
      const W4a8Pair p = w4a8_convert8(w, t);
      for (int i = 0; i < 8; ++i) {
        const uint32_t got = ((i < 4 ? p.x : p.y) >> (8 * (i % 4))) & 0xFF;
        ASSERT_EQ(got, w4a8_weight_code((w >> (4 * i)) & 15u, d))
            << "word " << std::hex << w << std::dec << " element " << i << " d " << d;
      }
    }
  }
}

TEST(W4a8Fp8, ActivationQuantization) {
  EXPECT_EQ(w4a8_act_scale(0.f), 1.f);
  EXPECT_EQ(w4a8_act_scale(448.f), 1.f);
  const float s = w4a8_act_scale(3.5f);
  EXPECT_EQ(w4a8_act_code(3.5f, s), 0x7E);   // the amax maps to 448 exactly
  EXPECT_EQ(w4a8_act_code(-3.5f, s), 0xFE);
  EXPECT_EQ(w4a8_act_code(0.f, s), 0x00);
  // Relative error of a normal code <= 2^-4 (3 mantissa bits, round to nearest).
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-3.5f, 3.5f);
  for (int i = 0; i < 10000; ++i) {
    const float x = u(rng);
    const float back = fp8_e4m3_to_f32(w4a8_act_code(x, s)) * s;
    if (std::fabs(x / s) >= std::ldexp(1.f, -6)) {
      EXPECT_LE(std::fabs(back - x), std::ldexp(std::fabs(x), -4)) << x;
    }
  }
}

TEST(W4a8Fp8, RowFactor) {
  EXPECT_EQ(w4a8_row_factor(133), 1.f);
  EXPECT_EQ(w4a8_row_factor(127), std::ldexp(1.f, -6));
  EXPECT_EQ(w4a8_row_factor(0), std::ldexp(1.f, -133));  // an f32 subnormal, exact
  EXPECT_EQ(w4a8_row_factor(254), std::ldexp(1.f, 121));
}

}  // namespace
}  // namespace mxserve::kernels
