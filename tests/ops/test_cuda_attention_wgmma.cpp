// The Hopper wgmma prefill attention kernel "wgmma_ws" (kernels/cuda/attention/paged_attention_wgmma_ws.cu, the
// warp-specialized one; issue 31 retired the first wgmma kernel, "wgmma") against the CPU reference attention
// and against the mma.sync block-shared kernel, its oracle at sizes the CPU reference cannot afford (label gpu;
// the device tests skip without a CUDA device, or without an sm_90 one: the kernel is Hopper-only):
//   planner   host-only: tree masks and head_dim != 128 never get the wgmma kernel, forced or not; an FP8 cache
//             gets the kernel a bf16 one gets; auto picks wgmma_ws on an sm_90 device for long chunks; forcing the
//             retired "wgmma" is an error.
//   cpu       ragged batches of several sequences (runs of rows of different sequences inside one 128-row
//             block), one-token chunks, chunks of 1..300 rows over prefixes not multiples of the 128-key tile or
//             of the cache block, cache blocks of 16 and 32, scattered (shuffled) block tables; against the CPU
//             reference within kTolBf16 = 4e-3 rel L2 (tests/ops/test_cuda_ops.cpp's attention budget), and
//             against the shared kernel.
//   big       GLM-4.5-Air heads (96 / 8 / 128): an 8192-row chunk over a 12288-key prefix and 4 x 2048-row chunks
//             against the shared kernel (kTolKernels = 6e-3: two bf16-rounded outputs; the CPU reference would
//             take minutes), plus a 3000-row chunk over 5000 keys at 2 heads against the CPU reference.
//   fp8       the same big shapes over an FP8 E4M3 cache (codes and scales written by the CUDA kv_write from the
//             bf16 K/V): wgmma_ws against the shared kernel on the same codes (both dequantize with fp8x8_to_bf16,
//             so the bf16 tiles are bit for bit equal: kTolKernels), and against the bf16 cache's output (the FP8
//             quantization itself: kTolFp8Quant). The small FP8 shapes vs the CPU are in test_cuda_kv_fp8.
// Each case prints one PASS / FAIL line with rel-L2 and max abs error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "backend/backend.h"
#include "backend/cuda_backend.h"
#include "core/numeric.h"
#include "kernels/cuda/attention/paged_attention_wgmma.h"
#include "kernels/cuda/cuda_kernels.h"
#include "model/forward_batch.h"
#include "gpu_oracle.h"

namespace mxserve {
namespace {

namespace kc = kernels::cuda;
using Force = kc::AttentionPlanOptions::Force;

constexpr double kTolBf16 = 4e-3;
constexpr double kTolKernels = 6e-3;
// FP8 cache vs bf16 cache output: the e4m3 quantization of K and V (3 mantissa bits), a gross check that the
// scales are applied (a missing or misplaced scale is off by orders of magnitude), not the kernel's oracle.
constexpr double kTolFp8Quant = 5e-2;
constexpr int kH200Sms = 132;

struct Seq {
  int32_t rows, prefix;  // new rows of the chunk, cached keys before it
};
struct Case {
  int nh, kvh;
  int64_t bs;
  std::vector<Seq> seqs;
  bool cpu_ref;  // false: the shared kernel is the reference (too large for the CPU)
  const char* what;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {96, 8, 16, {{300, 0}}, true, "Air heads: one 300-row chunk from position 0"},
      {96, 8, 16, {{1, 0}, {77, 35}, {129, 1000}, {300, 17}}, true, "Air heads: ragged 4 seqs, a one-token chunk"},
      {16, 2, 16, {{5, 123}, {64, 64}, {127, 129}, {128, 4095}, {200, 7}, {33, 1}, {1, 4000}}, true,
       "7 seqs, chunks 1..200 over prefixes off tile/block"},
      {16, 2, 32, {{250, 333}, {131, 2}, {17, 95}}, true, "cache block 32, chunks over odd prefixes"},
      {8, 1, 16, {{1, 0}}, true, "one token from position 0"},
      {12, 1, 16, {{129, 127}, {128, 128}, {255, 1}}, true, "GQA 12:1, chunks at tile edges"},
      {2, 1, 16, {{3000, 5000}}, true, "3000-row chunk over 5000 keys (2 heads)"},
      {96, 8, 16, {{8192, 12288}}, false, "Air heads: 8192-row chunk over 12288 prefix"},
      {96, 8, 16, {{2048, 0}, {2048, 1000}, {2048, 5}, {2048, 3333}}, false, "Air heads: 4 x 2048-row chunks"},
  };
  return c;
}

// The case's forward batch: blocks shuffled over the whole cache (scattered tables).
model::ForwardBatch batch_of(const Case& c, std::mt19937& rng, int64_t* n_blocks) {
  std::vector<gpu_oracle::PagedSpan> spans;
  for (const Seq& s : c.seqs) spans.push_back({s.rows, s.prefix + s.rows});
  return gpu_oracle::paged_batch(spans, c.bs, 5, rng, n_blocks);
}

kernels::AttentionParams shape_of(int nh, int kvh, int hd) { return gpu_oracle::attention_shape(nh, kvh, hd); }

using gpu_oracle::compare;
using gpu_oracle::Err;

// Host-only: the shapes the wgmma kernel does not serve stay on the mma.sync kernels, forced or not; an FP8 cache
// is served as a bf16 one.
TEST(AttentionWgmmaPlan, UnservedShapesKeepTheMmaKernels) {
  kernels::AttentionParams p = shape_of(96, 8, 128);
  p.n_tokens = 8192;
  p.n_seqs = 1;
  p.block_size = 16;
  p.max_blocks_per_seq = 1280;
  p.max_kv_len = 20480;
  for (Force f : {Force::kAuto, Force::kWgmmaWs}) {
    kc::AttentionPlanOptions o;
    o.force = f;
    kernels::AttentionParams fp8 = p;
    float dummy = 0;
    fp8.k_scales = fp8.v_scales = &dummy;
    EXPECT_EQ(kc::plan_paged_attention(fp8, kH200Sms, o).kernel, kc::plan_paged_attention(p, kH200Sms, o).kernel)
        << "fp8 cache";
    kernels::AttentionParams hd64 = shape_of(96, 8, 64);
    hd64.n_tokens = p.n_tokens;
    hd64.n_seqs = 1;
    hd64.block_size = 16;
    EXPECT_EQ(kc::plan_paged_attention(hd64, kH200Sms, o).kernel, kc::AttentionKernel::kShared) << "head_dim 64";
    kernels::AttentionParams tree = p;
    uint64_t mask = 1;
    int32_t base = 0;
    tree.tree_mask = &mask;
    tree.tree_base = &base;
    EXPECT_EQ(kc::plan_paged_attention(tree, kH200Sms, o).kernel, kc::AttentionKernel::kWarp) << "tree mask";
  }
  // An FP8 cache on wgmma_ws is dequantized once where the scratch holds every sequence at the longest context
  // (1 x 20480 keys of 16-key blocks), and keeps the per-tile dequantization beyond it (4 x 20480 > 65536 slots)
  // or where the comparison option asks for it.
  {
    kc::AttentionPlanOptions o;
    o.force = Force::kWgmmaWs;
    kernels::AttentionParams fp8 = p;
    float dummy = 0;
    fp8.k_scales = fp8.v_scales = &dummy;
    const kc::AttentionLaunch one = kc::plan_paged_attention(fp8, kH200Sms, o);
    if (one.kernel == kc::AttentionKernel::kWgmmaWs) {  // an sm_90 device
      EXPECT_TRUE(one.fp8_dequant_once);
      EXPECT_GE(one.workspace_bytes, size_t{2} * kc::kFp8DequantOnceSlots * 8 * 128 * 2);
      EXPECT_FALSE(kc::plan_paged_attention(p, kH200Sms, o).fp8_dequant_once) << "bf16 cache";
      kernels::AttentionParams four = fp8;
      four.n_seqs = 4;
      four.n_tokens = 4 * 2048;
      EXPECT_GT(kc::fp8_dequant_once_slots(four), kc::kFp8DequantOnceSlots);
      const kc::AttentionLaunch over = kc::plan_paged_attention(four, kH200Sms, o);
      EXPECT_EQ(over.kernel, kc::AttentionKernel::kWgmmaWs);
      EXPECT_FALSE(over.fp8_dequant_once) << "over the scratch";
      EXPECT_EQ(over.workspace_bytes, 0u);
      o.fp8_prefill = kc::AttentionPlanOptions::Fp8Prefill::kFused;
      EXPECT_FALSE(kc::plan_paged_attention(fp8, kH200Sms, o).fp8_dequant_once) << "fused asked for";
    }
  }
  // Short chunks (< 64 rows per sequence) keep the shared kernel on every device.
  kernels::AttentionParams short_chunks = p;
  short_chunks.n_tokens = 40 * 8;
  short_chunks.n_seqs = 8;
  EXPECT_EQ(kc::plan_paged_attention(short_chunks, kH200Sms).kernel, kc::AttentionKernel::kShared);
  // Auto picks the warp-specialized kernel (wgmma_ws, 1.35-1.59x the retired wgmma kernel on the H200:
  // docs/perf/prefill.md) where it serves the batch (an sm_90 device), else the shared kernel.
  const kc::AttentionKernel auto_kernel = kc::plan_paged_attention(p, kH200Sms).kernel;
  EXPECT_TRUE(auto_kernel == kc::AttentionKernel::kWgmmaWs || auto_kernel == kc::AttentionKernel::kShared)
      << kc::attention_kernel_name(auto_kernel);
  kc::AttentionPlanOptions ws;
  ws.force = Force::kWgmmaWs;
  const kc::AttentionKernel forced_ws = kc::plan_paged_attention(p, kH200Sms, ws).kernel;
  EXPECT_TRUE(forced_ws == kc::AttentionKernel::kWgmmaWs || forced_ws == kc::AttentionKernel::kShared)
      << kc::attention_kernel_name(forced_ws);
  std::printf("[ plan     ] bf16 8192-row chunk, forced wgmma_ws: %s\n", kc::attention_kernel_name(forced_ws));
  std::printf("[ plan     ] bf16 8192-row chunk, auto: %s (wgmma_ws on an sm_90 device, shared elsewhere)\n",
              kc::attention_kernel_name(kc::plan_paged_attention(p, kH200Sms).kernel));
}

class CudaAttentionWgmma : public gpu_oracle::CudaVsCpuTest {
 protected:
  CudaAttentionWgmma() : CudaVsCpuTest(20261202) {}
  void SetUp() override {
    CudaVsCpuTest::SetUp();
    if (IsSkipped()) return;
    kernels::AttentionParams p = shape_of(96, 8, 128);
    p.n_tokens = 8192;
    p.n_seqs = 1;
    p.block_size = 16;
    kc::AttentionPlanOptions o;
    o.force = Force::kWgmmaWs;
    if (kc::plan_paged_attention(p, kH200Sms, o).kernel != kc::AttentionKernel::kWgmmaWs)
      GTEST_SKIP() << "the wgmma attention kernel needs an sm_90 (Hopper) device";
    EXPECT_EQ(kc::plan_paged_attention(p, kH200Sms).kernel, kc::AttentionKernel::kWgmmaWs);
  }
  Tensor gpu_random(Shape s, float scale) {
    Tensor d = gpu_->alloc(DType::kBF16, std::move(s));
    kc::fill_random_bf16(d.raw(), d.numel(), seed_++, scale, backend::cuda_backend_stream(*gpu_));
    return d;
  }
  // The GPU output (host f32) of one forced kernel.
  Tensor run_kernel(const char* kernel, const Tensor& q, const Tensor& k, const Tensor& v,
                    const backend::AttentionMeta& meta, int64_t T, int64_t width, const char* fp8_prefill = "") {
    backend::KernelOptions forced;
    forced.attention_kernel = kernel;
    forced.attention_fp8_prefill = fp8_prefill;
    EXPECT_TRUE(gpu_->set_kernel_options(forced).is_ok());
    Tensor out = poison_bf16({T, width});
    gpu_->attention(q, k, v, meta, out);
    EXPECT_TRUE(gpu_->set_kernel_options({}).is_ok());
    return gpu_->to_host(out);
  }

  void run_cases(bool cpu_ref);
  void run_fp8_cases();

  uint64_t seed_ = 11;
};

void CudaAttentionWgmma::run_cases(bool cpu_ref) {
  constexpr int hd = 128;
  for (const Case& c : cases()) {
    if (c.cpu_ref != cpu_ref) continue;
    SCOPED_TRACE(c.what);
    int64_t n_blocks = 0;
    const model::ForwardBatch batch = batch_of(c, rng_, &n_blocks);
    ASSERT_TRUE(batch.validate(1, n_blocks, c.bs).is_ok());
    const int64_t T = batch.n_tokens(), n_slots = n_blocks * c.bs, width = static_cast<int64_t>(c.nh) * hd;
    auto gmeta = model::build_attention_meta(batch, *gpu_, c.bs, shape_of(c.nh, c.kvh, hd)).value();
    Tensor gq, gk, gv, ref;
    if (c.cpu_ref) {
      auto cmeta = model::build_attention_meta(batch, *cpu_, c.bs, shape_of(c.nh, c.kvh, hd)).value();
      Tensor k = rand_heads(n_slots, c.kvh, hd, -1, 0), v = rand_heads(n_slots, c.kvh, hd, -3, 1);
      Tensor q = rand_heads(T, c.nh, hd, -1, 0);
      ref = cpu_->alloc(DType::kF32, {T, width});
      cpu_->attention(q, k, v, cmeta, ref);
      gq = gpu_bf16(q);
      gk = gpu_bf16(k);
      gv = gpu_bf16(v);
    } else {
      gq = gpu_random({T, width}, 1.f);
      gk = gpu_random({n_slots, static_cast<int64_t>(c.kvh) * hd}, 1.f);
      gv = gpu_random({n_slots, static_cast<int64_t>(c.kvh) * hd}, 2.f);
    }
    const Tensor shared = run_kernel("shared", gq, gk, gv, gmeta, T, width);
    Err shared_vs_cpu{};
    if (c.cpu_ref) shared_vs_cpu = compare(shared, ref);
    const kc::AttentionBatchPlan plan = kc::plan_paged_attention_batch(gmeta.params, kH200Sms);
    const char* auto_kernel = kc::attention_kernel_name(plan.parts[plan.n_parts - 1].launch.kernel);
    for (const char* kernel : {"wgmma_ws"}) {
      SCOPED_TRACE(kernel);
      const Tensor got = run_kernel(kernel, gq, gk, gv, gmeta, T, width);
      const Err vs_shared = compare(got, shared);
      bool pass = vs_shared.rel_l2 <= kTolKernels;
      Err vs_cpu{};
      if (c.cpu_ref) {
        vs_cpu = compare(got, ref);
        pass = pass && vs_cpu.rel_l2 <= kTolBf16;
        EXPECT_LE(vs_cpu.rel_l2, kTolBf16);
      }
      EXPECT_LE(vs_shared.rel_l2, kTolKernels);
      if (c.cpu_ref)
        std::printf("[ %s ] %-8s %-52s T %-6lld vs cpu rel_l2 %.3e max_abs %.3e (shared: %.3e) | vs shared rel_l2 "
                    "%.3e max_abs %.3e | auto %s\n",
                    pass ? "PASS" : "FAIL", kernel, c.what, static_cast<long long>(T), vs_cpu.rel_l2, vs_cpu.max_abs,
                    shared_vs_cpu.rel_l2, vs_shared.rel_l2, vs_shared.max_abs, auto_kernel);
      else
        std::printf("[ %s ] %-8s %-52s T %-6lld vs shared rel_l2 %.3e max_abs %.3e (tol %.0e) | auto %s\n",
                    pass ? "PASS" : "FAIL", kernel, c.what, static_cast<long long>(T), vs_shared.rel_l2,
                    vs_shared.max_abs, kTolKernels, auto_kernel);
    }
  }
}

void CudaAttentionWgmma::run_fp8_cases() {
  constexpr int hd = 128;
  std::vector<Case> fp8_cases;
  for (const Case& c : cases())
    if (!c.cpu_ref) fp8_cases.push_back(c);
  fp8_cases.push_back({96, 8, 16, {{1, 0}, {77, 35}, {129, 1000}, {300, 17}}, false, "Air heads: ragged 4 seqs"});
  fp8_cases.push_back({16, 2, 32, {{250, 333}, {131, 2}, {17, 95}}, false, "cache block 32, chunks over odd prefixes"});
  for (const Case& c : fp8_cases) {
    SCOPED_TRACE(c.what);
    int64_t n_blocks = 0;
    const model::ForwardBatch batch = batch_of(c, rng_, &n_blocks);
    ASSERT_TRUE(batch.validate(1, n_blocks, c.bs).is_ok());
    const int64_t T = batch.n_tokens(), n_slots = n_blocks * c.bs, width = static_cast<int64_t>(c.nh) * hd;
    const int64_t kv_width = static_cast<int64_t>(c.kvh) * hd;
    auto meta16 = model::build_attention_meta(batch, *gpu_, c.bs, shape_of(c.nh, c.kvh, hd)).value();
    Tensor gq = gpu_random({T, width}, 1.f), gk = gpu_random({n_slots, kv_width}, 1.f),
           gv = gpu_random({n_slots, kv_width}, 2.f);
    // The FP8 cache of the same K / V: every slot written by the CUDA kv_write (per slot and kv head scales).
    Tensor k8 = gpu_->alloc(DType::kFP8E4M3, {n_slots, kv_width}), v8 = gpu_->alloc(DType::kFP8E4M3, {n_slots, kv_width});
    Tensor ks = gpu_->alloc(DType::kF32, {n_slots, c.kvh}), vs = gpu_->alloc(DType::kF32, {n_slots, c.kvh});
    std::vector<int32_t> all(n_slots);
    std::iota(all.begin(), all.end(), 0);
    backend::AttentionMeta wm;
    wm.slot_mapping = gpu_->upload(Tensor::view_of(all.data(), DType::kI32, {n_slots}));
    wm.params = shape_of(c.nh, c.kvh, hd);
    wm.params.k_scales = ks.data<float>();
    wm.params.v_scales = vs.data<float>();
    gpu_->kv_write(gk, gv, wm, k8, v8);
    auto meta8 = meta16;
    meta8.params.k_scales = ks.data<float>();
    meta8.params.v_scales = vs.data<float>();
    kc::AttentionPlanOptions forced;
    forced.force = Force::kWgmmaWs;
    const kc::AttentionBatchPlan plan = kc::plan_paged_attention_batch(meta8.params, kH200Sms, forced);
    ASSERT_EQ(plan.parts[plan.n_parts - 1].launch.kernel, kc::AttentionKernel::kWgmmaWs) << "FP8 cache not on wgmma_ws";
    EXPECT_TRUE(plan.parts[plan.n_parts - 1].launch.fp8_dequant_once) << "the scratch holds every test shape";
    const kc::AttentionBatchPlan auto_plan = kc::plan_paged_attention_batch(meta8.params, kH200Sms);
    const Tensor shared8 = run_kernel("shared", gq, k8, v8, meta8, T, width);
    const Tensor ws8 = run_kernel("wgmma_ws", gq, k8, v8, meta8, T, width);  // dequantized once (the default)
    const Tensor fused8 = run_kernel("wgmma_ws", gq, k8, v8, meta8, T, width, "fused");
    // The planner's own plan: a leading one-row sequence goes to the decode kernel, the rest (its rows' table
    // rows starting past 0) to the dequantize-once path.
    const Tensor auto8 = run_kernel("", gq, k8, v8, meta8, T, width);
    const Tensor ws16 = run_kernel("wgmma_ws", gq, gk, gv, meta16, T, width);
    const Err vs_shared = compare(ws8, shared8), vs_bf16 = compare(ws8, ws16);
    const Err fused_vs_shared = compare(fused8, shared8), once_vs_fused = compare(ws8, fused8);
    const Err auto_vs_shared = compare(auto8, shared8);
    // Both wgmma paths feed the same bf16 tiles (fp8x16_to_bf16) to the same consumer code: equal outputs.
    const bool pass = vs_shared.rel_l2 <= kTolKernels && vs_bf16.rel_l2 <= kTolFp8Quant &&
                      fused_vs_shared.rel_l2 <= kTolKernels && once_vs_fused.rel_l2 <= kTolKernels &&
                      auto_vs_shared.rel_l2 <= kTolKernels;
    EXPECT_LE(vs_shared.rel_l2, kTolKernels);
    EXPECT_LE(vs_bf16.rel_l2, kTolFp8Quant);
    EXPECT_LE(fused_vs_shared.rel_l2, kTolKernels);
    EXPECT_LE(once_vs_fused.rel_l2, kTolKernels);
    EXPECT_LE(auto_vs_shared.rel_l2, kTolKernels);
    std::printf("[ %s ] wgmma_ws fp8 %-48s T %-6lld dequantized once vs shared fp8 rel_l2 %.3e max_abs %.3e (tol "
                "%.0e) | fused vs shared %.3e | once vs fused max_abs %.3e (same tiles) | auto (%d part%s) vs shared "
                "%.3e | vs bf16 cache rel_l2 %.3e (quantization, tol %.0e)\n",
                pass ? "PASS" : "FAIL", c.what, static_cast<long long>(T), vs_shared.rel_l2, vs_shared.max_abs,
                kTolKernels, fused_vs_shared.rel_l2, once_vs_fused.max_abs, auto_plan.n_parts,
                auto_plan.n_parts > 1 ? "s" : "", auto_vs_shared.rel_l2, vs_bf16.rel_l2, kTolFp8Quant);
  }
}

// Forcing the retired first wgmma kernel is an error naming its replacement (no silent fallback).
TEST_F(CudaAttentionWgmma, RetiredWgmmaForceIsRefused) {
  const Status s = gpu_->set_kernel_options({.attention_kernel = "wgmma"});
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.to_string().find("wgmma_ws"), std::string::npos) << s.to_string();
  EXPECT_TRUE(gpu_->set_kernel_options({.attention_kernel = "wgmma_ws"}).is_ok());
  EXPECT_TRUE(gpu_->set_kernel_options({}).is_ok());
}

// Small and ragged batches against the CPU reference (and the shared kernel); quick enough for compute-sanitizer.
TEST_F(CudaAttentionWgmma, MatchesCpuReference) { run_cases(true); }
// GLM-4.5-Air prefill sizes against the shared kernel.
TEST_F(CudaAttentionWgmma, LargeMatchesSharedKernel) { run_cases(false); }
// An FP8 E4M3 cache: wgmma_ws (the producer dequantizes) against the shared kernel on the same codes.
TEST_F(CudaAttentionWgmma, Fp8CacheMatchesSharedKernel) { run_fp8_cases(); }

}  // namespace
}  // namespace mxserve
