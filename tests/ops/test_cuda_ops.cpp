// Every CUDA op against the CPU reference backend on random inputs at small serving shapes and the edge
// cases docs/fixtures.md lists (1 token, ragged batches, KV block boundaries, context splits, experts
// with no tokens, all tokens on one expert, top_k == n_experts). Inputs are bf16-representable, so
// both backends see identical values; the CUDA outputs are poisoned (NaN) first, so an unwritten element
// fails. Tolerances, declared per op:
//   exact        embedding, gather_rows, kv_write (copies); router ids (inputs on an exact grid)
//   kTolBf16Out  4e-3 rel L2: ops whose only difference is the final bf16 rounding (~2^-9 / sqrt 3)
//   kTolGemm     1e-2 rel L2: GEMM-based ops with bf16 intermediates (MoE act and y)
//   kTolF32      1e-5 rel L2: f32 outputs from identical bf16 operands (logits GEMM, router weights)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <stdlib.h>

#include "backend/backend.h"
#include "core/numeric.h"
#include "model/forward_batch.h"
#include "gpu_oracle.h"

namespace mxserve {
namespace {

using backend::Backend;

constexpr double kTolBf16Out = 4e-3;
constexpr double kTolGemm = 1e-2;
constexpr double kTolF32 = 1e-5;

class CudaOps : public gpu_oracle::CudaVsCpuTest {
 protected:
  CudaOps() : CudaVsCpuTest(20261129) {}
};

void expect_exact(const Tensor& got, const Tensor& ref) {
  ASSERT_EQ(got.numel(), ref.numel());
  ASSERT_EQ(got.nbytes(), ref.nbytes());
  EXPECT_EQ(std::memcmp(got.raw(), ref.raw(), ref.nbytes()), 0);
}

// EXPECT_WITHIN (gpu_oracle.h) prints every measured error (docs/cuda.md's op test table comes from these lines).

// ---- copies: exact -------------------------------------------------------------------------------

TEST_F(CudaOps, EmbeddingExact) {
  for (int64_t T : {1, 37}) {
    for (int64_t H : {64, 4096}) {
      Tensor table = rand({300, H});
      Tensor ids = ints({T}, 0, 299);
      Tensor ref = cpu_->alloc(DType::kF32, {T, H});
      cpu_->embedding(cpu(table), ids, ref);
      Tensor out = poison(DType::kBF16, {T, H});
      gpu_->embedding(gpu_bf16(table), gpu_exact(ids), out);
      expect_exact(host(out), ref);
    }
  }
}

TEST_F(CudaOps, GatherRowsExact) {
  Tensor x = rand({10, 72});
  Tensor rows = ints({13}, 0, 9);
  Tensor ref = cpu_->alloc(DType::kF32, {13, 72});
  cpu_->gather_rows(cpu(x), rows, ref);
  Tensor out = poison(DType::kBF16, {13, 72});
  gpu_->gather_rows(gpu_bf16(x), gpu_exact(rows), out);
  expect_exact(host(out), ref);
  Tensor out32 = poison(DType::kF32, {13, 72});  // f32 rows (logits) too
  gpu_->gather_rows(gpu_exact(x), gpu_exact(rows), out32);
  expect_exact(host(out32), ref);
}

TEST_F(CudaOps, ArgmaxRowsExact) {
  // Vocabularies with and without 16-byte rows, ties (lowest index wins), one row and many.
  for (int64_t V : {151552, 1001, 7}) {
    for (int64_t R : {1, 37}) {
      Tensor x = rand({R, V});
      for (int64_t r = 0; r < R; r += 3) {  // plant a tie for the maximum
        float* row = x.data<float>() + r * V;
        const float m = *std::max_element(row, row + V) + 1.f;
        row[V - 1] = m;
        row[V / 2] = m;
      }
      Tensor ref = Tensor::empty(DType::kI32, {R});
      cpu_->argmax_rows(x, ref);
      Tensor init = Tensor::empty(DType::kI32, {R});
      for (int64_t r = 0; r < R; ++r) init.data<int32_t>()[r] = -1;
      Tensor out = gpu_->upload(init);
      gpu_->argmax_rows(gpu_exact(x), out);
      expect_exact(host(out), ref);
    }
  }
}

TEST_F(CudaOps, KvWriteExactAtBlockBoundaries) {
  const int64_t bs = 16, n_blocks = 6, width = 2 * 32;
  Tensor kc = rand({n_blocks * bs, width}), vc = rand({n_blocks * bs, width});
  // Slots 15/16 and 31/32 straddle block boundaries; the rest are random and distinct.
  std::vector<int32_t> slots = {15, 16, 31, 32, 0, 95, 47, 48, 63, 64, 70};
  const int64_t T = static_cast<int64_t>(slots.size());
  Tensor k = rand({T, width}), v = rand({T, width});
  backend::AttentionMeta cm, gm;
  Tensor sm = Tensor::view_of(slots.data(), DType::kI32, {T});
  cm.slot_mapping = cpu(sm);
  gm.slot_mapping = gpu_exact(sm);
  cm.params.n_kv_heads = gm.params.n_kv_heads = 2;
  cm.params.head_dim = gm.params.head_dim = 32;
  Tensor ck = cpu(kc), cv = cpu(vc), gk = gpu_bf16(kc), gv = gpu_bf16(vc);
  cpu_->kv_write(cpu(k), cpu(v), cm, ck, cv);
  gpu_->kv_write(gpu_bf16(k), gpu_bf16(v), gm, gk, gv);
  expect_exact(host(gk), ck);
  expect_exact(host(gv), cv);
}

// ---- elementwise ---------------------------------------------------------------------------------

TEST_F(CudaOps, RmsNorm) {
  struct Case {
    int64_t rows, cols;
    bool in_place;
  };
  // Block-per-row kernel up to 8192 columns (partial last chunk pass at 6144, in place at 8192), the
  // warp-per-row kernel beyond (8200).
  for (const Case& c : {Case{1, 64, false}, Case{7, 4096, false}, Case{33 * 4, 128, true}, Case{5, 32, true},
                        Case{1, 6144, false}, Case{3, 8192, true}, Case{2, 8200, false}}) {
    Tensor x = rand({c.rows, c.cols}, 3.f), w = rand({c.cols});
    Tensor ref = cpu_->alloc(DType::kF32, {c.rows, c.cols});
    cpu_->rmsnorm(cpu(x), cpu(w), 1e-5f, ref);
    Tensor gx = gpu_bf16(x);
    Tensor out = c.in_place ? gx : poison(DType::kBF16, {c.rows, c.cols});
    gpu_->rmsnorm(gx, gpu_bf16(w), 1e-5f, out);
    SCOPED_TRACE(testing::Message() << "rows " << c.rows << " cols " << c.cols);
    EXPECT_WITHIN(host(out), ref, kTolBf16Out);
  }
}

// Fused residual add + RMSNorm (kernels/cuda/add_rmsnorm.cu): bit for bit the CUDA add then rmsnorm (residual
// and out), and within the bf16 output tolerance of the CPU reference; out aliasing x; the two-kernel
// fallback beyond 8192 columns.
TEST_F(CudaOps, AddRmsNorm) {
  struct Case {
    int64_t rows, cols;
    bool out_is_x;
  };
  for (const Case& c : {Case{1, 6144, false}, Case{1, 5120, true}, Case{8, 6144, false}, Case{7, 4096, true},
                        Case{33, 128, false}, Case{5, 32, false}, Case{3, 8192, false}, Case{2, 8200, true}}) {
    SCOPED_TRACE(testing::Message() << "rows " << c.rows << " cols " << c.cols << (c.out_is_x ? " out = x" : ""));
    Tensor x = rand({c.rows, c.cols}, 3.f), res = rand({c.rows, c.cols}, 20.f), w = rand({c.cols});
    // CPU reference
    Tensor res_ref = cpu(res), ref = cpu_->alloc(DType::kF32, {c.rows, c.cols});
    cpu_->add_rmsnorm(cpu(x), res_ref, cpu(w), 1e-5f, ref);
    // CUDA two kernels
    Tensor gw = gpu_bf16(w);
    Tensor res2 = gpu_bf16(res), out2 = poison(DType::kBF16, {c.rows, c.cols});
    gpu_->add(res2, gpu_bf16(x));
    gpu_->rmsnorm(res2, gw, 1e-5f, out2);
    // CUDA fused
    Tensor gx = gpu_bf16(x), res1 = gpu_bf16(res);
    Tensor out1 = c.out_is_x ? gx : poison(DType::kBF16, {c.rows, c.cols});
    gpu_->add_rmsnorm(gx, res1, gw, 1e-5f, out1);
    expect_exact(gpu_->to_host(res1), gpu_->to_host(res2));
    expect_exact(gpu_->to_host(out1), gpu_->to_host(out2));
    EXPECT_WITHIN(host(res1), res_ref, kTolBf16Out);
    EXPECT_WITHIN(host(out1), ref, kTolBf16Out);
  }
}

TEST_F(CudaOps, RopePartialNeox) {
  struct Case {
    int64_t T;
    int nh, hd, rd;
  };
  for (const Case& c : {Case{1, 4, 32, 16}, Case{19, 4, 32, 16}, Case{9, 12, 128, 64}}) {
    Tensor x = rand({c.T, c.nh, c.hd});
    Tensor pos = ints({c.T}, 0, 32767);
    if (c.T == 1) pos.data<int32_t>()[0] = 0;
    kernels::RopeParams p;
    p.n_heads = c.nh;
    p.head_dim = c.hd;
    p.rotary_dim = c.rd;
    p.theta = c.hd == 128 ? 1000000.f : 10000.f;
    Tensor cx = cpu(x), gx = gpu_bf16(x);
    cpu_->rope(cx, pos, p);
    gpu_->rope(gx, gpu_exact(pos), p);
    SCOPED_TRACE(testing::Message() << "T " << c.T << " hd " << c.hd);
    EXPECT_WITHIN(host(gx), cx, kTolBf16Out);
  }
}

TEST_F(CudaOps, SiluMulAndAdd) {
  for (int64_t T : {1, 9}) {
    for (int64_t I : {32, 1408}) {
      Tensor gu = rand({T, 2 * I}, 4.f);
      Tensor ref = cpu_->alloc(DType::kF32, {T, I});
      cpu_->silu_mul(cpu(gu), ref);
      Tensor out = poison(DType::kBF16, {T, I});
      gpu_->silu_mul(gpu_bf16(gu), out);
      EXPECT_WITHIN(host(out), ref, kTolBf16Out);
    }
  }
  Tensor a = rand({17, 64}), b = rand({17, 64});
  Tensor ca = cpu(a), ga = gpu_bf16(a);
  cpu_->add(ca, cpu(b));
  gpu_->add(ga, gpu_bf16(b));
  EXPECT_WITHIN(host(ga), ca, kTolBf16Out);
}

// ---- GEMMs ---------------------------------------------------------------------------------------

TEST_F(CudaOps, Linear) {
  struct Case {
    int64_t m, n, k;
    bool bias, f32_out;
  };
  for (const Case& c : {Case{1, 64, 64, false, false}, Case{5, 96, 64, true, false}, Case{33, 4096, 512, true, false},
                        Case{64, 1000, 4096, false, false}, Case{3, 384, 64, false, true},
                        Case{1, 151552 / 16, 4096, false, true}}) {
    Tensor x = rand({c.m, c.k}), w = rand({c.n, c.k}, 0.05f), b = rand({c.n});
    Tensor ref = cpu_->alloc(DType::kF32, {c.m, c.n});
    Tensor cb = cpu(b);
    cpu_->linear(cpu(x), cpu(w), c.bias ? &cb : nullptr, ref);
    Tensor gb = gpu_bf16(b);
    Tensor out = poison(c.f32_out ? DType::kF32 : DType::kBF16, {c.m, c.n});
    gpu_->linear(gpu_bf16(x), gpu_bf16(w), c.bias ? &gb : nullptr, out);
    SCOPED_TRACE(testing::Message() << "M " << c.m << " N " << c.n << " K " << c.k << (c.bias ? " +bias" : "")
                                    << (c.f32_out ? " f32" : " bf16"));
    EXPECT_WITHIN(host(out), ref, c.f32_out ? kTolF32 : kTolBf16Out);
  }
}

// ---- attention -----------------------------------------------------------------------------------

struct SeqCase {
  int32_t n_tokens, kv_len;
};

struct AttnCase {
  int nh, kvh, hd;
  std::vector<SeqCase> seqs;
  const char* what;
};

TEST_F(CudaOps, PagedAttention) {
  const std::vector<AttnCase> cases = {
      {4, 2, 32, {{1, 1}}, "one token, context 1"},
      {4, 2, 32, {{1, 1}, {5, 37}, {16, 16}, {1, 17}, {3, 33}, {1, 300}}, "ragged, block boundaries"},
      {4, 2, 32, {{9, 9}, {20, 40}, {1, 5}, {12, 100}}, "prefill-like ragged: sequences straddle 8-token blocks"},
      {8, 2, 128, {{64, 64}, {1, 700}}, "prefill-like, short: shared kernel with context splits"},
      {8, 2, 128, {{1, 4096}, {1, 3000}}, "long decode: context splits"},
      {8, 2, 128, {{200, 200}, {100, 150}}, "prefill: no split"},
      {4, 4, 64, {{7, 7}, {1, 65}}, "head_dim 64, no GQA"},
      {8, 1, 16, {{9, 9}, {1, 40}}, "head_dim 16, one kv head (fixture b shape)"},
      {96, 8, 128, {{1, 2000}, {4, 700}}, "GLM-4.5-Air heads (group 12)"},
      {96, 8, 128, {{300, 300}, {1, 8192}}, "GLM-4.5-Air heads: prefill chunk + long decode"},
      {32, 1, 64, {{5, 5}, {1, 600}}, "group 32: CUDA-core kernel"},
      {16, 1, 256, {{3, 40}, {1, 300}}, "head_dim 256: CUDA-core kernel"},
  };
  const int64_t bs = 16;
  for (const AttnCase& c : cases) {
    SCOPED_TRACE(c.what);
    std::vector<gpu_oracle::PagedSpan> spans;
    for (const SeqCase& s : c.seqs) spans.push_back({s.n_tokens, s.kv_len});
    int64_t n_blocks = 0;
    const model::ForwardBatch batch = gpu_oracle::paged_batch(spans, bs, 3, rng_, &n_blocks);
    const int64_t T = batch.n_tokens();
    const kernels::AttentionParams shape = gpu_oracle::attention_shape(c.nh, c.kvh, c.hd);
    auto cmeta = model::build_attention_meta(batch, *cpu_, bs, shape).value();
    auto gmeta = model::build_attention_meta(batch, *gpu_, bs, shape).value();
    Tensor kc = rand({n_blocks * bs, c.kvh * c.hd}, 2.f), vc = rand({n_blocks * bs, c.kvh * c.hd});
    Tensor q = rand({T, c.nh * c.hd}, 2.f);
    Tensor ref = cpu_->alloc(DType::kF32, {T, c.nh * c.hd});
    cpu_->attention(cpu(q), cpu(kc), cpu(vc), cmeta, ref);
    Tensor gq = gpu_bf16(q), gk = gpu_bf16(kc), gv = gpu_bf16(vc);
    // Every kernel design on every case: the planner's choice, then each one forced (a forced tensor-core
    // kernel on a shape it does not serve falls back to the CUDA-core one, by the planner's rule).
    for (const char* kernel : {"", "warp", "shared", "simt"}) {
      SCOPED_TRACE(kernel);
      ASSERT_TRUE(gpu_->set_kernel_options({.attention_kernel = kernel}).is_ok());
      Tensor out = poison(DType::kBF16, {T, c.nh * c.hd});
      gpu_->attention(gq, gk, gv, gmeta, out);
      ASSERT_TRUE(gpu_->set_kernel_options({}).is_ok());
      EXPECT_WITHIN(host(out), ref, kTolBf16Out);
    }
  }
}

// Tree attention (speculative verification and tree drafting): tree rows see the committed context and
// their ancestors only (AttentionParams::tree_mask). Plain sequences share the batch. Every kernel the
// planner may pick for such a batch (warp, simt; "shared" forced must still not be used) against the
// CPU reference, which applies the same mask (itself tested against a materialized mask).
struct TreeSeq {
  int32_t ctx;        // committed KV before the tree rows (the root row is at ctx - 1 when root is set)
  int32_t n_nodes;    // tree rows (0: a plain causal sequence of `plain` rows)
  int32_t plain;
  bool explicit_kv;   // tree rows at a scattered subset of KV indices (MTP tree drafting's layout)
};

TEST_F(CudaOps, PagedAttentionTreeMask) {
  struct Case {
    int nh, kvh, hd;
    std::vector<TreeSeq> seqs;
    const char* what;
  };
  const std::vector<Case> cases = {
      {4, 2, 32, {{5, 7, 0, false}}, "small tree, short context"},
      {4, 2, 32, {{37, 16, 0, false}, {0, 0, 1, false}, {17, 40, 0, false}}, "trees across key tiles + a decode"},
      {8, 2, 128, {{700, 64, 0, false}, {0, 0, 9, false}, {300, 5, 0, true}}, "64-node tree, splits, a prefill"},
      {96, 8, 128, {{2000, 7, 0, false}, {1500, 12, 0, true}}, "GLM-4.5-Air heads, long context (splits)"},
      {16, 1, 256, {{40, 9, 0, false}}, "head_dim 256: CUDA-core kernel"},
      {32, 1, 64, {{100, 20, 0, false}}, "group 32: CUDA-core kernel"},
  };
  const int64_t bs = 16;
  std::mt19937 trng(5);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    model::ForwardBatch batch;
    std::vector<model::SequenceSpan> spans;
    int64_t blocks_needed = 0;
    for (const TreeSeq& s : c.seqs) blocks_needed += (s.ctx + 2 * std::max(s.n_nodes, s.plain) + bs) / bs + 1;
    const int64_t n_blocks = blocks_needed + 3;
    std::vector<int32_t> perm(n_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng_);
    int64_t next_block = 0;
    for (const TreeSeq& s : c.seqs) {
      model::SequenceSpan span;
      span.token_begin = batch.n_tokens();
      if (s.n_nodes == 0) {
        span.n_tokens = s.plain;
        span.kv_len = s.ctx + s.plain;
        for (int32_t i = 0; i < s.plain; ++i) batch.positions.push_back(s.ctx + i);
      } else {
        // Root row at ctx - 1 (causal), then nodes with random parents at tree_base = ctx + ...
        span.tree_base = s.ctx;
        std::vector<uint64_t> anc(s.n_nodes);
        std::vector<int32_t> kv;
        int32_t j = s.ctx;
        span.kv_indices.push_back(s.ctx - 1);
        span.tree_mask.push_back(0);
        batch.positions.push_back(s.ctx - 1);
        for (int32_t i = 0; i < s.n_nodes; ++i) {
          if (s.explicit_kv && i > 0 && trng() % 3 == 0) ++j;  // gaps: unused slots between rows
          if (j - s.ctx >= 64) j = s.ctx + 63;                  // stay within the mask
          const int32_t bit = j - s.ctx;
          std::uniform_int_distribution<int32_t> pick(-1, i - 1);
          const int32_t parent = i == 0 ? -1 : pick(trng);
          int32_t pbit = -1;
          if (parent >= 0) pbit = span.kv_indices[1 + parent] - s.ctx;
          if (pbit >= bit) break;  // (only with gaps clamped at 63)
          anc[i] = (parent < 0 ? 0 : anc[parent]) | (uint64_t{1} << bit);
          span.kv_indices.push_back(j);
          span.tree_mask.push_back(anc[i]);
          batch.positions.push_back(s.ctx + 1);
          ++j;
          if (j - s.ctx >= 64) break;
        }
        span.n_tokens = static_cast<int32_t>(span.kv_indices.size());
        span.kv_len = *std::max_element(span.kv_indices.begin(), span.kv_indices.end()) + 1;
        if (!s.explicit_kv) span.kv_indices.clear();  // contiguous rows: the default layout
      }
      for (int64_t b = 0; b < (span.kv_len + bs - 1) / bs; ++b) span.block_table.push_back(perm[next_block++]);
      for (int32_t i = 0; i < span.n_tokens; ++i) batch.token_ids.push_back(0);
      batch.seqs.push_back(span);
    }
    ASSERT_TRUE(batch.validate(1, n_blocks, bs).is_ok()) << batch.validate(1, n_blocks, bs).to_string();
    const int64_t T = batch.n_tokens();
    const kernels::AttentionParams shape = gpu_oracle::attention_shape(c.nh, c.kvh, c.hd);
    auto cmeta = model::build_attention_meta(batch, *cpu_, bs, shape).value();
    auto gmeta = model::build_attention_meta(batch, *gpu_, bs, shape).value();
    ASSERT_NE(gmeta.params.tree_mask, nullptr);
    Tensor kc = rand({n_blocks * bs, c.kvh * c.hd}, 2.f), vc = rand({n_blocks * bs, c.kvh * c.hd});
    Tensor q = rand({T, c.nh * c.hd}, 2.f);
    Tensor ref = cpu_->alloc(DType::kF32, {T, c.nh * c.hd});
    cpu_->attention(cpu(q), cpu(kc), cpu(vc), cmeta, ref);
    Tensor gq = gpu_bf16(q), gk = gpu_bf16(kc), gv = gpu_bf16(vc);
    for (const char* kernel : {"", "warp", "shared", "simt"}) {
      SCOPED_TRACE(kernel);
      ASSERT_TRUE(gpu_->set_kernel_options({.attention_kernel = kernel}).is_ok());
      // (forced "shared": the planner still picks the per-warp kernel; the shared one would abort)
      Tensor out = poison(DType::kBF16, {T, c.nh * c.hd});
      gpu_->attention(gq, gk, gv, gmeta, out);
      ASSERT_TRUE(gpu_->set_kernel_options({}).is_ok());
      EXPECT_WITHIN(host(out), ref, kTolBf16Out);
    }
  }
}

TEST_F(CudaOps, KvCopyExactInOrder) {
  const int64_t bs = 16, n_blocks = 4, width = 2 * 64;
  Tensor kc = rand({n_blocks * bs, width}), vc = rand({n_blocks * bs, width});
  // Chained pairs: slot 20 is written by pair 0 and read by pair 1 (sequential semantics).
  std::vector<int32_t> src = {33, 20, 47, 5, 63}, dst = {20, 18, 17, 5, 1};
  const int64_t P = static_cast<int64_t>(src.size());
  Tensor hs = Tensor::view_of(src.data(), DType::kI32, {P}), hd = Tensor::view_of(dst.data(), DType::kI32, {P});
  Tensor ck = cpu(kc), cv = cpu(vc), gk = gpu_bf16(kc), gv = gpu_bf16(vc);
  cpu_->kv_copy(cpu(hs), cpu(hd), {&ck, &cv});
  gpu_->kv_copy(gpu_exact(hs), gpu_exact(hd), {&gk, &gv});
  expect_exact(host(gk), ck);
  expect_exact(host(gv), cv);
}

// ---- MoE -----------------------------------------------------------------------------------------

struct RouterCase {
  int E, K, n_group, topk_group;
  int64_t T;
};

// Router inputs on an exact grid (x in k/4, w in k/8, H = 64: every dot product is exact in fp32 in any
// order), so ids must match exactly, ties included (both sides break ties toward the lower index).
TEST_F(CudaOps, RouterExact) {
  for (const RouterCase& c : {RouterCase{16, 4, 4, 2, 1}, RouterCase{16, 4, 4, 2, 37}, RouterCase{128, 8, 1, 1, 33},
                              RouterCase{8, 8, 1, 1, 5}, RouterCase{64, 6, 8, 3, 20}}) {
    SCOPED_TRACE(testing::Message() << "E " << c.E << " K " << c.K << " groups " << c.n_group << "/" << c.topk_group
                                    << " T " << c.T);
    const int64_t H = 64;
    Tensor x = ints({c.T, H}, -2, 2), w = ints({c.E, H}, -3, 3), bias = ints({c.E}, -16, 16);
    Tensor xf = Tensor::empty(DType::kF32, {c.T, H}), wf = Tensor::empty(DType::kF32, {c.E, H});
    Tensor bf = Tensor::empty(DType::kF32, {c.E});
    for (int64_t i = 0; i < xf.numel(); ++i) xf.data<float>()[i] = x.data<int32_t>()[i] / 4.f;
    for (int64_t i = 0; i < wf.numel(); ++i) wf.data<float>()[i] = w.data<int32_t>()[i] / 8.f;
    for (int64_t i = 0; i < bf.numel(); ++i) bf.data<float>()[i] = bias.data<int32_t>()[i] / 64.f;
    kernels::RouterParams p;
    p.n_experts = c.E;
    p.top_k = c.K;
    p.n_group = c.n_group;
    p.topk_group = c.topk_group;
    p.routed_scaling_factor = 2.5f;
    Tensor cid = cpu_->alloc(DType::kI32, {c.T, c.K}), cw = cpu_->alloc(DType::kF32, {c.T, c.K});
    cpu_->router(cpu(xf), cpu(wf), cpu(bf), p, cid, cw);
    Tensor gid = gpu_->alloc(DType::kI32, {c.T, c.K});
    Tensor gw = poison(DType::kF32, {c.T, c.K});
    gpu_->router(gpu_bf16(xf), gpu_bf16(wf), gpu_exact(bf), p, gid, gw);
    expect_exact(host(gid), cid);
    EXPECT_WITHIN(host(gw), cw, kTolF32);
  }
}

struct MoeCase {
  int64_t T, H, I;
  int E, K;
  bool one_expert;  // every token's first slot on expert 3
  const char* what;
};

TEST_F(CudaOps, MoeExperts) {
  const std::vector<MoeCase> cases = {
      {1, 256, 96, 8, 2, false, "one token: most experts empty (GEMV path)"},
      {5, 256, 96, 8, 2, false, "5 tokens: N and K tails (grouped GEMM)"},
      {37, 64, 32, 16, 4, false, "ragged, fixture shape"},
      {40, 64, 32, 16, 4, true, "all tokens on one expert"},
      {9, 128, 64, 4, 4, false, "top_k == n_experts"},
      {64, 1024, 256, 128, 8, false, "128 experts, top 8"},
      {3, 1024, 256, 128, 8, false, "decode batch 3 (GEMV path)"},
      {4, 128, 64, 4, 4, false, "decode batch 4, top_k == n_experts (GEMV path)"},
      {4, 64, 32, 16, 4, true, "decode batch 4 all on one expert (GEMV path)"},
  };
  for (const MoeCase& c : cases) {
    SCOPED_TRACE(c.what);
    Tensor x = rand({c.T, c.H});
    Tensor gate_up = rand({c.E, 2 * c.I, c.H}, 2.f / std::sqrt(static_cast<float>(c.H)));
    Tensor down = rand({c.E, c.H, c.I}, 2.f / std::sqrt(static_cast<float>(c.I)));
    Tensor ids = Tensor::empty(DType::kI32, {c.T, c.K});
    std::vector<int32_t> experts(c.E);
    for (int64_t t = 0; t < c.T; ++t) {
      std::iota(experts.begin(), experts.end(), 0);
      std::shuffle(experts.begin(), experts.end(), rng_);
      if (c.one_expert) std::swap(*std::find(experts.begin(), experts.end(), 3), experts[0]);
      for (int k = 0; k < c.K; ++k) ids.data<int32_t>()[t * c.K + k] = experts[k];
    }
    Tensor wts = rand({c.T, c.K});
    for (int64_t i = 0; i < wts.numel(); ++i) wts.data<float>()[i] = std::fabs(wts.data<float>()[i]);
    Tensor out0 = rand({c.T, c.H});
    backend::ExpertWeights cex{cpu(gate_up), cpu(down)}, gex{gpu_bf16(gate_up), gpu_bf16(down)};
    Tensor ref = cpu(out0);
    cpu_->moe_experts(cpu(x), ids, wts, cex, ref);
    Tensor out = gpu_bf16(out0);
    gpu_->moe_experts(gpu_bf16(x), gpu_exact(ids), gpu_exact(wts), gex, out);
    EXPECT_WITHIN(host(out), ref, kTolGemm);
  }
}

}  // namespace
}  // namespace mxserve
