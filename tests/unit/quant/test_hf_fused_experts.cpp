// transformers' fused expert tensors (quant/hf_fused_experts.h) sliced per expert: hand-built FP8 and bf16
// stacks, each expert's gate / up / down rows and block-scale rows decoded and compared element by element
// with the stack decoded by hand; malformed stacks are errors naming the tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "core/numeric.h"
#include "io/checkpoint.h"
#include "io/safetensors_writer.h"
#include "quant/hf_fused_experts.h"

namespace mxserve::quant {
namespace {

namespace fs = std::filesystem;

class HfFused : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (fs::temp_directory_path() / ("mxserve_hf_fused_" + std::to_string(::getpid()) + ".safetensors")).string();
  }
  void TearDown() override { fs::remove(path_); }
  const io::Checkpoint& open(const io::NamedTensors& tensors) {
    EXPECT_TRUE(io::write_safetensors(path_, tensors).is_ok());
    auto ck = io::Checkpoint::open(path_);
    EXPECT_TRUE(ck.is_ok()) << ck.status().to_string();
    ck_ = std::move(ck).value();
    return *ck_;
  }
  std::string path_;
  std::unique_ptr<io::Checkpoint> ck_;
};

// Codes cycling over 1, 2, -0.5, 0.75 (e4m3 0x38, 0x40, 0xB0, 0x34) by flat index.
const uint8_t kCodes[4] = {0x38, 0x40, 0xB0, 0x34};
const float kValues[4] = {1.f, 2.f, -0.5f, 0.75f};

TEST_F(HfFused, Fp8StacksSliceIntoExpertsWithTheirScaleRows) {
  const int64_t E = 3, I = 16, H = 24, B = 8;  // gate_up [3, 32, 24], down [3, 24, 16]; blocks 8x8
  auto stack = [&](int64_t rows, int64_t cols) {
    Tensor q = Tensor::empty(DType::kFP8E4M3, {E, rows, cols});
    for (int64_t i = 0; i < q.numel(); ++i) q.data<uint8_t>()[i] = kCodes[i % 4];
    Tensor s = Tensor::empty(DType::kF32, {E, rows / B, cols / B});
    for (int64_t i = 0; i < s.numel(); ++i) s.data<float>()[i] = static_cast<float>(i + 1) / 64.f;
    return std::pair{q, s};
  };
  auto [gu, gus] = stack(2 * I, H);
  auto [dn, dns] = stack(H, I);
  const io::Checkpoint& ck = open({{"m.experts.gate_up_proj", gu}, {"m.experts.gate_up_proj_scale_inv", gus},
                                   {"m.experts.down_proj", dn}, {"m.experts.down_proj_scale_inv", dns}});
  const DetectOptions opts{B, B};
  struct Want {
    const char* proj;
    int64_t rows, cols, row0, stack_rows;  // the expert's rows [row0, row0 + rows) of a [E, stack_rows, cols] stack
  };
  for (int64_t e = 0; e < E; ++e)
    for (const Want& w : {Want{"gate", I, H, 0, 2 * I}, Want{"up", I, H, I, 2 * I}, Want{"down", H, I, 0, H}}) {
      const std::string name = "m.experts." + std::to_string(e) + "." + w.proj + "_proj.weight";
      auto s = hf_fused_expert_slice(ck, name, opts);
      ASSERT_TRUE(s.is_ok()) << s.status().to_string();
      ASSERT_TRUE(s->has_value()) << name;
      const StoredWeight& sw = (*s)->weight;
      EXPECT_EQ(sw.precision, Precision::kFp8Block);
      EXPECT_EQ(sw.shape, (Shape{w.rows, w.cols}));
      const Tensor f = to_host_f32(sw);
      for (int64_t r = 0; r < w.rows; ++r)
        for (int64_t c = 0; c < w.cols; ++c) {
          const int64_t R = w.row0 + r;  // row in the stack
          const float value = kValues[((e * w.stack_rows + R) * w.cols + c) % 4];
          const int64_t si = (e * (w.stack_rows / B) + R / B) * (w.cols / B) + c / B;
          ASSERT_EQ(f.data<float>()[r * w.cols + c], value * static_cast<float>(si + 1) / 64.f) << name << " " << r << "," << c;
        }
    }
  auto none = hf_fused_expert_slice(ck, "m.other.0.gate_proj.weight", opts);
  ASSERT_TRUE(none.is_ok());
  EXPECT_FALSE(none->has_value());
}

TEST_F(HfFused, FloatStacksSliceAndMalformedStacksNameTheTensor) {
  Tensor gu = Tensor::empty(DType::kBF16, {2, 8, 4});
  for (int64_t i = 0; i < gu.numel(); ++i) gu.data<uint16_t>()[i] = f32_to_bf16(static_cast<float>(i));
  const io::Checkpoint& ck = open({{"m.experts.gate_up_proj", gu}});
  auto up = hf_fused_expert_slice(ck, "m.experts.1.up_proj.weight", DetectOptions{});
  ASSERT_TRUE(up.is_ok() && up->has_value()) << up.status().to_string();
  EXPECT_EQ((*up)->weight.precision, Precision::kBF16);
  const Tensor f = to_host_f32((*up)->weight);
  ASSERT_EQ(f.shape(), (Shape{4, 4}));
  for (int64_t i = 0; i < 16; ++i) EXPECT_EQ(f.data<float>()[i], static_cast<float>(32 + 16 + i));  // expert 1, rows 4..7
  auto out_of_range = hf_fused_expert_slice(ck, "m.experts.2.gate_proj.weight", DetectOptions{});
  ASSERT_FALSE(out_of_range.is_ok());
  EXPECT_NE(out_of_range.status().message().find("expert 2 is outside 'm.experts.gate_up_proj' (2 experts)"),
            std::string::npos)
      << out_of_range.status().message();

  // FP8 halves of 12 rows with 8-row blocks: a block straddles gate and up.
  const io::Checkpoint& bad = open({{"m.experts.gate_up_proj", Tensor::zeros(DType::kFP8E4M3, {1, 24, 8})},
                                    {"m.experts.gate_up_proj_scale_inv", Tensor::zeros(DType::kF32, {1, 3, 1})}});
  auto straddle = hf_fused_expert_slice(bad, "m.experts.0.up_proj.weight", DetectOptions{8, 8});
  ASSERT_FALSE(straddle.is_ok());
  EXPECT_NE(straddle.status().message().find("one scale block straddles gate and up"), std::string::npos)
      << straddle.status().message();
  auto wrong_grid = hf_fused_expert_slice(bad, "m.experts.0.up_proj.weight", DetectOptions{4, 8});
  ASSERT_FALSE(wrong_grid.is_ok());
  EXPECT_NE(wrong_grid.status().message().find("is f32 [1, 3, 1], expected f32 [1, 6, 1] (blocks of 4x8)"),
            std::string::npos)
      << wrong_grid.status().message();
}

}  // namespace
}  // namespace mxserve::quant
