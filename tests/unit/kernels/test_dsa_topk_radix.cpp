// The fused CUDA DSA indexer's top-k select, emulated on the host (kernels/dsa_topk_radix.h: the same order
// codes, 12 / 12 / 8-bit digits, bin search and output positions the kernel runs) against the CPU oracle
// (kernels::cpu::indexer_topk_f32). The oracle is fed scores chosen exactly: 2 index heads of head_dim 1
// with q = (1, -1), w = (1, -1) and unit scales give score[j] = key[j] bit for bit, so ties, zeros, negative
// scores and near-equal scores are deliberate. Every row must equal the oracle's exactly (set, order,
// padding): random scores, few distinct values (ties straddling the threshold), all equal, scores sharing
// their first 12 or 24 bits, contexts below / at / above top_k, tree rows with hidden keys, and the causal
// rows of a prefill chunk. The cluster-split select's emulation (dsa::select_split_host, 1 / 2 / 4 / 8 CTAs a
// token) must give the same rows, including ties straddling the threshold across the CTAs' key ranges.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/dsa_topk_radix.h"

namespace mxserve {
namespace {

namespace dsa = kernels::dsa;

struct Row {
  int64_t n_ctx;          // kv_index + 1
  int32_t tree_base = -1;  // -1: no tree mask
  uint64_t tree_mask = 0;
};

// Runs the oracle over one sequence of scores (every row a token of it) and the host emulation; returns the
// number of rows that differ.
int compare(const std::vector<float>& scores, const std::vector<Row>& rows, int K, const char* what) {
  const int64_t n = static_cast<int64_t>(scores.size()), T = static_cast<int64_t>(rows.size());
  constexpr int32_t kBlock = 16;
  const int64_t n_blocks = (n + kBlock - 1) / kBlock;
  std::vector<int32_t> table(n_blocks);
  for (int64_t b = 0; b < n_blocks; ++b) table[b] = static_cast<int32_t>(n_blocks - 1 - b);  // reversed blocks
  std::vector<float> keys(n_blocks * kBlock, 0.f);
  for (int64_t j = 0; j < n; ++j) keys[table[j / kBlock] * kBlock + j % kBlock] = scores[j];
  std::vector<float> q, w;
  std::vector<int32_t> token_seq(T, 0), kv_index(T), tree_base(T);
  std::vector<uint64_t> tree_mask(T);
  bool any_tree = false;
  for (int64_t t = 0; t < T; ++t) {
    q.insert(q.end(), {1.f, -1.f});
    w.insert(w.end(), {1.f, -1.f});
    kv_index[t] = static_cast<int32_t>(rows[t].n_ctx - 1);
    any_tree |= rows[t].tree_base >= 0;
    tree_base[t] = rows[t].tree_base >= 0 ? rows[t].tree_base : INT32_MAX;
    tree_mask[t] = rows[t].tree_mask;
  }
  kernels::IndexerParams p;
  p.n_heads = 2;
  p.head_dim = 1;
  p.top_k = K;
  kernels::AttentionParams ap;
  ap.n_tokens = static_cast<int32_t>(T);
  ap.n_seqs = 1;
  ap.block_size = kBlock;
  ap.max_blocks_per_seq = static_cast<int32_t>(n_blocks);
  if (any_tree) {
    ap.tree_mask = tree_mask.data();
    ap.tree_base = tree_base.data();
  }
  std::vector<int32_t> ref(T * K, -7), got(T * K, -7);
  kernels::cpu::indexer_topk_f32(q.data(), w.data(), keys.data(), token_seq.data(), kv_index.data(), table.data(),
                                 ref.data(), p, ap);
  int differ = 0;
  for (int64_t t = 0; t < T; ++t) {
    const Row& r = rows[t];
    std::vector<uint32_t> codes(r.n_ctx);
    for (int64_t j = 0; j < r.n_ctx; ++j) {
      const bool visible = r.tree_base < 0 || j < r.tree_base || ((r.tree_mask >> (j - r.tree_base)) & 1u) != 0;
      codes[j] = visible ? dsa::order_code(scores[j]) : 0u;
    }
    dsa::select_host(codes.data(), r.n_ctx, static_cast<uint32_t>(K), got.data() + t * K);
    bool same = std::equal(got.begin() + t * K, got.begin() + (t + 1) * K, ref.begin() + t * K);
    // The cluster-split select (kFusedSplit) at every cluster size it launches: the same row.
    for (const int ctas : {1, 2, 4, 8}) {
      std::vector<int32_t> split(K, -7);
      dsa::select_split_host(codes.data(), r.n_ctx, static_cast<uint32_t>(K), ctas, split.data());
      if (!std::equal(split.begin(), split.end(), ref.begin() + t * K)) {
        ADD_FAILURE() << what << ": row " << t << " (ctx " << r.n_ctx << "): the " << ctas
                      << "-CTA split select differs from the oracle";
        same = false;
      }
    }
    differ += same ? 0 : 1;
    if (!same) {
      for (int i = 0; i < K; ++i)
        if (got[t * K + i] != ref[t * K + i]) {
          ADD_FAILURE() << what << ": row " << t << " (ctx " << r.n_ctx << ") entry " << i << ": emulation "
                        << got[t * K + i] << ", oracle " << ref[t * K + i];
          break;
        }
    }
  }
  std::printf("[ radix    ] %-52s %lld rows, K %d: %d differ from the oracle\n", what, static_cast<long long>(T), K,
              differ);
  return differ;
}

std::vector<Row> one_row(int64_t n) { return {Row{n}}; }

TEST(DsaTopkRadix, OrderCodeIsMonotone) {
  const std::vector<float> v = {-INFINITY, -3e38f, -1.f, -1e-30f, -1e-45f, -0.f, 0.f, 1e-45f, 1e-30f, 1.f,
                                std::nextafter(1.f, 2.f), 3e38f, INFINITY};
  for (size_t i = 0; i + 1 < v.size(); ++i) {
    if (v[i] == v[i + 1]) EXPECT_EQ(dsa::order_code(v[i]), dsa::order_code(v[i + 1])) << v[i];
    else EXPECT_LT(dsa::order_code(v[i]), dsa::order_code(v[i + 1])) << v[i] << " < " << v[i + 1];
    EXPECT_NE(dsa::order_code(v[i]), 0u) << "0 means not visible";
  }
}

TEST(DsaTopkRadix, MatchesOracle) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto random_scores = [&](int64_t n) {
    std::vector<float> s(n);
    for (float& x : s) x = normal(rng);
    return s;
  };
  int differ = 0;
  differ += compare(random_scores(20000), one_row(20000), 2048, "random, 20k keys, top-2048");
  differ += compare(random_scores(4099), one_row(4099), 2048, "random, non-multiple length");
  {
    std::vector<float> s(5000);
    for (int64_t j = 0; j < 5000; ++j) s[j] = static_cast<float>((j * 7919) % 7) - 3.f;  // 7 values, zeros too
    differ += compare(s, one_row(5000), 2048, "7 distinct values: ties straddle the threshold");
    for (int64_t j = 0; j < 5000; j += 3) s[j] = -0.f;
    differ += compare(s, one_row(5000), 1000, "with -0 and +0 (one code)");
  }
  differ += compare(std::vector<float>(3000, 0.25f), one_row(3000), 2048, "all equal");
  differ += compare(std::vector<float>(3000, 0.f), one_row(3000), 7, "all zero (every ReLU off)");
  {
    std::vector<float> s(9000);  // one first digit (> the kernel's 4096 candidates), distinct low bits
    float x = 1.f;
    for (float& v : s) v = x = std::nextafter(x, 2.f);
    std::shuffle(s.begin(), s.end(), rng);
    for (int64_t j = 0; j < 9000; j += 5) s[j] = s[(j + 1) % 9000];  // and ties among them
    differ += compare(s, one_row(9000), 2048, "scores sharing their first 12 bits");
    std::vector<float> s24(3000);
    for (int64_t j = 0; j < 3000; ++j) {
      uint32_t u = 0x3f800000u | static_cast<uint32_t>(j % 200);  // the first 24 bits equal
      std::memcpy(&s24[j], &u, 4);
    }
    differ += compare(s24, one_row(3000), 1111, "scores sharing their first 24 bits");
  }
  for (int64_t n : {int64_t{1}, int64_t{2047}, int64_t{2048}, int64_t{2049}, int64_t{2100}})
    differ += compare(random_scores(n), one_row(n), 2048, ("context vs top_k 2048: " + std::to_string(n)).c_str());
  {
    std::vector<float> s = random_scores(3000);
    for (int64_t j = 2950; j < 3000; ++j) s[j] = 100.f;  // the hidden tree keys would win if visible
    const std::vector<Row> rows = {{3000, 2950, 0x5555555555555ull}, {2990, 2950, 0x1ull}, {2000, 1990, 0x3ull},
                                   {3000}};
    differ += compare(s, rows, 2048, "tree rows (hidden keys) + a plain row");
  }
  {
    std::vector<float> s(6000);
    for (int64_t j = 0; j < 6000; ++j) s[j] = static_cast<float>(j % 13) * 0.5f;
    std::vector<Row> chunk;
    for (int64_t n = 1990; n <= 6000; n += 401) chunk.push_back({n});  // causal rows of one prefill chunk
    differ += compare(s, chunk, 2048, "prefill chunk: causal rows, tied scores");
    differ += compare(s, chunk, 1, "top-1 of tied scores");
  }
  {
    // The split select's ranges: ties straddling the threshold and the range borders (every 5th key at the
    // k-th score, the rest above / below), contexts not a multiple of the cluster size.
    for (const int64_t n : {int64_t{2049}, int64_t{20001}, int64_t{65536}}) {
      std::vector<float> s(n);
      for (int64_t j = 0; j < n; ++j) s[j] = j % 5 == 0 ? 1.f : (j % 5 < 3 ? 2.f : 0.5f);
      differ += compare(s, one_row(n), 2048, ("split: ties across the CTA ranges, " + std::to_string(n)).c_str());
    }
  }
  EXPECT_EQ(differ, 0);
}

TEST(DsaTopkRadix, SplitCtasPerToken) {
  EXPECT_EQ(dsa::split_ctas(1, 20480, 132, 8), 8);   // batch 1: 8 SMs for the select
  EXPECT_EQ(dsa::split_ctas(16, 20480, 132, 8), 8);  // 128 CTAs, one wave
  EXPECT_EQ(dsa::split_ctas(32, 20480, 132, 8), 4);
  EXPECT_EQ(dsa::split_ctas(64, 65536, 132, 8), 2);
  EXPECT_EQ(dsa::split_ctas(200, 65536, 132, 8), 1);
  EXPECT_EQ(dsa::split_ctas(1, 2048, 132, 8), 1);    // <= 2048 keys a CTA: no split
  EXPECT_EQ(dsa::split_ctas(1, 8192, 132, 8), 4);
  EXPECT_EQ(dsa::split_ctas(0, 20480, 0, 8), 1);     // degenerate inputs stay in range
}

TEST(DsaTopkRadix, SplitRangesCoverTheRow) {
  for (const int64_t n : {int64_t{1}, int64_t{7}, int64_t{2048}, int64_t{20001}})
    for (const int ctas : {1, 2, 4, 8}) {
      int64_t next = 0;
      for (int r = 0; r < ctas; ++r) {
        const dsa::SplitRange range = dsa::split_range(n, ctas, r);
        EXPECT_EQ(range.lo, next) << n << " keys, rank " << r << " of " << ctas;
        EXPECT_LE(range.lo, range.hi);
        next = range.hi;
      }
      EXPECT_EQ(next, n) << n << " keys over " << ctas;
    }
}

}  // namespace
}  // namespace mxserve
