// The CUDA MLA + DSA ops (backend/cuda_mla_dsa_ops.h) against the CPU reference backend on random
// bf16-representable inputs (label gpu; skips with a clear message where no CUDA device is present):
// LayerNorm with bias, GPT-J interleaved RoPE, column copy and cache write (exact), the DSA indexer's
// top-k and absorbed MLA attention (dense and sparse), on one token, ragged batches, sequences straddling
// KV blocks (shuffled block tables), contexts far above index_topk, exact score ties and speculative-tree
// rows, and the narrow linear of the indexer weights. CUDA outputs start as NaN (or a sentinel), so an unwritten
// element fails.
// The indexer's GLM-shaped cases (multiples of 16 index heads) run its tensor-core score kernel.
// MLA attention also runs the tensor-core attend kernel and its SIMT oracle directly through the launcher
// on GLM-5.x latent shapes (64 / 32 / 20 / 16 heads, tile and block edges, many KV splits, top-k below and
// above the context, tree rows, a prefill chunk). The Hopper path (kWgmma, forced through the launcher's kernel
// and split parameters) runs against the reference and the mma.sync kernel at 8 / 16 / 32 / 64 heads (sm_90 only),
// and so does its sparse-prefill attend (kWgmmaPrefill: one CTA per token, top-k rows only).
// Tolerances: copies exact; row ops and attention kTolBf16Out (4e-3 rel L2: fp32 math both sides, the
// CUDA output rounded to bf16 once). The indexer's selection is checked as a set: every CUDA row must be
// a valid top-k of the exact (fp64) scores up to kScoreSlack of the row's score scale (a near-tie may go
// either way between two fp32 summation orders), in the op's format (ascending, visible, -1 padded).
// Every case prints one line with its numbers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <string>

#include "backend/backend.h"
#include "backend/cuda_backend.h"
#include "backend/mla_dsa_ops.h"
#include "core/numeric.h"
#include "kernels/cuda/attention/dsa_indexer_fused.h"
#include "kernels/cuda/attention/mla_dsa.h"
#include "kernels/cuda/common/cuda_check.h"
#include "model/forward_batch.h"
#include "gpu_oracle.h"

namespace mxserve {
namespace {

using backend::Backend;
using backend::MlaDsaOps;

constexpr double kTolBf16Out = 4e-3;
constexpr double kScoreSlack = 1e-5;
// The tensor-core MLA attend kernel feeds q_abs and the softmax probabilities to the MMAs as bf16 (fp32
// accumulate): two more bf16 roundings than the SIMT kernel, hence a wider bound on the same rel-L2 metric.
constexpr double kTolMlaMma = 1e-2;
// The Hopper path (kWgmma) rounds the same two operands, plus q_abs out of the absorb GEMM and the latent output
// o_lat before the un-absorb GEMM (bf16 both): one more bf16 rounding than the mma.sync path.
constexpr double kTolMlaWgmma = 1.5e-2;

using gpu_oracle::rel_l2;

#define EXPECT_CLOSE(got, ref, tol, what)                                                                 \
  do {                                                                                                    \
    double mx_ = 0;                                                                                       \
    const double e_ = rel_l2(got, ref, &mx_);                                                             \
    std::printf("[ err      ] %-22s %-48s rel_l2 %.3e max_abs %.3e (tol %.0e) %s\n",                      \
                ::testing::UnitTest::GetInstance()->current_test_info()->name(), what, e_, mx_, tol,      \
                e_ <= tol ? "PASS" : "FAIL");                                                             \
    EXPECT_LE(e_, tol) << what;                                                                           \
  } while (0)

void expect_exact(const Tensor& got, const Tensor& ref, const char* what) {
  ASSERT_EQ(got.nbytes(), ref.nbytes());
  const bool same = std::memcmp(got.raw(), ref.raw(), ref.nbytes()) == 0;
  std::printf("[ exact    ] %-48s %s\n", what, same ? "PASS" : "FAIL");
  EXPECT_TRUE(same) << what;
}

struct SeqCase {
  int32_t n_tokens, kv_len;
};

// A tree sequence: `ctx` committed tokens, then a root row at ctx - 1 and n_nodes tree rows at KV
// indices ctx.. with random parents (AttentionParams::tree_mask).
struct TreeCase {
  int32_t ctx, n_nodes;
};

class CudaMlaDsa : public gpu_oracle::CudaVsCpuTest {
 public:
  CudaMlaDsa() : CudaVsCpuTest(20261202) {}
  void SetUp() override {
    CudaVsCpuTest::SetUp();
    if (IsSkipped()) return;
    gops_ = backend::mla_dsa_ops(*gpu_);
    cops_ = backend::mla_dsa_ops(*cpu_);
    ASSERT_NE(gops_, nullptr) << "the CUDA backend does not implement MlaDsaOps";
    ASSERT_NE(cops_, nullptr);
  }

  Tensor rand(Shape s, float scale = 1.f, float offset = 0.f) {
    std::uniform_real_distribution<float> u(-scale, scale);
    Tensor t = Tensor::empty(DType::kF32, std::move(s));
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = bf16_to_f32(f32_to_bf16(u(rng_) + offset));
    return t;
  }
  Tensor poison(Shape s) { return poison_bf16(std::move(s)); }

  // A batch of plain causal sequences and tree sequences over shuffled blocks of block_size bs.
  model::ForwardBatch make_batch(const std::vector<SeqCase>& seqs, const std::vector<TreeCase>& trees, int64_t bs,
                                 int64_t* n_blocks) {
    model::ForwardBatch batch;
    int64_t needed = 0;
    for (const SeqCase& s : seqs) needed += (s.kv_len + bs - 1) / bs;
    for (const TreeCase& t : trees) needed += (t.ctx + t.n_nodes + bs - 1) / bs;
    *n_blocks = needed + 3;
    std::vector<int32_t> perm(*n_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng_);
    int64_t next = 0;
    for (const SeqCase& s : seqs) {
      model::SequenceSpan span;
      span.token_begin = batch.n_tokens();
      span.n_tokens = s.n_tokens;
      span.kv_len = s.kv_len;
      for (int64_t b = 0; b < (s.kv_len + bs - 1) / bs; ++b) span.block_table.push_back(perm[next++]);
      for (int32_t i = 0; i < s.n_tokens; ++i) {
        batch.token_ids.push_back(0);
        batch.positions.push_back(s.kv_len - s.n_tokens + i);
      }
      batch.seqs.push_back(span);
    }
    for (const TreeCase& t : trees) {
      model::SequenceSpan span;
      span.token_begin = batch.n_tokens();
      span.tree_base = t.ctx;
      span.kv_indices.push_back(t.ctx - 1);
      span.tree_mask.push_back(0);
      batch.positions.push_back(t.ctx - 1);
      std::vector<uint64_t> anc;
      for (int32_t i = 0; i < t.n_nodes; ++i) {
        const int32_t parent = i == 0 ? -1 : std::uniform_int_distribution<int32_t>(-1, i - 1)(rng_);
        anc.push_back((parent < 0 ? 0 : anc[parent]) | (uint64_t{1} << i));
        span.kv_indices.push_back(t.ctx + i);
        span.tree_mask.push_back(anc.back());
        batch.positions.push_back(t.ctx + 1);
      }
      span.n_tokens = t.n_nodes + 1;
      span.kv_len = t.ctx + t.n_nodes;
      for (int64_t b = 0; b < (span.kv_len + bs - 1) / bs; ++b) span.block_table.push_back(perm[next++]);
      for (int32_t i = 0; i < span.n_tokens; ++i) batch.token_ids.push_back(0);
      batch.seqs.push_back(span);
    }
    return batch;
  }

  MlaDsaOps* gops_ = nullptr;
  MlaDsaOps* cops_ = nullptr;
};

// Host view of the batch: per token, its KV indices in order of the cache, and the visibility rule.
struct TokenView {
  std::vector<int64_t> slot_of_kv;  // slot of KV index j of the token's sequence
  int64_t kv_index;
  int64_t tree_base;  // INT64_MAX: plain causal row
  uint64_t tree_mask;
  bool visible(int64_t j) const {
    return j >= 0 && j <= kv_index && (j < tree_base || ((tree_mask >> (j - tree_base)) & 1u) != 0);
  }
};

std::vector<TokenView> token_views(const model::ForwardBatch& batch, int64_t bs) {
  std::vector<TokenView> v;
  for (const auto& s : batch.seqs) {
    std::vector<int64_t> slots(s.kv_len);
    for (int64_t j = 0; j < s.kv_len; ++j) slots[j] = static_cast<int64_t>(s.block_table[j / bs]) * bs + j % bs;
    for (int32_t i = 0; i < s.n_tokens; ++i) {
      TokenView tv{slots, s.kv_index_of(i), INT64_MAX, 0};
      if (!s.tree_mask.empty() && s.tree_mask[i] != 0) {
        tv.tree_base = s.tree_base;
        tv.tree_mask = s.tree_mask[i];
      }
      v.push_back(std::move(tv));
    }
  }
  return v;
}

kernels::AttentionParams meta_shape(int64_t heads, int64_t width) {
  kernels::AttentionParams a;
  a.n_heads = static_cast<int32_t>(heads);
  a.n_kv_heads = 1;
  a.head_dim = static_cast<int32_t>(width);
  return a;
}

// ---- row ops ---------------------------------------------------------------------------------------

TEST_F(CudaMlaDsa, LayerNormWithBias) {
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{1, 16}, {5, 24}, {33, 128}, {7, 1000}}) {
    Tensor x = rand({rows, cols}, 2.f, 1.5f), w = rand({cols}), b = rand({cols}, 0.5f);
    Tensor ref = cpu_->alloc(DType::kF32, {rows, cols});
    cops_->layernorm(cpu(x), cpu(w), cpu(b), 1e-6f, ref);
    Tensor gx = gpu_bf16(x), gw = gpu_bf16(w), gb = gpu_bf16(b), out = poison({rows, cols});
    gops_->layernorm(gx, gw, gb, 1e-6f, out);
    const std::string what = "[" + std::to_string(rows) + ", " + std::to_string(cols) + "]";
    EXPECT_CLOSE(host(out), ref, kTolBf16Out, what.c_str());
    gops_->layernorm(gx, gw, gb, 1e-6f, gx);  // in place (the indexer key norm runs so)
    EXPECT_CLOSE(host(gx), ref, kTolBf16Out, (what + " in place").c_str());
  }
}

TEST_F(CudaMlaDsa, RopeInterleaved) {
  struct Case {
    int heads, stride, offset, rotary;
    float theta;
    const char* what;
  };
  const std::vector<Case> cases = {
      {4, 24, 16, 8, 1e4f, "fixture a: q heads, rope after nope"},
      {1, 8, 0, 8, 1e4f, "fixture a: shared k_rope"},
      {2, 24, 0, 16, 1e4f, "fixture b: indexer heads, partial"},
      {64, 256, 192, 64, 8e6f, "GLM-5.2 q heads"},
      {32, 128, 0, 64, 8e6f, "GLM-5.2 indexer q"},
  };
  for (const Case& c : cases) {
    const int64_t T = 37;
    Tensor pos = Tensor::empty(DType::kI32, {T});
    for (int64_t t = 0; t < T; ++t) pos.data<int32_t>()[t] = t < 5 ? static_cast<int32_t>(t) : rng_() % 200000;
    Tensor x = rand({T, int64_t{c.heads} * c.stride}, 2.f);
    kernels::InterleavedRopeParams p{c.heads, c.stride, c.offset, c.rotary, c.theta};
    Tensor ref = cpu(x);
    cops_->rope_interleaved(ref, cpu(pos), p);
    Tensor gx = gpu_bf16(x);
    gops_->rope_interleaved(gx, gpu_->upload(pos), p);
    Tensor got = host(gx);
    EXPECT_CLOSE(got, ref, kTolBf16Out, c.what);
    bool untouched = true;  // dims outside [offset, offset + rotary) are not modified at all
    for (int64_t i = 0; i < x.numel(); ++i) {
      const int64_t d = i % c.stride;
      if (d < c.offset || d >= c.offset + c.rotary) untouched &= got.data<float>()[i] == x.data<float>()[i];
    }
    EXPECT_TRUE(untouched) << c.what << ": a dim outside the rotary range changed";
  }
}

TEST_F(CudaMlaDsa, CopyColumnsAndCacheWriteExact) {
  const int64_t bs = 16;
  int64_t n_blocks = 0;
  model::ForwardBatch batch = make_batch({{1, 1}, {5, 37}, {16, 16}, {3, 33}}, {}, bs, &n_blocks);
  const int64_t T = batch.n_tokens(), L = 24, R = 16;
  auto cmeta = model::build_attention_meta(batch, *cpu_, bs, meta_shape(1, L + R)).value();
  auto gmeta = model::build_attention_meta(batch, *gpu_, bs, meta_shape(1, L + R)).value();
  Tensor kv = rand({T, L + R}), cache = rand({n_blocks * bs, L + R});
  Tensor clat = cpu_->alloc(DType::kF32, {T, L}), crope = cpu_->alloc(DType::kF32, {T, R});
  cops_->copy_columns(cpu(kv), 0, L, clat);
  cops_->copy_columns(cpu(kv), L, L + R, crope);
  Tensor glat = poison({T, L}), grope = poison({T, R}), gkv = gpu_bf16(kv);
  gops_->copy_columns(gkv, 0, L, glat);
  gops_->copy_columns(gkv, L, L + R, grope);
  expect_exact(host(glat), clat, "copy_columns [0, L)");
  expect_exact(host(grope), crope, "copy_columns [L, L + R)");
  Tensor ccache = cpu(cache), gcache = gpu_bf16(cache);
  cops_->cache_write(clat, cmeta, ccache, 0);
  cops_->cache_write(crope, cmeta, ccache, L);
  gops_->cache_write(glat, gmeta, gcache, 0);
  gops_->cache_write(grope, gmeta, gcache, L);
  expect_exact(host(gcache), ccache, "cache_write at column offsets 0 and L");
}

// The indexer key's LayerNorm + RoPE + cache write in one kernel (kernels/cuda/attention/mla_key_write.cu) against
// the three CUDA ops it replaces (MlaDsaOps' default: bit for bit by construction, checked here as at most one
// bf16 ulp with the count of exact elements printed, in case the compiler contracts the rope's products
// differently) and the CPU reference; slots straddling KV blocks, k written in place too.
TEST_F(CudaMlaDsa, NormRopeCacheWriteFused) {
  struct Case {
    int64_t cols;
    int offset, rotary;
    float theta;
    const char* what;
  };
  const std::vector<Case> cases = {{128, 0, 64, 8e6f, "GLM-5.2 indexer key (128, rope 64)"},
                                   {16, 0, 8, 1e4f, "fixture-sized key (16, rope 8)"},
                                   {64, 32, 32, 1e4f, "rope after an offset"}};
  const int64_t bs = 16;
  for (const Case& c : cases) {
    int64_t n_blocks = 0;
    model::ForwardBatch batch = make_batch({{1, 1}, {5, 37}, {16, 16}, {3, 33}}, {}, bs, &n_blocks);
    const int64_t T = batch.n_tokens(), C = c.cols;
    auto cmeta = model::build_attention_meta(batch, *cpu_, bs, meta_shape(1, C)).value();
    auto gmeta = model::build_attention_meta(batch, *gpu_, bs, meta_shape(1, C)).value();
    Tensor pos = Tensor::empty(DType::kI32, {T});
    for (int64_t t = 0; t < T; ++t) pos.data<int32_t>()[t] = t < 5 ? static_cast<int32_t>(t) : rng_() % 200000;
    Tensor k = rand({T, C}, 2.f, 1.5f), w = rand({C}), b = rand({C}, 0.5f), cache = rand({n_blocks * bs, C});
    const kernels::InterleavedRopeParams p{1, static_cast<int32_t>(C), c.offset, c.rotary, c.theta};
    Tensor ck = cpu(k), ccache = cpu(cache);
    cops_->norm_rope_cache_write(ck, cpu(w), cpu(b), 1e-6f, cpu(pos), p, cmeta, ccache);
    Tensor gw = gpu_bf16(w), gb = gpu_bf16(b), gpos = gpu_->upload(pos);
    Tensor gk1 = gpu_bf16(k), gcache1 = gpu_bf16(cache);
    gops_->norm_rope_cache_write(gk1, gw, gb, 1e-6f, gpos, p, gmeta, gcache1);  // fused
    Tensor gk3 = gpu_bf16(k), gcache3 = gpu_bf16(cache);
    gops_->MlaDsaOps::norm_rope_cache_write(gk3, gw, gb, 1e-6f, gpos, p, gmeta, gcache3);  // the three ops
    const Tensor h1 = host(gcache1), h3 = host(gcache3), hk1 = host(gk1), hk3 = host(gk3);
    int64_t exact = 0, worst_ulp = 0;
    auto bf16_bits = [](float f) {
      uint32_t u;
      std::memcpy(&u, &f, 4);
      return static_cast<int64_t>(u >> 16);
    };
    for (const auto& [a, r] : {std::pair{&h1, &h3}, std::pair{&hk1, &hk3}}) {
      for (int64_t i = 0; i < a->numel(); ++i) {
        const float x = a->data<float>()[i], y = r->data<float>()[i];
        const int64_t d = std::abs(bf16_bits(x) - bf16_bits(y));
        if (x == y) ++exact;
        else worst_ulp = std::max<int64_t>(worst_ulp, (x < 0) == (y < 0) ? d : 1 << 20);
      }
    }
    std::printf("[ fused    ] %-48s %lld of %lld elements exact vs the three ops, worst %lld ulp\n", c.what,
                static_cast<long long>(exact), static_cast<long long>(h1.numel() + hk1.numel()),
                static_cast<long long>(worst_ulp));
    EXPECT_LE(worst_ulp, 1) << c.what;
    EXPECT_CLOSE(h1, ccache, kTolBf16Out, c.what);
    EXPECT_CLOSE(hk1, ck, kTolBf16Out, (std::string(c.what) + ", k in place").c_str());
  }
}

// The MLA cache row [rmsnorm(latent) | rope(k_rope)] from kv_a's output in one kernel (try_latent_cache_write,
// mla_key_write.cu) against the CUDA ops it replaces (copy_columns, rmsnorm, rope, two cache writes: <= 1 bf16
// ulp, the count of exact elements printed) and the CPU reference; kv as a column range of a wider GEMM output
// (the fused input projection) and as kv_a's own output; slots straddling KV blocks.
TEST_F(CudaMlaDsa, LatentCacheWriteFused) {
  struct Case {
    int64_t n_cols, col0, latent, rope;
    float theta;
    const char* what;
  };
  const std::vector<Case> cases = {{2784, 2048, 512, 64, 8e6f, "GLM-5.2 fused projection row"},
                                   {576, 0, 512, 64, 8e6f, "GLM-5.2 kv_a output"},
                                   {96, 48, 32, 8, 1e4f, "fixture a sized"},
                                   {80, 32, 24, 16, 1e4f, "fixture b sized"}};
  const int64_t bs = 16;
  for (const Case& c : cases) {
    int64_t n_blocks = 0;
    model::ForwardBatch batch = make_batch({{1, 1}, {5, 37}, {16, 16}, {3, 33}}, {}, bs, &n_blocks);
    const int64_t T = batch.n_tokens(), L = c.latent, R = c.rope, W = L + R;
    auto cmeta = model::build_attention_meta(batch, *cpu_, bs, meta_shape(1, W)).value();
    auto gmeta = model::build_attention_meta(batch, *gpu_, bs, meta_shape(1, W)).value();
    Tensor pos = Tensor::empty(DType::kI32, {T});
    for (int64_t t = 0; t < T; ++t) pos.data<int32_t>()[t] = t < 5 ? static_cast<int32_t>(t) : rng_() % 200000;
    Tensor kv = rand({T, c.n_cols}, 2.f), w = rand({L}), cache = rand({n_blocks * bs, W});
    const kernels::InterleavedRopeParams p{1, static_cast<int32_t>(R), 0, static_cast<int32_t>(R), c.theta};
    // CPU reference
    Tensor ccache = cpu(cache), ckv = cpu(kv);
    Tensor clat = cpu_->alloc(DType::kF32, {T, L}), crope = cpu_->alloc(DType::kF32, {T, R});
    cops_->copy_columns(ckv, c.col0, c.col0 + L, clat);
    cpu_->rmsnorm(clat, cpu(w), 1e-6f, clat);
    cops_->copy_columns(ckv, c.col0 + L, c.col0 + W, crope);
    cops_->rope_interleaved(crope, cpu(pos), p);
    cops_->cache_write(clat, cmeta, ccache, 0);
    cops_->cache_write(crope, cmeta, ccache, L);
    // CUDA: the ops
    Tensor gkv = gpu_bf16(kv), gw = gpu_bf16(w), gpos = gpu_->upload(pos);
    Tensor gcache3 = gpu_bf16(cache), glat = poison({T, L}), grope = poison({T, R});
    gops_->copy_columns(gkv, c.col0, c.col0 + L, glat);
    gpu_->rmsnorm(glat, gw, 1e-6f, glat);
    gops_->copy_columns(gkv, c.col0 + L, c.col0 + W, grope);
    gops_->rope_interleaved(grope, gpos, p);
    gops_->cache_write(glat, gmeta, gcache3, 0);
    gops_->cache_write(grope, gmeta, gcache3, L);
    // CUDA: fused
    Tensor gcache1 = gpu_bf16(cache);
    ASSERT_TRUE(gops_->try_latent_cache_write(gkv, c.col0, gw, 1e-6f, gpos, p, gmeta, gcache1)) << c.what;
    const Tensor h1 = host(gcache1), h3 = host(gcache3);
    int64_t exact = 0, worst_ulp = 0;
    for (int64_t i = 0; i < h1.numel(); ++i) {
      const float x = h1.data<float>()[i], y = h3.data<float>()[i];
      uint32_t ux, uy;
      std::memcpy(&ux, &x, 4);
      std::memcpy(&uy, &y, 4);
      if (x == y) ++exact;
      else worst_ulp = std::max<int64_t>(worst_ulp, (x < 0) == (y < 0) ? std::abs(int64_t{ux >> 16} - int64_t{uy >> 16})
                                                                        : int64_t{1} << 20);
    }
    std::printf("[ fused    ] %-48s %lld of %lld cache elements exact vs the ops, worst %lld ulp\n", c.what,
                static_cast<long long>(exact), static_cast<long long>(h1.numel()), static_cast<long long>(worst_ulp));
    EXPECT_LE(worst_ulp, 1) << c.what;
    EXPECT_CLOSE(h1, ccache, kTolBf16Out, c.what);
    expect_exact(host(gkv), gpu_->to_host(gpu_bf16(kv)), "kv not modified");
  }
}

// ---- the DSA indexer ---------------------------------------------------------------------------------

struct IndexerCase {
  int heads, dim, top_k;
  std::vector<SeqCase> seqs;
  std::vector<TreeCase> trees;
  bool equal_keys;  // every cached key identical: all scores tie, the lowest KV indices must win
  const char* what;
};

TEST_F(CudaMlaDsa, IndexerTopk) {
  const std::vector<IndexerCase> cases = {
      {4, 16, 6, {{1, 1}}, {}, false, "one token, context 1"},
      {4, 16, 6, {{1, 1}, {5, 37}, {16, 16}, {1, 17}, {3, 33}}, {}, false, "fixture a shape, ragged, block edges"},
      {2, 24, 4, {{9, 9}, {1, 5}, {2, 40}}, {}, false, "fixture b shape"},
      {4, 16, 6, {{20, 20}}, {}, true, "all keys equal: ties to the lower index"},
      {4, 16, 6, {{2, 30}}, {{40, 9}, {5, 3}}, false, "tree rows + a plain sequence"},
      {32, 128, 64, {{1, 3000}, {20, 20}, {4, 300}}, {}, false, "GLM-5.2 heads, context >> top_k"},
      {32, 128, 2048, {{1, 5000}, {1, 1500}, {3, 2050}}, {}, false, "top_k 2048: above and below"},
      {8, 64, 16, {{1, 70000}}, {}, false, "one decode over 70k keys"},
      // Multiples of 16 index heads run the tensor-core score kernel (kernels/cuda dsa_indexer_mma_supported).
      {32, 128, 64, {{2, 30}}, {{40, 9}}, false, "mma: GLM-5.2 heads, tree rows"},
      {16, 128, 8, {{20, 20}}, {}, true, "mma: all keys equal: ties to the lower index"},
      {64, 64, 512, {{1, 20000}, {1, 129}}, {}, false, "mma: 64 heads x 64, 20k keys"},
      {48, 32, 16, {{1, 1}, {5, 37}, {1, 128}, {1, 129}}, {}, false, "mma: 48 heads, block edges"},
  };
  const int64_t bs = 16;
  for (const IndexerCase& c : cases) {
    SCOPED_TRACE(c.what);
    int64_t n_blocks = 0;
    model::ForwardBatch batch = make_batch(c.seqs, c.trees, bs, &n_blocks);
    ASSERT_TRUE(batch.validate(1, n_blocks, bs).is_ok()) << batch.validate(1, n_blocks, bs).to_string();
    const int64_t T = batch.n_tokens(), NH = c.heads, D = c.dim, K = c.top_k;
    auto cmeta = model::build_attention_meta(batch, *cpu_, bs, meta_shape(1, D)).value();
    auto gmeta = model::build_attention_meta(batch, *gpu_, bs, meta_shape(1, D)).value();
    Tensor q = rand({T, NH * D}), w = rand({T, NH}), keys = rand({n_blocks * bs, D});
    if (c.equal_keys)
      for (int64_t i = 0; i < keys.numel(); ++i) keys.data<float>()[i] = keys.data<float>()[i % D];
    kernels::IndexerParams p;
    p.n_heads = c.heads;
    p.head_dim = c.dim;
    p.top_k = c.top_k;
    p.score_scale = 1.f / std::sqrt(static_cast<float>(D));
    p.weight_scale = 1.f / std::sqrt(static_cast<float>(NH));
    Tensor ref = cpu_->alloc(DType::kI32, {T, K});
    cops_->indexer_topk(cpu(q), cpu(w), cpu(keys), cmeta, p, ref);
    Tensor sentinel = Tensor::empty(DType::kI32, {T, K});
    std::fill(sentinel.data<int32_t>(), sentinel.data<int32_t>() + T * K, -7);
    Tensor gtopk = gpu_->upload(sentinel);
    gops_->indexer_topk(gpu_bf16(q), gpu_bf16(w), gpu_bf16(keys), gmeta, p, gtopk);
    Tensor got = host(gtopk);
    const std::vector<TokenView> views = token_views(batch, bs);
    int rows_differ = 0, bad_format = 0, not_topk = 0;
    for (int64_t t = 0; t < T; ++t) {
      const TokenView& v = views[t];
      const int32_t* g = got.data<int32_t>() + t * K;
      const int32_t* r = ref.data<int32_t>() + t * K;
      rows_differ += std::memcmp(g, r, sizeof(int32_t) * K) != 0 ? 1 : 0;
      // Exact fp64 scores of the visible keys.
      std::vector<double> score(v.kv_index + 1, -INFINITY);
      double scale = 0;
      int64_t n_visible = 0;
      for (int64_t j = 0; j <= v.kv_index; ++j) {
        if (!v.visible(j)) continue;
        ++n_visible;
        const float* key = keys.data<float>() + v.slot_of_kv[j] * D;
        double s = 0, s_abs = 0;
        for (int64_t h = 0; h < NH; ++h) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(q.data<float>()[(t * NH + h) * D + d]) * key[d];
          const double wh = static_cast<double>(w.data<float>()[t * NH + h]) * p.weight_scale;
          s += wh * std::max(dot * p.score_scale, 0.0);
          s_abs += std::fabs(wh) * std::fabs(dot * p.score_scale);
        }
        score[j] = s;
        scale = std::max(scale, s_abs);
      }
      const int64_t want = std::min<int64_t>(K, n_visible);
      std::set<int64_t> chosen;
      bool format_ok = true;
      for (int64_t i = 0; i < K; ++i) {
        if (i < want) {
          format_ok &= v.visible(g[i]) && (i == 0 || g[i] > g[i - 1]);
          chosen.insert(g[i]);
        } else {
          format_ok &= g[i] == -1;
        }
      }
      bad_format += format_ok ? 0 : 1;
      if (!format_ok) continue;
      double worst_in = INFINITY, best_out = -INFINITY;
      for (int64_t j = 0; j <= v.kv_index; ++j) {
        if (!v.visible(j)) continue;
        if (chosen.count(j)) worst_in = std::min(worst_in, score[j]);
        else best_out = std::max(best_out, score[j]);
      }
      not_topk += best_out > worst_in + kScoreSlack * scale ? 1 : 0;
    }
    const bool pass = bad_format == 0 && not_topk == 0 && (!c.equal_keys || rows_differ == 0);
    std::printf("[ topk     ] %-48s %lld rows, %d differ from the CPU's (near-ties), %d malformed, %d not a "
                "top-k: %s\n",
                c.what, static_cast<long long>(T), rows_differ, bad_format, not_topk, pass ? "PASS" : "FAIL");
    EXPECT_EQ(bad_format, 0);
    EXPECT_EQ(not_topk, 0);
    if (c.equal_keys) {
      EXPECT_EQ(rows_differ, 0) << "exact ties must go to the lower KV index";
    }
  }
}

// ---- the fused DSA indexer (IndexerScoreKernel::kFused) ---------------------------------------------
// Through the launcher (kernels/cuda/attention/dsa_indexer.cu), at GLM-5.x index shapes: batch 1 / 16 / 64
// decode rows at contexts below / at / above top_k (those <= top_k skipped on the device), lengths off the
// 128-key tile, causal rows of prefill chunks (some straddling top_k), tree rows, 16 / 48 / 64 heads, and
// deliberate ties: every key equal (20k keys: the threshold digit overflows the select's candidate buffer),
// a period of 7 keys (ties straddle the threshold) and half the keys scoring exactly 0 (every ReLU off).
// Each row must be a valid top-k (as IndexerTopk); tie cases must equal the CPU's rows exactly (ties to the
// lower KV index). The tensor-core kMma path (same score arithmetic, old select) is run alongside and rows
// that differ from it are printed. The cluster-split select (kFusedSplit) runs on every case and must give rows
// identical to kFused's and kMma's (the same codes); kFused with the score kernel's 3- and 4-stage key rings
// (forced) must give its 2-stage rows. A last case captures each fused launch (one-block and split
// select) in a CUDA graph and replays it after changing kv_index on the device (no host sync, no allocation).

enum class KeyPattern { kRandom, kEqual, kPeriod7, kHalfZero };

struct FusedCase {
  int heads, dim, top_k;
  std::vector<SeqCase> seqs;
  std::vector<TreeCase> trees;
  KeyPattern keys;
  const char* what;
};

struct TopkCheck {
  int rows_differ = 0, bad_format = 0, not_topk = 0;
};

// got / ref i32 [T, K] against the exact fp64 scores of the batch's visible keys (as in IndexerTopk).
TopkCheck check_topk_rows(const model::ForwardBatch& batch, int64_t bs, const Tensor& q, const Tensor& w,
                          const Tensor& keys, const kernels::IndexerParams& p, const int32_t* got,
                          const int32_t* ref) {
  const int64_t NH = p.n_heads, D = p.head_dim, K = p.top_k;
  const std::vector<TokenView> views = token_views(batch, bs);
  TopkCheck c;
  for (int64_t t = 0; t < static_cast<int64_t>(views.size()); ++t) {
    const TokenView& v = views[t];
    const int32_t* g = got + t * K;
    c.rows_differ += std::memcmp(g, ref + t * K, sizeof(int32_t) * K) != 0 ? 1 : 0;
    std::vector<double> score(v.kv_index + 1, -INFINITY);
    double scale = 0;
    int64_t n_visible = 0;
    for (int64_t j = 0; j <= v.kv_index; ++j) {
      if (!v.visible(j)) continue;
      ++n_visible;
      const float* key = keys.data<float>() + v.slot_of_kv[j] * D;
      double s = 0, s_abs = 0;
      for (int64_t h = 0; h < NH; ++h) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(q.data<float>()[(t * NH + h) * D + d]) * key[d];
        const double wh = static_cast<double>(w.data<float>()[t * NH + h]) * p.weight_scale;
        s += wh * std::max(dot * p.score_scale, 0.0);
        s_abs += std::fabs(wh) * std::fabs(dot * p.score_scale);
      }
      score[j] = s;
      scale = std::max(scale, s_abs);
    }
    const int64_t want = std::min<int64_t>(K, n_visible);
    std::set<int64_t> chosen;
    bool format_ok = true;
    for (int64_t i = 0; i < K; ++i) {
      if (i < want) {
        format_ok &= v.visible(g[i]) && (i == 0 || g[i] > g[i - 1]);
        chosen.insert(g[i]);
      } else {
        format_ok &= g[i] == -1;
      }
    }
    c.bad_format += format_ok ? 0 : 1;
    if (!format_ok) continue;
    double worst_in = INFINITY, best_out = -INFINITY;
    for (int64_t j = 0; j <= v.kv_index; ++j) {
      if (!v.visible(j)) continue;
      if (chosen.count(j)) worst_in = std::min(worst_in, score[j]);
      else best_out = std::max(best_out, score[j]);
    }
    c.not_topk += best_out > worst_in + kScoreSlack * scale ? 1 : 0;
  }
  return c;
}

int64_t launcher_max_ctx(const kernels::AttentionParams& ap) {
  return ap.max_kv_len > 0 ? ap.max_kv_len : static_cast<int64_t>(ap.max_blocks_per_seq) * ap.block_size;
}

TEST_F(CudaMlaDsa, IndexerTopkFused) {
  namespace kc = kernels::cuda;
  auto decode = [](int n, int32_t lo, int32_t step) {
    std::vector<SeqCase> s;
    for (int i = 0; i < n; ++i) s.push_back({1, lo + step * i});
    return s;
  };
  const std::vector<FusedCase> cases = {
      {32, 128, 2048, {{1, 20000}}, {}, KeyPattern::kRandom, "B1 ctx 20000 (above top_k)"},
      {32, 128, 2048, {{1, 2048}}, {}, KeyPattern::kRandom, "B1 ctx 2048 (= top_k: skipped)"},
      {32, 128, 2048, {{1, 2047}}, {}, KeyPattern::kRandom, "B1 ctx 2047 (below: skipped)"},
      {32, 128, 2048, {{1, 2049}}, {}, KeyPattern::kRandom, "B1 ctx 2049 (one above)"},
      {32, 128, 2048, decode(16, 1500, 377), {}, KeyPattern::kRandom, "B16 ctx 1500..7155, ragged, mixed skip"},
      {32, 128, 2048, decode(64, 2001, 61), {}, KeyPattern::kRandom, "B64 ctx 2001..5844"},
      {32, 128, 2048, {{120, 4000}, {64, 2080}, {1, 2100}}, {}, KeyPattern::kRandom,
       "prefill chunks: causal rows, one straddling top_k"},
      {32, 128, 2048, {{2, 2500}}, {{3000, 9}, {40, 5}}, KeyPattern::kRandom, "tree rows + decode rows"},
      {32, 128, 2048, {{1, 20000}, {1, 3000}}, {}, KeyPattern::kEqual, "ties: all keys equal (20k: no candidate buffer)"},
      {32, 128, 2048, decode(16, 2100, 250), {}, KeyPattern::kPeriod7, "ties: period-7 keys, B16"},
      {32, 128, 2048, {{1, 3001}, {40, 3900}}, {}, KeyPattern::kHalfZero, "ties: half the scores exactly 0, at the threshold"},
      {16, 128, 64, {{1, 70000}, {3, 300}}, {}, KeyPattern::kRandom, "16 heads, top-64 over 70k keys"},
      {64, 128, 512, {{1, 20000}, {1, 129}, {1, 513}}, {}, KeyPattern::kRandom, "64 heads x 128"},
      {48, 64, 16, {{1, 1}, {5, 37}, {1, 128}, {1, 129}}, {}, KeyPattern::kRandom, "48 heads x 64, tile edges"},
      {32, 128, 1, {{1, 5000}}, {}, KeyPattern::kPeriod7, "top-1 of tied keys"},
      // Head counts off a multiple of 16 (zero-padded heads): the fixtures' 4 x 16 and a 20-head shape.
      {4, 16, 6, {{1, 1}, {5, 37}, {16, 16}, {1, 17}, {3, 33}}, {}, KeyPattern::kRandom, "fixture a shape (4 heads)"},
      {4, 16, 6, {{20, 20}}, {}, KeyPattern::kEqual, "fixture a shape, all keys equal"},
      {20, 64, 100, {{1, 3000}, {2, 30}}, {{40, 9}}, KeyPattern::kRandom, "20 heads x 64, tree rows"},
      // The cluster-split select (kFusedSplit: 8 CTAs a token at batch 1, 2 at 64): contexts <= top_k skipped,
      // 20k / 64k keys, exact ties straddling the threshold and the CTAs' key ranges, batch 64.
      {32, 128, 2048, {{1, 2000}}, {}, KeyPattern::kRandom, "split: B1 ctx 2000 (skipped)"},
      {32, 128, 2048, {{1, 20480}}, {}, KeyPattern::kRandom, "split: B1 ctx 20480"},
      {32, 128, 2048, {{1, 65536}}, {}, KeyPattern::kRandom, "split: B1 ctx 65536"},
      {32, 128, 2048, {{1, 20480}}, {}, KeyPattern::kPeriod7, "split: B1 20k, period-7 ties"},
      {32, 128, 2048, {{1, 65536}}, {}, KeyPattern::kEqual, "split: B1 64k, all keys equal"},
      {32, 128, 2048, decode(64, 20000, 8), {}, KeyPattern::kRandom, "split: B64 ctx 20000..20504"},
  };
  const int64_t bs = 64;
  for (const FusedCase& c : cases) {
    SCOPED_TRACE(c.what);
    int64_t n_blocks = 0;
    model::ForwardBatch batch = make_batch(c.seqs, c.trees, bs, &n_blocks);
    ASSERT_TRUE(batch.validate(1, n_blocks, bs).is_ok()) << batch.validate(1, n_blocks, bs).to_string();
    const int64_t T = batch.n_tokens(), NH = c.heads, D = c.dim, K = c.top_k;
    auto cmeta = model::build_attention_meta(batch, *cpu_, bs, meta_shape(1, D)).value();
    auto gmeta = model::build_attention_meta(batch, *gpu_, bs, meta_shape(1, D)).value();
    Tensor q = rand({T, NH * D}), w = rand({T, NH}), keys = rand({n_blocks * bs, D});
    if (c.keys == KeyPattern::kHalfZero) {  // q > 0, odd slots' keys < 0: every dot < 0, score exactly 0
      auto away = [](float x, float sign) { return bf16_to_f32(f32_to_bf16(sign * (std::fabs(x) + 0.0625f))); };
      for (int64_t i = 0; i < q.numel(); ++i) q.data<float>()[i] = away(q.data<float>()[i], 1.f);
      for (int64_t s = 0; s < n_blocks * bs; ++s)
        for (int64_t d = 0; d < D; ++d) {
          float& x = keys.data<float>()[s * D + d];
          x = away(x, s % 2 ? -1.f : 1.f);
        }
      for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = away(w.data<float>()[i], 1.f);
    } else if (c.keys != KeyPattern::kRandom) {
      const int64_t period = c.keys == KeyPattern::kEqual ? 1 : 7;
      for (int64_t i = 0; i < keys.numel(); ++i) keys.data<float>()[i] = keys.data<float>()[(i / D % period) * D + i % D];
    }
    kernels::IndexerParams p;
    p.n_heads = c.heads;
    p.head_dim = c.dim;
    p.top_k = c.top_k;
    p.score_scale = 1.f / std::sqrt(static_cast<float>(D));
    p.weight_scale = 1.f / std::sqrt(static_cast<float>(NH));
    Tensor ref = cpu_->alloc(DType::kI32, {T, K});
    cops_->indexer_topk(cpu(q), cpu(w), cpu(keys), cmeta, p, ref);
    Tensor gq = gpu_bf16(q), gw = gpu_bf16(w), gkeys = gpu_bf16(keys);
    Tensor sentinel = Tensor::empty(DType::kI32, {T, K});
    std::fill(sentinel.data<int32_t>(), sentinel.data<int32_t>() + T * K, -7);
    Tensor out_fused = gpu_->upload(sentinel), out_mma = gpu_->upload(sentinel);
    const int64_t max_ctx = launcher_max_ctx(gmeta.params);
    const size_t ws_bytes = kc::dsa_indexer_workspace_bytes(T, max_ctx);
    Tensor ws = gpu_->alloc(DType::kU8, {static_cast<int64_t>(ws_bytes)});
    gpu_->synchronize();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    auto run = [&](kc::IndexerScoreKernel k, Tensor& out) {
      kc::dsa_indexer_topk(gq.raw(), gw.raw(), gkeys.raw(), gmeta.token_seq.data<int32_t>(),
                           gmeta.kv_index.data<int32_t>(), gmeta.block_tables.data<int32_t>(), out.data<int32_t>(), p,
                           gmeta.params, max_ctx, ws.raw(), ws_bytes, nullptr, k);
    };
    Tensor out_split = gpu_->upload(sentinel);
    run(kc::IndexerScoreKernel::kFused, out_fused);
    run(kc::IndexerScoreKernel::kFusedSplit, out_split);
    const bool have_mma = kc::dsa_indexer_mma_supported(p);
    if (have_mma) run(kc::IndexerScoreKernel::kMma, out_mma);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    Tensor got = host(out_fused), got_mma = host(out_mma), got_split = host(out_split);
    // The split select reads the same codes as kFused's one-block select (and kMma's, the same score arithmetic):
    // every row must be identical, near-ties included.
    int split_differ = 0, split_differ_mma = 0;
    for (int64_t t = 0; t < T; ++t) {
      split_differ += std::memcmp(got_split.data<int32_t>() + t * K, got.data<int32_t>() + t * K, 4 * K) != 0 ? 1 : 0;
      if (have_mma)
        split_differ_mma +=
            std::memcmp(got_split.data<int32_t>() + t * K, got_mma.data<int32_t>() + t * K, 4 * K) != 0 ? 1 : 0;
    }
    // The score kernel's deeper rings of key loads (3 and 4 stages, forced): the same codes, so kFused's rows.
    int ring_differ = 0;
    for (const int stages : {3, 4}) {
      Tensor out_ring = gpu_->upload(sentinel);
      kc::dsa_indexer_fused_force_stages(stages);
      run(kc::IndexerScoreKernel::kFused, out_ring);
      kc::dsa_indexer_fused_force_stages(0);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      Tensor got_ring = host(out_ring);
      for (int64_t t = 0; t < T; ++t)
        ring_differ += std::memcmp(got_ring.data<int32_t>() + t * K, got.data<int32_t>() + t * K, 4 * K) != 0 ? 1 : 0;
    }
    std::printf("[ ring     ] %-50s %lld rows x 2 rings, %d differ from the 2-stage kFused: %s\n", c.what,
                static_cast<long long>(T), ring_differ, ring_differ == 0 ? "PASS" : "FAIL");
    EXPECT_EQ(ring_differ, 0) << "a deeper ring of key loads must not change the codes";
    std::printf("[ split    ] %-50s %lld rows, %d differ from kFused, %d from kMma%s: %s\n", c.what,
                static_cast<long long>(T), split_differ, split_differ_mma, have_mma ? "" : " (n/a)",
                split_differ == 0 && split_differ_mma == 0 ? "PASS" : "FAIL");
    EXPECT_EQ(split_differ, 0) << "kFusedSplit must select kFused's set (same codes, same tie rule)";
    EXPECT_EQ(split_differ_mma, 0) << "kFusedSplit must select kMma's set (same score arithmetic, same tie rule)";
    const TopkCheck r = check_topk_rows(batch, bs, q, w, keys, p, got.data<int32_t>(), ref.data<int32_t>());
    int differ_mma = 0;
    for (int64_t t = 0; have_mma && t < T; ++t)
      differ_mma += std::memcmp(got.data<int32_t>() + t * K, got_mma.data<int32_t>() + t * K, 4 * K) != 0 ? 1 : 0;
    const bool ties = c.keys != KeyPattern::kRandom;
    const bool pass = r.bad_format == 0 && r.not_topk == 0 && (!ties || r.rows_differ == 0);
    std::printf("[ fused    ] %-50s %lld rows, %d differ from the CPU's, %d from kMma%s, %d malformed, %d not a "
                "top-k: %s\n",
                c.what, static_cast<long long>(T), r.rows_differ, differ_mma, have_mma ? "" : " (n/a)", r.bad_format,
                r.not_topk, pass ? "PASS" : "FAIL");
    EXPECT_EQ(r.bad_format, 0);
    EXPECT_EQ(r.not_topk, 0);
    if (ties) {
      EXPECT_EQ(r.rows_differ, 0) << "exact ties must go to the lower KV index, as the CPU oracle's";
    }
  }
}

class CudaMlaDsaGraph : public CudaMlaDsa, public ::testing::WithParamInterface<kernels::cuda::IndexerScoreKernel> {};

TEST_P(CudaMlaDsaGraph, IndexerTopkFusedInCudaGraph) {
  namespace kc = kernels::cuda;
  if (kc::sync_after_launch()) GTEST_SKIP() << "MXSERVE_CUDA_SYNC=1 synchronizes after every launch: no capture";
  const kc::IndexerScoreKernel path = GetParam();
  const int64_t bs = 64, NH = 32, D = 128, K = 2048;
  // Batch 4 decode rows over sequences of 9000 / 3000 / 2500 / 100 cached keys; the graph is captured at
  // contexts 9000 / 2048 / 2500 / 100, then replayed at 2048 / 3000 / 2100 / 100 (kv_index changed on the
  // device; rows move across top_k both ways).
  int64_t n_blocks = 0;
  model::ForwardBatch batch = make_batch({{1, 9000}, {1, 3000}, {1, 2500}, {1, 100}}, {}, bs, &n_blocks);
  auto gmeta = model::build_attention_meta(batch, *gpu_, bs, meta_shape(1, D)).value();
  const int64_t T = batch.n_tokens();
  Tensor q = rand({T, NH * D}), w = rand({T, NH}), keys = rand({n_blocks * bs, D});
  kernels::IndexerParams p;
  p.n_heads = NH;
  p.head_dim = D;
  p.top_k = K;
  p.score_scale = 1.f / std::sqrt(static_cast<float>(D));
  p.weight_scale = 1.f / std::sqrt(static_cast<float>(NH));
  Tensor gq = gpu_bf16(q), gw = gpu_bf16(w), gkeys = gpu_bf16(keys);
  Tensor out = gpu_->alloc(DType::kI32, {T, K});
  const int64_t max_ctx = launcher_max_ctx(gmeta.params);
  const size_t ws_bytes = kc::dsa_indexer_workspace_bytes(T, max_ctx);
  Tensor ws = gpu_->alloc(DType::kU8, {static_cast<int64_t>(ws_bytes)});
  gpu_->synchronize();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  auto launch = [&] {
    kc::dsa_indexer_topk(gq.raw(), gw.raw(), gkeys.raw(), gmeta.token_seq.data<int32_t>(),
                         gmeta.kv_index.data<int32_t>(), gmeta.block_tables.data<int32_t>(), out.data<int32_t>(), p,
                         gmeta.params, max_ctx, ws.raw(), ws_bytes, stream, path);
  };
  const std::vector<int32_t> capture_kv = {8999, 2047, 2499, 99};
  ASSERT_EQ(cudaMemcpy(gmeta.kv_index.data<int32_t>(), capture_kv.data(), 4 * T, cudaMemcpyHostToDevice), cudaSuccess);
  launch();  // first use outside the capture (one-time kernel attributes)
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  launch();
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  // New contexts (within each sequence's blocks): the CPU reference sees the same kv_index.
  const std::vector<int32_t> new_kv = {2047, 2999, 2099, 99};  // 9000 -> 2048 keys: now skipped; 2048 -> 3000
  ASSERT_EQ(cudaMemcpyAsync(gmeta.kv_index.data<int32_t>(), new_kv.data(), 4 * T, cudaMemcpyHostToDevice, stream),
            cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  Tensor got = host(out);
  // The reference batch: the same blocks with the new lengths.
  model::ForwardBatch ref_batch = batch;
  for (size_t s = 0; s < ref_batch.seqs.size(); ++s) {
    auto& span = ref_batch.seqs[s];
    span.kv_len = new_kv[s] + 1;
    span.block_table.resize((span.kv_len + bs - 1) / bs);
    ref_batch.positions[span.token_begin] = new_kv[s];
  }
  ASSERT_TRUE(ref_batch.validate(1, n_blocks, bs).is_ok()) << ref_batch.validate(1, n_blocks, bs).to_string();
  auto cmeta = model::build_attention_meta(ref_batch, *cpu_, bs, meta_shape(1, D)).value();
  Tensor ref = cpu_->alloc(DType::kI32, {T, K});
  cops_->indexer_topk(cpu(q), cpu(w), cpu(keys), cmeta, p, ref);
  const TopkCheck r = check_topk_rows(ref_batch, bs, q, w, keys, p, got.data<int32_t>(), ref.data<int32_t>());
  std::printf("[ fused    ] %-50s %lld rows, %d differ from the CPU's, %d malformed, %d not a top-k: %s\n",
              path == kc::IndexerScoreKernel::kFusedSplit ? "graph replay after kv_index changed (split select)"
                                                          : "graph replay after kv_index changed",
              static_cast<long long>(T), r.rows_differ, r.bad_format, r.not_topk,
              r.bad_format == 0 && r.not_topk == 0 ? "PASS" : "FAIL");
  EXPECT_EQ(r.bad_format, 0);
  EXPECT_EQ(r.not_topk, 0);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(FusedSelects, CudaMlaDsaGraph,
                         ::testing::Values(kernels::cuda::IndexerScoreKernel::kFused,
                                           kernels::cuda::IndexerScoreKernel::kFusedSplit),
                         [](const ::testing::TestParamInfo<kernels::cuda::IndexerScoreKernel>& i) {
                           return i.param == kernels::cuda::IndexerScoreKernel::kFusedSplit ? std::string("split")
                                                                                            : std::string("one_block");
                         });

// ---- absorbed MLA attention --------------------------------------------------------------------------

struct MlaCase {
  int heads, nope, rope, v, lora, top_k;  // top_k 0: dense causal (no top-k list)
  std::vector<SeqCase> seqs;
  std::vector<TreeCase> trees;
  const char* what;
};

// Runs one MLA case on the CPU reference and on CUDA through the op (kAuto: the tensor-core kernel for
// the GLM-5.x shape, else the SIMT kernel); with `both_kernels` also each attend kernel directly through
// the launcher (kSimple, the oracle, and kMma), each against the reference.
// wgmma_splits non-empty: also the Hopper path (kWgmma and kWgmmaSplitS) once per forced split count (0 = its own
// plan), against the reference and against the mma.sync kernel. sparse_prefill (top-k cases): also the
// sparse-prefill attend (kWgmmaPrefill), against the reference and the mma.sync kernel.
void run_mla_case(CudaMlaDsa& f, Backend& cpu_be, Backend& gpu_be, MlaDsaOps& cops, MlaDsaOps& gops, std::mt19937& rng,
                  const MlaCase& c, bool both_kernels, const std::vector<int>& wgmma_splits = {},
                  bool sparse_prefill = false);

TEST_F(CudaMlaDsa, MlaAttention) {
  const std::vector<MlaCase> cases = {
      {4, 16, 8, 24, 32, 0, {{1, 1}}, {}, "one token, dense"},
      {4, 16, 8, 24, 32, 0, {{1, 1}, {5, 37}, {16, 16}, {1, 17}, {3, 33}}, {}, "fixture a shape, dense, ragged"},
      {4, 16, 8, 24, 32, 6, {{1, 1}, {5, 37}, {16, 16}, {1, 17}, {3, 33}}, {}, "fixture a shape, top-6"},
      {8, 8, 16, 12, 24, 4, {{9, 9}, {1, 5}, {2, 40}}, {}, "fixture b shape, top-4 (lora 24)"},
      {4, 16, 8, 24, 32, 6, {{2, 30}}, {{40, 9}, {5, 3}}, "tree rows, top-6"},
      {4, 16, 8, 24, 32, 0, {}, {{40, 9}}, "tree rows, dense"},
      {16, 192, 64, 256, 512, 0, {{1, 600}, {8, 40}}, {}, "GLM-5.2 head shape, dense"},
      {16, 192, 64, 256, 512, 64, {{1, 3000}, {20, 20}, {4, 300}}, {}, "GLM-5.2 head shape, top-64"},
      {16, 192, 64, 256, 512, 2048, {{1, 5000}, {1, 1500}}, {}, "GLM-5.2 head shape, top-2048"},
  };
  for (const MlaCase& c : cases) run_mla_case(*this, *cpu_, *gpu_, *cops_, *gops_, rng_, c, false);
}

// The tensor-core attend kernel (mla_decode_mma.cu) and the SIMT oracle, each against the CPU reference, on
// the GLM-5.x latent shape: 64 heads (4 head groups), 20 heads (a partial head group), one token, ragged
// decode batches whose contexts end on / beside 16-token block and 32-key tile boundaries, contexts that
// split over many KV splits, top-k smaller and larger than the context (-1 padding, an out-of-range entry),
// tree rows, and a prefill chunk (splits = 1 per token).
TEST_F(CudaMlaDsa, MlaAttentionTensorCoreKernel) {
  const std::vector<MlaCase> cases = {
      {64, 192, 64, 256, 512, 0, {{1, 1}}, {}, "mma 64 heads, one token, ctx 1"},
      {64, 192, 64, 256, 512, 0, {{1, 31}, {1, 32}, {1, 33}, {1, 16}, {1, 17}, {1, 4097}}, {},
       "mma 64 heads, decode, tile/block edges"},
      {64, 192, 64, 256, 512, 0, {{1, 3001}, {1, 2048}, {1, 129}, {1, 700}}, {}, "mma 64 heads, decode, ragged"},
      {20, 192, 64, 256, 512, 0, {{1, 999}, {3, 64}}, {}, "mma 20 heads (partial group)"},
      {16, 192, 64, 256, 512, 0, {{24, 300}}, {}, "mma 16 heads, prefill chunk 24"},
      {16, 192, 64, 256, 512, 0, {{140, 160}}, {}, "mma 16 heads, prefill 140 (1 split, no combine)"},
      {16, 192, 64, 256, 512, 64, {{140, 400}}, {}, "mma 16 heads, prefill 140, top-64"},
      {64, 192, 64, 256, 512, 96, {{1, 5000}, {1, 50}, {1, 96}, {1, 97}}, {}, "mma 64 heads, top-96 </>= ctx"},
      {64, 192, 64, 256, 512, 2048, {{1, 6000}, {1, 1500}, {2, 2100}}, {}, "mma 64 heads, top-2048"},
      {32, 192, 64, 256, 512, 8, {{2, 30}}, {{40, 9}}, "mma 32 heads, tree rows, top-8"},
      {32, 192, 64, 256, 512, 0, {}, {{70, 12}}, "mma 32 heads, tree rows, dense"},
  };
  for (const MlaCase& c : cases) run_mla_case(*this, *cpu_, *gpu_, *cops_, *gops_, rng_, c, true);
}

// The Hopper attend path (kWgmma: mla_decode_wgmma.cu + the absorb GEMMs of mla_absorb_mma.cu) against the CPU
// reference and the mma.sync kernel at 8 / 16 / 32 / 64 heads per rank: contexts off the 64-key tile and the
// 16-token block, MTP-style runs of several tokens of one sequence (packed into the wgmma rows below 64 heads)
// beside single-token sequences, top-k below / above the context with -1 padding and an out-of-range entry, tree
// rows, a prefill chunk; each case unsplit (1), with a forced 3 / 7 splits and with its own plan. Skips (saying
// why) off sm_90.
TEST_F(CudaMlaDsa, MlaAttentionWgmmaKernel) {
  kernels::MlaParams probe = kernels::glm_mla_params(64);
  const char* why = nullptr;
  if (!kernels::cuda::mla_attend_wgmma_supported(probe, &why)) GTEST_SKIP() << "kWgmma not runnable: " << why;
  const std::vector<MlaCase> cases = {
      {64, 192, 64, 256, 512, 0, {{1, 1}}, {}, "wgmma 64 heads, one token, ctx 1"},
      {64, 192, 64, 256, 512, 0, {{1, 63}, {1, 64}, {1, 65}, {1, 17}, {1, 4097}, {1, 1000}}, {},
       "wgmma 64 heads, decode, tile/block edges"},
      {32, 192, 64, 256, 512, 0, {{1, 999}, {2, 130}, {1, 64}}, {}, "wgmma 32 heads, decode + MTP 2"},
      {16, 192, 64, 256, 512, 0, {{4, 300}, {1, 77}, {3, 129}, {1, 2000}}, {}, "wgmma 16 heads, MTP runs"},
      {8, 192, 64, 256, 512, 0, {{1, 3001}, {8, 511}, {1, 65}, {3, 40}, {1, 1}, {2, 700}}, {},
       "wgmma 8 heads, decode + MTP runs"},
      {8, 192, 64, 256, 512, 0, {{9, 200}}, {}, "wgmma 8 heads, 9 rows of one sequence"},
      {16, 192, 64, 256, 512, 0, {{70, 200}}, {}, "wgmma 16 heads, prefill chunk 70"},
      {64, 192, 64, 256, 512, 2048, {{1, 5000}, {1, 1500}, {2, 2100}}, {}, "wgmma 64 heads, top-2048"},
      {8, 192, 64, 256, 512, 96, {{1, 5000}, {1, 50}, {1, 96}, {1, 97}}, {}, "wgmma 8 heads, top-96 </>= ctx"},
      {32, 192, 64, 256, 512, 8, {{2, 30}}, {{40, 9}}, "wgmma 32 heads, tree rows, top-8"},
      {16, 192, 64, 256, 512, 0, {{1, 100}}, {{70, 12}}, "wgmma 16 heads, tree rows, dense"},
  };
  for (const MlaCase& c : cases) run_mla_case(*this, *cpu_, *gpu_, *cops_, *gops_, rng_, c, false, {1, 3, 7, 0});
}

// The sparse-prefill attend of the Hopper path (kWgmmaPrefill / kWgmmaPrefillEg: mla_sparse_prefill_wgmma.cu, one
// CTA per token with all of the rank's heads in the wgmma rows, no split-KV; all three schedules bitwise equal)
// against the CPU reference and the mma.sync kernel at 8 / 16 / 32 / 64 heads: prefill chunks of several sequences whose contexts are shorter than, equal to and longer
// than top_k (-1 padded lists, one entry past the context the kernel must skip, a context of 1), the full top-2048
// (32 tiles a token), tree rows. Skips (saying why) off sm_90.
TEST_F(CudaMlaDsa, MlaAttentionSparsePrefillKernel) {
  kernels::MlaParams probe = kernels::glm_mla_params(64);
  const char* why = nullptr;
  if (!kernels::cuda::mla_attend_wgmma_supported(probe, &why)) GTEST_SKIP() << "kWgmmaPrefill not runnable: " << why;
  const std::vector<MlaCase> cases = {
      {64, 192, 64, 256, 512, 128, {{48, 400}, {1, 1}, {20, 100}, {16, 130}}, {},
       "prefill 64 heads, top-128, 4 seqs, ctx 1..400"},
      {64, 192, 64, 256, 512, 2048, {{2, 5000}, {1, 1500}, {1, 2048}}, {}, "prefill 64 heads, top-2048"},
      {32, 192, 64, 256, 512, 2048, {{6, 2100}, {4, 2050}, {3, 600}}, {}, "prefill 32 heads, top-2048, 3 seqs"},
      // >= kMlaSparsePrefillMinTokens rows: the op (kAuto) runs the prefill attend once kMlaAutoSparsePrefill is on.
      {16, 192, 64, 256, 512, 64, {{260, 400}, {10, 40}}, {}, "prefill 16 heads, top-64, 270 rows"},
      {8, 192, 64, 256, 512, 96, {{1, 5000}, {1, 50}, {1, 96}, {1, 97}, {30, 200}}, {},
       "prefill 8 heads, top-96 </>= ctx"},
      {32, 192, 64, 256, 512, 8, {{2, 30}}, {{40, 9}}, "prefill 32 heads, tree rows, top-8"},
  };
  for (const MlaCase& c : cases) run_mla_case(*this, *cpu_, *gpu_, *cops_, *gops_, rng_, c, false, {}, true);
}

void run_mla_case(CudaMlaDsa& f, Backend& cpu_be, Backend& gpu_be, MlaDsaOps& cops, MlaDsaOps& gops, std::mt19937& rng,
                  const MlaCase& c, bool both_kernels, const std::vector<int>& wgmma_splits, bool sparse_prefill) {
  SCOPED_TRACE(c.what);
  const int64_t bs = 16;
  int64_t n_blocks = 0;
  model::ForwardBatch batch = f.make_batch(c.seqs, c.trees, bs, &n_blocks);
  ASSERT_TRUE(batch.validate(1, n_blocks, bs).is_ok()) << batch.validate(1, n_blocks, bs).to_string();
  const int64_t T = batch.n_tokens(), NH = c.heads, W = c.lora + c.rope;
  auto cmeta = model::build_attention_meta(batch, cpu_be, bs, meta_shape(NH, W)).value();
  auto gmeta = model::build_attention_meta(batch, gpu_be, bs, meta_shape(NH, W)).value();
  Tensor q = f.rand({T, NH * (c.nope + c.rope)}), cache = f.rand({n_blocks * bs, W});
  Tensor kv_b = f.rand({NH * (c.nope + c.v), c.lora}, 0.2f);
  const kernels::MlaParams p = kernels::mla_params(c.heads, c.nope, c.rope, c.v, c.lora);
  // A top-k list per token: a random ascending subset of its visible keys (all when fewer), -1 padded,
  // with one index past the token's context where there is room (the op must ignore it).
  Tensor topk;
  if (c.top_k > 0) {
    topk = Tensor::empty(DType::kI32, {T, c.top_k});
    const std::vector<TokenView> views = token_views(batch, bs);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int32_t> vis;
      for (int64_t j = 0; j <= views[t].kv_index; ++j)
        if (views[t].visible(j)) vis.push_back(static_cast<int32_t>(j));
      std::shuffle(vis.begin(), vis.end(), rng);
      if (static_cast<int64_t>(vis.size()) > c.top_k) vis.resize(c.top_k);
      std::sort(vis.begin(), vis.end());
      if (static_cast<int64_t>(vis.size()) < c.top_k) vis.push_back(static_cast<int32_t>(views[t].kv_index + 1));
      vis.resize(c.top_k, -1);
      std::copy(vis.begin(), vis.end(), topk.data<int32_t>() + t * c.top_k);
    }
  }
  Tensor ref = cpu_be.alloc(DType::kF32, {T, NH * c.v});
  Tensor ctopk = c.top_k > 0 ? f.cpu(topk) : Tensor();
  cops.mla_attention(f.cpu(q), f.cpu(cache), f.cpu(kv_b), c.top_k > 0 ? &ctopk : nullptr, cmeta, p, ref);
  Tensor gtopk = c.top_k > 0 ? gpu_be.upload(topk) : Tensor();
  Tensor gq = f.gpu_bf16(q), gcache = f.gpu_bf16(cache), gkv_b = f.gpu_bf16(kv_b);
  const bool mma = kernels::cuda::mla_attend_mma_supported(p);
  // kAuto runs the wgmma path once kMlaAutoWgmma is on (and the device is sm_90): its bound then.
  const bool auto_wgmma = kernels::cuda::kMlaAutoWgmma && kernels::cuda::mla_attend_wgmma_supported(p);
  const double tol = auto_wgmma ? kTolMlaWgmma : mma ? kTolMlaMma : kTolBf16Out;
  {
    Tensor out = f.poison({T, NH * c.v});
    gops.mla_attention(gq, gcache, gkv_b, c.top_k > 0 ? &gtopk : nullptr, gmeta, p, out);
    EXPECT_CLOSE(f.host(out), ref, tol,
                 (std::string(c.what) + (auto_wgmma ? " [op: wgmma]" : mma ? " [op: mma]" : " [op: simt]")).c_str());
  }
  namespace kc = kernels::cuda;
  auto launch = [&](kc::MlaAttendKernel kernel, int splits, Tensor& out) {
    const size_t bytes = kc::mla_attention_workspace_bytes(T, p, splits);
    Tensor w = gpu_be.alloc(DType::kU8, {static_cast<int64_t>(bytes)});
    kc::mla_attention_bf16(gq.raw(), gcache.raw(), gkv_b.raw(), c.top_k > 0 ? gtopk.data<int32_t>() : nullptr,
                           c.top_k, gmeta.token_seq.data<int32_t>(), gmeta.kv_index.data<int32_t>(),
                           gmeta.block_tables.data<int32_t>(), out.raw(), p, gmeta.params, w.raw(), bytes,
                           backend::cuda_backend_stream(gpu_be), kernel, splits);
  };
  if (sparse_prefill && c.top_k > 0) {
    Tensor mma_out = f.poison({T, NH * c.v});
    launch(kc::MlaAttendKernel::kMma, 0, mma_out);
    const std::string what = std::string(c.what) + " [wgmma sparse prefill]";
    // The op with the attend's default schedule (kWgmmaPrefill) and its early-gather schedule (kWgmmaPrefillEg):
    // each against the reference and the mma op, and the two bitwise equal.
    Tensor out = f.poison({T, NH * c.v}), out_eg = f.poison({T, NH * c.v});
    launch(kc::MlaAttendKernel::kWgmmaPrefill, 0, out);
    launch(kc::MlaAttendKernel::kWgmmaPrefillEg, 0, out_eg);
    const Tensor got = f.host(out), got_eg = f.host(out_eg), mma_host = f.host(mma_out);
    EXPECT_CLOSE(got, ref, kTolMlaWgmma, what.c_str());
    EXPECT_CLOSE(got, mma_host, kTolMlaWgmma, (what + " vs mma").c_str());
    EXPECT_CLOSE(got_eg, ref, kTolMlaWgmma, (what + " early-gather").c_str());
    EXPECT_CLOSE(got_eg, mma_host, kTolMlaWgmma, (what + " early-gather vs mma").c_str());
    expect_exact(got_eg, got, (what + " op early-gather == default schedule").c_str());
    // The attend alone in its three schedules (P V waited per tile / left in flight under the next tile's scores /
    // that plus each warpgroup gathering its half of the next tile early): the same arithmetic, so bitwise-equal o_lat.
    const cudaStream_t stream = backend::cuda_backend_stream(gpu_be);
    Tensor q_abs = gpu_be.alloc(DType::kBF16, {T, NH * c.lora});
    kc::mla_absorb_gemm_bf16(gq.raw(), gkv_b.raw(), q_abs.raw(), 0, T, p, stream);
    Tensor o_plain = f.poison_bf16({T, NH * c.lora}), o_overlap = f.poison_bf16({T, NH * c.lora});
    Tensor o_early = f.poison_bf16({T, NH * c.lora});
    for (const int sched : {0, 1, 2})
      kc::mla_sparse_prefill_wgmma(gq.raw(), q_abs.raw(), gcache.raw(), gtopk.data<int32_t>(), c.top_k,
                                   gmeta.token_seq.data<int32_t>(), gmeta.kv_index.data<int32_t>(),
                                   gmeta.block_tables.data<int32_t>(),
                                   sched == 0 ? o_plain.raw() : sched == 1 ? o_overlap.raw() : o_early.raw(), 0, T, p,
                                   gmeta.params, stream, sched >= 1, sched == 2);
    const Tensor plain_host = f.host(o_plain);
    expect_exact(f.host(o_overlap), plain_host, (what + " overlap-PV schedule == plain").c_str());
    expect_exact(f.host(o_early), plain_host, (what + " early-gather schedule == plain").c_str());
  }
  if (!wgmma_splits.empty()) {
    Tensor mma_out = f.poison({T, NH * c.v});
    launch(kc::MlaAttendKernel::kMma, 0, mma_out);
    const Tensor mma_host = f.host(mma_out);
    for (const auto variant : {kc::MlaAttendKernel::kWgmma, kc::MlaAttendKernel::kWgmmaSplitS})
    for (const int splits : wgmma_splits) {
      const kc::MlaSplitPlan plan = kc::mla_attend_wgmma_split_plan(
          T,
          c.top_k > 0                      ? c.top_k
          : gmeta.params.max_kv_len > 0 ? gmeta.params.max_kv_len
                                           : int64_t{gmeta.params.max_blocks_per_seq} * gmeta.params.block_size,
          p, c.top_k > 0, splits);
      Tensor out = f.poison({T, NH * c.v});
      launch(variant, splits, out);
      const Tensor got = f.host(out);
      const std::string what = std::string(c.what) +
                               (variant == kc::MlaAttendKernel::kWgmma ? " [wgmma, " : " [wgmma split-S, ") +
                               std::to_string(plan.n_splits) + " splits" + (splits > 0 ? ", forced]" : "]");
      EXPECT_CLOSE(got, ref, kTolMlaWgmma, what.c_str());
      EXPECT_CLOSE(got, mma_host, kTolMlaWgmma, (what + " vs mma").c_str());
    }
  }
  if (!both_kernels) return;
  const size_t ws_bytes = kernels::cuda::mla_attention_workspace_bytes(T, p);
  Tensor ws = gpu_be.alloc(DType::kU8, {static_cast<int64_t>(ws_bytes)});
  for (const auto kernel : {kernels::cuda::MlaAttendKernel::kSimple, kernels::cuda::MlaAttendKernel::kMma}) {
    if (kernel == kernels::cuda::MlaAttendKernel::kMma && !mma) continue;
    Tensor out = f.poison({T, NH * c.v});
    kernels::cuda::mla_attention_bf16(gq.raw(), gcache.raw(), gkv_b.raw(),
                                      c.top_k > 0 ? gtopk.data<int32_t>() : nullptr, c.top_k,
                                      gmeta.token_seq.data<int32_t>(), gmeta.kv_index.data<int32_t>(),
                                      gmeta.block_tables.data<int32_t>(), out.raw(), p, gmeta.params, ws.raw(),
                                      ws_bytes, backend::cuda_backend_stream(gpu_be), kernel);
    const bool simple = kernel == kernels::cuda::MlaAttendKernel::kSimple;
    const double tol_k = simple ? kTolBf16Out : kTolMlaMma;
    EXPECT_CLOSE(f.host(out), ref, tol_k,
                 (std::string(c.what) + (simple ? " [simt]" : " [mma]")).c_str());
  }
}

// The indexer's weights_proj is a linear with index_n_heads outputs (2 / 4 in the fixtures, 32 in GLM-5.x):
// output rows narrower than 16 bytes, which no other model's linear produces. Last in this file: a cuBLASLt
// refusal aborts the binary.
TEST_F(CudaMlaDsa, LinearNarrowOutputs) {
  for (const int64_t n : {2, 4, 32}) {
    const int64_t m = 13, k = 64;
    Tensor x = rand({m, k}), w = rand({n, k});
    Tensor ref = cpu_->alloc(DType::kF32, {m, n});
    cpu_->linear(cpu(x), cpu(w), nullptr, ref);
    Tensor out = poison({m, n});
    gpu_->linear(gpu_bf16(x), gpu_bf16(w), nullptr, out);
    EXPECT_CLOSE(host(out), ref, kTolBf16Out, ("linear [13, 64] x [" + std::to_string(n) + ", 64]^T").c_str());
  }
}

}  // namespace
}  // namespace mxserve
