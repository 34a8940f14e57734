// CPU reference: sigmoid router with group-limited top-k, exactly as transformers' Glm4MoeTopkRouter:
//   s = sigmoid(logits); sc = s + bias; group score = sum of the top-2 sc in each group;
//   keep topk_group groups, mask others with -inf; top_k over sc; weights = s of the chosen experts,
//   / (sum + 1e-20) when norm_topk_prob, * routed_scaling_factor.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"

namespace mxserve::kernels::cpu {

void moe_router_f32(const float* logits, const float* bias, int32_t* topk_ids, float* topk_weights,
                    int64_t n_tokens, const RouterParams& p) {
  const int E = p.n_experts;
  const int per_group = E / p.n_group;
  std::vector<float> s(E), sc(E), group_score(p.n_group);
  std::vector<int> order(std::max(E, p.n_group));
  std::vector<char> group_kept(p.n_group);
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* l = logits + t * E;
    for (int e = 0; e < E; ++e) {
      s[e] = 1.0f / (1.0f + std::exp(-l[e]));
      sc[e] = s[e] + (bias ? bias[e] : 0.f);
    }
    if (p.n_group > 1) {
      for (int g = 0; g < p.n_group; ++g) {
        float a = -INFINITY, b = -INFINITY;  // top two of the group
        for (int e = g * per_group; e < (g + 1) * per_group; ++e) {
          if (sc[e] > a) {
            b = a;
            a = sc[e];
          } else if (sc[e] > b) {
            b = sc[e];
          }
        }
        group_score[g] = a + b;
      }
      std::iota(order.begin(), order.begin() + p.n_group, 0);
      std::stable_sort(order.begin(), order.begin() + p.n_group,
                       [&](int x, int y) { return group_score[x] > group_score[y]; });
      std::fill(group_kept.begin(), group_kept.end(), 0);
      for (int i = 0; i < p.topk_group; ++i) group_kept[order[i]] = 1;
      for (int e = 0; e < E; ++e)
        if (!group_kept[e / per_group]) sc[e] = -INFINITY;
    }
    std::iota(order.begin(), order.begin() + E, 0);
    std::partial_sort(order.begin(), order.begin() + p.top_k, order.begin() + E, [&](int x, int y) {
      return sc[x] > sc[y] || (sc[x] == sc[y] && x < y);
    });
    float sum = 0.f;
    for (int i = 0; i < p.top_k; ++i) sum += s[order[i]];
    const float denom = p.norm_topk_prob ? sum + 1e-20f : 1.0f;
    for (int i = 0; i < p.top_k; ++i) {
      topk_ids[t * p.top_k + i] = order[i];
      topk_weights[t * p.top_k + i] = s[order[i]] / denom * p.routed_scaling_factor;
    }
  }
}

}  // namespace mxserve::kernels::cpu
