// W4A8 MXFP4 MoE (design 8, wg8_*: FP8 e4m3 activations on the Hopper wgmma prefill GEMMs, opt-in through
// MoeShape::fp8_activations) at real model sizes:
//   - against the W4A8 host oracle (moe_mxfp4_synth.h with W4a8Ref: x and the intermediate quantized per row
//     to e4m3 and the weights converted exactly as the GPU does, through the shared kernels/w4a8_fp8.h) on
//     sampled output rows: tolerance kTolW4a8;
//   - printed (the accuracy figure of W4A8, not a pass criterion beyond a sanity bound): rel L2 against the
//     plain bf16-activation host reference and against the bf16 wg_* GPU run over the whole output.
// Plans: both GEMMs on each wg8_* variant (named directly), both on wg_n128_s3 under fp8_activations (the
// dispatcher maps it by rows per expert: moe_mxfp4_w4a8_variant), and one GEMM W4A8 with the other on
// pf_t128 (bf16), so each GEMM's quantize pass and kernel is checked alone.
// Plans with a W4A8 down GEMM are checked in two parts, because the down GEMM re-quantizes the intermediate
// per row to e4m3: (a) the GPU's own intermediate act [P, I] (read back from the workspace) against the
// oracle's intermediate, and (b) the GPU output against the down GEMM + weighted un-permute of the oracle
// applied to that GPU intermediate. The end-to-end W4A8 oracle number is printed as information only (see
// kRequantNote).
// Cases: GLM-4.5-Air (E128 H4096 I1408 top 8) and GLM-5.2 (E256 H6144 I2048 top 8); one token, ragged 37
// tokens, 300 tokens on 20 experts (most experts empty, tile tails), one hot expert (many 128-row tiles),
// M = 2048 / 8192 / 16384. A small shape with a wide scale spread (blocks 12+ exponents below their row's
// maximum) exercises the exact slow conversion path. fp8_activations = false still runs bf16 (a plan naming
// wg_* gives the design-6 result, not the W4A8 one). Seed random, printed; MXSERVE_WG_SEED=N reruns one.
#include <gtest/gtest.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "kernels/cuda/moe_mxfp4/moe_mxfp4.h"
#include "gpu_oracle.h"
#include "moe_mxfp4_synth.h"
#include "moe_oracle.h"

namespace mxserve {
namespace {

namespace kc = kernels::cuda;
namespace ms = moe_synth;
// GPU vs the W4A8 oracle: both use bit-identical e4m3 operands (same encoder, exact weight conversion), so
// what remains is fp32 vs double accumulation (~1e-6 relative over K <= 6144), the bf16 rounding of act, y
// and out (2^-9 relative per element: ~2e-3 rel L2 after the top-8 sum), and rare e4m3 code flips where
// the fp32 and double SwiGLU values straddle a bf16 / e4m3 rounding boundary (one e4m3 ulp, 6%, on single
// elements of a 1408 / 2048-long row: < 1e-3 rel L2). 1e-2 bounds that sum with margin, the same bound as
// the bf16 kernels' test against their oracle; a wrong scale, swizzle or row would be O(1).
constexpr double kTolW4a8 = 1e-2;
// kRequantNote: why a chained plan is not gated end to end. The oracle's intermediate and the GPU's differ by
// bf16 rounding / accumulation order (~2e-3 rel L2); the down GEMM then rounds each row to e4m3, and an
// element within that noise of an e4m3 rounding boundary lands on the neighbouring code (a 6-12% step). On
// the H200 run ~3% of the elements flipped, giving 0.9-1.8% rel L2 end to end, identical for all three wg8
// variants (so the GPU output was consistent). Re-quantizing the GPU's own intermediate in the oracle removes
// the flips; the intermediate itself is checked separately against the oracle's.
// Sanity bound only: W4A8 vs bf16 activations differs by the e4m3 quantization noise (~2^-4 relative per
// element, a few % rel L2 on the output); the printed value is the accuracy figure.
constexpr double kSanityVsBf16 = 0.15;

struct Wg8Case {
  int64_t T;
  int pool;  // 0: all experts
  int hot;   // -1: none
  const char* what;
};

using gpu_oracle::have_sm90;
using moe_oracle::any_nonzero;
using moe_oracle::rel_l2;
using moe_oracle::sampled_rows;

int variant(const char* name) {
  const int v = kc::moe_mxfp4_variant_index(kc::MoeGemm::kGateUp, name);
  EXPECT_GE(v, 0) << name;
  return v;
}

std::vector<double> ref_rows(const ms::Model& m, const ms::Batch& b, const std::vector<int64_t>& rows,
                             ms::W4a8Ref w) {
  std::vector<double> ref;
  for (int64_t t : rows) {
    const std::vector<double> r = ms::reference_row(m, b, t, w);
    ref.insert(ref.end(), r.begin(), r.end());
  }
  return ref;
}

// The permutation and the bf16 intermediate of the last run, read back from the workspace. The offsets mirror
// moe_carve_workspace (kernels/cuda/moe/moe_permute.cuh: device code a host test cannot include); a drift
// there fails the permutation checks of read_gpu_perm loudly rather than comparing wrong rows.
struct GpuPerm {
  std::vector<int32_t> row_offsets;  // [E + 1]
  std::vector<int32_t> row_token;    // [P]
  std::vector<int32_t> pair_row;     // [P]
  size_t act_offset = 0;             // bytes from the workspace base to act [P, I] bf16
  bool ok = false;                   // the permutation matches the routing (else nothing is read from act)
};
size_t ws_align_up(size_t v) { return (v + 255) / 256 * 256; }

GpuPerm read_gpu_perm(const ms::Shape& s, const ms::Batch& b, const ms::DeviceBatch& db) {
  const int64_t P = b.T * s.K;
  const size_t a_e = ws_align_up(4 * (s.E + 1)), a_p = ws_align_up(4 * P);
  GpuPerm g;
  g.row_offsets.resize(s.E + 1);
  g.row_token.resize(P);
  g.pair_row.resize(P);
  const char* base = static_cast<const char*>(db.ws);
  // Layout: row_offsets, tile_offsets, active, n_active ([E + 1] each, aligned), row_token [P], pair_row [P],
  // act [P, I], y [P, H].
  MX_CUDA_CHECK(cudaMemcpy(g.row_offsets.data(), base, 4 * (s.E + 1), cudaMemcpyDeviceToHost));
  MX_CUDA_CHECK(cudaMemcpy(g.row_token.data(), base + 4 * a_e, 4 * P, cudaMemcpyDeviceToHost));
  MX_CUDA_CHECK(cudaMemcpy(g.pair_row.data(), base + 4 * a_e + a_p, 4 * P, cudaMemcpyDeviceToHost));
  g.act_offset = 4 * a_e + 2 * a_p;
  // The permutation must be the one of the routing: pair (t, k) on a row of expert ids[t, k] whose token is t,
  // every row used once.
  EXPECT_EQ(g.row_offsets[0], 0);
  EXPECT_EQ(g.row_offsets[s.E], P) << "workspace layout drift? (moe_carve_workspace)";
  std::vector<char> used(P, 0);
  int64_t bad = 0;
  for (int64_t i = 0; i < P; ++i) {
    const int32_t row = g.pair_row[i];
    const int e = b.ids[i];
    const bool ok = row >= 0 && row < P && !used[row] && row >= g.row_offsets[e] && row < g.row_offsets[e + 1] &&
                    g.row_token[row] == i / s.K;
    if (ok) used[row] = 1;
    bad += ok ? 0 : 1;
  }
  EXPECT_EQ(bad, 0) << s.name << " M=" << b.T << ": pairs not on a row of their expert / token (layout drift?)";
  g.ok = bad == 0 && g.row_offsets[0] == 0 && g.row_offsets[s.E] == P;
  return g;
}

// act row `row` of the last run ([I] bf16 -> double).
std::vector<double> read_gpu_act(const ms::Shape& s, const ms::DeviceBatch& db, const GpuPerm& g, int32_t row) {
  std::vector<uint16_t> bits(s.I);
  MX_CUDA_CHECK(cudaMemcpy(bits.data(), static_cast<const char*>(db.ws) + g.act_offset + 2 * row * s.I, 2 * s.I,
                           cudaMemcpyDeviceToHost));
  return moe_oracle::bf16_to_f64(bits);
}

void run_shape(const ms::Shape& shape, const std::vector<Wg8Case>& cases, int spread = 4) {
  const uint32_t seed = moe_oracle::test_seed("MXSERVE_WG_SEED");
  std::printf("%s (scale spread %d): seed %u (rerun with MXSERVE_WG_SEED=%u)\n", shape.name, spread, seed, seed);
  std::fflush(stdout);
  std::mt19937_64 rng(seed);
  const ms::Model model(shape, seed, spread);
  cudaStream_t stream = nullptr;
  const auto& names = kc::moe_mxfp4_variants(kc::MoeGemm::kGateUp);
  const int pf = variant("pf_t128"), wg256 = variant("wg_n256_s4"), wg128 = variant("wg_n128_s3");
  const int w8n256 = variant("wg8_n256_s4"), w8n128 = variant("wg8_n128_s3"), m256 = variant("wg8_n128_s3_m256");
  struct PlanCase {
    kc::MoeMxfp4Plan plan;
    ms::W4a8Ref w;
  };
  // wg_* under fp8_activations runs moe_mxfp4_w4a8_variant (wg8_n128_s3 or _m256 by rows per expert), so
  // every wg8_* variant is also named directly.
  const PlanCase plans[] = {{{w8n256, w8n256}, {true, true}},
                            {{w8n128, w8n128}, {true, true}},
                            {{m256, m256}, {true, true}},
                            {{wg128, wg128}, {true, true}},
                            {{wg256, pf}, {true, false}},
                            {{pf, wg128}, {false, true}}};

  for (const Wg8Case& c : cases) {
    const ms::Batch b = ms::make_batch(shape, c.T, c.pool > 0 ? c.pool : shape.E, c.hot, rng);
    ms::DeviceBatch db(shape, b);
    const std::vector<int64_t> rows = sampled_rows(c.T);
    const std::vector<double> ref_bf16 = ref_rows(model, b, rows, {});
    // The bf16 wg_n256_s4 run over the whole output (fp8 off: also the "false still selects bf16" check).
    db.run(model, {wg256, wg256}, stream, true, false);
    MX_CUDA_CHECK(cudaStreamSynchronize(stream));
    MX_CUDA_CHECK(cudaGetLastError());
    const std::vector<double> bf16_all = moe_oracle::bf16_to_f64(db.out_host());
    std::vector<double> bf16_sampled;
    for (int64_t t : rows)
      bf16_sampled.insert(bf16_sampled.end(), bf16_all.begin() + t * shape.H, bf16_all.begin() + (t + 1) * shape.H);
    double mx16 = 0;
    const double e16 = rel_l2(bf16_sampled, ref_bf16, &mx16);
    const bool bf16_ok = e16 <= 1e-2 && any_nonzero(bf16_all);
    std::printf("%s %s %-44s M=%-6lld fp8_activations=false wg_n256_s4 (bf16) rel_l2 vs bf16 ref %.3g\n",
                bf16_ok ? "PASS" : "FAIL", shape.name, c.what, static_cast<long long>(c.T), e16);
    EXPECT_TRUE(bf16_ok) << shape.name << " " << c.what << ": bf16 path rel_l2 " << e16;

    int plans_ok = 0, plans_run = 0;
    std::vector<double> refs[2][2];  // [gate_up fp8][down fp8], computed once per case
    refs[0][0] = ref_bf16;
    std::vector<double> ref_acts[2];  // [gate_up fp8]: the oracle intermediate of every sampled (t, k), [rows*K, I]
    kc::MoeShape fp8_shape{c.T, shape.H, shape.I, shape.E, shape.K};
    fp8_shape.fp8_activations = true;
    for (const PlanCase& pc : plans) {
      std::vector<double>& ref = refs[pc.w.gate_up][pc.w.down];
      if (ref.empty()) ref = ref_rows(model, b, rows, pc.w);
      db.run(model, pc.plan, stream, true, true);
      MX_CUDA_CHECK(cudaStreamSynchronize(stream));
      MX_CUDA_CHECK(cudaGetLastError());
      const std::vector<double> all = moe_oracle::bf16_to_f64(db.out_host());
      std::vector<double> sampled;
      for (int64_t t : rows) sampled.insert(sampled.end(), all.begin() + t * shape.H, all.begin() + (t + 1) * shape.H);
      double mx_ref = 0, mx_bf = 0, mx_gpu16 = 0;
      const double e_ref = rel_l2(sampled, ref, &mx_ref);
      const double e_bf = rel_l2(sampled, ref_bf16, &mx_bf);
      const double e_gpu16 = rel_l2(all, bf16_all, &mx_gpu16);
      // W4A8 down (kRequantNote): the gate is (a) the GPU intermediate vs the oracle's and (b) the output vs the
      // oracle's down GEMM + un-permute of the GPU's own intermediate; e_ref is then information only.
      double e_act = 0, e_own = 0, mx_act = 0, mx_own = 0;
      if (pc.w.down) {
        std::vector<double>& ref_act = ref_acts[pc.w.gate_up];
        if (ref_act.empty())
          for (int64_t t : rows)
            for (int k = 0; k < shape.K; ++k) {
              const std::vector<double> a =
                  ms::reference_act_of(shape, model.gate_up, b, t, k, pc.w.gate_up);
              ref_act.insert(ref_act.end(), a.begin(), a.end());
            }
        const GpuPerm perm = read_gpu_perm(shape, b, db);
        std::vector<double> gpu_act, own;
        for (int64_t t : rows) {
          if (!perm.ok) break;  // e_act / e_own stay infinite below
          std::vector<double> out(shape.H, 0.0);
          for (int k = 0; k < shape.K; ++k) {
            const std::vector<double> a = read_gpu_act(shape, db, perm, perm.pair_row[t * shape.K + k]);
            gpu_act.insert(gpu_act.end(), a.begin(), a.end());
            const std::vector<double> y = ms::reference_down_of(shape, model.down, b.ids[t * shape.K + k], a, true);
            for (int64_t n = 0; n < shape.H; ++n) out[n] += b.wts[t * shape.K + k] * y[n];
          }
          own.insert(own.end(), out.begin(), out.end());
        }
        e_act = perm.ok ? rel_l2(gpu_act, ref_act, &mx_act) : INFINITY;
        e_own = perm.ok ? rel_l2(sampled, own, &mx_own) : INFINITY;
      }
      const double e_gate = pc.w.down ? std::max(e_act, e_own) : e_ref;
      // The W4A8 run must differ from the bf16 one (else fp8_activations did nothing).
      const bool differs = mx_gpu16 > 0;
      const bool ok = e_gate <= kTolW4a8 && e_bf <= kSanityVsBf16 && differs && any_nonzero(all) && any_nonzero(ref);
      ++plans_run;
      plans_ok += ok ? 1 : 0;
      // What ran: a wg_* plan GEMM under fp8_activations is the dispatcher's wg8_* choice.
      auto ran = [&](int v, bool fp8) { return fp8 ? names[kc::moe_mxfp4_w4a8_variant(v, fp8_shape)] : names[v]; };
      if (pc.w.down)
        std::printf("%s %s %-44s M=%-6lld gate_up %-16s down %-16s intermediate vs W4A8 ref %.3g (max_abs %.3g), "
                    "rel_l2 vs W4A8 down of the GPU intermediate %.3g (max_abs %.3g) | vs end-to-end W4A8 oracle "
                    "%.3g (info: e4m3 re-quantization flips) | W4A8 accuracy: vs bf16 ref %.3g, vs bf16 GPU (all "
                    "rows) %.3g\n",
                    ok ? "PASS" : "FAIL", shape.name, c.what, static_cast<long long>(c.T),
                    ran(pc.plan.gate_up, pc.w.gate_up).c_str(), ran(pc.plan.down, pc.w.down).c_str(), e_act, mx_act,
                    e_own, mx_own, e_ref, e_bf, e_gpu16);
      else
        std::printf("%s %s %-44s M=%-6lld gate_up %-16s down %-16s rel_l2 vs W4A8 ref %.3g (max_abs %.3g) | "
                    "W4A8 accuracy: vs bf16 ref %.3g, vs bf16 GPU (all rows) %.3g\n",
                    ok ? "PASS" : "FAIL", shape.name, c.what, static_cast<long long>(c.T),
                    ran(pc.plan.gate_up, pc.w.gate_up).c_str(), ran(pc.plan.down, pc.w.down).c_str(), e_ref, mx_ref,
                    e_bf, e_gpu16);
      std::fflush(stdout);
      EXPECT_LE(e_gate, kTolW4a8) << shape.name << " " << c.what << " " << names[pc.plan.gate_up] << "/"
                                  << names[pc.plan.down] << (pc.w.down ? " (intermediate / own-intermediate down)" : "");
      EXPECT_LE(e_bf, kSanityVsBf16) << shape.name << " " << c.what;
      EXPECT_TRUE(differs) << shape.name << " " << c.what << ": W4A8 output identical to bf16 (fp8 path not run?)";
      EXPECT_TRUE(any_nonzero(all)) << shape.name << " " << c.what << ": all-zero output";
    }
    const bool case_ok = plans_ok == plans_run && bf16_ok && !rows.empty() && any_nonzero(ref_bf16);
    std::printf("CASE %s %s %s M=%lld: %d/%d W4A8 plans pass\n", case_ok ? "PASS" : "FAIL", shape.name, c.what,
                static_cast<long long>(c.T), plans_ok, plans_run);
    std::fflush(stdout);
    EXPECT_TRUE(case_ok) << shape.name << " " << c.what;
  }
}

std::vector<Wg8Case> cases() {
  return {
      {1, 0, -1, "one token"},
      {37, 0, -1, "ragged, 37 tokens (rows per expert 0..few)"},
      {300, 20, -1, "300 tokens on 20 experts (rest empty), tile tails"},
      {1000, 0, 3, "1000 tokens, expert 3 hot (1000 rows = 8 tiles)"},
      {2048, 0, -1, "M=2048"},
      {8192, 0, -1, "M=8192 (65536 rows)"},
      {16384, 0, -1, "M=16384 (131072 rows)"},
  };
}


// Host-only: the W4A8 variants are eligible exactly when the caller opted in, the workspace grows only then,
// and the heuristic never picks them.
TEST(CudaMoeMxfp4Wg8Registry, OptInOnly) {
  const int wg8a = kc::moe_mxfp4_variant_index(kc::MoeGemm::kGateUp, "wg8_n256_s4");
  const int wg8b = kc::moe_mxfp4_variant_index(kc::MoeGemm::kGateUp, "wg8_n128_s3");
  const int wg8c = kc::moe_mxfp4_variant_index(kc::MoeGemm::kGateUp, "wg8_n128_s3_m256");
  ASSERT_GE(wg8a, 0);
  ASSERT_GE(wg8b, 0);
  ASSERT_GE(wg8c, 0);
  kc::MoeShape s{4096, 4096, 1408, 128, 8};
  for (kc::MoeGemm g : {kc::MoeGemm::kGateUp, kc::MoeGemm::kDown})
    for (int v : {wg8a, wg8b, wg8c}) {
      s.fp8_activations = false;
      EXPECT_EQ(kc::moe_mxfp4_variant_max_tokens(g, v, s), 0) << v;
      s.fp8_activations = true;
      EXPECT_GT(kc::moe_mxfp4_variant_max_tokens(g, v, s), 0) << v;
    }
  s.fp8_activations = false;
  const size_t plain = kc::moe_mxfp4_workspace_bytes(s);
  s.fp8_activations = true;
  const size_t fp8 = kc::moe_mxfp4_workspace_bytes(s);
  // x8 [T, H] + the intermediate [P, I] in e4m3 + one f32 scale per row of each.
  EXPECT_GE(fp8, plain + 4096 * 4096 + 4096 * 8 * 1408 + 4 * (4096 + 4096 * 8));
  for (int64_t m : {1, 16, 256, 4096, 16384}) {
    for (bool f : {false, true}) {
      kc::MoeShape h{m, 6144, 2048, 256, 8};
      h.fp8_activations = f;
      const kc::MoeMxfp4Plan p = kc::moe_mxfp4_heuristic_plan(h);
      EXPECT_NE(kc::kMoeMxfp4Variants[p.gate_up].design, kc::MoeMxfp4Design::kWg8);
      EXPECT_NE(kc::kMoeMxfp4Variants[p.down].design, kc::MoeMxfp4Design::kWg8);
    }
  }
  // The dispatcher's wg_* -> wg8_* choice under fp8_activations (moe_mxfp4.cu, measured on H200):
  // wg8_n128_s3_m256 from 256 mean rows per active expert (P / min(E, P), rounded up), else wg8_n128_s3,
  // whatever the BN of the wg_* plan; named wg8_* variants and every other design run as named.
  const int wg_a = kc::moe_mxfp4_variant_index(kc::MoeGemm::kGateUp, "wg_n256_s4");
  const int wg_b = kc::moe_mxfp4_variant_index(kc::MoeGemm::kGateUp, "wg_n128_s3");
  const int pf = kc::moe_mxfp4_variant_index(kc::MoeGemm::kGateUp, "pf_t128");
  ASSERT_GE(wg_a, 0);
  ASSERT_GE(wg_b, 0);
  ASSERT_GE(pf, 0);
  struct MapCase {
    int64_t T, H, I;
    int E;
    int want;
  };
  const MapCase maps[] = {
      {1, 4096, 1408, 128, wg8b},      // r 1
      {2048, 4096, 1408, 128, wg8b},   // Air M=2048: r 128 (measured: n128_s3 354 > m256 292 TFLOP/s)
      {4064, 4096, 1408, 128, wg8b},   // r 254
      {4095, 4096, 1408, 128, wg8c},   // r 255.9 -> 256
      {4096, 4096, 1408, 128, wg8c},   // r 256
      {8192, 4096, 1408, 128, wg8c},   // Air M=8192: r 512 (480 > 459)
      {16384, 4096, 1408, 128, wg8c},  // r 1024 (518 > 479)
      {2048, 6144, 2048, 256, wg8b},   // GLM-5.2 M=2048: r 64 (287 > 177)
      {8192, 6144, 2048, 256, wg8c},   // r 256 (459 > 432)
      {16384, 6144, 2048, 256, wg8c},  // r 512 (541 > 477)
  };
  for (const MapCase& mc : maps) {
    kc::MoeShape ms{mc.T, mc.H, mc.I, mc.E, 8};
    for (int v : {wg_a, wg_b}) {
      ms.fp8_activations = true;
      EXPECT_EQ(kc::moe_mxfp4_w4a8_variant(v, ms), mc.want) << "T " << mc.T << " E " << mc.E << " variant " << v;
      ms.fp8_activations = false;
      EXPECT_EQ(kc::moe_mxfp4_w4a8_variant(v, ms), v) << "fp8 off: T " << mc.T;
    }
    ms.fp8_activations = true;
    for (int v : {pf, wg8a, wg8b, wg8c}) EXPECT_EQ(kc::moe_mxfp4_w4a8_variant(v, ms), v) << "T " << mc.T;
  }
  // K % 128 != 0 (I 1376): no W4A8 on down even when opted in.
  kc::MoeShape odd{64, 4096, 1376, 128, 8};
  odd.fp8_activations = true;
  EXPECT_EQ(kc::moe_mxfp4_variant_max_tokens(kc::MoeGemm::kDown, wg8a, odd), 0);
}

// Host-only: the W4A8 oracle with both flags off is the bf16 oracle, and with them on it differs by a few %
// (the quantization is really applied), on a small shape.
TEST(CudaMoeMxfp4Wg8Registry, OracleFlags) {
  const ms::Shape s{"small", 256, 128, 4, 2};
  std::vector<ms::HostMx> gu, dn;
  for (int e = 0; e < s.E; ++e) {
    gu.push_back(ms::make_mx(2 * s.I, s.H, 2 * e));
    dn.push_back(ms::make_mx(s.H, s.I, 2 * e + 1));
  }
  std::mt19937_64 rng(9);
  const ms::Batch b = ms::make_batch(s, 3, s.E, -1, rng);
  for (int64_t t = 0; t < b.T; ++t) {
    const std::vector<double> plain = ms::reference_row_of(s, gu, dn, b, t);
    EXPECT_EQ(ms::reference_row_of(s, gu, dn, b, t, {false, false}), plain);
    double mx = 0;
    const double e = rel_l2(ms::reference_row_of(s, gu, dn, b, t, {true, true}), plain, &mx);
    std::printf("oracle token %lld: W4A8 vs bf16 activations rel_l2 %.3g\n", static_cast<long long>(t), e);
    EXPECT_GT(e, 1e-4);
    EXPECT_LT(e, kSanityVsBf16);
    // The parts the chained-plan check composes by hand (intermediate, then down + weighted sum) give exactly
    // the end-to-end oracle when fed the oracle's own intermediate.
    std::vector<double> composed(s.H, 0.0);
    for (int k = 0; k < s.K; ++k) {
      const std::vector<double> y =
          ms::reference_down_of(s, dn, b.ids[t * s.K + k], ms::reference_act_of(s, gu, b, t, k, true), true);
      for (int64_t n = 0; n < s.H; ++n) composed[n] += b.wts[t * s.K + k] * y[n];
    }
    EXPECT_EQ(composed, ms::reference_row_of(s, gu, dn, b, t, {true, true}));
  }
}

TEST(CudaMoeMxfp4Wg8, GlmAir) {
  if (!have_sm90()) GTEST_SKIP() << "needs an sm_90 device: W4A8 runs bf16 elsewhere (nothing to test)";
  run_shape(ms::kGlmAir, cases());
}

TEST(CudaMoeMxfp4Wg8, Glm52) {
  if (!have_sm90()) GTEST_SKIP() << "needs an sm_90 device: W4A8 runs bf16 elsewhere (nothing to test)";
  run_shape(ms::kGlm52, cases());
}

// Blocks up to 15 exponents below their row's maximum: the exact slow conversion (subnormal / flushed e4m3
// weights) on a good share of blocks, checked against the oracle that rounds those weights the same way.
TEST(CudaMoeMxfp4Wg8, WideScaleSpread) {
  if (!have_sm90()) GTEST_SKIP() << "needs an sm_90 device: W4A8 runs bf16 elsewhere (nothing to test)";
  const ms::Shape wide{"wide-spread", 1024, 512, 16, 4};
  run_shape(wide, {{1, 0, -1, "one token"}, {300, 0, -1, "300 tokens"}, {700, 0, 2, "700 tokens, expert 2 hot"}},
            16);
}

}  // namespace
}  // namespace mxserve
