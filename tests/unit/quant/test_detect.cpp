// Per-tensor precision detection on small synthetic checkpoints: every storage form is recognized,
// every malformed one (missing scale, wrong scale shape or dtype, float weight with a scale) is an
// error naming the tensor with expected vs found.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "io/checkpoint.h"
#include "io/safetensors_writer.h"
#include "quant/detect.h"
#include "quant/precision_map.h"

namespace mxserve::quant {
namespace {

namespace fs = std::filesystem;

class Detect : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (fs::temp_directory_path() / ("mxserve_detect_" + std::to_string(::getpid()) + ".safetensors")).string();
  }
  void TearDown() override { fs::remove(path_); }
  std::unique_ptr<io::Checkpoint> open(const io::NamedTensors& tensors) {
    EXPECT_TRUE(io::write_safetensors(path_, tensors).is_ok());
    auto ck = io::Checkpoint::open(path_);
    EXPECT_TRUE(ck.is_ok()) << ck.status().to_string();
    return std::move(ck).value();
  }
  Result<StoredWeight> detect(const io::NamedTensors& tensors, const std::string& name) {
    ck_ = open(tensors);
    return detect_weight(*ck_, name, DetectOptions{});
  }
  std::string path_;
  std::unique_ptr<io::Checkpoint> ck_;
};

Tensor z(DType dt, Shape s) { return Tensor::zeros(dt, std::move(s)); }

TEST_F(Detect, RecognizesEveryStorageForm) {
  auto bf = detect({{"a.weight", z(DType::kBF16, {8, 64})}}, "a.weight");
  ASSERT_TRUE(bf.is_ok());
  EXPECT_EQ(bf->precision, Precision::kBF16);

  auto mx = detect({{"a.weight", z(DType::kU8, {8, 32})}, {"a.weight_scale", z(DType::kU8, {8, 2})}}, "a.weight");
  ASSERT_TRUE(mx.is_ok()) << mx.status().to_string();
  EXPECT_EQ(mx->precision, Precision::kMxfp4);
  EXPECT_EQ(mx->shape, (Shape{8, 64}));
  EXPECT_EQ(mx->describe(), "mxfp4 (weight u8 [8, 32] + weight_scale u8 [8, 2])");

  auto e8 = detect({{"a.weight", z(DType::kU8, {8, 24})}, {"a.weight_scale", z(DType::kE8M0, {8, 2})}}, "a.weight");
  ASSERT_TRUE(e8.is_ok()) << e8.status().to_string();  // 48 wide: a partial second block
  EXPECT_EQ(e8->shape, (Shape{8, 48}));

  auto fb = detect({{"a.weight", z(DType::kFP8E4M3, {200, 130})}, {"a.weight_scale_inv", z(DType::kF32, {2, 2})}},
                   "a.weight");
  ASSERT_TRUE(fb.is_ok()) << fb.status().to_string();
  EXPECT_EQ(fb->precision, Precision::kFp8Block);

  auto ft = detect({{"a.weight", z(DType::kFP8E4M3, {4, 4})}, {"a.weight_scale", z(DType::kF32, {1})}}, "a.weight");
  ASSERT_TRUE(ft.is_ok()) << ft.status().to_string();
  EXPECT_EQ(ft->precision, Precision::kFp8Tensor);

  auto fc = detect({{"a.weight", z(DType::kFP8E4M3, {4, 4})}, {"a.weight_scale", z(DType::kBF16, {4, 1})}}, "a.weight");
  ASSERT_TRUE(fc.is_ok()) << fc.status().to_string();
  EXPECT_EQ(fc->precision, Precision::kFp8Channel);

  auto g = open({{"model.layers.0.mlp.experts.gate_up_proj_blocks", z(DType::kU8, {2, 6, 2, 16})},
                 {"model.layers.0.mlp.experts.gate_up_proj_scales", z(DType::kU8, {2, 6, 2})}});
  auto gw = detect_gpt_oss_blocks(*g, "model.layers.0.mlp.experts.gate_up_proj_blocks");
  ASSERT_TRUE(gw.is_ok()) << gw.status().to_string();
  EXPECT_EQ(gw->precision, Precision::kMxfp4GptOss);
  EXPECT_EQ(gw->shape, (Shape{2, 6, 64}));
  EXPECT_EQ(to_host_f32(*gw).shape(), (Shape{2, 6, 64}));
}

TEST_F(Detect, MalformedCasesNameTheTensor) {
  struct Case {
    io::NamedTensors tensors;
    std::vector<std::string> needles;
  };
  const std::vector<Case> cases = {
      {{{"x.weight", z(DType::kU8, {8, 32})}}, {"tensor 'x.weight' is u8 [8, 32]", "'x.weight_scale' is missing"}},
      {{{"x.weight", z(DType::kU8, {8, 32})}, {"x.weight_scale", z(DType::kU8, {8, 4})}},
       {"'x.weight_scale'", "has shape [8, 4], expected [8, 2]"}},
      {{{"x.weight", z(DType::kU8, {8, 32})}, {"x.weight_scale", z(DType::kF32, {8, 2})}},
       {"'x.weight_scale'", "is f32 [8, 2], expected u8 or e8m0 [8, 2]"}},
      {{{"x.weight", z(DType::kBF16, {8, 64})}, {"x.weight_scale", z(DType::kU8, {8, 2})}},
       {"tensor 'x.weight' is bf16 [8, 64] (unquantized)", "'x.weight_scale'"}},
      {{{"x.weight", z(DType::kFP8E4M3, {8, 64})}}, {"tensor 'x.weight' is fp8_e4m3 [8, 64]", "'x.weight_scale_inv'"}},
      {{{"x.weight", z(DType::kFP8E4M3, {300, 64})}, {"x.weight_scale_inv", z(DType::kF32, {2, 1})}},
       {"'x.weight_scale_inv'", "is f32 [2, 1], expected f32 [3, 1]"}},
      {{{"x.weight", z(DType::kI32, {8, 64})}}, {"tensor 'x.weight' has dtype i32"}},
      {{{"x.weight", z(DType::kFP8E4M3, {8, 64})}, {"x.weight_scale", z(DType::kF32, {8, 2})}},
       {"'x.weight_scale'", "is f32 [8, 2], expected a float [1] (per tensor) or [8, 1] (per output channel)"}},
  };
  for (const auto& c : cases) {
    auto r = detect(c.tensors, "x.weight");
    ASSERT_FALSE(r.is_ok());
    for (const auto& n : c.needles) EXPECT_NE(r.status().message().find(n), std::string::npos) << r.status().message();
  }
}

// transformers' FineGrainedFP8 layout with a block other than 128 (quantization_config.weight_block_size),
// partial edge blocks and per-expert scale grids saved squeezed ([1, 2] as [2]): hand-built codes and scales,
// decoded values written out by hand.
TEST_F(Detect, Fp8BlockOfAnySizeDecodesExactlyWithPartialBlocksAndSqueezedGrids) {
  const uint8_t kOne = 0x38, kTwo = 0x40, kMinusHalf = 0xB0, kThreeQuarters = 0x34;  // 1, 2, -0.5, 0.75
  const uint8_t pattern[4] = {kOne, kTwo, kMinusHalf, kThreeQuarters};
  const float value[4] = {1.f, 2.f, -0.5f, 0.75f};
  auto codes = [&](int64_t rows, int64_t cols) {
    Tensor q = Tensor::empty(DType::kFP8E4M3, {rows, cols});
    for (int64_t i = 0; i < rows * cols; ++i) q.data<uint8_t>()[i] = pattern[(i / cols + 3 * (i % cols)) % 4];
    return q;
  };
  auto grid = [](Shape shape, float first) {
    Tensor t = Tensor::empty(DType::kF32, std::move(shape));
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = first * static_cast<float>(1 << i);  // distinct
    return t;
  };
  const DetectOptions b32{32, 32};
  auto check = [&](int64_t rows, int64_t cols, Shape scale_shape, int64_t grid_cols) {
    ck_ = open({{"x.weight", codes(rows, cols)}, {"x.weight_scale_inv", grid(scale_shape, 0.25f)}});
    auto w = detect_weight(*ck_, "x.weight", b32);
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    EXPECT_EQ(w->precision, Precision::kFp8Block);
    EXPECT_EQ(w->block_rows, 32);
    const Tensor f = to_host_f32(*w);
    ASSERT_EQ(f.shape(), (Shape{rows, cols}));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const float scale = 0.25f * static_cast<float>(1 << ((r / 32) * grid_cols + c / 32));
        ASSERT_EQ(f.data<float>()[r * cols + c], value[(r + 3 * c) % 4] * scale) << rows << "x" << cols << " at " << r << "," << c;
      }
  };
  check(40, 70, {2, 3}, 3);  // partial last row block (8 rows) and column block (6 columns)
  check(32, 64, {2}, 2);     // grid [1, 2] saved squeezed
  check(64, 32, {2}, 1);     // grid [2, 1] saved squeezed
  check(32, 32, {}, 1);      // grid [1, 1] saved as a scalar

  struct Bad {
    Shape weight, scale;
    const char* needle;
  };
  for (const Bad& b : {Bad{{32, 64}, {3}, "is f32 [3], expected f32 [1, 2] (blocks of 32x32"},
                       Bad{{32, 64}, {2, 1}, "is f32 [2, 1], expected f32 [1, 2]"},
                       Bad{{40, 70}, {1, 3}, "is f32 [1, 3], expected f32 [2, 3]"}}) {
    ck_ = open({{"x.weight", codes(b.weight[0], b.weight[1])}, {"x.weight_scale_inv", grid(b.scale, 1.f)}});
    auto w = detect_weight(*ck_, "x.weight", b32);
    ASSERT_FALSE(w.is_ok()) << shape_to_string(b.scale);
    EXPECT_NE(w.status().message().find(b.needle), std::string::npos) << w.status().message();
    EXPECT_NE(w.status().message().find("'x.weight_scale_inv'"), std::string::npos) << w.status().message();
  }
}

TEST_F(Detect, PrecisionMapGroupsLayersAndMarksMtp) {
  auto ck = open({{"model.layers.0.self_attn.q_proj.weight", z(DType::kBF16, {4, 64})},
                  {"model.layers.0.mlp.experts.0.up_proj.weight", z(DType::kU8, {4, 32})},
                  {"model.layers.0.mlp.experts.0.up_proj.weight_scale", z(DType::kU8, {4, 2})},
                  {"model.layers.0.mlp.experts.1.up_proj.weight", z(DType::kU8, {4, 32})},
                  {"model.layers.0.mlp.experts.1.up_proj.weight_scale", z(DType::kU8, {4, 2})},
                  {"model.layers.1.eh_proj.weight", z(DType::kBF16, {4, 8})},
                  {"model.layers.1.mlp.experts.0.up_proj.weight", z(DType::kBF16, {4, 64})},
                  {"model.layers.1.input_layernorm.weight", z(DType::kBF16, {4})},
                  {"lm_head.weight", z(DType::kBF16, {4, 4})}});
  const std::string text = format_precision_map(precision_map(*ck, 1, DetectOptions{}));
  EXPECT_NE(text.find("(global)"), std::string::npos) << text;
  EXPECT_NE(text.find("lm_head bf16"), std::string::npos) << text;
  EXPECT_NE(text.find("layer 0:"), std::string::npos) << text;
  EXPECT_NE(text.find("mlp.experts mxfp4x2"), std::string::npos) << text;
  EXPECT_NE(text.find("layer 1 (MTP):"), std::string::npos) << text;
  EXPECT_NE(text.find("eh_proj bf16 | mlp.experts bf16"), std::string::npos) << text;
  EXPECT_EQ(text.find("layernorm"), std::string::npos) << text;
  EXPECT_EQ(tensor_precision_label(*ck, "model.layers.0.mlp.experts.1.up_proj.weight_scale", DetectOptions{}),
            "scale of model.layers.0.mlp.experts.1.up_proj.weight");
}

}  // namespace
}  // namespace mxserve::quant
