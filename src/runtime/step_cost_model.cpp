#include "runtime/step_cost_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace mxserve::runtime {
namespace {

// Feature order and scales: the solver works on features divided by these, all of order 1 in a busy
// step, so the normal equations stay well conditioned and the ridge weighs every coefficient alike.
// Order: base, prefill_tokens, prefill_pairs, decode_rows, decode_kv_tokens.
constexpr std::array<double, 5> kScale = {1.0, 1e3, 1e7, 1e2, 1e6};
constexpr double kHuberK = 2.5;       // residuals beyond kHuberK robust sigmas are down-weighted
constexpr int kHuberPasses = 3;       // reweighted solves per refit
constexpr int64_t kMaxTokens = int64_t{1} << 30;

std::array<double, 5> as_array(const StepCostCoefficients& c) {
  return {c.base, c.per_prefill_token, c.per_prefill_pair, c.per_decode_row, c.per_decode_kv_token};
}

StepCostCoefficients from_array(const std::array<double, 5>& a) {
  return {a[0], a[1], a[2], a[3], a[4]};
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<long>(mid), v.end());
  return v[mid];
}

// Solves A x = b for a symmetric positive definite 5x5 A (Cholesky); free[j] == false pins x[j] = 0.
template <size_t N>
std::array<double, N> solve_spd(std::array<std::array<double, N>, N> a, std::array<double, N> b,
                                const std::array<bool, N>& free) {
  for (size_t j = 0; j < N; ++j) {
    if (free[j]) continue;
    for (size_t k = 0; k < N; ++k) a[j][k] = a[k][j] = 0;
    a[j][j] = 1;
    b[j] = 0;
  }
  std::array<std::array<double, N>, N> l{};
  for (size_t i = 0; i < N; ++i) {
    for (size_t j = 0; j <= i; ++j) {
      double s = a[i][j];
      for (size_t k = 0; k < j; ++k) s -= l[i][k] * l[j][k];
      if (i == j) l[i][i] = std::sqrt(std::max(s, 1e-300));
      else l[i][j] = s / l[j][j];
    }
  }
  std::array<double, N> y{}, x{};
  for (size_t i = 0; i < N; ++i) {
    double s = b[i];
    for (size_t k = 0; k < i; ++k) s -= l[i][k] * y[k];
    y[i] = s / l[i][i];
  }
  for (size_t i = N; i-- > 0;) {
    double s = y[i];
    for (size_t k = i + 1; k < N; ++k) s -= l[k][i] * x[k];
    x[i] = s / l[i][i];
  }
  return x;
}

}  // namespace

void StepShape::add_chunk(int64_t start, int64_t n_rows, int64_t n_drafts) {
  if (is_decode(n_rows, n_drafts)) {
    decode_rows += static_cast<double>(n_rows);
    decode_kv_tokens += static_cast<double>(start + n_rows);
    return;
  }
  const double n = static_cast<double>(n_rows);
  prefill_tokens += n;
  prefill_pairs += n * (static_cast<double>(start) + (n + 1) / 2);
}

StepCostModel::StepCostModel(StepCostOptions options) : options_(options), coef_(options.prior) {}

bool StepCostModel::push(const StepShape& shape, double seconds) {
  if (!std::isfinite(seconds) || seconds <= 0) return false;
  const Vec raw = {1.0, shape.prefill_tokens, shape.prefill_pairs, shape.decode_rows, shape.decode_kv_tokens};
  Sample s{{}, seconds};
  for (int j = 0; j < kFeatures; ++j) s.x[j] = raw[j] / kScale[j];
  auto& window = shape.prefill_tokens > 0 ? with_prefill_ : decode_only_;
  window.push_back(s);
  while (static_cast<int>(window.size()) > std::max(options_.window, 1)) window.pop_front();
  ++n_observed_;
  return true;
}

void StepCostModel::observe(const StepShape& shape, double seconds) {
  if (push(shape, seconds)) refit();
}

void StepCostModel::observe_all(const std::vector<std::pair<StepShape, double>>& steps) {
  bool any = false;
  for (const auto& [shape, seconds] : steps) any |= push(shape, seconds);
  if (any) refit();
}

void StepCostModel::refit() {
  // The samples with their recency weights (newest of each window: 1, then decay, decay^2, ...).
  std::vector<const Sample*> samples;
  std::vector<double> recency;
  for (const auto* window : {&decode_only_, &with_prefill_}) {
    double w = 1;
    for (auto it = window->rbegin(); it != window->rend(); ++it, w *= options_.decay) {
      samples.push_back(&*it);
      recency.push_back(w);
    }
  }
  Vec prior_scaled;
  const Vec prior = as_array(options_.prior);
  for (int j = 0; j < kFeatures; ++j) prior_scaled[j] = prior[j] * kScale[j];
  std::vector<double> ys;
  for (const Sample* s : samples) ys.push_back(s->seconds);
  const double noise = options_.timing_noise * median(ys);
  Vec ridge;
  for (int j = 0; j < kFeatures; ++j) {
    const double sd = options_.prior_spread * std::max(prior_scaled[j], 1e-12);
    ridge[j] = std::max(noise * noise / (sd * sd), 1e-18);
  }
  // Iteratively reweighted: each pass takes Huber weights from the residuals of the previous fit (the
  // first from the fit before this sample, so one stalled step cannot contaminate the start).
  const Vec current = as_array(coef_);
  Vec theta;
  for (int j = 0; j < kFeatures; ++j) theta[j] = current[j] * kScale[j];
  std::vector<double> huber(samples.size()), abs_res(samples.size());
  for (int pass = 0; pass < kHuberPasses; ++pass) {
    for (size_t i = 0; i < samples.size(); ++i) {
      double pred = 0;
      for (int j = 0; j < kFeatures; ++j) pred += theta[j] * samples[i]->x[j];
      abs_res[i] = std::fabs(samples[i]->seconds - pred);
    }
    const double sigma = std::max({1.4826 * median(abs_res), 0.005 * median(ys), 1e-7});  // robust scale
    for (size_t i = 0; i < samples.size(); ++i)
      huber[i] = abs_res[i] <= kHuberK * sigma ? 1.0 : kHuberK * sigma / abs_res[i];
    std::array<Vec, kFeatures> a{};
    Vec b{};
    for (int j = 0; j < kFeatures; ++j) {
      a[j][j] = ridge[j];
      b[j] = ridge[j] * prior_scaled[j];
    }
    for (size_t i = 0; i < samples.size(); ++i) {
      const double w = recency[i] * huber[i];
      const Vec& x = samples[i]->x;
      for (int j = 0; j < kFeatures; ++j) {
        b[j] += w * x[j] * samples[i]->seconds;
        for (int k = 0; k < kFeatures; ++k) a[j][k] += w * x[j] * x[k];
      }
    }
    // Non-negative coefficients: pin the most negative one to 0 and solve again, until none is negative.
    std::array<bool, kFeatures> free;
    free.fill(true);
    for (int round = 0; round < kFeatures; ++round) {
      theta = solve_spd(a, b, free);
      int worst = -1;
      for (int j = 0; j < kFeatures; ++j)
        if (free[j] && theta[j] < 0 && (worst < 0 || theta[j] < theta[worst])) worst = j;
      if (worst < 0) break;
      free[worst] = false;
    }
    for (int j = 0; j < kFeatures; ++j) theta[j] = std::max(theta[j], 0.0);
  }
  Vec unscaled;
  for (int j = 0; j < kFeatures; ++j) unscaled[j] = theta[j] / kScale[j];
  coef_ = from_array(unscaled);
}

double StepCostModel::predict(const StepShape& s) const {
  return coef_.base + coef_.per_prefill_token * s.prefill_tokens + coef_.per_prefill_pair * s.prefill_pairs +
         coef_.per_decode_row * s.decode_rows + coef_.per_decode_kv_token * s.decode_kv_tokens;
}

bool StepCostModel::ready() const {
  return n_observed_ >= options_.min_samples &&
         static_cast<int>(with_prefill_.size()) >= options_.min_prefill_samples;
}

double StepCostModel::mean_relative_error() const {
  double sum = 0;
  int64_t n = 0;
  const Vec c = as_array(coef_);
  for (const auto* window : {&decode_only_, &with_prefill_})
    for (const Sample& s : *window) {
      double pred = 0;
      for (int j = 0; j < kFeatures; ++j) pred += c[j] * kScale[j] * s.x[j];
      sum += std::fabs(s.seconds - pred) / s.seconds;
      ++n;
    }
  return n > 0 ? sum / static_cast<double>(n) : 0;
}

double StepCostModel::prefill_chunk_seconds(int64_t start, int64_t n) const {
  const double nd = static_cast<double>(n);
  return coef_.per_prefill_token * nd + coef_.per_prefill_pair * nd * (static_cast<double>(start) + (nd + 1) / 2);
}

int64_t StepCostModel::max_prefill_tokens(int64_t start, double seconds) const {
  if (!(seconds > 0)) return 0;
  // Largest n with (e/2) n^2 + (b + e (start + 1/2)) n <= seconds, e = per pair, b = per token.
  const double e = coef_.per_prefill_pair;
  const double lin = coef_.per_prefill_token + e * (static_cast<double>(start) + 0.5);
  double n;
  if (e <= 0) n = lin > 0 ? seconds / lin : static_cast<double>(kMaxTokens);
  else n = (-lin + std::sqrt(lin * lin + 2 * e * seconds)) / e;
  if (!std::isfinite(n)) return kMaxTokens;
  int64_t tokens = static_cast<int64_t>(std::floor(std::min(n, static_cast<double>(kMaxTokens))));
  while (tokens > 0 && prefill_chunk_seconds(start, tokens) > seconds) --tokens;  // rounding at the boundary
  return std::max<int64_t>(tokens, 0);
}

PrefillBudget::PrefillBudget(const StepCostModel* model, double target_seconds, int64_t min_chunk, int64_t align,
                             const StepShape& decodes)
    : model_(model), target_(target_seconds), min_chunk_(std::max<int64_t>(min_chunk, 1)),
      align_(std::max<int64_t>(align, 1)) {
  limited_ = model_ != nullptr && target_ > 0 && decodes.decode_rows > 0 && model_->ready();
  if (!limited_) return;
  decode_seconds_ = model_->predict(decodes);
  predicted_ = decode_seconds_;
}

int64_t PrefillBudget::grant(int64_t start, int64_t wanted) {
  if (wanted <= 0) return 0;
  if (!limited_) return wanted;
  int64_t n = model_->max_prefill_tokens(start, target_ - predicted_);
  if (n < wanted) n -= n % align_;  // a cut-short chunk ends on a block boundary (no fragments under a block)
  n = std::min(std::max(n, min_chunk_ - granted_), wanted);  // the step's prefill floor comes first
  if (n > 0) {
    granted_ += n;
    predicted_ += model_->prefill_chunk_seconds(start, n);
  }
  return n;
}

int64_t PrefillBudget::grant_past_target(int64_t start, int64_t wanted) {
  if (wanted <= 0) return 0;
  if (!limited_) return wanted;
  granted_ += wanted;
  predicted_ += model_->prefill_chunk_seconds(start, wanted);
  ++past_target_;
  return wanted;
}

}  // namespace mxserve::runtime
