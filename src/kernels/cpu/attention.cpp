// CPU reference: paged causal GQA attention, fp32 with a max-subtracted softmax.
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"

namespace mxserve::kernels::cpu {

void kv_write_f32(const float* k, const float* v, const int32_t* slot_mapping, float* k_cache, float* v_cache,
                  int64_t n_tokens, int64_t kv_width) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int64_t slot = slot_mapping[t];
    std::memcpy(k_cache + slot * kv_width, k + t * kv_width, sizeof(float) * kv_width);
    std::memcpy(v_cache + slot * kv_width, v + t * kv_width, sizeof(float) * kv_width);
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

void paged_attention_f32(const float* q, const float* k_cache, const float* v_cache, const int32_t* token_seq,
                         const int32_t* kv_index, const int32_t* block_tables, float* out,
                         const AttentionParams& p) {
  const int64_t kv_width = static_cast<int64_t>(p.n_kv_heads) * p.head_dim;
  const int group = p.n_heads / p.n_kv_heads;
#pragma omp parallel
  {
    std::vector<float> scores;
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
          const float* kv = k_cache + slot * kv_width + kvh * p.head_dim;
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
          const float* vv = v_cache + slot * kv_width + kvh * p.head_dim;
          const float w = static_cast<float>(scores[j] / denom);
          for (int d = 0; d < p.head_dim; ++d) o[d] += w * vv[d];
        }
      }
    }
  }
}

}  // namespace mxserve::kernels::cpu
