// The MXFP4 prefill dequant path (kernels/cuda/moe_mxfp4/moe_prefill_dequant.h: dequantize the active experts to
// bf16, then the bf16 wgmma grouped GEMM) at GLM-4.5-Air (E128 H4096 I1408 top 8) and GLM-5.2 (E256 H6144 I2048
// top 8) sizes, M = 1024 / 4096 / 8192 plus ragged cases (most experts empty; one hot expert with a ragged tile
// tail), against
//   - the host reference of sampled rows (moe_mxfp4_synth.h, decoded from the packed codes; it matches the CPU
//     backend, CudaMoeMxfp4WgOracle.HostReferenceMatchesCpuBackend), rel L2 <= kTol;
//   - the current W4A16 path (moe_experts_mxfp4, plan wg_n128_s3 / wg_n128_s3, the tuned H200 choice at
//     M = 2048 .. 16384) over the whole output, rel L2 <= kTolVsW4a16;
//   - and on a small shape the CPU backend itself (moe_experts on dequantized f32 weights), whole output.
// The dequant path's workspace is poisoned (0xff: NaN bf16) before each run, so an unwritten copy element, act or
// y row shows as NaN. Each case prints PASS/FAIL with its errors; a case that compared nothing FAILS.
// Seed: random, printed; MXSERVE_WG_SEED=N reruns one. Host-only checks (switch, sizes) run without a GPU.
#include <gtest/gtest.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/numeric.h"
#include "gpu_oracle.h"
#include "kernels/cuda/moe_mxfp4/moe_bf16_wg_schedule.h"
#include "kernels/cuda/moe_mxfp4/moe_mxfp4.h"
#include "kernels/cuda/moe_mxfp4/moe_prefill_dequant.h"
#include "moe_mxfp4_synth.h"
#include "moe_oracle.h"
#include "quant/mxfp4.h"

namespace mxserve {
namespace {

namespace kc = kernels::cuda;
namespace ms = moe_synth;
constexpr double kTol = 1e-2;         // vs the host reference (bf16 intermediates), as test_cuda_moe_mxfp4_wg
constexpr double kTolVsW4a16 = 1e-2;  // vs wg_n128_s3: the same bf16 weights and math, another fp32 order

using gpu_oracle::have_cuda_device;
using gpu_oracle::have_sm90;
using moe_oracle::rel_l2;

// The grouped GEMM kernels every case runs: BN 256 and BN 128 (all warps load + multiply), then the
// warp-specialized one (mbarrier ring; last, so a hang there leaves the others' lines in the log).
struct GemmKernel {
  kc::MoePrefillDequantPlan plan;
  const char* name;
};
const GemmKernel kKernels[] = {{{256, 256, false}, "bn256"}, {{128, 128, false}, "bn128"}, {{256, 256, true}, "ws256"}};
constexpr int kNumKernels = sizeof(kKernels) / sizeof(kKernels[0]);

struct Case {
  int64_t T;
  int pool;  // 0: all experts
  int hot;   // -1: none
  const char* what;
};

// The dequant path on db's inputs into db.out (zeroed first), its own (poisoned) workspace.
struct DequantRunner {
  void* ws = nullptr;
  size_t bytes = 0;
  DequantRunner(const ms::Shape& shape, int64_t T) {
    const kc::MoeShape s{T, shape.H, shape.I, shape.E, shape.K};
    bytes = kc::moe_prefill_dequant_workspace_bytes(s);
    MX_CUDA_CHECK(cudaMalloc(&ws, bytes));
  }
  ~DequantRunner() { cudaFree(ws); }
  DequantRunner(const DequantRunner&) = delete;
  DequantRunner& operator=(const DequantRunner&) = delete;
  void run(const ms::Model& m, ms::DeviceBatch& db, const kc::MoePrefillDequantPlan& plan, cudaStream_t stream) {
    const kc::MoeShape s{db.T, m.shape.H, m.shape.I, m.shape.E, m.shape.K};
    MX_CUDA_CHECK(cudaMemsetAsync(db.out, 0, db.out_bytes, stream));
    MX_CUDA_CHECK(cudaMemsetAsync(ws, 0xff, bytes, stream));
    kc::moe_experts_mxfp4_prefill_dequant(db.x, db.ids, db.wts, m.weights(), db.out, s, plan, ws, stream);
  }
};

void run_shape(const ms::Shape& shape, const std::vector<Case>& cases) {
  const uint32_t seed = moe_oracle::announced_seed("MXSERVE_WG_SEED", shape.name);
  std::mt19937_64 rng(seed);
  const ms::Model model(shape, seed);
  cudaStream_t stream = nullptr;
  const int wg = kc::moe_mxfp4_variant_index(kc::MoeGemm::kGateUp, "wg_n128_s3");
  ASSERT_GE(wg, 0) << "wg_n128_s3 is not a variant (moe_mxfp4_variants.h)";
  for (const Case& c : cases) {
    const ms::Batch b = ms::make_batch(shape, c.T, c.pool > 0 ? c.pool : shape.E, c.hot, rng);
    ms::DeviceBatch db(shape, b);
    std::vector<int64_t> rows;
    for (int64_t t : {int64_t{0}, c.T - 1, c.T / 2})
      if (std::find(rows.begin(), rows.end(), t) == rows.end()) rows.push_back(t);
    std::vector<double> ref;
    for (int64_t t : rows) {
      const std::vector<double> r = ms::reference_row(model, b, t);
      ref.insert(ref.end(), r.begin(), r.end());
    }
    db.run(model, {wg, wg}, stream);
    MX_CUDA_CHECK(cudaStreamSynchronize(stream));
    MX_CUDA_CHECK(cudaGetLastError());
    const std::vector<double> w4a16 = moe_oracle::bf16_to_f64(db.out_host());

    DequantRunner dq(shape, c.T);
    int plans_ok = 0, plans_run = 0;
    for (const GemmKernel& k : kKernels) {
      dq.run(model, db, k.plan, stream);
      MX_CUDA_CHECK(cudaStreamSynchronize(stream));
      MX_CUDA_CHECK(cudaGetLastError());
      const std::vector<double> all = moe_oracle::bf16_to_f64(db.out_host());
      std::vector<double> sampled;
      for (int64_t t : rows) sampled.insert(sampled.end(), all.begin() + t * shape.H, all.begin() + (t + 1) * shape.H);
      double max_ref = 0, max_w = 0;
      const double e_ref = rel_l2(sampled, ref, &max_ref), e_w = rel_l2(all, w4a16, &max_w);
      const bool ok = e_ref <= kTol && e_w <= kTolVsW4a16 && moe_oracle::all_finite_nonzero(all) && moe_oracle::all_finite_nonzero(w4a16);
      ++plans_run;
      plans_ok += ok ? 1 : 0;
      std::printf("%s %s %-46s M=%-6lld %s: rel_l2 vs ref (%zu rows) %.3g (max_abs %.3g), vs W4A16 wg_n128_s3 "
                  "%.3g (max_abs %.3g), workspace %.2f GiB\n",
                  ok ? "PASS" : "FAIL", shape.name, c.what, static_cast<long long>(c.T), k.name, rows.size(), e_ref,
                  max_ref, e_w, max_w, dq.bytes / double(1ull << 30));
      std::fflush(stdout);
      EXPECT_LE(e_ref, kTol) << shape.name << " " << c.what << " " << k.name;
      EXPECT_LE(e_w, kTolVsW4a16) << shape.name << " " << c.what << " " << k.name;
      EXPECT_TRUE(moe_oracle::all_finite_nonzero(all)) << shape.name << " " << c.what << " " << k.name
                                           << ": NaN/Inf or all-zero output";
    }
    const bool case_ok = plans_ok == plans_run && plans_run == kNumKernels;
    std::printf("CASE %s %s %s M=%lld: %d/%d GEMM kernels pass\n", case_ok ? "PASS" : "FAIL", shape.name, c.what,
                static_cast<long long>(c.T), plans_ok, plans_run);
    std::fflush(stdout);
  }
}

std::vector<Case> cases() {
  return {
      {1024, 0, -1, "M=1024"},
      {4096, 0, -1, "M=4096"},
      {8192, 0, -1, "M=8192 (65536 rows)"},
      {300, 20, -1, "300 tokens on 20 experts (rest empty)"},
      {1100, 0, 3, "1100 tokens, expert 3 hot (9 tiles, ragged tail)"},
  };
}


// Host-only: the switch is off by default and never takes small or unsupported calls; the workspace holds the
// bookkeeping plus one bf16 copy of every expert.
TEST(CudaMoePrefillDequantHost, SwitchAndWorkspace) {
  const kc::MoeShape air{8192, 4096, 1408, 128, 8};
  if (!kc::kMoePrefillDequantDefault && std::getenv("MXSERVE_MOE_PREFILL_DEQUANT") == nullptr) {
    EXPECT_FALSE(kc::moe_prefill_dequant_enabled(air, false)) << "off by default";
  }
  kc::MoeShape small = air;
  small.n_tokens = kc::kMoePrefillDequantMinTokens - 1;
  EXPECT_FALSE(kc::moe_prefill_dequant_enabled(small, true)) << "below the token threshold";
  kc::MoeShape odd = air;
  odd.inter = 1408 + 32;
  EXPECT_FALSE(kc::moe_prefill_dequant_supports(odd));
  EXPECT_FALSE(kc::moe_prefill_dequant_enabled(odd, true));
  EXPECT_TRUE(kc::moe_prefill_dequant_supports(air));
  const size_t copies = 2ull * 128 * (2 * 1408 * 4096 + 4096 * 1408);
  const size_t ws = kc::moe_prefill_dequant_workspace_bytes(air);
  EXPECT_GE(ws, copies);
  EXPECT_LE(ws, copies + kc::moe_mxfp4_workspace_bytes(air) + 4096);
  kc::MoeShape glm52{8192, 6144, 2048, 256, 8};  // 18 GiB of copies: every expert has room (indexed by id)
  EXPECT_GE(kc::moe_prefill_dequant_workspace_bytes(glm52), 2ull * 256 * 3 * 2048 * 6144);
}

// Host-only: the bf16 grouped GEMM's tile schedule (moe_bf16_wg_schedule.h, the kernel's own function) covers
// every (expert, weight tile, row tile) of a routing exactly once inside the launch bound ceil(P / 128) + min(E, P)
// tiles x NT, row tiles innermost, and nothing past it -- on routings with empty, single-row and hot experts.
TEST(CudaMoePrefillDequantHost, TileScheduleCoversEveryTileOnce) {
  std::mt19937_64 rng(17);
  for (int trial = 0; trial < 40; ++trial) {
    const int E = 1 + static_cast<int>(rng() % 300), NT = 1 + static_cast<int>(rng() % 24);
    std::vector<int32_t> count(E), off(E + 1, 0);
    int64_t P = 0;
    for (int e = 0; e < E; ++e) {
      const uint64_t kind = rng() % 6;
      count[e] = kind == 0 ? 0 : kind == 1 ? 1 : kind == 2 ? static_cast<int32_t>(rng() % 2000) : static_cast<int32_t>(rng() % 300);
      P += count[e];
      off[e + 1] = off[e] + (count[e] + 127) / 128;
    }
    const int64_t max_tiles = (P + 127) / 128 + std::min<int64_t>(E, P);
    ASSERT_LE(off[E], max_tiles) << "trial " << trial;
    std::vector<int> seen;  // index: (off[e] + mtile) * NT + wtile
    seen.assign(static_cast<size_t>(off[E]) * NT, 0);
    int bad = 0;
    for (int64_t t = 0; t < max_tiles * NT; ++t) {
      const kc::MoeBf16WgTile tl = kc::moe_bf16_wg_tile(t, off.data(), E, NT);
      if (t >= static_cast<int64_t>(off[E]) * NT) {
        bad += tl.valid ? 1 : 0;
        continue;
      }
      if (!tl.valid || tl.expert < 0 || tl.expert >= E || tl.wtile < 0 || tl.wtile >= NT || tl.mtile < 0 ||
          128 * tl.mtile >= count[tl.expert]) {
        ++bad;
        continue;
      }
      ++seen[(static_cast<size_t>(off[tl.expert]) + tl.mtile) * NT + tl.wtile];
      if (t > 0) {  // row tiles innermost: the previous tile is the same weight tile's previous row tile
        const kc::MoeBf16WgTile pv = kc::moe_bf16_wg_tile(t - 1, off.data(), E, NT);
        if (tl.mtile > 0 && !(pv.expert == tl.expert && pv.wtile == tl.wtile && pv.mtile == tl.mtile - 1)) ++bad;
      }
    }
    const int64_t once = std::count(seen.begin(), seen.end(), 1);
    EXPECT_EQ(bad, 0) << "trial " << trial << " E " << E << " NT " << NT;
    EXPECT_EQ(once, static_cast<int64_t>(seen.size())) << "trial " << trial << ": a tile missed or repeated";
  }
}

// The CPU backend itself as the oracle, whole output, on a small shape (d_model, inter % 128 == 0).
TEST(CudaMoePrefillDequant, SmallShapeVsCpuBackend) {
  if (!have_sm90()) GTEST_SKIP() << "needs an sm_90 device (wgmma)";
  const ms::Shape s{"small", 256, 128, 6, 3};
  const ms::Model model(s, 7);
  std::mt19937_64 rng(9);
  const ms::Batch b = ms::make_batch(s, 1100, s.E, -1, rng);
  const Tensor ref_t = moe_oracle::cpu_moe_reference(s, model.gate_up, model.down, b);
  const std::vector<double> ref(ref_t.data<float>(), ref_t.data<float>() + ref_t.numel());

  ms::DeviceBatch db(s, b);
  DequantRunner dq(s, b.T);
  for (const GemmKernel& k : kKernels) {
    dq.run(model, db, k.plan, nullptr);
    MX_CUDA_CHECK(cudaDeviceSynchronize());
    MX_CUDA_CHECK(cudaGetLastError());
    const std::vector<double> got = moe_oracle::bf16_to_f64(db.out_host());
    double max_abs = 0;
    const double err = rel_l2(got, ref, &max_abs);
    std::printf("%s small E6 H256 I128 top 3, M=1100, %s vs CPU backend: rel_l2 %.3g max_abs %.3g\n",
                err <= kTol && moe_oracle::all_finite_nonzero(got) ? "PASS" : "FAIL", k.name, err, max_abs);
    std::fflush(stdout);
    EXPECT_LE(err, kTol) << k.name;
    EXPECT_TRUE(moe_oracle::all_finite_nonzero(got)) << k.name;
  }
}

TEST(CudaMoePrefillDequant, GlmAir) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device: run on the GPU machine";
  if (!have_sm90()) GTEST_SKIP() << "not an sm_90 device: the dequant path needs wgmma";
  run_shape(ms::kGlmAir, cases());
}

TEST(CudaMoePrefillDequant, Glm52) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device: run on the GPU machine";
  if (!have_sm90()) GTEST_SKIP() << "not an sm_90 device: the dequant path needs wgmma";
  run_shape(ms::kGlm52, cases());
}

}  // namespace
}  // namespace mxserve
