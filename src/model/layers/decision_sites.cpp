// Router and indexer decision sites (decision_sites.h).
#include "model/layers/decision_sites.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

#include "core/check.h"

namespace mxserve::model {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Row r of an i32 [T, width] host tensor, ascending, -1 padding last.
std::vector<int32_t> sorted_rows(const Tensor& ids_host, int64_t rows, int64_t width) {
  std::vector<int32_t> out(ids_host.data<int32_t>(), ids_host.data<int32_t>() + rows * width);
  for (int64_t r = 0; r < rows; ++r) {
    auto* b = out.data() + r * width;
    std::sort(b, b + width, [](int32_t a, int32_t c) { return (a < 0) != (c < 0) ? c < 0 : a < c; });
  }
  return out;
}

// min over kept - max over dropped of `score` (candidates with visible[j]); +inf when nothing was dropped.
// *pair: {the lowest kept, the highest dropped} ({-1, -1} when nothing was dropped).
double margin_of(const std::vector<double>& score, const std::vector<char>& visible, const int32_t* kept, int64_t width,
                 std::pair<int32_t, int32_t>* pair) {
  std::vector<char> is_kept(score.size(), 0);
  double lo = kInf, hi = -kInf;
  *pair = {-1, -1};
  int32_t lo_at = -1;
  for (int64_t i = 0; i < width; ++i)
    if (kept[i] >= 0 && kept[i] < static_cast<int32_t>(score.size())) {
      is_kept[kept[i]] = 1;
      if (score[kept[i]] < lo) lo = score[kept[i]], lo_at = kept[i];
    }
  for (size_t j = 0; j < score.size(); ++j)
    if (visible[j] && !is_kept[j] && score[j] > hi) {
      hi = score[j];
      *pair = {lo_at, static_cast<int32_t>(j)};
    }
  return hi == -kInf ? kInf : lo - hi;
}

}  // namespace

int64_t layer_of_prefix(const std::string& prefix) {
  const std::string head = "model.layers.";
  if (prefix.rfind(head, 0) != 0) return -1;
  int64_t v = 0;
  size_t i = head.size();
  if (i >= prefix.size() || !std::isdigit(static_cast<unsigned char>(prefix[i]))) return -1;
  for (; i < prefix.size() && std::isdigit(static_cast<unsigned char>(prefix[i])); ++i) v = v * 10 + (prefix[i] - '0');
  return v;
}

void routing_decision(backend::Backend& be, const Tensor& x, const Tensor& gate, const Tensor& bias,
                      const kernels::RouterParams& rp, int64_t layer, DecisionHook& hook, Tensor& ids,
                      Tensor& weights) {
  const int64_t T = x.dim(0), E = rp.n_experts, K = rp.top_k, G = std::max<int32_t>(rp.n_group, 1);
  Tensor logits_dev = be.alloc(DType::kF32, {T, E});
  be.linear(x, gate, nullptr, logits_dev);
  const Tensor logits = be.to_host(logits_dev), b = be.to_host(bias), chosen = be.to_host(ids);
  const Tensor xh = be.to_host(x), gh = be.to_host(gate);
  const int64_t H = x.dim(1);
  // sum_i |x_i g_ei|: router logit e's worst-case error per unit relative error of x (the rounded input; the
  // gate weights are the checkpoint's own values on every backend).
  auto abs_dot = [&](int64_t t, int64_t e) {
    double s = 0;
    for (int64_t i = 0; i < H; ++i)
      s += std::fabs(static_cast<double>(xh.data<float>()[t * H + i]) * gh.data<float>()[e * H + i]);
    return s;
  };
  DecisionRows d;
  d.site = DecisionSite::kExpertRouting;
  d.layer = layer;
  d.rows = T;
  d.width = K;
  d.ids = sorted_rows(chosen, T, K);
  d.n_group = G;
  d.topk_group = rp.topk_group;
  std::vector<std::vector<double>> sig(T, std::vector<double>(E));
  const int64_t per_group = E / G;
  for (int64_t t = 0; t < T; ++t) {
    const float* l = logits.data<float>() + t * E;
    std::vector<double> sc(E);
    for (int64_t e = 0; e < E; ++e) {
      sig[t][e] = 1.0 / (1.0 + std::exp(-static_cast<double>(l[e])));
      sc[e] = sig[t][e] + b.data<float>()[e];
    }
    std::vector<char> visible(E, 1);
    double group_margin = kInf;
    if (G > 1) {  // group score = sum of the group's top two; keep topk_group groups
      std::vector<double> gs(G);
      for (int64_t g = 0; g < G; ++g) {
        std::vector<double> v(sc.begin() + g * per_group, sc.begin() + (g + 1) * per_group);
        std::partial_sort(v.begin(), v.begin() + std::min<int64_t>(2, per_group), v.end(), std::greater<>());
        gs[g] = v[0] + (per_group > 1 ? v[1] : 0.0);
      }
      std::vector<int64_t> order(G);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t c) { return gs[a] > gs[c]; });
      if (rp.topk_group < G) group_margin = gs[order[rp.topk_group - 1]] - gs[order[rp.topk_group]];
      for (int64_t i = rp.topk_group; i < G; ++i)
        for (int64_t e = order[i] * per_group; e < (order[i] + 1) * per_group; ++e) visible[e] = 0;
    }
    std::pair<int32_t, int32_t> pair;
    const double expert_margin = margin_of(sc, visible, d.row(t), K, &pair);
    d.margin.push_back(std::min(group_margin, expert_margin));
    d.margin_pair.push_back(group_margin < expert_margin ? std::pair<int32_t, int32_t>{-1, -1} : pair);
    // Score sensitivity of expert e: the sigmoid's slope s(1 - s) at its logit (linearized) x the logit's.
    std::vector<double> sens(E);
    for (int64_t e = 0; e < E; ++e) sens[e] = sig[t][e] * (1.0 - sig[t][e]) * abs_dot(t, e);
    d.scores.push_back(std::move(sc));
    d.sensitivity.push_back(std::move(sens));
  }
  hook.on_decision(d);
  if (!d.forced) return;
  MX_CHECK_EQ(static_cast<int64_t>(d.ids.size()), T * K);
  Tensor new_ids = Tensor::empty(DType::kI32, {T, K}), new_w = Tensor::empty(DType::kF32, {T, K});
  for (int64_t t = 0; t < T; ++t) {
    double sum = 0;
    for (int64_t i = 0; i < K; ++i) sum += sig[t][d.row(t)[i]];
    const double denom = rp.norm_topk_prob ? sum + 1e-20 : 1.0;
    for (int64_t i = 0; i < K; ++i) {
      new_ids.data<int32_t>()[t * K + i] = d.row(t)[i];
      new_w.data<float>()[t * K + i] = static_cast<float>(sig[t][d.row(t)[i]] / denom * rp.routed_scaling_factor);
    }
  }
  ids = be.upload(new_ids);
  weights = be.upload(new_w);
}

void index_decision(backend::Backend& be, const Tensor& q_dev, const Tensor& w_dev, const Tensor& cache_dev,
                    const backend::AttentionMeta& meta, const kernels::IndexerParams& ip, int64_t layer,
                    DecisionHook& hook, Tensor& topk) {
  if (meta.tree_mask.defined() && meta.tree_mask.numel() > 0) return;
  if (cache_dev.dtype() != DType::kF32 && cache_dev.dtype() != DType::kBF16) return;  // FP8 cache: not observed
  const int64_t T = q_dev.dim(0), NH = ip.n_heads, D = ip.head_dim, K = ip.top_k;
  const Tensor q = be.to_host(q_dev), w = be.to_host(w_dev), cache = be.to_host(cache_dev);
  const Tensor seq = be.to_host(meta.token_seq), kvi = be.to_host(meta.kv_index), tables = be.to_host(meta.block_tables);
  const int64_t bs = meta.params.block_size, stride = meta.params.max_blocks_per_seq;
  DecisionRows d;
  d.site = DecisionSite::kIndexTopk;
  d.layer = layer;
  d.rows = T;
  d.width = K;
  d.ids = sorted_rows(be.to_host(topk), T, K);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t n = kvi.data<int32_t>()[t] + 1;
    const int32_t* table = tables.data<int32_t>() + seq.data<int32_t>()[t] * stride;
    std::vector<double> score(n), sens(n);  // sens: 3 x sum_h |w_h| sum_d |q_hd k_d| (q, k, w each rounded)
    for (int64_t j = 0; j < n; ++j) {
      const float* key = cache.data<float>() + (static_cast<int64_t>(table[j / bs]) * bs + j % bs) * D;
      double s = 0, a = 0;
      for (int64_t h = 0; h < NH; ++h) {
        const float* qh = q.data<float>() + (t * NH + h) * D;
        double dot = 0, l1 = 0;
        for (int64_t k = 0; k < D; ++k) {
          const double p = static_cast<double>(qh[k]) * key[k];
          dot += p;
          l1 += std::fabs(p);
        }
        const double wh = static_cast<double>(w.data<float>()[t * NH + h]) * ip.weight_scale * ip.score_scale;
        s += wh * std::max(dot, 0.0);
        a += std::fabs(wh) * l1;  // every head: the ReLU is 1-Lipschitz, so a head near its kink is covered too
      }
      score[j] = s;
      sens[j] = 3.0 * a;
    }
    std::pair<int32_t, int32_t> pair;
    d.margin.push_back(margin_of(score, std::vector<char>(n, 1), d.row(t), K, &pair));
    d.margin_pair.push_back(pair);
    d.scores.push_back(std::move(score));
    d.sensitivity.push_back(std::move(sens));
  }
  hook.on_decision(d);
  if (!d.forced) return;
  MX_CHECK_EQ(static_cast<int64_t>(d.ids.size()), T * K);
  Tensor forced = Tensor::empty(DType::kI32, {T, K});
  std::copy(d.ids.begin(), d.ids.end(), forced.data<int32_t>());
  topk = be.upload(forced);
}

}  // namespace mxserve::model
