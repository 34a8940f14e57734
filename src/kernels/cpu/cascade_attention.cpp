// CPU reference: cascade (shared-prefix) decode attention as three passes (prefix per work item, suffix per
// row, log-sum-exp merge), fp32 (kernels/cpu/cascade_attention.h).
#include "kernels/cpu/cascade_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/numeric.h"

namespace mxserve::kernels::cpu {
namespace {

// Attention of one query head over keys [begin, end) of a block table: the normalized output and the
// log-sum-exp of the scaled scores (-inf and a zero output for an empty range).
struct Partial {
  std::vector<float> o;
  float lse = -INFINITY;
};

Partial attend_range(const float* qv, const void* k_cache, const void* v_cache, const int32_t* table, int64_t begin,
                     int64_t end, int kvh, const AttentionParams& p) {
  const int64_t kv_width = static_cast<int64_t>(p.n_kv_heads) * p.head_dim;
  Partial r;
  r.o.assign(p.head_dim, 0.f);
  if (end <= begin) return r;
  std::vector<float> row(p.head_dim);
  auto head_row = [&](const void* cache, const float* scales, int64_t slot) -> const float* {
    if (!p.fp8_kv()) return static_cast<const float*>(cache) + slot * kv_width + kvh * p.head_dim;
    const uint8_t* codes = static_cast<const uint8_t*>(cache) + slot * kv_width + kvh * p.head_dim;
    const float scale = scales[slot * p.n_kv_heads + kvh];
    for (int d = 0; d < p.head_dim; ++d) row[d] = fp8_e4m3_to_f32(codes[d]) * scale;
    return row.data();
  };
  auto slot_of = [&](int64_t j) {
    return static_cast<int64_t>(table[j / p.block_size]) * p.block_size + j % p.block_size;
  };
  std::vector<float> s(end - begin);
  float mx = -INFINITY;
  for (int64_t j = begin; j < end; ++j) {
    const float* kv = head_row(k_cache, p.k_scales, slot_of(j));
    float dot = 0.f;
    for (int d = 0; d < p.head_dim; ++d) dot += qv[d] * kv[d];
    s[j - begin] = dot * p.scale;
    mx = std::max(mx, s[j - begin]);
  }
  double denom = 0.0;
  for (float& x : s) {
    x = std::exp(x - mx);
    denom += x;
  }
  for (int64_t j = begin; j < end; ++j) {
    const float* vv = head_row(v_cache, p.v_scales, slot_of(j));
    const float w = static_cast<float>(s[j - begin] / denom);
    for (int d = 0; d < p.head_dim; ++d) r.o[d] += w * vv[d];
  }
  r.lse = mx + static_cast<float>(std::log(denom));
  return r;
}

}  // namespace

void cascade_attention_f32(const float* q, const void* k_cache, const void* v_cache, const int32_t* token_seq,
                           const int32_t* kv_index, const int32_t* block_tables, const int32_t* cascade,
                           const CascadeShape& shape, float* out, const AttentionParams& p) {
  const int G = p.n_heads / p.n_kv_heads;
  const int64_t T = p.n_tokens, H = p.n_heads, D = p.head_dim;
  const int32_t* prefix_keys = cascade;
  const int32_t* members = cascade + shape.cap_rows;
  const int32_t* work = cascade + 2 * shape.cap_rows;
  auto table_of = [&](int64_t t) { return block_tables + static_cast<int64_t>(token_seq[t]) * p.max_blocks_per_seq; };
  // (1) Prefix pass: per work item, rows [row_begin, row_begin + 64) of the group's members x G rows, every
  // kv head, through the first member's table (the shared blocks are the same physical blocks for all).
  std::vector<Partial> prefix(static_cast<size_t>(T * H));
  for (int32_t w = 0; w < shape.cap_work; ++w) {
    const int32_t* item = work + 4 * w;
    const int32_t member_begin = item[0], n_members = item[1], row_begin = item[2], keys = item[3];
    if (n_members == 0) continue;
    const int32_t* table = table_of(members[member_begin]);
    const int32_t rows = std::min(n_members * G, row_begin + kCascadeRowsPerItem);
    for (int kvh = 0; kvh < p.n_kv_heads; ++kvh)
      for (int32_t r = row_begin; r < rows; ++r) {
        const int64_t t = members[member_begin + r / G];
        const int64_t h = static_cast<int64_t>(kvh) * G + r % G;
        prefix[t * H + h] = attend_range(q + (t * H + h) * D, k_cache, v_cache, table, 0, keys, kvh, p);
      }
  }
  // (2) Suffix pass per row and (3) the log-sum-exp merge.
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const int kvh = static_cast<int>(h / G);
      const int64_t pk = prefix_keys[t];
      const Partial sfx = attend_range(q + (t * H + h) * D, k_cache, v_cache, table_of(t), pk,
                                       static_cast<int64_t>(kv_index[t]) + 1, kvh, p);
      float* o = out + (t * H + h) * D;
      const Partial& pre = prefix[t * H + h];
      const float lse_p = pk > 0 ? pre.lse : -INFINITY;
      const float m = std::max(lse_p, sfx.lse);
      if (m == -INFINITY) {
        std::fill(o, o + D, 0.f);
        continue;
      }
      const float wp = lse_p == -INFINITY ? 0.f : std::exp(lse_p - m);
      const float ws = sfx.lse == -INFINITY ? 0.f : std::exp(sfx.lse - m);
      for (int64_t d = 0; d < D; ++d)
        o[d] = ((pk > 0 ? pre.o[d] * wp : 0.f) + sfx.o[d] * ws) / (wp + ws);
    }
}

}  // namespace mxserve::kernels::cpu
