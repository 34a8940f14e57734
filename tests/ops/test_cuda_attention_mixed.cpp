// Mixed attention batches (plain decode rows first, then a prefill chunk) on CUDA against the CPU reference,
// bf16 and FP8 E4M3 caches (label gpu; the device tests skip without a CUDA device):
//   planner      a mixed batch the whole-batch planner sends to the block-shared kernel (or whose chunk alone
//                would take it) is split: the leading decode rows run the per-warp kernel with a split-KV plan,
//                the rest the shared kernel; forcing a kernel keeps one launch (the old path). Host-only: runs
//                without a device.
//   attention    the split path, the forced shared path (old) and the forced per-warp path, each against the
//                CPU reference: kTolBf16 = 4e-3 rel L2 (tests/ops/test_cuda_ops.cpp's attention budget),
//                kTolFp8 = 8e-3 (tests/ops/test_cuda_kv_fp8.cpp: one more bf16 rounding of each K and V).
// Decode rows reach 20k keys (the seed workload's contexts) in a small head geometry and 8k keys in
// GLM-4.5-Air's (96 / 8 / 128), so the CPU reference stays a few seconds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "backend/backend.h"
#include "core/numeric.h"
#include "kernels/cuda/cuda_kernels.h"
#include "model/forward_batch.h"
#include "gpu_oracle.h"

namespace mxserve {
namespace {

namespace kc = kernels::cuda;

constexpr double kTolBf16 = 4e-3;
constexpr double kTolFp8 = 8e-3;
constexpr int kH200Sms = 132;

struct MixedCase {
  int nh, kvh, hd;
  std::vector<int32_t> decode_ctx;  // one decode row per sequence, at these context lengths
  int32_t prefill_rows, prefill_kv_len;
  const char* what;
};

// n contexts first, first + step, ...
std::vector<int32_t> ramp(int n, int32_t first, int32_t step) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(first + step * i);
  return v;
}

const std::vector<MixedCase>& mixed_cases() {
  static const std::vector<MixedCase> cases = {
      {8, 2, 128, {20000, 1, 17, 19000, 4096, 300, 20000, 64, 12000, 5000, 8191, 8193}, 160, 1200,
       "12 decode rows to 20k + a 160-token chunk"},
      {96, 8, 128, {8192, 1, 3000, 700, 6000, 129, 4000, 8000}, 96, 640,
       "GLM-4.5-Air heads: 8 decode rows to 8k + a 96-token chunk"},
      {32, 2, 64, {5000, 2, 2500}, 40, 40, "head_dim 64: 3 decode rows + a 40-token prompt from position 0"},
      {8, 2, 128, ramp(30, 1, 200), 200, 2000, "30 decode rows + a 200-token chunk (whole batch: warp)"},
  };
  return cases;
}

// The forward batch of a case: decode spans first (as the scheduler orders them), then the prefill chunk;
// blocks shuffled over the whole cache.
model::ForwardBatch mixed_batch(const MixedCase& c, int64_t bs, std::mt19937& rng, int64_t* n_blocks) {
  std::vector<gpu_oracle::PagedSpan> spans;
  for (int32_t ctx : c.decode_ctx) spans.push_back({1, ctx});
  spans.push_back({c.prefill_rows, c.prefill_kv_len});
  return gpu_oracle::paged_batch(spans, bs, 3, rng, n_blocks);
}

kernels::AttentionParams shape_of(const MixedCase& c) { return gpu_oracle::attention_shape(c.nh, c.kvh, c.hd); }

// Host-only: the planner's choice for each case's metadata (built on the CPU backend: the same params).
TEST(AttentionMixedPlan, LeadingDecodeRowsGetTheDecodeKernel) {
  auto cpu = backend::make_cpu_backend();
  std::mt19937 rng(1);
  for (const MixedCase& c : mixed_cases()) {
    SCOPED_TRACE(c.what);
    int64_t n_blocks = 0;
    const model::ForwardBatch batch = mixed_batch(c, 16, rng, &n_blocks);
    const auto meta = model::build_attention_meta(batch, *cpu, 16, shape_of(c)).value();
    const kernels::AttentionParams& p = meta.params;
    const int32_t n_dec = static_cast<int32_t>(c.decode_ctx.size());
    ASSERT_EQ(p.n_leading_decode_rows, n_dec);
    // The whole batch is prefill-like (>= 8 rows per sequence) except in the last case, where only the chunk is.
    const bool whole_shared = p.n_tokens >= 8 * p.n_seqs;
    EXPECT_EQ(kc::plan_paged_attention(p, kH200Sms).kernel,
              whole_shared ? kc::AttentionKernel::kShared : kc::AttentionKernel::kWarp);
    const kc::AttentionBatchPlan plan = kc::plan_paged_attention_batch(p, kH200Sms);
    ASSERT_EQ(plan.n_parts, 2);
    const kc::AttentionBatchPart &dec = plan.parts[0], &rest = plan.parts[1];
    EXPECT_EQ(dec.row_begin, 0);
    EXPECT_EQ(dec.params.n_tokens, n_dec);
    EXPECT_EQ(dec.params.n_seqs, n_dec);
    EXPECT_EQ(dec.launch.kernel, kc::AttentionKernel::kWarp);
    EXPECT_EQ(rest.row_begin, n_dec);
    EXPECT_EQ(rest.params.n_tokens, c.prefill_rows);
    EXPECT_EQ(rest.params.n_seqs, 1);
    EXPECT_EQ(rest.launch.kernel, kc::AttentionKernel::kShared);
    EXPECT_EQ(plan.workspace_bytes, std::max(dec.launch.workspace_bytes, rest.launch.workspace_bytes));
    if (*std::max_element(c.decode_ctx.begin(), c.decode_ctx.end()) >= 8192) {
      EXPECT_GT(dec.launch.n_splits, 1) << "long decode rows get split-KV";
    }
    std::printf("[ plan     ] %-62s decode %d rows warp x%d splits | rest %d rows %s x%d splits\n", c.what,
                dec.params.n_tokens, dec.launch.n_splits, rest.params.n_tokens,
                kc::attention_kernel_name(rest.launch.kernel), rest.launch.n_splits);
    // Forced kernels: one launch over the whole batch (the old path stays reachable).
    for (auto force : {kc::AttentionPlanOptions::Force::kShared, kc::AttentionPlanOptions::Force::kWarp}) {
      kc::AttentionPlanOptions o;
      o.force = force;
      EXPECT_EQ(kc::plan_paged_attention_batch(p, kH200Sms, o).n_parts, 1);
    }
    // No leading decode rows, or nothing but decode rows: one launch.
    kernels::AttentionParams none = p;
    none.n_leading_decode_rows = 0;
    EXPECT_EQ(kc::plan_paged_attention_batch(none, kH200Sms).n_parts, 1);
    kernels::AttentionParams all = p;
    all.n_leading_decode_rows = p.n_tokens;
    EXPECT_EQ(kc::plan_paged_attention_batch(all, kH200Sms).n_parts, 1);
  }
}

class CudaAttentionMixed : public gpu_oracle::CudaVsCpuTest {
 protected:
  CudaAttentionMixed() : CudaVsCpuTest(20261202) {}
  static double rel_l2(const Tensor& got, const Tensor& ref) { return gpu_oracle::rel_l2(got, ref); }
  void run(bool fp8);
};

void CudaAttentionMixed::run(bool fp8) {
  const int64_t bs = 16;
  for (const MixedCase& c : mixed_cases()) {
    SCOPED_TRACE(c.what);
    int64_t n_blocks = 0;
    const model::ForwardBatch batch = mixed_batch(c, bs, rng_, &n_blocks);
    ASSERT_TRUE(batch.validate(1, n_blocks, bs).is_ok());
    const int64_t T = batch.n_tokens(), n_slots = n_blocks * bs;
    auto cmeta = model::build_attention_meta(batch, *cpu_, bs, shape_of(c)).value();
    auto gmeta = model::build_attention_meta(batch, *gpu_, bs, shape_of(c)).value();
    Tensor k = rand_heads(n_slots, c.kvh, c.hd, -1, 0), v = rand_heads(n_slots, c.kvh, c.hd, -3, 1);
    Tensor ck, cv, gk, gv, cks, cvs, gks, gvs;
    if (fp8) {  // the CPU reference writes the FP8 bytes; both backends read the same codes and scales
      ck = Tensor::empty(DType::kFP8E4M3, {n_slots, c.kvh * c.hd});
      cv = Tensor::empty(DType::kFP8E4M3, {n_slots, c.kvh * c.hd});
      cks = Tensor::empty(DType::kF32, {n_slots, c.kvh});
      cvs = Tensor::empty(DType::kF32, {n_slots, c.kvh});
      std::vector<int32_t> all(n_slots);
      std::iota(all.begin(), all.end(), 0);
      backend::AttentionMeta m;
      m.slot_mapping = Tensor::view_of(all.data(), DType::kI32, {n_slots});
      m.params.n_kv_heads = c.kvh;
      m.params.head_dim = c.hd;
      m.params.k_scales = cks.data<float>();
      m.params.v_scales = cvs.data<float>();
      cpu_->kv_write(k, v, m, ck, cv);
      gk = gpu_->upload(ck);
      gv = gpu_->upload(cv);
      gks = gpu_->upload(cks);
      gvs = gpu_->upload(cvs);
      cmeta.params.k_scales = cks.data<float>();
      cmeta.params.v_scales = cvs.data<float>();
      gmeta.params.k_scales = gks.data<float>();
      gmeta.params.v_scales = gvs.data<float>();
    } else {
      ck = k;
      cv = v;
      gk = gpu_bf16(k);
      gv = gpu_bf16(v);
    }
    Tensor q = rand_heads(T, c.nh, c.hd, -1, 0);
    Tensor ref = cpu_->alloc(DType::kF32, {T, c.nh * c.hd});
    cpu_->attention(q, ck, cv, cmeta, ref);
    Tensor gq = gpu_bf16(q);
    const double tol = fp8 ? kTolFp8 : kTolBf16;
    // "": the split path (asserted by the planner test); "shared": the whole batch in the shared kernel (the
    // old path); "warp": the whole batch in the per-warp kernel.
    for (const char* kernel : {"", "shared", "warp"}) {
      SCOPED_TRACE(kernel);
      backend::KernelOptions forced;
      forced.attention_kernel = kernel;
      ASSERT_TRUE(gpu_->set_kernel_options(forced).is_ok());
      Tensor out = poison_bf16({T, c.nh * c.hd});
      gpu_->attention(gq, gk, gv, gmeta, out);
      ASSERT_TRUE(gpu_->set_kernel_options({}).is_ok());
      Tensor got = gpu_->to_host(out);
      const double e = rel_l2(got, ref);
      // The decode rows alone (the rows the split moves): a wrong offset shows here first.
      const int64_t dec_elems = static_cast<int64_t>(c.decode_ctx.size()) * c.nh * c.hd;
      const Tensor got_dec = Tensor::view_of(got.data<float>(), DType::kF32, {dec_elems});
      const Tensor ref_dec = Tensor::view_of(ref.data<float>(), DType::kF32, {dec_elems});
      const double e_dec = rel_l2(got_dec, ref_dec);
      const bool pass = e <= tol && e_dec <= tol;
      std::printf("[ %s ] %s mixed %-62s %-6s rel_l2 %.3e decode rows %.3e (tol %.0e)\n", pass ? "PASS" : "FAIL",
                  fp8 ? "fp8 " : "bf16", c.what, kernel[0] ? kernel : "split", e, e_dec, tol);
      EXPECT_LE(e, tol);
      EXPECT_LE(e_dec, tol);
    }
  }
}

TEST_F(CudaAttentionMixed, Bf16CacheMatchesCpu) { run(false); }
TEST_F(CudaAttentionMixed, Fp8CacheMatchesCpu) { run(true); }

}  // namespace
}  // namespace mxserve
