// Synthetic weights on the GPU (label gpu; skips without a CUDA device): the CUDA kernel generates the
// same bits as the CPU backend's loops (bf16 values, f32 bias, column windows, MXFP4 codes + scales, MXFP4
// dequantized), and the synthetic truncated model's logits on CUDA match the CPU backend's within the bf16
// tolerance (the CPU backend is the oracle: same weights, f32 activations).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "backend/backend.h"
#include "kvcache/kv_cache.h"
#include "model/causal_lm.h"
#include "model/synthetic_weights.h"

namespace mxserve {
namespace {

std::unique_ptr<backend::Backend> cuda_or_skip(std::string* why) {
  auto be = backend::make_backend("cuda");
  if (!be.is_ok()) {
    *why = be.status().to_string();
    return nullptr;
  }
  return std::move(*be);
}

#define REQUIRE_CUDA(be)                                                                   \
  std::string why_;                                                                        \
  auto be = cuda_or_skip(&why_);                                                           \
  if (!be) GTEST_SKIP() << "no CUDA device: run on the GPU machine (" << why_ << ")"

kernels::SyntheticFill params(const char* name, int64_t rows, int64_t cols, float mean, float sd) {
  kernels::SyntheticFill p;
  p.stream = kernels::synthetic_stream(42, name);
  p.mean = mean;
  p.stddev = sd;
  p.rows = rows;
  p.cols = cols;
  p.src_cols = cols;
  return p;
}

// Device fill -> host f32 (bf16 widened by to_host), against the CPU loops' f32.
void expect_same_float(backend::Backend& be, const kernels::SyntheticFill& p, DType dt) {
  Tensor d = be.alloc(dt, {p.rows, p.cols});
  be.fill_synthetic(p, d, nullptr);
  const Tensor got = be.to_host(d);
  std::vector<float> want(p.rows * p.cols);
  kernels::cpu::synthetic_fill(p, want.data(), false, nullptr);
  int64_t diff = 0, first = -1;
  for (int64_t i = 0; i < p.rows * p.cols; ++i) {
    uint32_t a, b;
    std::memcpy(&a, got.data<float>() + i, 4);
    std::memcpy(&b, want.data() + i, 4);
    if (a != b && diff++ == 0) first = i;
  }
  EXPECT_EQ(diff, 0) << "kind " << static_cast<int>(p.kind) << " " << dtype_name(dt) << ": first mismatch at " << first
                     << " cuda " << (first >= 0 ? got.data<float>()[first] : 0.f) << " cpu "
                     << (first >= 0 ? want[first] : 0.f);
}

TEST(CudaSynthetic, KernelBitsEqualCpu) {
  REQUIRE_CUDA(be);
  expect_same_float(*be, params("a.q_proj.weight", 300, 4096, 0.f, 0.02f), DType::kBF16);
  expect_same_float(*be, params("a.input_layernorm.weight", 1, 4096, 1.f, 0.05f), DType::kBF16);
  expect_same_float(*be, params("a.mlp.gate.weight", 128, 4096, 0.f, 1.f / 64), DType::kBF16);
  auto bias = params("a.e_score_correction_bias", 1, 128, 0.f, 0.02f);
  bias.keep_f32 = true;
  expect_same_float(*be, bias, DType::kF32);
  auto win = params("a.eh_proj.weight", 64, 4096, 0.f, 0.02f);
  win.src_cols = 8192;
  win.col_offset = 4096;
  expect_same_float(*be, win, DType::kBF16);
  auto deq = params("a.experts.0.down_proj.weight", 512, 1408, 0.f, 0.02f);
  deq.kind = kernels::SyntheticKind::kMxfp4Dequant;
  expect_same_float(*be, deq, DType::kBF16);
  expect_same_float(*be, deq, DType::kF32);

  // MXFP4 codes and scales, byte for byte.
  auto mx = params("a.experts.7.gate_proj.weight", 1408, 4096, 0.f, 0.02f);
  mx.kind = kernels::SyntheticKind::kMxfp4;
  Tensor codes = be->alloc(DType::kU8, {mx.rows, mx.cols / 2}), scales = be->alloc(DType::kU8, {mx.rows, mx.cols / 32});
  be->fill_synthetic(mx, codes, &scales);
  const Tensor gc = be->to_host(codes), gs = be->to_host(scales);
  std::vector<uint8_t> wc(mx.rows * mx.cols / 2), ws(mx.rows * mx.cols / 32);
  kernels::cpu::synthetic_fill(mx, wc.data(), false, ws.data());
  EXPECT_EQ(std::memcmp(gc.raw(), wc.data(), wc.size()), 0) << "mxfp4 codes";
  EXPECT_EQ(std::memcmp(gs.raw(), ws.data(), ws.size()), 0) << "mxfp4 scales";
}

// Teacher-forced logits of one prompt through the truncated synthetic model on a backend (f32 on host).
// A failed load or forward stops the calling test (ASSERT_NO_FATAL_FAILURE at the call).
void logits_of(backend::Backend& be, const std::string& config, const std::string& plan, int64_t layers,
               const std::vector<int32_t>& ids, Tensor* logits) {
  model::LoadOptions lo;
  lo.load_mtp = false;
  lo.synthetic = true;
  lo.seed = 3;
  lo.num_layers_override = layers;
  lo.synthetic_quantization = plan;
  auto lm = model::load_causal_lm(config, be, lo);
  ASSERT_TRUE(lm.is_ok()) << "loading " << config << " on " << be.name() << ": " << lm.status().to_string();
  const int64_t bs = 16, T = static_cast<int64_t>(ids.size());
  kvcache::KvCache kv((*lm)->kv_spec(T / bs + 2, bs), [&](DType d, Shape s) { return be.alloc(d, std::move(s)); });
  model::ForwardBatch fb;
  fb.token_ids = ids;
  model::SequenceSpan span;
  span.n_tokens = static_cast<int32_t>(T);
  span.kv_len = static_cast<int32_t>(T);
  for (int64_t b = 0; b < T / bs + 1; ++b) span.block_table.push_back(static_cast<int32_t>(b));
  fb.seqs.push_back(span);
  for (int64_t t = 0; t < T; ++t) {
    fb.positions.push_back(static_cast<int32_t>(t));
    fb.logit_rows.push_back(static_cast<int32_t>(t));
  }
  auto out = (*lm)->forward(fb, kv);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  *logits = be.to_host(out->logits);
  ASSERT_EQ(logits->ndim(), 2) << logits->describe();
  ASSERT_EQ(logits->dim(0), T);
}

double rel_l2(const Tensor& a, const Tensor& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double d = double(a.data<float>()[i]) - b.data<float>()[i];
    num += d * d;
    den += double(b.data<float>()[i]) * b.data<float>()[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// The tiny config, found without a compile-time path: $MXSERVE_CONFIG_ROOT/tiny.json (the GPU scripts set
// it), then ../configs/tiny.json next to this binary (the GPU payload's layout), then the source tree of a
// local build (models/tiny-glm4-moe/config.json above the build directory's tests/model/). Empty if none.
std::string tiny_config_path(std::string* tried) {
  namespace fs = std::filesystem;
  std::vector<fs::path> candidates;
  if (const char* env = std::getenv("MXSERVE_CONFIG_ROOT")) candidates.push_back(fs::path(env) / "tiny.json");
  std::error_code ec;
  const fs::path exe_dir = fs::read_symlink("/proc/self/exe", ec).parent_path();
  if (!ec) {
    candidates.push_back(exe_dir / "../configs/tiny.json");
    for (fs::path d = exe_dir; !d.empty() && d != d.root_path(); d = d.parent_path())
      candidates.push_back(d / "models/tiny-glm4-moe/config.json");
  }
  for (const auto& c : candidates) {
    *tried += (tried->empty() ? "" : ", ") + c.string();
    if (fs::exists(c, ec)) return c.string();
  }
  return {};
}

TEST(CudaSynthetic, TruncatedModelLogitsMatchCpu) {
  REQUIRE_CUDA(be);
  auto cpu = backend::make_cpu_backend();
  const std::vector<int32_t> ids = {9707, 11, 1879, 13, 576, 3974, 7, 100, 2000, 31, 5, 77, 1024, 4096, 8, 9, 10,
                                    11, 12, 13};
  std::string tried;
  const std::string cfg = tiny_config_path(&tried);
  ASSERT_FALSE(cfg.empty()) << "the tiny config is not found (set MXSERVE_CONFIG_ROOT); tried: " << tried;
  for (const char* plan : {"", "mxfp4", "mxfp4:fp8-block"}) {
    SCOPED_TRACE(std::string("plan '") + plan + "'");
    Tensor want, got;
    ASSERT_NO_FATAL_FAILURE(logits_of(*cpu, cfg, plan, 2, ids, &want));
    ASSERT_NO_FATAL_FAILURE(logits_of(*be, cfg, plan, 2, ids, &got));
    ASSERT_EQ(got.shape(), want.shape());
    const double err = rel_l2(got, want);
    std::printf("synthetic tiny (2 layers, plan '%s'): cuda vs cpu logits rel_l2 %.3e\n", plan, err);
    EXPECT_LT(err, 2e-2) << "plan '" << plan << "' (bf16 activations on CUDA vs f32 on CPU: docs/cuda.md tolerances)";
  }
}

}  // namespace
}  // namespace mxserve
