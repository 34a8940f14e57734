// WeightLoader::experts() on checkpoint (BoundWeights) MXFP4 experts (issue 9), on the CPU: a backend that
// runs MXFP4 experts gets the packed codes and E8M0 scales stacked byte for byte (gate rows, then up rows, per
// expert); a backend that does not gets the dequantized float stack; widths that are not multiples of 32 and
// layers mixing precisions are dequantized. The "MXFP4-capable" backend here is the CPU backend claiming the
// format (the CUDA test, tests/model/test_cuda_mxfp4_moe.cpp, runs the real one).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/layers/weight_loader.h"
#include "model/weight_table.h"
#include "quant/mxfp4.h"
#include "../../model/forwarding_backend.h"

namespace mxserve::model {
namespace {

using backend::ExpertFormat;

// The CPU backend, claiming to run MXFP4 experts (only the loader is exercised).
class Mxfp4ClaimingBackend final : public test::ForwardingBackend {
 public:
  Mxfp4ClaimingBackend() : ForwardingBackend(backend::make_cpu_backend()) {}
  std::string name() const override { return "cpu+mxfp4-claim"; }
  bool supports_expert_format(ExpertFormat) const override { return true; }
};

Tensor random_f32(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  Tensor t = Tensor::empty(DType::kF32, {rows, cols});
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = n(rng);
  return t;
}

BoundWeight mxfp4_weight(const std::string& name, int64_t rows, int64_t cols, uint32_t seed) {
  auto q = quant::quantize_mxfp4(random_f32(rows, cols, seed), quant::ScaleRule::kEven, name);
  EXPECT_TRUE(q.is_ok()) << q.status().to_string();
  quant::StoredWeight s;
  s.precision = Precision::kMxfp4;
  s.name = name;
  s.data = q->packed;
  s.scale_name = name + "_scale";
  s.scale = q->scales;
  s.shape = {rows, cols};
  return BoundWeight(std::move(s));
}

struct Layer {
  BoundWeights w;
  std::vector<std::vector<std::string>> gate_up;
  std::vector<std::string> down;
};

// E experts, d_model H, expert width I; every expert tensor MXFP4 unless bf16_expert >= 0.
Layer make_layer(int64_t E, int64_t H, int64_t I, int bf16_expert = -1) {
  Layer l;
  uint32_t seed = 1;
  for (int64_t e = 0; e < E; ++e) {
    const std::string p = "mlp.experts." + std::to_string(e) + ".";
    l.gate_up.push_back({p + "gate_proj.weight", p + "up_proj.weight"});
    l.down.push_back(p + "down_proj.weight");
    l.w.add(p + "gate_proj.weight", mxfp4_weight(p + "gate_proj.weight", I, H, seed++));
    l.w.add(p + "up_proj.weight", mxfp4_weight(p + "up_proj.weight", I, H, seed++));
    if (e == bf16_expert)
      l.w.add(p + "down_proj.weight", BoundWeight(random_f32(H, I, seed++), Precision::kF32));
    else
      l.w.add(p + "down_proj.weight", mxfp4_weight(p + "down_proj.weight", H, I, seed++));
  }
  return l;
}

bool same_bytes(const Tensor& stacked_slice_base, int64_t offset, const Tensor& t) {
  return std::memcmp(static_cast<const uint8_t*>(stacked_slice_base.raw()) + offset, t.raw(), t.nbytes()) == 0;
}

TEST(WeightLoaderMxfp4, KeptPackedWhenTheBackendRunsMxfp4) {
  const int64_t E = 3, H = 64, I = 32;
  Layer l = make_layer(E, H, I);
  Mxfp4ClaimingBackend be;
  WeightLoader wl(be, l.w);
  const backend::ExpertWeights ex = wl.experts(l.gate_up, l.down);
  ASSERT_EQ(ex.format, ExpertFormat::kMxfp4);
  EXPECT_EQ(ex.gate_up.dtype(), DType::kU8);
  EXPECT_EQ(ex.gate_up_scales.dtype(), DType::kU8);
  EXPECT_EQ(ex.gate_up.shape(), (Shape{E, 2 * I, H / 2}));
  EXPECT_EQ(ex.gate_up_scales.shape(), (Shape{E, 2 * I, H / 32}));
  EXPECT_EQ(ex.down.shape(), (Shape{E, H, I / 2}));
  EXPECT_EQ(ex.down_scales.shape(), (Shape{E, H, I / 32}));
  EXPECT_EQ(ex.n_experts(), E);
  EXPECT_EQ(ex.inter(), I);
  for (int64_t e = 0; e < E; ++e) {
    const auto& g = l.w.at(l.gate_up[e][0]).stored;
    const auto& u = l.w.at(l.gate_up[e][1]).stored;
    const auto& d = l.w.at(l.down[e]).stored;
    const int64_t gq = e * 2 * I * H / 2, gs = e * 2 * I * H / 32;
    EXPECT_TRUE(same_bytes(ex.gate_up, gq, g.data)) << "expert " << e << " gate codes";
    EXPECT_TRUE(same_bytes(ex.gate_up, gq + I * H / 2, u.data)) << "expert " << e << " up codes after gate";
    EXPECT_TRUE(same_bytes(ex.gate_up_scales, gs, g.scale)) << "expert " << e << " gate scales";
    EXPECT_TRUE(same_bytes(ex.gate_up_scales, gs + I * H / 32, u.scale)) << "expert " << e << " up scales";
    EXPECT_TRUE(same_bytes(ex.down, e * H * I / 2, d.data)) << "expert " << e << " down codes";
    EXPECT_TRUE(same_bytes(ex.down_scales, e * H * I / 32, d.scale)) << "expert " << e << " down scales";
  }
}

TEST(WeightLoaderMxfp4, DequantizedForABackendWithoutMxfp4) {
  const int64_t E = 2, H = 64, I = 32;
  Layer l = make_layer(E, H, I);
  auto be = backend::make_cpu_backend();
  ASSERT_FALSE(be->supports_expert_format(ExpertFormat::kMxfp4));
  WeightLoader wl(*be, l.w);
  const backend::ExpertWeights ex = wl.experts(l.gate_up, l.down);
  ASSERT_EQ(ex.format, ExpertFormat::kFloat);
  EXPECT_EQ(ex.gate_up.shape(), (Shape{E, 2 * I, H}));
  EXPECT_EQ(ex.down.shape(), (Shape{E, H, I}));
  // Expert 1's up rows are the dequantized MXFP4 up_proj.
  const auto& u = l.w.at(l.gate_up[1][1]).stored;
  const Tensor ref = quant::dequantize_mxfp4(u.data, u.scale, H);
  const Tensor got = be->to_host(ex.gate_up);
  EXPECT_EQ(std::memcmp(got.data<float>() + (2 * I + I) * H, ref.data<float>(), I * H * sizeof(float)), 0);
}

TEST(WeightLoaderMxfp4, WidthsNotMultipleOf32AreDequantized) {
  Layer l = make_layer(2, 48, 32);  // d_model 48: the scale blocks of gate/up rows are partial
  Mxfp4ClaimingBackend be;
  WeightLoader wl(be, l.w);
  const backend::ExpertWeights ex = wl.experts(l.gate_up, l.down);
  EXPECT_EQ(ex.format, ExpertFormat::kFloat);
  EXPECT_EQ(ex.gate_up.shape(), (Shape{2, 64, 48}));
}

TEST(WeightLoaderMxfp4, MixedPrecisionLayerIsDequantized) {
  Layer l = make_layer(3, 64, 32, /*bf16_expert=*/1);
  Mxfp4ClaimingBackend be;
  WeightLoader wl(be, l.w);
  const backend::ExpertWeights ex = wl.experts(l.gate_up, l.down);
  EXPECT_EQ(ex.format, ExpertFormat::kFloat);
  EXPECT_EQ(ex.down.shape(), (Shape{3, 64, 32}));
}

}  // namespace
}  // namespace mxserve::model
