#include <gtest/gtest.h>

#include <cmath>

#include "core/dtype.h"
#include "core/numeric.h"
#include "core/tensor.h"

namespace mxserve {
namespace {

TEST(Numeric, Bf16RoundTripAndRounding) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-2.5f)), -2.5f);
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties to even -> 1.0.
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  // Just above halfway rounds up.
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -12))), 1.0078125f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(Numeric, F16Decode) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_TRUE(std::isinf(f16_to_f32(0x7c00)));
}

TEST(Numeric, Fp8E4M3Decode) {
  EXPECT_EQ(fp8_e4m3_to_f32(0x38), 1.0f);    // exp 7, mant 0
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);  // max normal
  EXPECT_EQ(fp8_e4m3_to_f32(0xfe), -448.0f);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0x7f)));
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
}

TEST(Numeric, Fp8E5M2Decode) {
  EXPECT_EQ(fp8_e5m2_to_f32(0x3c), 1.0f);
  EXPECT_EQ(fp8_e5m2_to_f32(0x7b), 57344.0f);
  EXPECT_TRUE(std::isinf(fp8_e5m2_to_f32(0x7c)));
}

TEST(Numeric, E8M0AndFp4) {
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(130), 8.0f);
  EXPECT_EQ(e8m0_to_f32(0), std::ldexp(1.0f, -127));
  EXPECT_TRUE(std::isnan(e8m0_to_f32(0xff)));
  const float expected[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (int n = 0; n < 16; ++n) EXPECT_EQ(fp4_e2m1_to_f32(static_cast<uint8_t>(n)), expected[n]) << n;
}

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_bytes(DType::kBF16, 10).value(), 20u);
  EXPECT_EQ(dtype_bytes(DType::kFP4E2M1, 10).value(), 5u);
  EXPECT_FALSE(dtype_bytes(DType::kFP4E2M1, 3).has_value());
  EXPECT_EQ(dtype_from_safetensors("F8_E4M3").value(), DType::kFP8E4M3);
  EXPECT_EQ(dtype_from_safetensors("F8_E8M0").value(), DType::kE8M0);
  EXPECT_FALSE(dtype_from_safetensors("Q4_K").has_value());
  EXPECT_STREQ(dtype_name(DType::kFP4E2M1), "fp4_e2m1");
}

TEST(Tensor, ShapesSlicesViews) {
  Tensor t = Tensor::zeros(DType::kF32, {4, 3});
  EXPECT_EQ(t.numel(), 12);
  EXPECT_EQ(t.nbytes(), 48u);
  EXPECT_TRUE(t.is_contiguous());
  for (int i = 0; i < 12; ++i) t.data<float>()[i] = static_cast<float>(i);
  Tensor rows = t.slice_rows(1, 3);
  EXPECT_EQ(rows.shape(), (Shape{2, 3}));
  EXPECT_EQ(rows.data<float>()[0], 3.0f);
  Tensor r = t.reshape({2, 6});
  EXPECT_EQ(r.dim(1), 6);
  EXPECT_EQ(r.data<float>(), t.data<float>());  // shares storage
  EXPECT_EQ(t.describe(), "f32[4, 3]");
  Tensor packed = Tensor::empty(DType::kFP4E2M1, {2, 8});
  EXPECT_EQ(packed.nbytes(), 8u);
  EXPECT_EQ(static_cast<char*>(packed.slice_rows(1, 2).raw()) - static_cast<char*>(packed.raw()), 4);
}

}  // namespace
}  // namespace mxserve
