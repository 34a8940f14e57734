// mxserve's own quantizer against the formats' worst-case error (quant_bound.h): every dequantized routed-expert
// weight within the per-element bound of MXFP4 ("even" scales, whose bytes must match the rule) and FP8 block
// 128x128, and the logits within the envelope of the fixture moved by that bound -- tolerances derived from the
// format and the fixture's weights, not from this implementation's measurements.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "io/checkpoint.h"
#include "quant/quantizer.h"
#include "quant_bound.h"

namespace mxserve::quant_bound {
namespace {

namespace fs = std::filesystem;

std::string fixture_dir(const std::string& fx) { return std::string(MXSERVE_SOURCE_DIR) + "/tests/fixtures/" + fx; }
std::string scratch(const std::string& tag) {
  return (fs::temp_directory_path() / ("mxserve_qb_" + std::to_string(::getpid()) + "_" + tag)).string();
}

struct Case {
  const char* fx;
  quant::Scheme scheme;
  const char* tag;
};
const Case kCases[] = {{"glm4_moe_tiny_a", quant::Scheme::kMxfp4, "mxfp4"},
                       {"glm4_moe_tiny_b", quant::Scheme::kMxfp4, "mxfp4"},
                       {"glm4_moe_tiny_a", quant::Scheme::kFp8Block, "fp8_block"},
                       {"glm4_moe_tiny_b", quant::Scheme::kFp8Block, "fp8_block"}};

BoundFn routed_expert_bound(quant::Scheme scheme) {
  return [scheme](const std::string& name, const std::vector<float>& w, int64_t rows, int64_t cols) {
    if (!is_routed_expert_weight(name)) return std::vector<float>{};
    return scheme == quant::Scheme::kMxfp4 ? mxfp4_even_error_bound(w, rows, cols)
                                           : fp8_block_error_bound(w, rows, cols, 128, 128);
  };
}

std::string quantize(const Case& c) {
  quant::QuantizeOptions o;
  o.in_dir = fixture_dir(c.fx);
  o.out_dir = scratch(std::string(c.fx) + "_" + c.tag);
  fs::remove_all(o.out_dir);
  o.scheme = c.scheme;
  o.scale_rule = quant::ScaleRule::kEven;
  auto r = quant::quantize_checkpoint(o, nullptr);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return o.out_dir;
}

class QuantBound : public ::testing::TestWithParam<size_t> {};

TEST_P(QuantBound, EveryDequantizedWeightWithinTheFormatsWorstCase) {
  const Case& c = kCases[GetParam()];
  const std::string dir = quantize(c);
  auto orig = io::Checkpoint::open(fixture_dir(c.fx));
  auto quant = io::Checkpoint::open(dir);
  ASSERT_TRUE(orig.is_ok() && quant.is_ok());
  int64_t checked = 0, over = 0, nonzero_error = 0, scale_mismatch = 0;
  std::string first_over;
  for (const auto& name : (*orig)->names()) {
    if (!is_routed_expert_weight(name)) continue;
    const Tensor w_t = (*orig)->view(*(*orig)->find(name));
    const int64_t rows = w_t.dim(0), cols = w_t.dim(1);
    const std::vector<float> w = to_f32(w_t);
    const auto* q = (*quant)->find(name);
    ASSERT_NE(q, nullptr) << name << " missing from the quantized checkpoint";
    std::vector<float> deq, bound;
    if (c.scheme == quant::Scheme::kMxfp4) {
      const auto* s = (*quant)->find(name + "_scale");
      ASSERT_NE(s, nullptr) << name << "_scale";
      const Tensor scales = (*quant)->view(*s);
      deq = decode_mxfp4((*quant)->view(*q), scales, rows, cols);
      bound = mxfp4_even_error_bound(w, rows, cols);
      const uint8_t* sb = static_cast<const uint8_t*>(scales.raw());
      const int64_t sc = (cols + 31) / 32;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t b = 0; b < sc; ++b) {
          float amax = 0;
          for (int64_t k = b * 32; k < std::min(cols, b * 32 + 32); ++k) amax = std::max(amax, std::fabs(w[r * cols + k]));
          scale_mismatch += sb[r * sc + b] != mxfp4_even_scale_byte(amax);
        }
    } else {
      const auto* s = (*quant)->find(name + "_scale_inv");
      ASSERT_NE(s, nullptr) << name << "_scale_inv";
      deq = decode_fp8_block((*quant)->view(*q), (*quant)->view(*s), rows, cols, 128, 128);
      bound = fp8_block_error_bound(w, rows, cols, 128, 128);
    }
    for (size_t i = 0; i < w.size(); ++i) {
      const float err = std::fabs(deq[i] - w[i]);
      nonzero_error += err > 0;
      if (!(err <= bound[i])) {
        if (over++ == 0)
          first_over = name + "[" + std::to_string(i) + "]: w " + std::to_string(w[i]) + " dequantized " +
                       std::to_string(deq[i]) + " error " + std::to_string(err) + " > bound " + std::to_string(bound[i]);
      }
      ++checked;
    }
  }
  std::printf("%s %s: %lld elements, %lld changed, %lld over the format bound\n", c.fx, c.tag,
              static_cast<long long>(checked), static_cast<long long>(nonzero_error), static_cast<long long>(over));
  EXPECT_GT(checked, 1000);
  EXPECT_GT(nonzero_error, checked / 10) << "quantization must change the weights";
  EXPECT_EQ(over, 0) << first_over;
  EXPECT_EQ(scale_mismatch, 0) << "E8M0 scale bytes differ from the even rule";
  fs::remove_all(dir);
}

TEST_P(QuantBound, LogitsWithinTheFormatEnvelope) {
  const Case& c = kCases[GetParam()];
  const std::string dir = quantize(c);
  auto env = envelope(fixture_dir(c.fx), scratch(std::string(c.fx) + "_" + c.tag), routed_expert_bound(c.scheme),
                      /*with_mtp=*/true, /*draws=*/3);
  ASSERT_TRUE(env.is_ok()) << env.status().to_string();
  auto got = logit_error(dir, fixture_dir(c.fx), /*with_mtp=*/true);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  std::printf("%s %s: logits rel_l2 %.4f (envelope %.4f), MTP %.4f (envelope %.4f)\n", c.fx, c.tag,
              got->logits_rel_l2, env->logits_rel_l2, got->mtp_rel_l2, env->mtp_rel_l2);
  EXPECT_GT(got->logits_rel_l2, 1e-4) << "quantization must change the logits";
  EXPECT_LE(got->logits_rel_l2, env->logits_rel_l2);
  EXPECT_GT(env->mtp_rel_l2, 0) << "the MTP layer's experts are quantized too";
  EXPECT_LE(got->mtp_rel_l2, env->mtp_rel_l2);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(FixturesAndSchemes, QuantBound, ::testing::Range<size_t>(0, 4),
                         [](const ::testing::TestParamInfo<size_t>& i) {
                           return std::string(kCases[i.param].fx) + "_" + kCases[i.param].tag;
                         });

// The bound itself, on values whose errors are known: it must be tight at the grid's midpoints.
TEST(QuantBoundFormula, TightAtMidpoints) {
  // One 32-block with amax 6 (X = 1 under the even rule: 6 < 1.75 * 4, so a = 4, X = 2^(2 - 2)).
  std::vector<float> w(32, 0.f);
  w[0] = 6.f;
  w[1] = 5.f;     // midpoint of 4 and 6: error exactly 1
  w[2] = 2.5f;    // midpoint of 2 and 3: 0.5
  w[3] = 0.75f;   // midpoint of 0.5 and 1: 0.25
  const auto e = mxfp4_even_error_bound(w, 1, 32);
  EXPECT_EQ(mxfp4_even_scale_byte(6.f), 127);
  EXPECT_FLOAT_EQ(e[1], 1.f);
  EXPECT_FLOAT_EQ(e[2], 0.5f);
  EXPECT_FLOAT_EQ(e[3], 0.25f);
  EXPECT_EQ(mxfp4_even_scale_byte(7.f), 128);  // 7 >= 1.75 * 4 rounds up to 8: X = 2
  EXPECT_EQ(mxfp4_even_scale_byte(0.f), 0);
  // FP8: amax 448 gives s = 1; 17 lies in [16, 32) where e4m3 steps by 2: bound 1 (+ the f32 allowance).
  std::vector<float> f = {448.f, 17.f};
  const auto fe = fp8_block_error_bound(f, 1, 2, 128, 128);
  EXPECT_NEAR(fe[1], 1.f, 1e-4);
  EXPECT_FLOAT_EQ(decode_e4m3(0x7E), 448.f);
  EXPECT_FLOAT_EQ(decode_e4m3(0x01), std::ldexp(1.f, -9));
  EXPECT_FLOAT_EQ(decode_e2m1(0xF), -6.f);
}

}  // namespace
}  // namespace mxserve::quant_bound
