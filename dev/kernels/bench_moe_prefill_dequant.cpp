// Benchmark of the MXFP4 MoE prefill dequant path (kernels/cuda/moe_mxfp4/moe_prefill_dequant.h, issue 33
// item 2 prototype) against the current W4A16 path (moe_experts_mxfp4 with the wg_* plans), in the same run, on
// the GLM-4.5-Air and GLM-5.2 shapes (uniform random top-8 routing, every expert's weights resident).
// Per shape and M it prints (CUDA events, kernels/cuda/ceilings.h time_on_stream medians):
//   w4a16     the fastest of the four wg_n128_s3 / wg_n256_s4 plan pairs (named), us and TFLOP/s;
//   w4a8      for context: the W4A8 path (fp8_activations, wg_n128_s3 plan -> moe_mxfp4_w4a8_variant), TFLOP/s;
//   dequant   permute + dequantization of the active experts (moe_prefill_dequant_stage), us and its streamed
//             bytes (codes + scales read, bf16 written) as GB/s and a fraction of the measured copy bandwidth;
//   gemm      the two bf16 grouped GEMMs + un-permute (moe_prefill_dequant_gemms) with each GEMM kernel (bn256,
//             bn128, ws256 = warp-specialized; one line each), us and TFLOP/s of the fastest (named);
//   total     the whole path (moe_experts_mxfp4_prefill_dequant with the fastest), us, TFLOP/s, its fraction of
//             the cuBLASLt bf16 GEMM ceiling measured first (ceilings.h), and the speedup over w4a16.
// FLOPs: 2 M top_k (2 I H + H I) (the W4A16 bench's count). Oracle: test_cuda_moe_prefill_dequant.
//   usage: bench_moe_prefill_dequant [M ...]      (default 2048 8192)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kernels/cuda/ceilings.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/moe_mxfp4/moe_mxfp4.h"
#include "kernels/cuda/moe_mxfp4/moe_prefill_dequant.h"
#include "ops/moe_mxfp4_synth.h"
#include "bench_device.h"

namespace {

namespace kc = mxserve::kernels::cuda;
namespace ms = mxserve::moe_synth;
constexpr int kReps = 3;

double tflops(double flops, double us) { return flops / (us * 1e-6) / 1e12; }

}  // namespace

int main(int argc, char** argv) {
  if (!bench::cuda_device_present(" (run on the GPU machine)")) return 0;
  if (!kc::moe_prefill_dequant_device_ok()) {
    std::printf("SKIP: not an sm_90 device (the dequant path's GEMM is wgmma)\n");
    return 0;
  }
  std::vector<int64_t> m_list;
  if (!bench::token_counts_from_args(argc, argv, "bench_moe_prefill_dequant", {2048, 8192}, &m_list)) return 2;
  cudaStream_t stream = nullptr;
  const kc::Ceilings ceil = kc::measure_ceilings(stream, 1ll << 30);
  std::printf("ceilings: cuBLASLt bf16 GEMM %.1f TFLOP/s (n %lld), copy %.0f GB/s (read + write)\n", ceil.gemm_tflops,
              static_cast<long long>(ceil.gemm_n), ceil.copy_gbs);
  const ms::Shape shapes[] = {ms::kGlmAir, ms::kGlm52};
  const auto& names = kc::moe_mxfp4_variants(kc::MoeGemm::kGateUp);
  const int wg128 = kc::moe_mxfp4_variant_index(kc::MoeGemm::kGateUp, "wg_n128_s3");
  const int wg256 = kc::moe_mxfp4_variant_index(kc::MoeGemm::kGateUp, "wg_n256_s4");
  if (wg128 < 0 || wg256 < 0) {
    std::fprintf(stderr, "bench_moe_prefill_dequant: wg_n128_s3 / wg_n256_s4 are not variants any more\n");
    return 2;
  }
  std::mt19937_64 rng(1234);
  std::printf("%-12s %-6s %-24s %9s %7s | %9s %7s %5s | %9s %7s %6s | %9s %7s %6s %7s\n", "shape", "M", "w4a16 plan",
              "w4a16_us", "TFLOP/s", "deq_us", "GB/s", "frac", "gemm_us", "TFLOP/s", "kernel", "total_us", "TFLOP/s",
              "f_ceil", "speedup");
  for (const ms::Shape& shape : shapes) {
    const ms::Model model(shape, 7);
    for (int64_t M : m_list) {
      const ms::Batch b = ms::make_batch(shape, M, shape.E, -1, rng);
      ms::DeviceBatch db(shape, b);
      const kc::MoeShape s{M, shape.H, shape.I, shape.E, shape.K};
      const double flops = 2.0 * M * shape.K * (2.0 * shape.I * shape.H + 1.0 * shape.H * shape.I);
      // The current W4A16 path: the fastest wg_* pair.
      double best_w = 1e30;
      std::string best_plan;
      for (int g : {wg128, wg256})
        for (int d : {wg128, wg256}) {
          const kc::MoeMxfp4Plan plan{g, d};
          const double us = 1000.0 * kc::time_on_stream(stream, [&](int) {
            kc::moe_experts_mxfp4(db.x, db.ids, db.wts, model.weights(), db.out, s, plan, db.ws, stream);
          }, kReps);
          if (us < best_w) {
            best_w = us;
            best_plan = names[g] + "/" + names[d];
          }
        }
      kc::MoeShape s8 = s;
      s8.fp8_activations = true;
      const kc::MoeMxfp4Plan plan8{wg128, wg128};
      const double w4a8 = 1000.0 * kc::time_on_stream(stream, [&](int) {
        kc::moe_experts_mxfp4(db.x, db.ids, db.wts, model.weights(), db.out, s8, plan8, db.ws, stream);
      }, kReps);
      std::printf("  %s M=%lld w4a8 (context): %.1f us, %.1f TFLOP/s\n", shape.name, static_cast<long long>(M), w4a8,
                  tflops(flops, w4a8));
      // The dequant path.
      void* ws = nullptr;
      const size_t ws_bytes = kc::moe_prefill_dequant_workspace_bytes(s);
      if (cudaMalloc(&ws, ws_bytes) != cudaSuccess) {
        std::printf("%-12s %-6lld SKIP dequant path: cannot allocate its %.2f GiB workspace\n", shape.name,
                    static_cast<long long>(M), ws_bytes / double(1ull << 30));
        cudaGetLastError();
        continue;
      }
      const double deq = 1000.0 * kc::time_on_stream(stream, [&](int) {
        kc::moe_prefill_dequant_stage(db.ids, model.weights(), s, ws, stream);
      }, kReps);
      const int64_t active = static_cast<int64_t>(std::set<int32_t>(b.ids.begin(), b.ids.end()).size());
      const double elems = static_cast<double>(active) * 3.0 * shape.I * shape.H;  // gate_up 2 I H + down H I
      const double bytes = elems * (0.5 + 1.0 / 32 + 2.0);
      const double gbs = bytes / (deq * 1e-6) / 1e9;
      struct GemmKernel {
        kc::MoePrefillDequantPlan plan;
        const char* name;
      };
      const GemmKernel kernels[] = {{{256, 256, false}, "bn256"}, {{128, 128, false}, "bn128"},
                                    {{256, 256, true}, "ws256"}};
      double best_g = 1e30;
      const GemmKernel* best_k = &kernels[0];
      for (const GemmKernel& k : kernels) {
        const double us = 1000.0 * kc::time_on_stream(stream, [&](int) {
          kc::moe_prefill_dequant_gemms(db.x, db.wts, db.out, s, k.plan, ws, stream);
        }, kReps);
        std::printf("  %s M=%lld gemm %s: %.1f us, %.1f TFLOP/s (%.3f of the ceiling)\n", shape.name,
                    static_cast<long long>(M), k.name, us, tflops(flops, us), tflops(flops, us) / ceil.gemm_tflops);
        std::fflush(stdout);
        if (us < best_g) {
          best_g = us;
          best_k = &k;
        }
      }
      const kc::MoePrefillDequantPlan plan = best_k->plan;
      const double total = 1000.0 * kc::time_on_stream(stream, [&](int) {
        kc::moe_experts_mxfp4_prefill_dequant(db.x, db.ids, db.wts, model.weights(), db.out, s, plan, ws, stream);
      }, kReps);
      MX_CUDA_CHECK(cudaStreamSynchronize(stream));
      MX_CUDA_CHECK(cudaFree(ws));
      std::printf("%-12s %-6lld %-24s %9.1f %7.1f | %9.1f %7.0f %5.2f | %9.1f %7.1f %6s | %9.1f %7.1f %6.3f %7.2f\n",
                  shape.name, static_cast<long long>(M), best_plan.c_str(), best_w, tflops(flops, best_w), deq, gbs,
                  gbs / ceil.copy_gbs, best_g, tflops(flops, best_g), best_k->name, total, tflops(flops, total),
                  tflops(flops, total) / ceil.gemm_tflops, best_w / total);
      std::fflush(stdout);
    }
  }
  return 0;
}
