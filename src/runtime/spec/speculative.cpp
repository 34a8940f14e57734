#include "runtime/spec/speculative.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"

namespace mxserve::runtime {

double TokenDistribution::prob_of(int32_t token) const {
  auto it = std::lower_bound(ids.begin(), ids.end(), token);  // ids are sorted
  return it != ids.end() && *it == token ? probs[it - ids.begin()] : 0.0;
}

int32_t TokenDistribution::argmax() const {
  return ids[std::max_element(probs.begin(), probs.end()) - probs.begin()];
}

int32_t TokenDistribution::draw(double u) const {
  double acc = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    acc += probs[i];
    if (u < acc) return ids[i];
  }
  return ids.back();
}

// O(V) on the common paths: top-k by selection, top-p by growing selections instead of a full sort.
// NOTE: at a 150k vocabulary a full sort per row cost ~5 ms per sampled token on one core.
TokenDistribution sampling_distribution(std::span<const float> logits, const SamplingParams& p) {
  TokenDistribution d;
  const int64_t V = static_cast<int64_t>(logits.size());
  if (p.temperature <= 0.f) {
    d.ids = {static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin())};
    d.probs = {1.0};
    return d;
  }
  std::vector<int32_t> cand(V);
  std::iota(cand.begin(), cand.end(), 0);
  if (p.top_k > 0 && p.top_k < V) {
    std::nth_element(cand.begin(), cand.begin() + p.top_k, cand.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    cand.resize(p.top_k);
    std::sort(cand.begin(), cand.end());  // keep candidates in token-id order
  }
  float mx = -INFINITY;
  for (int32_t t : cand) mx = std::max(mx, logits[t]);
  const float inv_t = 1.0f / p.temperature;
  std::vector<float> e(cand.size());
  double total = 0;
  for (size_t i = 0; i < cand.size(); ++i) total += e[i] = std::exp((logits[cand[i]] - mx) * inv_t);
  std::vector<char> keep(cand.size(), 1);
  if (p.top_p < 1.f) {
    // The smallest set of most likely tokens whose mass reaches top_p (ties broken by token id).
    std::vector<int32_t> order(cand.size());
    std::iota(order.begin(), order.end(), 0);
    auto more_likely = [&](int32_t a, int32_t b) { return e[a] > e[b] || (e[a] == e[b] && cand[a] < cand[b]); };
    const double target = p.top_p * total;
    size_t k = std::min<size_t>(64, order.size());
    for (;;) {
      if (k < order.size()) std::nth_element(order.begin(), order.begin() + k, order.end(), more_likely);
      double head = 0;
      for (size_t i = 0; i < k; ++i) head += e[order[i]];
      if (head >= target || k == order.size()) break;
      k = std::min(order.size(), k * 8);
    }
    std::sort(order.begin(), order.begin() + k, more_likely);
    std::fill(keep.begin(), keep.end(), 0);
    double cum = 0;
    for (size_t i = 0; i < k && (i == 0 || cum < target); ++i) {
      keep[order[i]] = 1;
      cum += e[order[i]];
    }
  }
  if (p.min_p > 0.f)  // relative to the most likely token, whose e is 1
    for (size_t i = 0; i < cand.size(); ++i)
      if (e[i] < p.min_p) keep[i] = 0;
  // Candidates are in token-id order, so the kept ids are sorted (prob_of uses binary search).
  double kept_total = 0;
  for (size_t i = 0; i < cand.size(); ++i)
    if (keep[i]) {
      d.ids.push_back(cand[i]);
      d.probs.push_back(e[i]);
      kept_total += e[i];
    }
  for (double& q : d.probs) q /= kept_total;
  return d;
}

ChainVerdict verify_chain_impl(std::span<const int32_t> drafts, const std::vector<TokenDistribution>& q,
                               const std::vector<TokenDistribution>& p, bool greedy,
                               const std::vector<double>& u) {
  MX_CHECK_EQ(p.size(), drafts.size() + 1);
  ChainVerdict v;
  const size_t N = drafts.size();
  for (size_t i = 0; i < N; ++i) {
    const int32_t d = drafts[i];
    bool accept;
    if (greedy) {
      accept = d == p[i].argmax();
    } else {
      const double pd = p[i].prob_of(d), qd = q[i].prob_of(d);
      accept = qd > 0 && u[2 * i] < std::min(1.0, pd / qd);
    }
    if (!accept) {
      if (greedy) {
        v.next_token = p[i].argmax();
      } else {  // residual distribution norm(max(0, p - q))
        TokenDistribution r;
        double z = 0;
        for (size_t j = 0; j < p[i].ids.size(); ++j) {
          const double m = std::max(0.0, p[i].probs[j] - q[i].prob_of(p[i].ids[j]));
          if (m > 0) {
            r.ids.push_back(p[i].ids[j]);
            r.probs.push_back(m);
            z += m;
          }
        }
        if (z <= 0) {  // p == q on the draft's support: any draw from p is exact
          v.next_token = p[i].draw(u[2 * i + 1]);
        } else {
          for (double& m : r.probs) m /= z;
          v.next_token = r.draw(u[2 * i + 1]);
        }
      }
      return v;
    }
    ++v.n_accepted;
  }
  v.next_token = greedy ? p[N].argmax() : p[N].draw(u[2 * N]);
  return v;
}

int32_t SpecPolicy::steps_for(int64_t n_decoding, int64_t token_budget) {
  if (cfg_.num_steps <= 0) return 0;
  int32_t n = cfg_.num_steps;
  if (cfg_.adaptive && !cfg_.simulate_acceptance) {
    if (cooldown_ > 0) {
      --cooldown_;
      return 0;
    }
    // Expected tokens per verify with N drafts at acceptance a: (1 - a^(N+1)) / (1 - a). Stop adding
    // drafts once the next one is expected to be accepted less than a quarter of the time.
    while (n > 1 && std::pow(rate_, n) < 0.25) --n;
    if (observed_ >= 32 && rate_ < 0.15) {  // not paying: plain decoding, probe again later
      cooldown_ = 64;
      rate_ = 0.3;
      return 0;
    }
  }
  // Never let drafts crowd out the batch: keep (N+1) * decodes within the step budget.
  while (n > 0 && n_decoding * (n + 1) > token_budget) --n;
  return n;
}

void SpecPolicy::record(int32_t drafted, int32_t accepted) {
  if (drafted <= 0) return;
  const double r = static_cast<double>(accepted) / drafted;
  rate_ = 0.9 * rate_ + 0.1 * r;
  observed_ += drafted;
}

}  // namespace mxserve::runtime
