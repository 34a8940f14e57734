#include "runtime/spec/speculative.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"

namespace mxserve::runtime {

double TokenDistribution::prob_of(int32_t token) const {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] == token) return probs[i];
  return 0.0;
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

TokenDistribution sampling_distribution(std::span<const float> logits, const SamplingParams& p) {
  TokenDistribution d;
  const int64_t V = static_cast<int64_t>(logits.size());
  if (p.temperature <= 0.f) {
    d.ids = {static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin())};
    d.probs = {1.0};
    return d;
  }
  std::vector<int32_t> idx(V);
  std::iota(idx.begin(), idx.end(), 0);
  int64_t n = V;
  if (p.top_k > 0 && p.top_k < V) {
    std::nth_element(idx.begin(), idx.begin() + p.top_k, idx.end(),
                     [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    n = p.top_k;
  }
  std::sort(idx.begin(), idx.begin() + n,
            [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  std::vector<double> prob(n);
  const double mx = logits[idx[0]];
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += prob[i] = std::exp((logits[idx[i]] - mx) / p.temperature);
  for (double& q : prob) q /= sum;
  if (p.top_p < 1.f) {
    double cum = 0;
    int64_t keep = 0;
    while (keep < n && (keep == 0 || cum < p.top_p)) cum += prob[keep++];
    n = keep;
  }
  if (p.min_p > 0.f) {
    const double floor_p = p.min_p * prob[0];
    int64_t keep = 1;
    while (keep < n && prob[keep] >= floor_p) ++keep;
    n = keep;
  }
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += prob[i];
  d.ids.assign(idx.begin(), idx.begin() + n);
  d.probs.resize(n);
  for (int64_t i = 0; i < n; ++i) d.probs[i] = prob[i] / total;
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
