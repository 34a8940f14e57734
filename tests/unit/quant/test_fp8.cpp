// FP8 e4m3 against the spec: every code round-trips, encoding agrees bit-exactly with a brute-force
// nearest-value search (ties to the even code, saturation at 448), and block / per-tensor quantization
// keeps the documented error bound with partial edge blocks.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/numeric.h"
#include "quant/fp8.h"

namespace mxserve::quant {
namespace {

double ref_decode(int code) {  // positive codes 0..0x7e, straight from the definition
  const int e = (code >> 3) & 0xf, m = code & 7;
  return e == 0 ? m * std::ldexp(1.0, -9) : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
}

uint8_t ref_encode(float v) {
  if (std::isnan(v)) return 0x7f;
  const uint8_t sign = std::signbit(v) ? 0x80 : 0;
  const double m = std::fabs(static_cast<double>(v));
  int best = 0;
  for (int c = 1; c <= 0x7e; ++c) {
    const double d = std::fabs(ref_decode(c) - m), db = std::fabs(ref_decode(best) - m);
    if (d < db || (d == db && c % 2 == 0)) best = c;
  }
  return sign | static_cast<uint8_t>(best);
}

TEST(E4M3, EveryFiniteCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    const float v = e4m3_decode(static_cast<uint8_t>(c));
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(v));
      continue;
    }
    EXPECT_EQ(static_cast<double>(std::fabs(v)), ref_decode(c & 0x7f)) << c;
    EXPECT_EQ(e4m3_encode(v), c) << c;
  }
  EXPECT_EQ(e4m3_decode(0x7e), 448.0f);
}

TEST(E4M3, EncodeMatchesBruteForceIncludingTiesAndSaturation) {
  std::vector<float> values = {448.0f, 449.0f, 464.0f, 1e9f, INFINITY, -INFINITY, NAN, 0.0f, -0.0f,
                               std::ldexp(1.0f, -10), std::ldexp(3.0f, -11), std::ldexp(1.0f, -6)};
  for (int c = 1; c < 0x7e; ++c) {  // midpoints between neighbours are ties
    values.push_back(static_cast<float>((ref_decode(c) + ref_decode(c + 1)) / 2));
    values.push_back(-static_cast<float>((ref_decode(c) + ref_decode(c + 1)) / 2));
  }
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> ex(-14, 10);
  for (int i = 0; i < 5000; ++i) values.push_back((i % 2 ? -1 : 1) * std::ldexp(mant(rng), ex(rng)));
  for (float v : values) ASSERT_EQ(e4m3_encode(v), std::isinf(v) ? (v > 0 ? 0x7e : 0xfe) : ref_encode(v)) << v;
}

TEST(Fp8Block, PartialBlocksScalesAndErrorBound) {
  const int64_t rows = 200, cols = 130;  // edge blocks of 72 rows and 2 columns
  Tensor w = Tensor::empty(DType::kF32, {rows, cols});
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = normal(rng) * (i % 7 == 0 ? 30.0f : 1.0f);
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t r = 128; r < rows; ++r)
      if (c >= 128) w.data<float>()[r * cols + c] = 0.0f;  // an all-zero block
  auto q = quantize_fp8_block(w, 128, 128, "w");
  ASSERT_TRUE(q.is_ok());
  EXPECT_EQ(q->weight.shape(), (Shape{rows, cols}));
  EXPECT_EQ(q->scale.shape(), (Shape{2, 2}));
  EXPECT_EQ(q->scale.data<float>()[3], 1.0f);  // all-zero block: scale 1
  Tensor d = dequantize_fp8(q->weight, q->scale, 128, 128);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float x = w.data<float>()[r * cols + c], y = d.data<float>()[r * cols + c];
      const float s = q->scale.data<float>()[(r / 128) * 2 + c / 128];
      // Half an ulp of a 3-bit mantissa (1/16 relative) or half the subnormal step 2^-10 in scaled units.
      ASSERT_LE(std::fabs(x - y), std::max(std::fabs(x) / 16.0f, std::ldexp(s, -10)) * 1.0001f) << r << "," << c;
    }
}

TEST(Fp8Tensor, SingleScale) {
  Tensor w = Tensor::empty(DType::kF32, {4, 8});
  for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = static_cast<float>(i) - 10.0f;
  auto q = quantize_fp8_tensor(w, "w");
  ASSERT_TRUE(q.is_ok());
  EXPECT_EQ(q->scale.shape(), (Shape{1}));
  EXPECT_FLOAT_EQ(q->scale.data<float>()[0], 21.0f / 448.0f);
  Tensor d = dequantize_fp8(q->weight, q->scale, 1, 1);
  for (int64_t i = 0; i < w.numel(); ++i) EXPECT_NEAR(d.data<float>()[i], w.data<float>()[i], 21.0 / 16);
}

TEST(Fp8Channel, OneScalePerRowAnyFloatDtype) {
  Tensor w = Tensor::empty(DType::kF32, {3, 5});
  for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = static_cast<float>((i % 5) + 1) * (i / 5 + 1);
  auto q = quantize_fp8_channel(w, "w");
  ASSERT_TRUE(q.is_ok());
  EXPECT_EQ(q->scale.shape(), (Shape{3, 1}));
  for (int r = 0; r < 3; ++r) EXPECT_FLOAT_EQ(q->scale.data<float>()[r], 5.0f * (r + 1) / 448.0f);
  Tensor d = dequantize_fp8_rows(q->weight, q->scale);
  for (int64_t i = 0; i < w.numel(); ++i) EXPECT_NEAR(d.data<float>()[i], w.data<float>()[i], w.data<float>()[i] / 16);
  // bf16 scales (as compressed-tensors exports often store them) dequantize the same way.
  Tensor s16 = Tensor::empty(DType::kBF16, {3, 1});
  for (int r = 0; r < 3; ++r) s16.data<uint16_t>()[r] = f32_to_bf16(2.0f);
  Tensor d16 = dequantize_fp8_rows(q->weight, s16);
  EXPECT_EQ(d16.data<float>()[0], e4m3_decode(q->weight.data<uint8_t>()[0]) * 2.0f);
}

TEST(Fp8Block, NonFiniteBlockIsNan) {
  Tensor w = Tensor::zeros(DType::kF32, {2, 2});
  w.data<float>()[1] = INFINITY;
  auto q = quantize_fp8_block(w, 128, 128, "w");
  ASSERT_TRUE(q.is_ok());
  EXPECT_TRUE(std::isnan(q->scale.data<float>()[0]));
  EXPECT_TRUE(std::isnan(dequantize_fp8(q->weight, q->scale, 128, 128).data<float>()[0]));
}

}  // namespace
}  // namespace mxserve::quant
