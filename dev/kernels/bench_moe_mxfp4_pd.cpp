// Benchmark of the MXFP4 MoE decode paths: the existing one (moe_experts_mxfp4 on the heuristic plan, and on
// the best design-5 plan found by a small search here: gv_*, 2 launches at M = 1, permute + 2 GEMMs + un-permute
// above) against design 9, the persistent decode
// path (moe_experts_mxfp4_pd: 2 launches at every M), at GLM-4.5-Air and GLM-5.2 sizes, M = 1 / 8 / 16 / 64
// by default. Uniform random top-8 routing, kRot routing sets rotated call to call (so the experts a call
// reads are mostly not the previous call's L2 lines), every expert resident. Per row: us per call (median of
// timed regions of back-to-back calls, CUDA events: launch overlap included, as in a decode step), MB read
// (distinct experts hit, mean over the sets, x (packed codes + E8M0 scales) + x + out read and written), GB/s
// and the fraction of the device copy bandwidth measured in the same run AFTER the kernels (kernels/cuda/
// ceilings.h; the clock is not yet throttled by the copy when the kernels run). Design 9 rows also sweep its
// launch knobs (MoeMxfp4PdConfig: gate_up / down CTAs per SM, gate_up split-K warps, down warps per CTA).
//   usage: bench_moe_mxfp4_pd [M ...]     prints "SKIP" and exits 0 without a CUDA device
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kernels/cuda/ceilings.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/moe_mxfp4/moe_mxfp4.h"
#include "kernels/cuda/moe_mxfp4/moe_mxfp4_pd.h"
#include "ops/moe_mxfp4_synth.h"
#include "bench_device.h"

namespace {

namespace kc = mxserve::kernels::cuda;
namespace ms = mxserve::moe_synth;
constexpr int kRot = 8;
constexpr int kReps = 50;

struct Row {
  std::string shape, path;
  int64_t M;
  double us, mb;
};

}  // namespace

int main(int argc, char** argv) {
  if (!bench::cuda_device_present(" (run on the GPU machine)")) return 0;
  std::vector<int64_t> m_list;
  if (!bench::token_counts_from_args(argc, argv, "bench_moe_mxfp4_pd", {1, 8, 16, 64}, &m_list)) return 2;
  const ms::Shape shapes[] = {ms::kGlmAir, ms::kGlm52};
  // {gate_up CTAs per SM, down CTAs per SM, gate_up split, down warps}, the default first; 0 CTAs per SM = one
  // resident wave (16 warps per SM).
  const kc::MoeMxfp4PdConfig configs[] = {{0, 0, 4, 8}, {0, 0, 2, 8}, {0, 0, 8, 8}, {0, 0, 4, 4},
                                          {0, 0, 2, 4}, {8, 0, 4, 8}, {0, 4, 4, 8}};
  const auto& names = kc::moe_mxfp4_variants(kc::MoeGemm::kGateUp);
  cudaStream_t stream = nullptr;
  MX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::mt19937_64 rng(1234);
  std::vector<Row> rows;
  for (const ms::Shape& shape : shapes) {
    const ms::Model model(shape, 7);
    const double expert_bytes = 3.0 * shape.I * shape.H / 2 + 3.0 * shape.I * shape.H / 32;  // gate_up + down
    for (int64_t M : m_list) {
      std::vector<std::unique_ptr<ms::DeviceBatch>> dbs;
      double hit = 0;
      for (int r = 0; r < kRot; ++r) {
        const ms::Batch b = ms::make_batch(shape, M, shape.E, -1, rng);
        hit += static_cast<double>(std::set<int32_t>(b.ids.begin(), b.ids.end()).size()) / kRot;
        dbs.push_back(std::make_unique<ms::DeviceBatch>(shape, b));
      }
      const double mb = (hit * expert_bytes + 3.0 * M * shape.H * 2) / 1e6;
      const kc::MoeShape s{M, shape.H, shape.I, shape.E, shape.K};
      auto time_old = [&](const kc::MoeMxfp4Plan& plan) {
        return kc::time_on_stream(
            stream,
            [&](int i) {
              ms::DeviceBatch& db = *dbs[i % kRot];
              kc::moe_experts_mxfp4(db.x, db.ids, db.wts, model.weights(), db.out, s, plan, db.ws, stream);
            },
            kReps);
      };
      const kc::MoeMxfp4Plan heur = kc::moe_mxfp4_heuristic_plan(s);
      const double heur_ms = time_old(heur);
      rows.push_back(
          {shape.name, "old heuristic " + names[heur.gate_up] + "/" + names[heur.down], M, 1000 * heur_ms, mb});
      // The old path at its best over design 5 (what `tune-moe` would pick among gv_*): gate_up first (down on
      // the heuristic's), then down on that gate_up.
      kc::MoeMxfp4Plan best = heur;
      double best_ms = heur_ms;
      for (int gemm = 0; gemm < 2; ++gemm)
        for (int v = 0; v < kc::kMoeMxfp4NumVariants; ++v) {
          if (kc::kMoeMxfp4Variants[v].design != kc::MoeMxfp4Design::kGv) continue;
          kc::MoeMxfp4Plan p = best;
          (gemm == 0 ? p.gate_up : p.down) = v;
          if (!kc::moe_mxfp4_variant_supports(kc::MoeGemm::kGateUp, p.gate_up, s) ||
              !kc::moe_mxfp4_variant_supports(kc::MoeGemm::kDown, p.down, s))
            continue;
          const double t = time_old(p);
          if (t < best_ms) {
            best_ms = t;
            best = p;
          }
        }
      rows.push_back(
          {shape.name, "old best gv " + names[best.gate_up] + "/" + names[best.down], M, 1000 * best_ms, mb});
      if (!kc::moe_mxfp4_pd_supports(s)) continue;
      for (const kc::MoeMxfp4PdConfig& cfg : configs) {
        const double pd_ms = kc::time_on_stream(
            stream,
            [&](int i) {
              ms::DeviceBatch& db = *dbs[i % kRot];
              kc::moe_experts_mxfp4_pd(db.x, db.ids, db.wts, model.weights(), db.out, s, db.ws, stream, cfg);
            },
            kReps);
        const kc::MoeMxfp4PdConfig def{};
        const bool is_def = cfg.gate_up_ctas_per_sm == def.gate_up_ctas_per_sm &&
                            cfg.down_ctas_per_sm == def.down_ctas_per_sm && cfg.gate_up_split == def.gate_up_split &&
                            cfg.down_warps == def.down_warps;
        const std::string label = "pd gu" + std::to_string(cfg.gate_up_ctas_per_sm) + "/dn" +
                                  std::to_string(cfg.down_ctas_per_sm) + "/split" + std::to_string(cfg.gate_up_split) +
                                  "/dw" + std::to_string(cfg.down_warps) + (is_def ? " (default)" : "");
        rows.push_back({shape.name, label, M, 1000 * pd_ms, mb});
      }
      MX_CUDA_CHECK(cudaGetLastError());
      std::fprintf(stderr, "%s M=%lld timed\n", shape.name, static_cast<long long>(M));
    }
  }
  const kc::Ceilings ceil = kc::measure_ceilings(stream, int64_t{1} << 31, 1024);
  std::printf("copy bandwidth %.0f GB/s (read + write, measured after the kernels)\n", ceil.copy_gbs);
  std::printf("%-12s %-4s %-32s %10s %9s %9s %8s\n", "shape", "M", "path", "us", "MB read", "GB/s", "frac_copy");
  for (const Row& r : rows) {
    const double gbs = r.mb / 1e3 / (r.us * 1e-6);
    std::printf("%-12s %-4lld %-32s %10.1f %9.1f %9.0f %8.3f\n", r.shape.c_str(), static_cast<long long>(r.M),
                r.path.c_str(), r.us, r.mb, gbs, gbs / ceil.copy_gbs);
  }
  MX_CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}
