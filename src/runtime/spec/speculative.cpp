#include "runtime/spec/speculative.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"

namespace mxserve::runtime {

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
  // The estimate is the best measured choice's (not an exploration's), and it is kept while this bucket lacks
  // a measured N = 0: a run's ragged tail (fewer decoding sequences, an unmeasured bucket) must not reset it.
  if (row[0].samples >= kMinSamples && best > 0) gain_ = best * row[0].t;
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
