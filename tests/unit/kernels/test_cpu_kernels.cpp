// The CPU reference kernels against independent, direct formulas (double precision where it matters).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"

namespace mxserve::kernels::cpu {
namespace {

float sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }
float logit(float p) { return std::log(p / (1.f - p)); }

TEST(Router, GroupMaskingWithNegativeBiasedScores) {
  // 8 experts in 4 groups of 2; keep 2 groups; top-2. The bias makes every biased score negative, so
  // masking with 0 (instead of -inf) would wrongly prefer experts of the dropped groups.
  RouterParams p{.n_experts = 8, .top_k = 2, .n_group = 4, .topk_group = 2, .norm_topk_prob = true,
                 .routed_scaling_factor = 2.5f};
  const float s[8] = {0.10f, 0.20f, 0.90f, 0.80f, 0.30f, 0.35f, 0.60f, 0.70f};
  float bias[8], logits[8];
  for (int e = 0; e < 8; ++e) {
    bias[e] = -1.0f;
    logits[e] = logit(s[e]);
  }
  int32_t ids[2];
  float w[2];
  moe_router_f32(logits, bias, ids, w, 1, p);
  // Group scores (sum of top 2, biased): g0 -1.7, g1 -0.3, g2 -1.35, g3 -0.7 -> keep g1, g3; top-2 = {2, 3}.
  EXPECT_EQ((std::set<int>{ids[0], ids[1]}), (std::set<int>{2, 3}));
  EXPECT_NEAR(w[0] + w[1], 2.5f, 1e-5);  // normalized, then scaled
  EXPECT_NEAR(ids[0] == 2 ? w[0] : w[1], 0.9f / 1.7f * 2.5f, 1e-5);

  // Same scores, keep only 1 group whose members are both negative after bias: with top_k 2 the picks
  // must stay inside it even though dropped experts would score 0 under a 0-mask.
  p.topk_group = 1;
  moe_router_f32(logits, bias, ids, w, 1, p);
  EXPECT_EQ((std::set<int>{ids[0], ids[1]}), (std::set<int>{2, 3}));
}

TEST(Router, BiasSelectsButDoesNotWeight) {
  RouterParams p{.n_experts = 4, .top_k = 1, .n_group = 1, .topk_group = 1, .norm_topk_prob = false,
                 .routed_scaling_factor = 1.0f};
  const float s[4] = {0.9f, 0.2f, 0.3f, 0.4f};
  const float bias[4] = {0.f, 1.0f, 0.f, 0.f};  // expert 1 wins selection only because of its bias
  float logits[4];
  for (int e = 0; e < 4; ++e) logits[e] = logit(s[e]);
  int32_t id;
  float w;
  moe_router_f32(logits, bias, &id, &w, 1, p);
  EXPECT_EQ(id, 1);
  EXPECT_NEAR(w, 0.2f, 1e-6);  // the unbiased sigmoid score, not 1.2
}

TEST(Router, TopKEqualsExpertCount) {
  RouterParams p{.n_experts = 6, .top_k = 6, .n_group = 1, .topk_group = 1, .norm_topk_prob = true,
                 .routed_scaling_factor = 1.0f};
  std::mt19937 rng(1);
  std::normal_distribution<float> n(0.f, 1.f);
  float logits[12];
  const float bias[6] = {0.1f, -0.2f, 0.3f, 0.f, 0.05f, -0.4f};
  for (float& l : logits) l = n(rng);
  int32_t ids[12];
  float w[12];
  moe_router_f32(logits, bias, ids, w, 2, p);
  for (int t = 0; t < 2; ++t) {
    EXPECT_EQ(std::set<int>(ids + 6 * t, ids + 6 * t + 6).size(), 6u);
    float total = 0;
    for (int e = 0; e < 6; ++e) total += sigmoid(logits[6 * t + e]);
    for (int k = 0; k < 6; ++k) EXPECT_NEAR(w[6 * t + k], sigmoid(logits[6 * t + ids[6 * t + k]]) / total, 1e-6);
  }
}

TEST(Rope, PartialNeoxMatchesDirectFormula) {
  RopeParams p{.n_heads = 3, .head_dim = 16, .rotary_dim = 8, .theta = 10000.f};
  const int T = 5;
  std::vector<int32_t> pos = {0, 1, 7, 100, 4095};
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> x(T * p.n_heads * p.head_dim);
  for (float& v : x) v = u(rng);
  const std::vector<float> orig = x;
  rope_neox_f32(x.data(), pos.data(), T, p);
  const int half = p.rotary_dim / 2;
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < p.n_heads; ++h) {
      const float* o = &orig[(t * p.n_heads + h) * p.head_dim];
      const float* r = &x[(t * p.n_heads + h) * p.head_dim];
      const double tol = 2e-4 * (1 + pos[t] / 1000.0);  // fp32 angle rounding grows with position
      for (int j = 0; j < half; ++j) {
        const double a = pos[t] / std::pow(10000.0, 2.0 * j / p.rotary_dim);
        EXPECT_NEAR(r[j], o[j] * std::cos(a) - o[j + half] * std::sin(a), tol);
        EXPECT_NEAR(r[j + half], o[j + half] * std::cos(a) + o[j] * std::sin(a), tol);
      }
      for (int d = p.rotary_dim; d < p.head_dim; ++d) EXPECT_EQ(r[d], o[d]) << "pass-through dim " << d;
    }
}

TEST(RmsNorm, MatchesDefinition) {
  const int R = 3, C = 7;
  std::vector<float> x(R * C), w(C), out(R * C);
  for (int i = 0; i < R * C; ++i) x[i] = static_cast<float>(i % 5) - 2.f;
  for (int c = 0; c < C; ++c) w[c] = 0.5f + c;
  rmsnorm_f32(x.data(), w.data(), out.data(), R, C, 1e-5f);
  for (int r = 0; r < R; ++r) {
    double ss = 0;
    for (int c = 0; c < C; ++c) ss += x[r * C + c] * x[r * C + c];
    const double inv = 1.0 / std::sqrt(ss / C + 1e-5);
    for (int c = 0; c < C; ++c) EXPECT_NEAR(out[r * C + c], w[c] * x[r * C + c] * inv, 1e-5);
  }
}

// The fused residual add + RMSNorm is bit for bit the add then rmsnorm_f32 (the forward's oracle for the
// CUDA kernel), including out aliasing x and more than 16 rows (the OpenMP path).
TEST(AddRmsNorm, BitwiseEqualsAddThenRmsNorm) {
  std::mt19937 rng(36);
  std::normal_distribution<float> nd(0.f, 2.f);
  for (const auto& [R, C, alias] : {std::tuple{1, 6144, false}, std::tuple{3, 7, true}, std::tuple{37, 256, false},
                                   std::tuple{20, 64, true}}) {
    std::vector<float> x(R * C), res(R * C), w(C);
    for (float& v : x) v = nd(rng);
    for (float& v : res) v = nd(rng) * 10.f;
    for (float& v : w) v = 1.f + 0.1f * nd(rng);
    // reference: residual += x; out = rmsnorm(residual)
    std::vector<float> res_ref = res, out_ref(R * C);
    for (int i = 0; i < R * C; ++i) res_ref[i] += x[i];
    rmsnorm_f32(res_ref.data(), w.data(), out_ref.data(), R, C, 1e-5f);
    std::vector<float> res_got = res, x_in = x, out_buf(R * C, std::numeric_limits<float>::quiet_NaN());
    float* out = alias ? x_in.data() : out_buf.data();
    add_rmsnorm_f32(x_in.data(), res_got.data(), w.data(), out, R, C, 1e-5f);
    SCOPED_TRACE(testing::Message() << "rows " << R << " cols " << C << (alias ? " out = x" : ""));
    int res_diff = 0, out_diff = 0;
    for (int i = 0; i < R * C; ++i) {
      res_diff += std::memcmp(&res_got[i], &res_ref[i], sizeof(float)) != 0;
      out_diff += std::memcmp(&out[i], &out_ref[i], sizeof(float)) != 0;
    }
    EXPECT_EQ(res_diff, 0);
    EXPECT_EQ(out_diff, 0);
    // and the values are a norm: the row's mean square of out / w is ~1
    double ms = 0;
    for (int c = 0; c < C; ++c) ms += static_cast<double>(out[c] / w[c]) * (out[c] / w[c]);
    EXPECT_NEAR(ms / C, 1.0, 1e-3);
  }
}

TEST(PagedAttention, MatchesContiguousCausalAttention) {
  // Two sequences in shuffled blocks of size 3; GQA: 4 query heads over 2 KV heads.
  AttentionParams p{.n_tokens = 0, .n_seqs = 2, .n_heads = 4, .n_kv_heads = 2, .head_dim = 8, .block_size = 3,
                    .max_blocks_per_seq = 3, .scale = 0.35f};
  const int lens[2] = {7, 4};
  const int32_t tables[2][3] = {{5, 0, 3}, {2, 4, 0}};
  const int kvw = p.n_kv_heads * p.head_dim;
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0.f, 1.f);
  std::vector<float> kc(6 * 3 * kvw, NAN), vc(6 * 3 * kvw, NAN);  // unwritten slots poison the result
  std::vector<std::vector<float>> K(2), V(2);
  std::vector<int32_t> token_seq, kv_index;
  std::vector<float> q;
  for (int s = 0; s < 2; ++s) {
    K[s].resize(lens[s] * kvw);
    V[s].resize(lens[s] * kvw);
    for (int j = 0; j < lens[s]; ++j) {
      const int slot = tables[s][j / 3] * 3 + j % 3;
      for (int c = 0; c < kvw; ++c) {
        K[s][j * kvw + c] = kc[slot * kvw + c] = n(rng);
        V[s][j * kvw + c] = vc[slot * kvw + c] = n(rng);
      }
      token_seq.push_back(s);
      kv_index.push_back(j);
      for (int c = 0; c < p.n_heads * p.head_dim; ++c) q.push_back(n(rng));
    }
  }
  p.n_tokens = static_cast<int32_t>(token_seq.size());
  std::vector<float> out(q.size());
  paged_attention_f32(q.data(), kc.data(), vc.data(), token_seq.data(), kv_index.data(), &tables[0][0], out.data(), p);
  for (int t = 0; t < p.n_tokens; ++t)
    for (int h = 0; h < p.n_heads; ++h) {
      const int s = token_seq[t], kvh = h / 2;
      std::vector<double> sc(kv_index[t] + 1);
      double mx = -1e300, den = 0;
      for (int j = 0; j <= kv_index[t]; ++j) {
        double d = 0;
        for (int c = 0; c < p.head_dim; ++c)
          d += q[(t * p.n_heads + h) * p.head_dim + c] * K[s][j * kvw + kvh * p.head_dim + c];
        sc[j] = d * p.scale;
        mx = std::max(mx, sc[j]);
      }
      for (double& v : sc) den += (v = std::exp(v - mx));
      for (int c = 0; c < p.head_dim; ++c) {
        double o = 0;
        for (int j = 0; j <= kv_index[t]; ++j) o += sc[j] / den * V[s][j * kvw + kvh * p.head_dim + c];
        EXPECT_NEAR(out[(t * p.n_heads + h) * p.head_dim + c], o, 1e-5);
      }
    }
}


// Tree attention: rows of a speculative tree see the committed context plus their ancestors (and
// themselves) only; a plain causal sequence shares the batch. Reference: a materialized [T, kv] mask.
TEST(PagedAttention, TreeMaskMatchesMaterializedMask) {
  AttentionParams p{.n_tokens = 0, .n_seqs = 2, .n_heads = 4, .n_kv_heads = 2, .head_dim = 8, .block_size = 4,
                    .max_blocks_per_seq = 4, .scale = 0.3f};
  const int32_t tables[2][4] = {{6, 1, 3, 0}, {2, 4, 5, 7}};
  const int kvw = p.n_kv_heads * p.head_dim;
  std::mt19937 rng(11);
  std::normal_distribution<float> n(0.f, 1.f);
  std::vector<float> kc(8 * 4 * kvw), vc(8 * 4 * kvw);
  for (auto& x : kc) x = n(rng);
  for (auto& x : vc) x = n(rng);
  // Sequence 0: context 0..4 (x_last at 4), tree nodes at KV 5..11 with these parents (node indices).
  const int32_t base = 5;
  const std::vector<int32_t> parents = {-1, -1, 0, 0, 1, 2, 5};
  std::vector<int32_t> token_seq, kv_index, tree_base;
  std::vector<uint64_t> tree_mask;
  std::vector<std::vector<char>> allowed;  // [t][j]
  token_seq.push_back(0);
  kv_index.push_back(base - 1);
  tree_base.push_back(base);
  tree_mask.push_back(0);
  allowed.push_back(std::vector<char>(base, 1));
  std::vector<uint64_t> anc(parents.size());
  for (size_t i = 0; i < parents.size(); ++i) {
    anc[i] = (parents[i] < 0 ? 0 : anc[parents[i]]) | (uint64_t{1} << i);
    token_seq.push_back(0);
    kv_index.push_back(base + static_cast<int32_t>(i));
    tree_base.push_back(base);
    tree_mask.push_back(anc[i]);
    std::vector<char> a(base + i + 1, 0);
    for (int j = 0; j < base; ++j) a[j] = 1;
    for (int32_t c = static_cast<int32_t>(i); c >= 0; c = parents[c]) a[base + c] = 1;  // ancestors and self
    allowed.push_back(a);
  }
  // Sequence 1: a plain causal prefill of 6 tokens.
  for (int j = 0; j < 6; ++j) {
    token_seq.push_back(1);
    kv_index.push_back(j);
    tree_base.push_back(std::numeric_limits<int32_t>::max());
    tree_mask.push_back(0);
    allowed.push_back(std::vector<char>(j + 1, 1));
  }
  p.n_tokens = static_cast<int32_t>(token_seq.size());
  p.tree_mask = tree_mask.data();
  p.tree_base = tree_base.data();
  std::vector<float> q(p.n_tokens * p.n_heads * p.head_dim), out(q.size());
  for (auto& x : q) x = n(rng);
  paged_attention_f32(q.data(), kc.data(), vc.data(), token_seq.data(), kv_index.data(), &tables[0][0], out.data(), p);
  for (int t = 0; t < p.n_tokens; ++t)
    for (int h = 0; h < p.n_heads; ++h) {
      const int s = token_seq[t], kvh = h / 2;
      auto slot = [&](int j) { return tables[s][j / 4] * 4 + j % 4; };
      double mx = -1e300, den = 0;
      std::vector<double> sc(allowed[t].size(), 0);
      for (size_t j = 0; j < allowed[t].size(); ++j) {
        if (!allowed[t][j]) continue;
        double d = 0;
        for (int c = 0; c < p.head_dim; ++c)
          d += q[(t * p.n_heads + h) * p.head_dim + c] * kc[slot(j) * kvw + kvh * p.head_dim + c];
        sc[j] = d * p.scale;
        mx = std::max(mx, sc[j]);
      }
      for (size_t j = 0; j < sc.size(); ++j) den += allowed[t][j] ? (sc[j] = std::exp(sc[j] - mx)) : (sc[j] = 0);
      for (int c = 0; c < p.head_dim; ++c) {
        double o = 0;
        for (size_t j = 0; j < sc.size(); ++j) o += sc[j] / den * vc[slot(j) * kvw + kvh * p.head_dim + c];
        EXPECT_NEAR(out[(t * p.n_heads + h) * p.head_dim + c], o, 1e-5) << "row " << t << " head " << h;
      }
    }
}

// KV compaction: pairs applied in order (a later pair may read what an earlier one wrote).
TEST(KvCopy, MatchesSequentialReference) {
  const int kvw = 6, n_slots = 12;
  std::vector<float> k(n_slots * kvw), v(n_slots * kvw);
  for (int i = 0; i < n_slots * kvw; ++i) {
    k[i] = static_cast<float>(i);
    v[i] = static_cast<float>(-i);
  }
  std::vector<float> rk = k, rv = v;
  const std::vector<int32_t> src = {7, 9, 3, 4, 11}, dst = {3, 4, 5, 4, 0};
  for (size_t i = 0; i < src.size(); ++i)
    for (int c = 0; c < kvw; ++c) {
      rk[dst[i] * kvw + c] = rk[src[i] * kvw + c];
      rv[dst[i] * kvw + c] = rv[src[i] * kvw + c];
    }
  kv_copy_f32(src.data(), dst.data(), static_cast<int64_t>(src.size()), k.data(), v.data(), kvw);
  EXPECT_EQ(k, rk);
  EXPECT_EQ(v, rv);
  EXPECT_EQ(k[5 * kvw], 7.f * kvw) << "slot 5 got slot 3's new value (slot 7's row)";
}

}  // namespace
}  // namespace mxserve::kernels::cpu
