// The wg_* MXFP4 MoE variants (Hopper wgmma, moe_mxfp4_wg.cu) at real model sizes, on both GEMMs:
//   - against a host reference of sampled output rows (moe_mxfp4_synth.h: decoded straight from the packed
//     codes, act and y rounded to bf16 as on the GPU), tolerance kTol rel L2 over the sampled rows;
//   - against pf_t128 (design 4, the kernel they replace) over the whole output, tolerance kTolVsPf.
// Cases: GLM-4.5-Air (E128 H4096 I1408 top 8) and GLM-5.2 (E256 H6144 I2048 top 8); one token, ragged
// small batches (M not a multiple of the 128-row tile), a pool of 20 experts (most experts empty), one hot
// expert holding every token (many row tiles), and M = 2048 / 8192 (65536 rows). Every plan of a case prints
// a PASS/FAIL line with the errors, then the case prints one CASE PASS/FAIL verdict; a case that compared
// nothing (no plan run, an all-zero reference or output) FAILS. Sampled rows are always rows of the batch
// (sampled_rows; checked host-only with every case's routing in CudaMoeMxfp4WgOracle). Seed: random, printed;
// MXSERVE_WG_SEED=N reruns one. Off sm_90 the wg_* launchers run pf_t128, so the GPU cases skip there.
// The tiny shapes of test_cuda_moe_mxfp4 also run these variants.
#include <gtest/gtest.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/numeric.h"
#include "kernels/cuda/moe_mxfp4/moe_mxfp4.h"
#include "gpu_oracle.h"
#include "moe_mxfp4_synth.h"
#include "moe_oracle.h"
#include "quant/mxfp4.h"

namespace mxserve {
namespace {

namespace kc = kernels::cuda;
namespace ms = moe_synth;
constexpr double kTol = 1e-2;       // vs the host reference (bf16 intermediates, as test_cuda_moe_mxfp4)
constexpr double kTolVsPf = 1e-2;   // vs pf_t128: the same math, different fp32 summation order

struct WgCase {
  int64_t T;
  int pool;  // 0: all experts
  int hot;   // -1: none
  const char* what;
};

using gpu_oracle::have_cuda_device;

// The wg_* kernels need sm_90 (elsewhere their launcher runs pf_t128: the comparison would be vacuous).
using gpu_oracle::have_sm90;
using moe_oracle::any_nonzero;
using moe_oracle::rel_l2;
using moe_oracle::sampled_rows;

void run_shape(const ms::Shape& shape, const std::vector<WgCase>& cases) {
  const uint32_t seed = moe_oracle::announced_seed("MXSERVE_WG_SEED", shape.name);
  std::mt19937_64 rng(seed);
  const ms::Model model(shape, seed);
  cudaStream_t stream = nullptr;
  const auto& names = kc::moe_mxfp4_variants(kc::MoeGemm::kGateUp);
  const int pf = kc::moe_mxfp4_variant_index(kc::MoeGemm::kGateUp, "pf_t128");
  ASSERT_GE(pf, 0);
  std::vector<int> wg;
  for (const auto& name : names)
    if (name.rfind("wg_", 0) == 0) wg.push_back(kc::moe_mxfp4_variant_index(kc::MoeGemm::kGateUp, name));
  ASSERT_FALSE(wg.empty()) << "no wg_* variant in moe_mxfp4_variants.h";

  for (const WgCase& c : cases) {
    const ms::Batch b = ms::make_batch(shape, c.T, c.pool > 0 ? c.pool : shape.E, c.hot, rng);
    ms::DeviceBatch db(shape, b);
    const std::vector<int64_t> rows = sampled_rows(c.T);
    std::vector<double> ref;
    for (int64_t t : rows) {
      const std::vector<double> r = ms::reference_row(model, b, t);
      ref.insert(ref.end(), r.begin(), r.end());
    }
    db.run(model, {pf, pf}, stream);
    MX_CUDA_CHECK(cudaStreamSynchronize(stream));
    MX_CUDA_CHECK(cudaGetLastError());
    const std::vector<uint16_t> out_pf = db.out_host();
    std::vector<double> pf_all(out_pf.size());
    for (size_t i = 0; i < out_pf.size(); ++i) pf_all[i] = bf16_to_f32(out_pf[i]);
    // Non-vacuity: the reference and pf_t128 both produced something to compare against.
    const bool ref_ok = !rows.empty() && any_nonzero(ref), pf_ok = any_nonzero(pf_all);

    int plans_run = 0, plans_ok = 0;
    for (int v : wg) {
      for (const kc::MoeMxfp4Plan plan : {kc::MoeMxfp4Plan{v, v}, kc::MoeMxfp4Plan{v, pf}, kc::MoeMxfp4Plan{pf, v}}) {
        db.run(model, plan, stream);
        MX_CUDA_CHECK(cudaStreamSynchronize(stream));
        MX_CUDA_CHECK(cudaGetLastError());
        const std::vector<uint16_t> out = db.out_host();
        std::vector<double> all(out.size()), sampled;
        for (size_t i = 0; i < out.size(); ++i) all[i] = bf16_to_f32(out[i]);
        for (int64_t t : rows)
          sampled.insert(sampled.end(), all.begin() + t * shape.H, all.begin() + (t + 1) * shape.H);
        double max_ref = 0, max_pf = 0;
        const double e_ref = rel_l2(sampled, ref, &max_ref), e_pf = rel_l2(all, pf_all, &max_pf);
        const bool ok = e_ref <= kTol && e_pf <= kTolVsPf && any_nonzero(all);
        ++plans_run;
        plans_ok += ok ? 1 : 0;
        std::printf("%s %s %-44s M=%-6lld gate_up %-11s down %-11s rel_l2 vs ref (%zu rows) %.3g (max_abs %.3g), "
                    "vs pf_t128 %.3g (max_abs %.3g)\n",
                    ok ? "PASS" : "FAIL", shape.name, c.what, static_cast<long long>(c.T), names[plan.gate_up].c_str(),
                    names[plan.down].c_str(), rows.size(), e_ref, max_ref, e_pf, max_pf);
        std::fflush(stdout);
        EXPECT_LE(e_ref, kTol) << shape.name << " " << c.what << " " << names[plan.gate_up] << "/" << names[plan.down];
        EXPECT_LE(e_pf, kTolVsPf) << shape.name << " " << c.what << " " << names[plan.gate_up] << "/"
                                  << names[plan.down];
        EXPECT_TRUE(any_nonzero(all)) << shape.name << " " << c.what << ": all-zero output";
      }
    }
    const bool case_ok = plans_run == 3 * static_cast<int>(wg.size()) && plans_ok == plans_run && ref_ok && pf_ok;
    std::printf("CASE %s %s %s M=%lld: %d/%d plans pass, %zu reference rows%s%s\n", case_ok ? "PASS" : "FAIL",
                shape.name, c.what, static_cast<long long>(c.T), plans_ok, plans_run, rows.size(),
                ref_ok ? "" : ", reference all zero (nothing compared)", pf_ok ? "" : ", pf_t128 output all zero");
    std::fflush(stdout);
    EXPECT_TRUE(case_ok) << shape.name << " " << c.what;
  }
}

std::vector<WgCase> cases() {
  return {
      {1, 0, -1, "one token"},
      {37, 0, -1, "ragged, 37 tokens (rows per expert 0..few)"},
      {300, 20, -1, "300 tokens on 20 experts (rest empty), tile tails"},
      {1000, 0, 3, "1000 tokens, expert 3 hot (1000 rows = 8 tiles)"},
      {2048, 0, -1, "M=2048"},
      {8192, 0, -1, "M=8192 (65536 rows)"},
  };
}

// The oracle itself (host-only, runs without a GPU): reference_row against the CPU backend's moe_experts on
// weights dequantized by quant::dequantize_mxfp4, on a small shape (the CPU path keeps act / y in f32, the
// reference rounds them to bf16: agreement within 1e-2 rel L2).
TEST(CudaMoeMxfp4WgOracle, HostReferenceMatchesCpuBackend) {
  const ms::Shape s{"small", 256, 96, 6, 3};
  std::mt19937_64 rng(5);
  std::vector<ms::HostMx> gu, dn;
  for (int e = 0; e < s.E; ++e) {
    gu.push_back(ms::make_mx(2 * s.I, s.H, 11 + 2 * e));
    dn.push_back(ms::make_mx(s.H, s.I, 12 + 2 * e));
  }
  const ms::Batch b = ms::make_batch(s, 7, s.E, -1, rng);
  const Tensor ref = moe_oracle::cpu_moe_reference(s, gu, dn, b);
  std::vector<double> got, want;
  for (int64_t t = 0; t < b.T; ++t) {
    const std::vector<double> r = ms::reference_row_of(s, gu, dn, b, t);
    got.insert(got.end(), r.begin(), r.end());
    for (int64_t n = 0; n < s.H; ++n) want.push_back(ref.data<float>()[t * s.H + n]);
  }
  double max_abs = 0;
  const double err = rel_l2(got, want, &max_abs);
  std::printf("%s host reference vs CPU backend: rel_l2 %.3g max_abs %.3g\n", err <= 1e-2 ? "PASS" : "FAIL", err,
              max_abs);
  EXPECT_LE(err, 1e-2);
  EXPECT_GT(max_abs, 0.0);  // the two differ in bf16 rounding: identical outputs would mean a copied path
}


// Host-only: every case of both shapes samples only rows of its batch, and its routing is what the case says
// (distinct experts per token, inside the pool, the hot expert in slot 0), so run_shape's host reference
// never indexes past the batch or the expert list (the one-token case once sampled row 1 of 1: SIGSEGV).
TEST(CudaMoeMxfp4WgOracle, CasesSampleValidRowsAndRoutes) {
  for (const ms::Shape& shape : {ms::kGlmAir, ms::kGlm52}) {
    std::mt19937_64 rng(3);
    for (const WgCase& c : cases()) {
      const std::vector<int64_t> rows = sampled_rows(c.T);
      ASSERT_FALSE(rows.empty()) << c.what;
      EXPECT_EQ(rows.front(), 0) << c.what;
      for (int64_t t : rows) EXPECT_TRUE(t >= 0 && t < c.T) << shape.name << " " << c.what << ": row " << t;
      const int pool = c.pool > 0 ? c.pool : shape.E;
      const ms::Batch b = ms::make_batch(shape, c.T, pool, c.hot, rng);
      ASSERT_EQ(b.ids.size(), static_cast<size_t>(c.T * shape.K));
      ASSERT_EQ(b.x.size(), static_cast<size_t>(c.T * shape.H));
      int bad = 0;
      for (int64_t t = 0; t < c.T; ++t) {
        const int32_t* ids = b.ids.data() + t * shape.K;
        std::vector<int32_t> sorted(ids, ids + shape.K);
        std::sort(sorted.begin(), sorted.end());
        const bool distinct = std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end();
        bad += (!distinct || sorted.front() < 0 || sorted.back() >= pool || (c.hot >= 0 && ids[0] != c.hot)) ? 1 : 0;
      }
      std::printf("%s %s %-44s M=%-6lld %zu sampled rows, %d bad routings\n", bad == 0 ? "PASS" : "FAIL", shape.name,
                  c.what, static_cast<long long>(c.T), rows.size(), bad);
      EXPECT_EQ(bad, 0) << shape.name << " " << c.what;
    }
  }
}

// Host-only: the reference names a bad row or expert id instead of reading past its inputs.
TEST(CudaMoeMxfp4WgOracle, ReferenceRejectsOutOfRangeRowsAndExperts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const ms::Shape s{"small", 128, 64, 4, 2};
  std::vector<ms::HostMx> gu, dn;
  for (int e = 0; e < s.E; ++e) {
    gu.push_back(ms::make_mx(2 * s.I, s.H, 2 * e));
    dn.push_back(ms::make_mx(s.H, s.I, 2 * e + 1));
  }
  std::mt19937_64 rng(1);
  ms::Batch b = ms::make_batch(s, 1, s.E, -1, rng);
  EXPECT_DEATH(ms::reference_row_of(s, gu, dn, b, 1), "row 1 of a 1-token batch");
  b.ids[1] = s.E;
  EXPECT_DEATH(ms::reference_row_of(s, gu, dn, b, 0), "routes to expert 4 of 4");
  EXPECT_DEATH(ms::make_batch(s, 4, s.E, s.E, rng), "hot 4");
}

TEST(CudaMoeMxfp4Wg, GlmAir) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device: run on the GPU machine";
  if (!have_sm90()) GTEST_SKIP() << "not an sm_90 device: the wg_* launchers run pf_t128 here (nothing to test)";
  run_shape(ms::kGlmAir, cases());
}

TEST(CudaMoeMxfp4Wg, Glm52) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device: run on the GPU machine";
  if (!have_sm90()) GTEST_SKIP() << "not an sm_90 device: the wg_* launchers run pf_t128 here (nothing to test)";
  run_shape(ms::kGlm52, cases());
}

}  // namespace
}  // namespace mxserve
