// CPU reference for MLA + DeepSeek sparse attention (glm_moe_dsa), fp32 with fp64 softmax denominators:
// LayerNorm (the indexer key norm), GPT-J interleaved RoPE, column-offset cache writes, the DSA indexer's
// top-k and absorbed MLA attention over the paged latent cache. Semantics: research/glm5-dsa.md.
// Invariant: a token only ever sees KV indices j <= kv_index[t] that its tree mask (if any) allows; the
// indexer and the attention apply the same visibility rule, so a sparse set never widens the causal one.
// FP8 cache (--kv-cache-dtype fp8_e4m3): the latent and indexer-key caches hold packed FP8 rows
// (kernels/mla_fp8.h, the bytes the CUDA kernels write); readers dequantize a row on the fly (RowReader).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/numeric.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/mla_fp8.h"

namespace mxserve::kernels::cpu {
namespace {

struct Visibility {
  int64_t n_ctx;
  int64_t tree_base;
  uint64_t tree_mask;
  bool operator()(int64_t j) const {
    return j < n_ctx && (j < tree_base || ((tree_mask >> (j - tree_base)) & 1u) != 0);
  }
};

Visibility visibility(const int32_t* kv_index, const AttentionParams& ap, int64_t t) {
  const int64_t n_ctx = static_cast<int64_t>(kv_index[t]) + 1;
  if (ap.tree_mask == nullptr) return {n_ctx, n_ctx, 0};
  return {n_ctx, ap.tree_base[t], ap.tree_mask[t]};
}

int64_t slot_of(const int32_t* table, int64_t j, int64_t block_size) {
  return static_cast<int64_t>(table[j / block_size]) * block_size + j % block_size;
}

// One cache row as f32: a pointer into an f32 cache, or a packed FP8 row (mla_fp8.h) dequantized into buf_.
class RowReader {
 public:
  RowReader(const void* cache, bool fp8, int64_t n, int64_t tail)
      : cache_(cache), fp8_(fp8), n_(n), tail_(tail),
        stride_(fp8 ? mla_fp8_row_bytes(n, tail) : n + tail), buf_(fp8 ? n + tail : 0) {}
  const float* row(int64_t slot) {
    if (!fp8_) return static_cast<const float*>(cache_) + slot * stride_;
    dequant_fp8_packed_row(static_cast<const uint8_t*>(cache_) + slot * stride_, n_, tail_, buf_.data());
    return buf_.data();
  }

 private:
  const void* cache_;
  bool fp8_;
  int64_t n_, tail_, stride_;
  std::vector<float> buf_;
};

}  // namespace

void cache_write_fp8_packed(const float* rows, const int32_t* slot_mapping, uint8_t* cache, int64_t n_tokens,
                            int64_t width, int64_t row_bytes, int64_t col_offset) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    if (slot_mapping[t] < 0) continue;
    uint8_t* row = cache + static_cast<int64_t>(slot_mapping[t]) * row_bytes;
    const float* x = rows + t * width;
    if (col_offset > 0) {  // the bf16 tail after the quantized part of col_offset values
      uint8_t* tail = row + mla_fp8_tail_offset(col_offset);
      for (int64_t c = 0; c < width; ++c) {
        const uint16_t b = f32_to_bf16(x[c]);
        std::memcpy(tail + 2 * c, &b, 2);
      }
      continue;
    }
    for (int64_t b0 = 0, blk = 0; b0 < width; b0 += kMlaFp8Block, ++blk) {
      const int64_t e = std::min<int64_t>(width, b0 + kMlaFp8Block);
      float amax = 0.f;
      for (int64_t c = b0; c < e; ++c) amax = std::max(amax, std::fabs(x[c]));
      const float scale = kv_fp8_scale(amax);
      for (int64_t c = b0; c < e; ++c) row[c] = kv_fp8_quantize(x[c], scale);
      std::memcpy(row + width + 4 * blk, &scale, 4);
    }
  }
}

void dequant_fp8_packed_row(const uint8_t* row, int64_t n, int64_t tail, float* out) {
  for (int64_t blk = 0; blk < mla_fp8_n_scales(n); ++blk) {
    float scale;
    std::memcpy(&scale, row + n + 4 * blk, 4);
    const int64_t e = std::min<int64_t>(n, (blk + 1) * kMlaFp8Block);
    for (int64_t c = blk * kMlaFp8Block; c < e; ++c) out[c] = fp8_e4m3_to_f32(row[c]) * scale;
  }
  const uint8_t* t = row + mla_fp8_tail_offset(n);
  for (int64_t c = 0; c < tail; ++c) {
    uint16_t b;
    std::memcpy(&b, t + 2 * c, 2);
    out[n + c] = bf16_to_f32(b);
  }
}

void layernorm_f32(const float* x, const float* w, const float* b, float* out, int64_t rows, int64_t cols,
                   float eps) {
#pragma omp parallel for if (rows > 16)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    double mean = 0;
    for (int64_t c = 0; c < cols; ++c) mean += xr[c];
    mean /= static_cast<double>(cols);
    double var = 0;
    for (int64_t c = 0; c < cols; ++c) var += (xr[c] - mean) * (xr[c] - mean);
    var /= static_cast<double>(cols);
    const float inv = static_cast<float>(1.0 / std::sqrt(var + eps));
    float* o = out + r * cols;
    for (int64_t c = 0; c < cols; ++c) o[c] = (static_cast<float>(xr[c] - mean) * inv) * w[c] + b[c];
  }
}

void rope_interleaved_f32(float* x, const int32_t* positions, int64_t n_tokens, const InterleavedRopeParams& p) {
  const int half = p.rotary_dim / 2;
  std::vector<float> inv_freq(half);
  for (int j = 0; j < half; ++j) {  // transformers: 1 / theta^(arange(0, rd, 2) / rd) in fp32
    const float exponent = static_cast<float>(2 * j) / static_cast<float>(p.rotary_dim);
    inv_freq[j] = 1.0f / static_cast<float>(std::pow(static_cast<double>(p.theta), static_cast<double>(exponent)));
  }
#pragma omp parallel for if (n_tokens > 16)
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float pos = static_cast<float>(positions[t]);
    for (int j = 0; j < half; ++j) {
      const float angle = pos * inv_freq[j];
      const float c = std::cos(angle), s = std::sin(angle);
      for (int h = 0; h < p.n_heads; ++h) {
        float* v = x + (t * p.n_heads + h) * p.head_stride + p.rot_offset;
        const float x1 = v[2 * j], x2 = v[2 * j + 1];
        v[2 * j] = x1 * c - x2 * s;
        v[2 * j + 1] = x2 * c + x1 * s;
      }
    }
  }
}

void cache_write_f32(const float* rows, const int32_t* slot_mapping, float* cache, int64_t n_tokens, int64_t width,
                     int64_t cache_width, int64_t col_offset) {
  for (int64_t t = 0; t < n_tokens; ++t)
    std::memcpy(cache + static_cast<int64_t>(slot_mapping[t]) * cache_width + col_offset, rows + t * width,
                sizeof(float) * width);
}

void indexer_topk_f32(const float* q, const float* weights, const void* key_cache, const int32_t* token_seq,
                      const int32_t* kv_index, const int32_t* block_tables, int32_t* topk, const IndexerParams& p,
                      const AttentionParams& ap) {
  const int64_t D = p.head_dim, NH = p.n_heads, K = p.top_k;
#pragma omp parallel
  {
    std::vector<std::pair<float, int32_t>> cand;
    RowReader keys(key_cache, p.fp8_keys, D, 0);
#pragma omp for
    for (int64_t t = 0; t < ap.n_tokens; ++t) {
      const Visibility vis = visibility(kv_index, ap, t);
      const int32_t* table = block_tables + static_cast<int64_t>(token_seq[t]) * ap.max_blocks_per_seq;
      cand.clear();
      for (int64_t j = 0; j < vis.n_ctx; ++j) {
        if (!vis(j)) continue;
        const float* key = keys.row(slot_of(table, j, ap.block_size));
        float score = 0.f;
        for (int64_t h = 0; h < NH; ++h) {
          const float* qh = q + (t * NH + h) * D;
          float dot = 0.f;
          for (int64_t d = 0; d < D; ++d) dot += qh[d] * key[d];
          score += weights[t * NH + h] * p.weight_scale * std::max(dot * p.score_scale, 0.f);
        }
        cand.emplace_back(score, static_cast<int32_t>(j));
      }
      if (static_cast<int64_t>(cand.size()) > K) {
        std::partial_sort(cand.begin(), cand.begin() + K, cand.end(), [](const auto& a, const auto& b) {
          return a.first > b.first || (a.first == b.first && a.second < b.second);
        });
        cand.resize(static_cast<size_t>(K));
      }
      std::sort(cand.begin(), cand.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
      int32_t* out = topk + t * K;
      for (int64_t i = 0; i < K; ++i) out[i] = i < static_cast<int64_t>(cand.size()) ? cand[i].second : -1;
    }
  }
}

void mla_attention_f32(const float* q, const void* cache, const float* kv_b, const int32_t* topk, int64_t topk_width,
                       const int32_t* token_seq, const int32_t* kv_index, const int32_t* block_tables, float* out,
                       const MlaParams& p, const AttentionParams& ap) {
  const int64_t NOPE = p.qk_nope_dim, ROPE = p.qk_rope_dim, V = p.v_dim, L = p.kv_lora_rank;
  const int64_t q_stride = NOPE + ROPE, kvb_rows = NOPE + V;
#pragma omp parallel
  {
    RowReader rows(cache, p.fp8_cache, L, ROPE);
    std::vector<float> q_abs(L), o_lat(L), scores;
    std::vector<int64_t> keys;
#pragma omp for collapse(2)
    for (int64_t t = 0; t < ap.n_tokens; ++t) {
      for (int64_t h = 0; h < p.n_heads; ++h) {
        const Visibility vis = visibility(kv_index, ap, t);
        const int32_t* table = block_tables + static_cast<int64_t>(token_seq[t]) * ap.max_blocks_per_seq;
        keys.clear();
        if (topk != nullptr) {
          for (int64_t i = 0; i < topk_width; ++i) {
            const int64_t j = topk[t * topk_width + i];
            if (j >= 0 && vis(j)) keys.push_back(j);
          }
        } else {
          for (int64_t j = 0; j < vis.n_ctx; ++j)
            if (vis(j)) keys.push_back(j);
        }
        const float* qn = q + (t * p.n_heads + h) * q_stride;
        const float* qr = qn + NOPE;
        const float* w_uk = kv_b + h * kvb_rows * L;  // rows [0, NOPE) of this head: k_nope = W_uk latent
        const float* w_uv = w_uk + NOPE * L;          // rows [NOPE, NOPE + V): v = W_uv latent
        std::fill(q_abs.begin(), q_abs.end(), 0.f);
        for (int64_t d = 0; d < NOPE; ++d)
          for (int64_t c = 0; c < L; ++c) q_abs[c] += qn[d] * w_uk[d * L + c];
        scores.resize(keys.size());
        float max_score = -INFINITY;
        for (size_t i = 0; i < keys.size(); ++i) {
          const float* row = rows.row(slot_of(table, keys[i], ap.block_size));
          float dot = 0.f;
          for (int64_t c = 0; c < L; ++c) dot += q_abs[c] * row[c];
          for (int64_t r = 0; r < ROPE; ++r) dot += qr[r] * row[L + r];
          scores[i] = dot * p.scale;
          max_score = std::max(max_score, scores[i]);
        }
        double denom = 0.0;
        for (float& s : scores) {
          s = std::exp(s - max_score);
          denom += s;
        }
        std::fill(o_lat.begin(), o_lat.end(), 0.f);
        for (size_t i = 0; i < keys.size(); ++i) {
          const float* row = rows.row(slot_of(table, keys[i], ap.block_size));
          const float w = static_cast<float>(scores[i] / denom);
          for (int64_t c = 0; c < L; ++c) o_lat[c] += w * row[c];
        }
        float* o = out + (t * p.n_heads + h) * V;
        for (int64_t e = 0; e < V; ++e) {
          float acc = 0.f;
          for (int64_t c = 0; c < L; ++c) acc += w_uv[e * L + c] * o_lat[c];
          o[e] = acc;
        }
      }
    }
  }
}

void copy_columns_f32(const float* x, float* out, int64_t rows, int64_t cols, int64_t begin, int64_t end) {
  const int64_t w = end - begin;
  for (int64_t r = 0; r < rows; ++r) std::memcpy(out + r * w, x + r * cols + begin, sizeof(float) * w);
}

}  // namespace mxserve::kernels::cpu
