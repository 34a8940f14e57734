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

namespace {

// norm(max(0, P - Q)) over P's support; empty when P <= Q everywhere.
TokenDistribution residual(const TokenDistribution& P, const TokenDistribution& Q) {
  TokenDistribution r;
  double z = 0;
  for (size_t j = 0; j < P.ids.size(); ++j) {
    const double m = std::max(0.0, P.probs[j] - Q.prob_of(P.ids[j]));
    if (m > 0) {
      r.ids.push_back(P.ids[j]);
      r.probs.push_back(m);
      z += m;
    }
  }
  for (double& m : r.probs) m /= z;
  return r;
}

TokenDistribution point_mass(int32_t token) {
  TokenDistribution d;
  d.ids = {token};
  d.probs = {1.0};
  return d;
}

}  // namespace

TreeVerdict verify_tree_impl(const DraftTree& tree, const std::vector<TokenDistribution>& q,
                             const std::vector<TokenDistribution>& p, bool greedy, const std::vector<double>& u) {
  const size_t M = tree.tokens.size();
  MX_CHECK_EQ(tree.parents.size(), M);
  MX_CHECK_EQ(p.size(), M + 1);
  MX_CHECK(tree.proposal.empty() || tree.proposal.size() == M);
  std::vector<std::vector<int32_t>> children(M + 1);  // [node + 1]: children in node order
  for (size_t i = 0; i < M; ++i) {
    MX_CHECK_MSG(tree.parents[i] >= -1 && tree.parents[i] < static_cast<int32_t>(i), "tree nodes must be topological");
    children[tree.parents[i] + 1].push_back(static_cast<int32_t>(i));
  }
  TreeVerdict v;
  int32_t cur = -1;  // the root
  size_t k = 0;      // uniforms used
  for (;;) {
    const auto& kids = children[cur + 1];
    if (greedy) {
      const int32_t t = p[cur + 1].argmax();
      int32_t next = -1;
      for (int32_t c : kids)
        if (tree.tokens[c] == t) {
          next = c;
          break;
        }
      if (next < 0) {
        v.next_token = t;
        return v;
      }
      v.path.push_back(cur = next);
      continue;
    }
    TokenDistribution P = p[cur + 1];
    int32_t next = -1;
    for (int32_t c : kids) {
      const int32_t pi = tree.proposal.empty() ? -1 : tree.proposal[c];
      const TokenDistribution Q = pi < 0 ? point_mass(tree.tokens[c]) : q[pi];
      const double qc = Q.prob_of(tree.tokens[c]), pc = P.prob_of(tree.tokens[c]);
      if (qc > 0 && u[k++] < std::min(1.0, pc / qc)) {
        next = c;
        break;
      }
      TokenDistribution r = residual(P, Q);
      if (r.ids.empty()) break;  // P <= Q on P's support: P and Q agree, draw from P as it is
      P = std::move(r);
    }
    if (next < 0) {
      v.next_token = P.draw(u[u.size() - 1]);
      return v;
    }
    v.path.push_back(cur = next);
  }
}

SpecPolicy::SpecPolicy(const SpecConfig& cfg)
    : cfg_(cfg),
      alpha_(std::max(cfg.num_steps, 0), 0.7),  // optimistic prior: measured within a few steps
      alpha_obs_(std::max(cfg.num_steps, 0), 0),
      cells_(kMaxBuckets, std::vector<Cell>(std::max(cfg.num_steps, 0) + 1)),
      bucket_steps_(kMaxBuckets, 0),
      exploring_(kMaxBuckets, -1),
      explore_start_(kMaxBuckets, 0),
      defer_until_(kMaxBuckets, 0) {}

int SpecPolicy::bucket_of(int64_t n_decoding) {
  int b = 0;
  while (b + 1 < kMaxBuckets && (int64_t{1} << (b + 1)) <= n_decoding) ++b;
  return b;
}

double SpecPolicy::expected_accepted(int32_t n) const {
  double e = 0, reach = 1;
  for (int32_t i = 0; i < n && i < static_cast<int32_t>(alpha_.size()); ++i) {
    reach *= alpha_[i];
    e += reach;
  }
  return e;
}

double SpecPolicy::step_time(int32_t n, int64_t n_decoding) const {
  if (n < 0 || n >= static_cast<int32_t>(cells_[0].size())) return -1;
  const Cell& c = cells_[bucket_of(n_decoding)][n];
  return c.samples > 0 ? c.t : -1;
}

int32_t SpecPolicy::steps_for(int64_t n_decoding, int64_t token_budget) {
  if (cfg_.num_steps <= 0) return 0;
  // Never let drafts crowd out the batch: keep (rows(N) + 1) * decodes within the step budget (rows(N) = N
  // in chain mode, the tree's nodes at depth N in tree mode).
  int32_t n_max = cfg_.num_steps;
  while (n_max > 0 && n_decoding * (cfg_.draft_rows(n_max) + 1) > token_budget) --n_max;
  if (!cfg_.adaptive || n_decoding <= 0) return last_choice_ = n_max;
  const int b = bucket_of(n_decoding);
  last_bucket_ = b;
  const int64_t step = ++bucket_steps_[b];
  std::vector<Cell>& row = cells_[b];
  int32_t choice = -1;
  // 1. Keep measuring the candidate under exploration until it has a fresh steady sample.
  // An exploration that cannot complete (every step also carries prefill, so none is steady) is
  // abandoned after kExploreTimeout steps and not retried in this bucket for kExploreEvery steps.
  if (exploring_[b] >= 0 && exploring_[b] <= n_max) {
    const Cell& c = row[exploring_[b]];
    const bool done = c.samples >= kMinSamples && c.last_step >= step - 2;
    if (done) {
      exploring_[b] = -1;
    } else if (step - explore_start_[b] > kExploreTimeout) {
      row[exploring_[b]].last_step = step;
      exploring_[b] = -1;
      defer_until_[b] = step + kExploreEvery;
    } else {
      choice = exploring_[b];
    }
  } else {
    exploring_[b] = -1;
  }
  // 2. Unmeasured candidates first, cheapest first: N = 0 and N = 1, then N + 1 only while N is the best
  // measured choice (a longer chain pays only if a shorter one already does), so a short run where
  // speculation cannot pay spends just a few steps finding that out.
  // Drafts that are (almost) never accepted cannot pay at any cost: explore only N = 0 then (the periodic
  // re-measurement below still refreshes the acceptance now and then).
  const bool useless = alpha_obs_.empty() || (alpha_obs_[0] >= kMinAcceptObs && alpha_[0] < kUselessAlpha);
  if (choice < 0 && step >= defer_until_[b]) {
    int32_t best_measured = -1;
    double best_score = -1;
    for (int32_t n = 0; n <= n_max; ++n) {
      if (row[n].samples < kMinSamples) {
        if ((n <= 1 || best_measured == n - 1) && (n == 0 || !useless)) {
          choice = exploring_[b] = n;
          explore_start_[b] = step;
        }
        break;
      }
      const double score = (1.0 + expected_accepted(n)) / row[n].t;
      if (score > best_score) {
        best_score = score;
        best_measured = n;
      }
    }
  }
  // 3. Periodically re-measure the stalest candidate.
  if (choice < 0 && step % kExploreEvery == 0) {
    int32_t stalest = 0;  // among the measured cells: the pruned (never measured) ones stay pruned
    for (int32_t n = 1; n <= n_max; ++n)
      if (row[n].samples > 0 && row[n].last_step < row[stalest].last_step) stalest = n;
    if (row[stalest].samples >= kMinSamples) row[stalest].samples = kMinSamples - 1;  // one fresh sample completes it
    choice = exploring_[b] = stalest;
    explore_start_[b] = step;
  }
  // 4. Exploit: maximize (1 + E[accepted | N]) / t(N, b); ties go to the smaller N.
  double best = -1;
  int32_t best_n = 0;
  for (int32_t n = 0; n <= n_max; ++n) {
    if (row[n].samples < kMinSamples) continue;
    const double score = (1.0 + expected_accepted(n)) / row[n].t;
    if (score > best) {
      best = score;
      best_n = n;
    }
  }
  if (choice < 0) choice = best_n;
  gain_ = row[0].samples >= kMinSamples && row[choice].samples >= kMinSamples
              ? (1.0 + expected_accepted(choice)) / row[choice].t * row[0].t
              : 1.0;
  return last_choice_ = choice;
}

void SpecPolicy::record(int32_t drafted, int32_t accepted) {
  if (drafted <= 0) return;
  const double r = static_cast<double>(accepted) / drafted;
  rate_ = 0.9 * rate_ + 0.1 * r;
  // Position i (0-based) was reached when the first i drafts were accepted; its outcome is known.
  // A running mean over the first observations (the prior counts as one), then an EMA of weight kAcceptEma.
  for (int32_t i = 0; i < drafted && i <= accepted && i < static_cast<int32_t>(alpha_.size()); ++i) {
    const double w = std::max(kAcceptEma, 1.0 / static_cast<double>(++alpha_obs_[i] + 1));
    alpha_[i] = (1 - w) * alpha_[i] + w * (i < accepted ? 1.0 : 0.0);
  }
}

void SpecPolicy::record_step(int32_t n_verified, int64_t n_decoding, double seconds, double extend_seconds) {
  if (!cfg_.adaptive || n_decoding <= 0 || seconds <= 0) return;
  if (n_verified == 0 && extend_seconds > 0) seconds = std::max(seconds - extend_seconds, 0.2 * seconds);
  if (n_verified != last_choice_) return;  // mixed step (verified one N, drafted another): not steady
  if (n_verified < 0 || n_verified >= static_cast<int32_t>(cells_[0].size())) return;
  const int b = bucket_of(n_decoding);
  Cell& c = cells_[b][n_verified];
  c.t = c.samples == 0 ? seconds : (1 - kTimeEma) * c.t + kTimeEma * seconds;
  ++c.samples;
  c.last_step = bucket_steps_[b];
}

}  // namespace mxserve::runtime
