// Random shared-prefix decode batches for the cascade attention tests (CPU: test_cascade_attention; GPU:
// tests/ops/test_cuda_cascade_attention): groups of sequences whose block tables share whole leading blocks
// (a token prefix of any length: its partly filled last block is a private copy per sequence, as the radix
// cache leaves it), rows in no group, rows shuffled so groups interleave, physical block ids shuffled.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/op_params.h"

namespace mxserve::kernels::cascade_test {

struct CaseSpec {
  int32_t n_kv_heads = 2, group = 4, head_dim = 32, block_size = 16;
  std::vector<int32_t> group_sizes;  // sequences per shared prefix
  int32_t n_lone = 0;                // sequences sharing nothing
  int32_t min_prefix = 40, max_prefix = 200;  // shared token prefix (any length)
  int32_t min_suffix = 1, max_suffix = 60;    // tokens after the prefix (>= 1: the row's own key)
};

struct Case {
  AttentionParams p;
  std::vector<int32_t> token_seq, kv_index, tables;  // tables [rows, max_blocks]
  std::vector<int32_t> expect_shared_blocks;          // per row: floor(prefix / block) of its group, 0 if lone
  std::vector<int32_t> expect_group;                  // per row: constructed group id, -1 if lone
  int64_t n_slots = 0;
  std::vector<const int32_t*> table_ptrs() const {
    std::vector<const int32_t*> out;
    for (int32_t r = 0; r < p.n_tokens; ++r) out.push_back(tables.data() + static_cast<int64_t>(r) * p.max_blocks_per_seq);
    return out;
  }
  std::vector<int32_t> n_blocks() const {
    std::vector<int32_t> out;
    for (int32_t r = 0; r < p.n_tokens; ++r) out.push_back(kv_index[r] / p.block_size + 1);
    return out;
  }
};

inline Case make_case(const CaseSpec& s, std::mt19937& rng) {
  Case c;
  const int32_t bs = s.block_size;
  auto uni = [&](int32_t lo, int32_t hi) { return std::uniform_int_distribution<int32_t>(lo, hi)(rng); };
  struct Seq {
    int32_t group, prefix_len, len;
  };
  std::vector<Seq> seqs;
  std::vector<int32_t> prefix_len;
  for (size_t g = 0; g < s.group_sizes.size(); ++g) {
    prefix_len.push_back(uni(s.min_prefix, s.max_prefix));
    for (int32_t i = 0; i < s.group_sizes[g]; ++i)
      seqs.push_back({static_cast<int32_t>(g), prefix_len[g], prefix_len[g] + uni(s.min_suffix, s.max_suffix)});
  }
  for (int32_t i = 0; i < s.n_lone; ++i) seqs.push_back({-1, 0, uni(s.min_suffix, s.max_prefix + s.max_suffix)});
  std::shuffle(seqs.begin(), seqs.end(), rng);
  const int32_t T = static_cast<int32_t>(seqs.size());
  int32_t max_blocks = 1, total_blocks = 0;
  for (const Seq& q : seqs) max_blocks = std::max(max_blocks, (q.len + bs - 1) / bs);
  for (int32_t pl : prefix_len) total_blocks += pl / bs;
  for (const Seq& q : seqs) total_blocks += (q.len + bs - 1) / bs - q.prefix_len / bs;
  std::vector<int32_t> ids(total_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  int32_t next = 0;
  std::vector<std::vector<int32_t>> shared(prefix_len.size());
  for (size_t g = 0; g < prefix_len.size(); ++g)
    for (int32_t b = 0; b < prefix_len[g] / bs; ++b) shared[g].push_back(ids[next++]);
  c.tables.assign(static_cast<size_t>(T) * max_blocks, 0);
  for (int32_t r = 0; r < T; ++r) {
    const Seq& q = seqs[r];
    int32_t* row = c.tables.data() + static_cast<int64_t>(r) * max_blocks;
    const int32_t n_shared = q.group >= 0 ? q.prefix_len / bs : 0;
    for (int32_t b = 0; b < n_shared; ++b) row[b] = shared[q.group][b];
    for (int32_t b = n_shared; b < (q.len + bs - 1) / bs; ++b) row[b] = ids[next++];
    c.token_seq.push_back(r);
    c.kv_index.push_back(q.len - 1);
    // Whole blocks strictly before the row's own key.
    c.expect_shared_blocks.push_back(std::min(n_shared, (q.len - 1) / bs));
    c.expect_group.push_back(q.group);
  }
  c.n_slots = static_cast<int64_t>(total_blocks) * bs;
  AttentionParams& p = c.p;
  p.n_tokens = T;
  p.n_seqs = T;
  p.n_kv_heads = s.n_kv_heads;
  p.n_heads = s.n_kv_heads * s.group;
  p.head_dim = s.head_dim;
  p.block_size = bs;
  p.max_blocks_per_seq = max_blocks;
  int32_t max_kv = 1;
  for (const Seq& q : seqs) max_kv = std::max(max_kv, q.len);
  p.max_kv_len = max_kv;
  p.n_leading_decode_rows = T;
  p.scale = 1.f / std::sqrt(static_cast<float>(s.head_dim));
  return c;
}

}  // namespace mxserve::kernels::cascade_test
