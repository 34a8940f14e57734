// CPU reference: paged causal GQA attention, fp32 with a max-subtracted softmax, over an f32 cache or an
// FP8 E4M3 one (codes dequantized per key row in f32), and the KV writes / copies of both layouts.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/numeric.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/kv_fp8.h"

namespace mxserve::kernels::cpu {

void kv_write_f32(const float* k, const float* v, const int32_t* slot_mapping, float* k_cache, float* v_cache,
                  int64_t n_tokens, int64_t kv_width) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int64_t slot = slot_mapping[t];
    if (slot < 0) continue;  // a padding row: not written (the MLA writers' rule)
    std::memcpy(k_cache + slot * kv_width, k + t * kv_width, sizeof(float) * kv_width);
    std::memcpy(v_cache + slot * kv_width, v + t * kv_width, sizeof(float) * kv_width);
  }
}

void kv_write_fp8(const float* k, const float* v, const int32_t* slot_mapping, uint8_t* k_cache, uint8_t* v_cache,
                  float* k_scales, float* v_scales, int64_t n_tokens, int64_t n_kv_heads, int64_t head_dim) {
  const int64_t width = n_kv_heads * head_dim;
  auto quantize = [&](const float* row, uint8_t* codes, float* scales) {
    for (int64_t h = 0; h < n_kv_heads; ++h) {
      const float* x = row + h * head_dim;
      float amax = 0.f;
      for (int64_t d = 0; d < head_dim; ++d) amax = std::fmax(amax, std::fabs(x[d]));
      const float scale = kv_fp8_scale(amax);
      scales[h] = scale;
      for (int64_t d = 0; d < head_dim; ++d) codes[h * head_dim + d] = kv_fp8_quantize(x[d], scale);
    }
  };
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int64_t slot = slot_mapping[t];
    if (slot < 0) continue;  // a padding row: not written
    quantize(k + t * width, k_cache + slot * width, k_scales + slot * n_kv_heads);
    quantize(v + t * width, v_cache + slot * width, v_scales + slot * n_kv_heads);
  }
}

void kv_copy_rows(const int32_t* src_slots, const int32_t* dst_slots, int64_t n_pairs, uint8_t* a, uint8_t* b,
                  int64_t row_bytes) {
  for (int64_t i = 0; i < n_pairs; ++i) {
    if (src_slots[i] == dst_slots[i]) continue;
    const int64_t s = src_slots[i], d = dst_slots[i];
    std::memmove(a + d * row_bytes, a + s * row_bytes, row_bytes);
    if (b != a) std::memmove(b + d * row_bytes, b + s * row_bytes, row_bytes);
  }
}

void kv_copy_f32(const int32_t* src_slots, const int32_t* dst_slots, int64_t n_pairs, float* k_cache, float* v_cache,
                 int64_t kv_width) {
  for (int64_t i = 0; i < n_pairs; ++i) {
    if (src_slots[i] == dst_slots[i]) continue;
    const int64_t s = src_slots[i], d = dst_slots[i];
    std::memcpy(k_cache + d * kv_width, k_cache + s * kv_width, sizeof(float) * kv_width);
    std::memcpy(v_cache + d * kv_width, v_cache + s * kv_width, sizeof(float) * kv_width);
  }
}

void paged_attention_f32(const float* q, const void* k_cache, const void* v_cache, const int32_t* token_seq,
                         const int32_t* kv_index, const int32_t* block_tables, float* out,
                         const AttentionParams& p) {
  const int64_t kv_width = static_cast<int64_t>(p.n_kv_heads) * p.head_dim;
  const int group = p.n_heads / p.n_kv_heads;
  const bool fp8 = p.fp8_kv();
#pragma omp parallel
  {
    std::vector<float> scores;
    std::vector<float> row(static_cast<size_t>(p.head_dim));
    // Head kvh of the cache row at `slot`: f32 in place, or FP8 codes * the (slot, head) scale into `row`.
    auto head_row = [&](const void* cache, const float* scales, int64_t slot, int kvh) -> const float* {
      if (!fp8) return static_cast<const float*>(cache) + slot * kv_width + kvh * p.head_dim;
      const uint8_t* codes = static_cast<const uint8_t*>(cache) + slot * kv_width + kvh * p.head_dim;
      const float scale = scales[slot * p.n_kv_heads + kvh];
      for (int d = 0; d < p.head_dim; ++d) row[d] = fp8_e4m3_to_f32(codes[d]) * scale;
      return row.data();
    };
#pragma omp for collapse(2)
    for (int64_t t = 0; t < p.n_tokens; ++t) {
      for (int h = 0; h < p.n_heads; ++h) {
        const int kvh = h / group;
        const int32_t* table = block_tables + static_cast<int64_t>(token_seq[t]) * p.max_blocks_per_seq;
        const int64_t n_ctx = static_cast<int64_t>(kv_index[t]) + 1;
        // Tree rows: keys at or after tree_base only where the ancestor mask has their bit.
        const int64_t tbase = p.tree_mask != nullptr ? p.tree_base[t] : n_ctx;
        const uint64_t tmask = p.tree_mask != nullptr ? p.tree_mask[t] : 0;
        auto visible = [&](int64_t j) { return j < tbase || ((tmask >> (j - tbase)) & 1u) != 0; };
        const float* qv = q + (t * p.n_heads + h) * p.head_dim;
        scores.resize(n_ctx);
        float max_score = -INFINITY;
        for (int64_t j = 0; j < n_ctx; ++j) {
          if (!visible(j)) {
            scores[j] = -INFINITY;
            continue;
          }
          const int64_t slot = static_cast<int64_t>(table[j / p.block_size]) * p.block_size + j % p.block_size;
          const float* kv = head_row(k_cache, p.k_scales, slot, kvh);
          float dot = 0.f;
          for (int d = 0; d < p.head_dim; ++d) dot += qv[d] * kv[d];
          scores[j] = dot * p.scale;
          max_score = std::max(max_score, scores[j]);
        }
        double denom = 0.0;
        for (int64_t j = 0; j < n_ctx; ++j) {
          scores[j] = std::exp(scores[j] - max_score);
          denom += scores[j];
        }
        float* o = out + (t * p.n_heads + h) * p.head_dim;
        for (int d = 0; d < p.head_dim; ++d) o[d] = 0.f;
        for (int64_t j = 0; j < n_ctx; ++j) {
          if (!visible(j)) continue;
          const int64_t slot = static_cast<int64_t>(table[j / p.block_size]) * p.block_size + j % p.block_size;
          const float* vv = head_row(v_cache, p.v_scales, slot, kvh);
          const float w = static_cast<float>(scores[j] / denom);
          for (int d = 0; d < p.head_dim; ++d) o[d] += w * vv[d];
        }
      }
    }
  }
}

}  // namespace mxserve::kernels::cpu
