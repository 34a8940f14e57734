// CPU reference: partial NeoX RoPE exactly as transformers computes it for glm4_moe:
// inv_freq[j] = 1 / theta^(2j/rd) (fp32), angle = pos * inv_freq (fp32), rotate halves of [0, rd).
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"

namespace mxserve::kernels::cpu {

void rope_neox_f32(float* x, const int32_t* positions, int64_t n_tokens, const RopeParams& p) {
  const int half = p.rotary_dim / 2;
  std::vector<float> inv_freq(half);
  for (int j = 0; j < half; ++j) {
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
        float* v = x + (t * p.n_heads + h) * p.head_dim;
        const float x1 = v[j], x2 = v[j + half];
        v[j] = x1 * c - x2 * s;
        v[j + half] = x2 * c + x1 * s;
      }
    }
  }
}

}  // namespace mxserve::kernels::cpu
