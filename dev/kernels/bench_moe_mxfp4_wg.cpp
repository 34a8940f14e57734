// Benchmark of the MXFP4 MoE prefill GEMMs: pf_t128 (mma.sync) vs the wg_* variants (Hopper wgmma) on the
// GLM-4.5-Air and GLM-5.2 shapes at M = 2048, 8192, 16384 tokens (uniform random top-8 routing, every
// expert's weights resident). Per plan it times (CUDA events, median of kIters after a warm-up):
//   gate_up = the MoeProbe::kGateUp run (permute + gate_up GEMM with SwiGLU),
//   whole   = the whole MoE (permute, gate_up, down, weighted un-permute),
//   down    = whole - gate_up (down GEMM + un-permute),
// and prints us, TFLOP/s (2 M top_k N K per GEMM: gate_up N = 2 I, K = H; down N = H, K = I) and the
// fraction of 798 TFLOP/s (the measured H200 bf16 GEMM ceiling). W4A8 rows (wg8_*, MoeShape::fp8_activations,
// design 8: each wg8_* named, and "->wg8_*" for a wg_* plan through moe_mxfp4_w4a8_variant) time the same spans, their per-row FP8 quantize passes
// included (x in gate_up, the intermediate in down); the last column is the whole MoE's fraction of
// ~1600 TFLOP/s (the H200 dense FP8 peak; the W4A8 issue's target is >= 700 TFLOP/s equivalent).
//   usage: bench_moe_mxfp4_wg [M ...]      (default 2048 8192 16384)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/moe_mxfp4/moe_mxfp4.h"
#include "ops/moe_mxfp4_synth.h"
#include "bench_device.h"

namespace {

namespace kc = mxserve::kernels::cuda;
namespace ms = mxserve::moe_synth;
constexpr double kCeilingTflops = 798.0;
constexpr double kFp8PeakTflops = 1600.0;
constexpr int kIters = 10;

double median_us(const ms::Model& m, ms::DeviceBatch& db, const kc::MoeMxfp4Plan& plan, cudaStream_t stream,
                 bool fp8) {
  cudaEvent_t a, b;
  MX_CUDA_CHECK(cudaEventCreate(&a));
  MX_CUDA_CHECK(cudaEventCreate(&b));
  kc::MoeShape s{db.T, m.shape.H, m.shape.I, m.shape.E, m.shape.K};
  s.fp8_activations = fp8;
  std::vector<double> us;
  for (int i = 0; i < kIters + 2; ++i) {
    MX_CUDA_CHECK(cudaEventRecord(a, stream));
    kc::moe_experts_mxfp4(db.x, db.ids, db.wts, m.weights(), db.out, s, plan, db.ws, stream);
    MX_CUDA_CHECK(cudaEventRecord(b, stream));
    MX_CUDA_CHECK(cudaEventSynchronize(b));
    float ms_ = 0;
    MX_CUDA_CHECK(cudaEventElapsedTime(&ms_, a, b));
    if (i >= 2) us.push_back(1000.0 * ms_);
  }
  MX_CUDA_CHECK(cudaEventDestroy(a));
  MX_CUDA_CHECK(cudaEventDestroy(b));
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (!bench::cuda_device_present(" (run on the GPU machine)")) return 0;
  std::vector<int64_t> ms_list;
  if (!bench::token_counts_from_args(argc, argv, "bench_moe_mxfp4_wg", {2048, 8192, 16384}, &ms_list)) return 2;
  const ms::Shape shapes[] = {ms::kGlmAir, ms::kGlm52};
  const auto& names = kc::moe_mxfp4_variants(kc::MoeGemm::kGateUp);
  struct Row {
    int plan;  // the plan's variant (both GEMMs)
    bool fp8;  // MoeShape::fp8_activations: a wg_* plan runs moe_mxfp4_w4a8_variant
    std::string label;
  };
  std::vector<Row> plans = {{kc::moe_mxfp4_variant_index(kc::MoeGemm::kGateUp, "pf_t128"), false, "pf_t128"}};
  for (const auto& name : names)
    if (name.rfind("wg_", 0) == 0)
      plans.push_back({kc::moe_mxfp4_variant_index(kc::MoeGemm::kGateUp, name), false, name});
  for (const auto& name : names)  // W4A8: every wg8_* variant, named by the plan
    if (name.rfind("wg8_", 0) == 0)
      plans.push_back({kc::moe_mxfp4_variant_index(kc::MoeGemm::kGateUp, name), true, name});
  // W4A8 through the dispatcher: a wg_* plan under fp8_activations runs moe_mxfp4_w4a8_variant (by rows per
  // expert); labelled "->" + the variant it maps to at that M.
  plans.push_back({kc::moe_mxfp4_variant_index(kc::MoeGemm::kGateUp, "wg_n128_s3"), true, ""});
  cudaStream_t stream = nullptr;
  std::mt19937_64 rng(1234);
  std::printf("%-12s %-6s %-16s %10s %8s %6s %10s %8s %6s %10s %8s %6s %8s\n", "shape", "M", "variant", "gate_up_us",
              "TFLOP/s", "frac", "down_us", "TFLOP/s", "frac", "whole_us", "TFLOP/s", "frac", "frac_fp8");
  for (const ms::Shape& shape : shapes) {
    const ms::Model model(shape, 7);
    for (int64_t M : ms_list) {
      const ms::Batch b = ms::make_batch(shape, M, shape.E, -1, rng);
      ms::DeviceBatch db(shape, b);
      const double rows = static_cast<double>(M) * shape.K;
      const double f_gu = 2.0 * rows * (2 * shape.I) * shape.H, f_dn = 2.0 * rows * shape.H * shape.I;
      for (const Row& row : plans) {
        const int v = row.plan;
        const double gu = median_us(model, db, {v, v, kc::MoeProbe::kGateUp}, stream, row.fp8);
        const double whole = median_us(model, db, {v, v}, stream, row.fp8);
        const double dn = whole - gu;
        auto tf = [](double flops, double us) { return flops / (us * 1e-6) / 1e12; };
        kc::MoeShape fs{M, shape.H, shape.I, shape.E, shape.K};
        fs.fp8_activations = true;
        const std::string label = row.label.empty() ? "->" + names[kc::moe_mxfp4_w4a8_variant(v, fs)] : row.label;
        std::printf("%-12s %-6lld %-16s %10.1f %8.1f %6.3f %10.1f %8.1f %6.3f %10.1f %8.1f %6.3f %8.3f\n",
                    shape.name, static_cast<long long>(M), label.c_str(), gu, tf(f_gu, gu),
                    tf(f_gu, gu) / kCeilingTflops, dn, tf(f_dn, dn), tf(f_dn, dn) / kCeilingTflops, whole,
                    tf(f_gu + f_dn, whole), tf(f_gu + f_dn, whole) / kCeilingTflops,
                    tf(f_gu + f_dn, whole) / kFp8PeakTflops);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
