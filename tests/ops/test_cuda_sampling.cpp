// Backend::sample_rows on CUDA against the CPU sampler (kernels/cpu/sampling.h) at GLM's vocabulary
// (V = 151,552): for each parameter set, >= 20k seeded draws over varied counters must
//   - agree token for token with the CPU draw (TokenDistribution::draw(counter_uniform(seed, step))) in
//     >= 99.9% of draws (the two differ only where float sums round differently at a boundary),
//   - never land on a token of probability 0, and
//   - pass a chi-square goodness of fit against sampling_distribution's probabilities (p > 1e-4);
// greedy rows equal the CPU argmax exactly, logprobs / top logprobs agree within 1e-4, and a NaN or
// all -inf row is a per-row error code (no crash). Skips without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "backend/backend.h"
#include "gpu_oracle.h"
#include "kernels/cpu/sampling.h"

namespace mxserve {
namespace {

namespace kc = kernels::cpu;
using kernels::SampleRowParams;
using kernels::SampleRowsInput;

constexpr int64_t kVocab = 151552;
constexpr int64_t kDraws = 20000;

class CudaSampling : public gpu_oracle::CudaTest {};

// Logits of a realistic shape: a normal bulk, a few strong tokens, some exact ties.
std::vector<float> make_logits(uint32_t seed, float sigma) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, sigma);
  std::vector<float> l(kVocab);
  for (float& x : l) x = nd(rng);
  for (int i = 0; i < 8; ++i) l[(i * 7919 + 13) % kVocab] = 4.f * sigma + 0.5f * static_cast<float>(i % 3);
  for (int64_t v = 1000; v < 1200; ++v) l[v] = 3.5f * sigma;  // a block of ties above most of the bulk
  return l;
}

struct Case {
  const char* name;
  float temperature = 1.f, top_p = 1.f, min_p = 0.f, rep = 1.f, presence = 0.f, frequency = 0.f;
  int32_t top_k = 0;
  float sigma = 2.f;
  bool penalties = false;
};

// Penalty / bias data of the "penalties" case (the same for every draw of the case).
void add_processing(const Case& c, SampleRowParams* row, SampleRowsInput* in) {
  if (!c.penalties) return;
  row->bias_begin = static_cast<int32_t>(in->biases.size());
  in->biases.push_back({17, 6.f});
  in->biases.push_back({17, -1.f});
  in->biases.push_back({kVocab - 1, 9.f});
  row->bias_count = 3;
  row->penalty_begin = static_cast<int32_t>(in->penalties.size());
  for (int32_t t = 0; t < 64; ++t) in->penalties.push_back({(t * 2311 + 7) % static_cast<int32_t>(kVocab), t % 4, t % 3 == 0});
  row->penalty_count = 64;
}

SampleRowParams params_of(const Case& c) {
  SampleRowParams p;
  p.temperature = c.temperature;
  p.top_k = c.top_k;
  p.top_p = c.top_p;
  p.min_p = c.min_p;
  p.repetition_penalty = c.rep;
  p.presence_penalty = c.presence;
  p.frequency_penalty = c.frequency;
  return p;
}

// Chi-square statistic over bins of consecutive ids merged until each expects >= 20 draws.
void expect_fits(const kc::TokenDistribution& d, const std::vector<int64_t>& counts_by_index, int64_t n,
                 const char* name) {
  double stat = 0, exp_acc = 0, obs_acc = 0;
  int64_t bins = 0;
  for (size_t i = 0; i < d.ids.size(); ++i) {
    exp_acc += d.probs[i] * n;
    obs_acc += counts_by_index[i];
    if (exp_acc >= 20 || i + 1 == d.ids.size()) {
      stat += (obs_acc - exp_acc) * (obs_acc - exp_acc) / std::max(exp_acc, 1e-9);
      ++bins;
      exp_acc = obs_acc = 0;
    }
  }
  if (bins < 2) return;  // a point mass: agreement checks cover it
  const double df = static_cast<double>(bins - 1), z = 3.72;  // upper 1e-4 quantile (Wilson-Hilferty)
  const double crit = df * std::pow(1 - 2 / (9 * df) + z * std::sqrt(2 / (9 * df)), 3);
  EXPECT_LT(stat, crit) << name << ": chi-square " << stat << " over " << bins << " bins";
  std::printf("[ sampling ] %-12s chi2 %.1f (df %.0f, crit %.1f), support %zu tokens\n", name, stat, df, crit,
              d.ids.size());
}

TEST_F(CudaSampling, DistributionAndSeededAgreementWithTheCpuSampler) {
  const std::vector<Case> cases = {
      {.name = "t0.7", .temperature = 0.7f},
      {.name = "t1.0", .temperature = 1.0f, .sigma = 0.05f},  // nearly flat: the whole vocabulary
      {.name = "t1.5", .temperature = 1.5f},
      {.name = "top_k50", .temperature = 1.0f, .top_k = 50},
      {.name = "top_p0.9", .temperature = 1.0f, .top_p = 0.9f},
      {.name = "min_p0.05", .temperature = 1.0f, .min_p = 0.05f, .sigma = 1.f},
      {.name = "k_p_ties", .temperature = 0.8f, .top_p = 0.5f, .top_k = 150},
      {.name = "penalties", .temperature = 1.0f, .rep = 1.3f, .presence = 0.5f, .frequency = 0.3f, .penalties = true},
  };
  uint32_t seed = 1;
  for (const Case& c : cases) {
    std::vector<float> raw = make_logits(seed++, c.sigma);
    Tensor dev = gpu_->upload(Tensor::view_of(raw.data(), DType::kF32, {1, kVocab}));
    // CPU reference: the processed row and its distribution.
    SampleRowsInput proto;
    SampleRowParams p = params_of(c);
    add_processing(c, &p, &proto);
    std::vector<float> processed = raw;
    kc::apply_bias_and_penalties(processed, p, proto.biases, proto.penalties);
    const kc::TokenDistribution d = kc::sampling_distribution(processed, c.temperature, c.top_k, c.top_p, c.min_p);
    std::vector<int64_t> counts(d.ids.size(), 0);
    int64_t mismatches = 0, outside = 0;
    constexpr int64_t kPerCall = 2000;
    for (int64_t base = 0; base < kDraws; base += kPerCall) {
      SampleRowsInput in;
      for (int64_t j = 0; j < kPerCall; ++j) {
        SampleRowParams r = params_of(c);
        add_processing(c, &r, &in);
        r.seed = 0x5EED0000ull + static_cast<uint64_t>(base + j) % 7;
        r.step = static_cast<uint64_t>(base + j) * 3 + 1;
        in.rows.push_back(r);
      }
      const auto got = gpu_->sample_rows(dev, in);
      ASSERT_EQ(got.size(), static_cast<size_t>(kPerCall));
      for (int64_t j = 0; j < kPerCall; ++j) {
        ASSERT_EQ(got[j].error, kernels::kSampleOk) << c.name;
        const int32_t want = d.draw(kc::counter_uniform(in.rows[j].seed, in.rows[j].step));
        mismatches += got[j].token != want;
        auto it = std::lower_bound(d.ids.begin(), d.ids.end(), got[j].token);
        if (it == d.ids.end() || *it != got[j].token) ++outside;
        else ++counts[it - d.ids.begin()];
      }
    }
    EXPECT_EQ(outside, 0) << c.name << ": draws outside the distribution's support";
    EXPECT_LE(mismatches, kDraws / 1000) << c.name << ": seeded draws differing from the CPU sampler";
    std::printf("[ sampling ] %-12s %lld / %lld seeded draws differ from the CPU\n", c.name,
                static_cast<long long>(mismatches), static_cast<long long>(kDraws));
    expect_fits(d, counts, kDraws - outside, c.name);
  }
}

// Draws n seeded tokens of one row with parameters p (seed / step varied) and checks them against the CPU
// sampler's distribution: no draw outside its support, at most max_mismatch draws differing from the CPU's
// draw. Returns the distribution (support checks by the caller).
kc::TokenDistribution expect_draws_match(backend::Backend& gpu, const std::vector<float>& raw, SampleRowParams p,
                                         int64_t n, int64_t max_mismatch, const char* name) {
  Tensor dev = gpu.upload(Tensor::view_of(const_cast<float*>(raw.data()), DType::kF32, {1, kVocab}));
  const kc::TokenDistribution d = kc::sampling_distribution(raw, p.temperature, p.top_k, p.top_p, p.min_p);
  SampleRowsInput in;
  for (int64_t j = 0; j < n; ++j) {
    p.seed = 0xB0DE0000ull + static_cast<uint64_t>(j) % 5;
    p.step = static_cast<uint64_t>(j) * 7 + 3;
    in.rows.push_back(p);
  }
  const auto got = gpu.sample_rows(dev, in);
  int64_t mismatches = 0, outside = 0;
  for (int64_t j = 0; j < n; ++j) {
    EXPECT_EQ(got[j].error, kernels::kSampleOk) << name;
    mismatches += got[j].token != d.draw(kc::counter_uniform(in.rows[j].seed, in.rows[j].step));
    outside += d.prob_of(got[j].token) == 0.0;
  }
  EXPECT_EQ(outside, 0) << name << ": draws outside the CPU distribution's support";
  EXPECT_LE(mismatches, max_mismatch) << name << ": seeded draws differing from the CPU sampler";
  std::printf("[ sampling ] %-22s support %zu, %lld / %lld seeded draws differ from the CPU\n", name, d.ids.size(),
              static_cast<long long>(mismatches), static_cast<long long>(n));
  return d;
}

// Cut boundaries that land exactly on a tie group (weights exactly 1 or 0, so the CPU's double sums and the
// device's fixed-point sums are both exact): the kept set must be the CPU's to the token.
TEST_F(CudaSampling, CutBoundariesAndTiesMatchTheCpuExactly) {
  std::vector<float> four(kVocab, -INFINITY);
  for (int32_t id : {10, 20, 30, 40}) four[id] = 0.f;
  struct PCase {
    float top_p;
    size_t support;
  };
  for (const PCase c : {PCase{0.25f, 1}, PCase{0.5f, 2}, PCase{0.75f, 3}, PCase{0.9f, 4}}) {
    SampleRowParams p;
    p.top_p = c.top_p;
    const std::string name = "4 ties top_p " + std::to_string(c.top_p).substr(0, 4);
    const auto d = expect_draws_match(*gpu_, four, p, 2000, 0, name.c_str());
    EXPECT_EQ(d.ids.size(), c.support) << name;
  }
  // Top-k through a tie group: the lowest ids of the group fill k.
  std::vector<float> ties = make_logits(77, 1.f);
  for (int32_t id : {7, 300, 5000, 70000, 151000}) ties[id] = 9.f;
  for (int32_t k : {3, 5, 6}) {
    SampleRowParams p;
    p.top_k = k;
    const std::string name = "top_k " + std::to_string(k) + " through 5 ties";
    const auto d = expect_draws_match(*gpu_, ties, p, 2000, 2, name.c_str());
    EXPECT_EQ(d.ids.size(), static_cast<size_t>(k)) << name;
  }
  // A uniform row: every token a tie, the top-p cut inside the group (ids in order).
  std::vector<float> flat(kVocab, 0.5f);
  for (float top_p : {0.3f, 0.999f}) {
    SampleRowParams p;
    p.top_p = top_p;
    const std::string name = "uniform top_p " + std::to_string(top_p).substr(0, 5);
    expect_draws_match(*gpu_, flat, p, 2000, 2, name.c_str());
  }
  // +inf logits share the mass alone; top-p halves them.
  std::vector<float> inf_row = make_logits(78, 1.f);
  inf_row[123] = inf_row[4567] = INFINITY;
  {
    SampleRowParams p;
    p.top_p = 0.5f;
    const auto d = expect_draws_match(*gpu_, inf_row, p, 500, 0, "+inf ties top_p 0.5");
    EXPECT_EQ(d.ids, std::vector<int32_t>{123});
  }
  // bf16-like logits (multiples of 1/8: thousands of ties per value) through every filter at once.
  std::vector<float> coarse = make_logits(79, 2.f);
  for (float& x : coarse) x = std::round(x * 8.f) / 8.f;
  {
    SampleRowParams p;
    p.temperature = 0.9f;
    p.top_k = 2000;
    p.top_p = 0.8f;
    p.min_p = 0.001f;
    expect_draws_match(*gpu_, coarse, p, 4000, 4, "coarse k2000 p0.8 min_p");
  }
}

// A row's seeded token does not depend on what else is in the batch or where the row sits in it.
TEST_F(CudaSampling, SameSeededTokensAcrossBatchCompositions) {
  const int64_t R = 3;
  std::vector<float> raw(R * kVocab);
  for (int64_t r = 0; r < R; ++r) {
    auto l = make_logits(200 + static_cast<uint32_t>(r), 1.f + static_cast<float>(r));
    std::copy(l.begin(), l.end(), raw.begin() + r * kVocab);
  }
  Tensor dev = gpu_->upload(Tensor::view_of(raw.data(), DType::kF32, {R, kVocab}));
  SampleRowParams probe;
  probe.logit_row = 1;
  probe.temperature = 0.8f;
  probe.top_p = 0.9f;
  probe.top_k = 500;
  int64_t differ = 0;
  for (uint64_t step = 0; step < 40; ++step) {
    probe.seed = 1234 + step % 3;
    probe.step = step;
    SampleRowsInput alone;
    alone.rows = {probe};
    SampleRowsInput mixed;
    for (int64_t j = 0; j < 64; ++j) {
      SampleRowParams o;
      o.logit_row = static_cast<int32_t>((j + step) % R);
      o.temperature = j % 4 == 0 ? 0.f : 1.2f;
      o.top_k = j % 3 == 0 ? 20 : 0;
      o.top_p = j % 5 == 0 ? 0.7f : 1.f;
      o.n_top = j % 7 == 0 ? 3 : -1;
      o.seed = j;
      o.step = step;
      mixed.rows.push_back(o);
    }
    const int64_t at = static_cast<int64_t>(step * 13 % 64);
    mixed.rows[at] = probe;
    const auto a = gpu_->sample_rows(dev, alone);
    const auto b = gpu_->sample_rows(dev, mixed);
    differ += a[0].token != b[at].token;
  }
  EXPECT_EQ(differ, 0) << "seeded tokens changed with the batch composition";
  std::printf("[ sampling ] batch composition: %lld / 40 seeded tokens differ\n", static_cast<long long>(differ));
}

TEST_F(CudaSampling, GreedyLogprobsAndTopLogprobsMatchTheCpu) {
  const int64_t R = 6;
  std::vector<float> raw(R * kVocab);
  for (int64_t r = 0; r < R; ++r) {
    auto l = make_logits(100 + static_cast<uint32_t>(r), 1.5f);
    std::copy(l.begin(), l.end(), raw.begin() + r * kVocab);
  }
  raw[3 * kVocab + 5] = raw[3 * kVocab + 6] = 50.f;  // tied argmax: the lower id
  Tensor dev = gpu_->upload(Tensor::view_of(raw.data(), DType::kF32, {R, kVocab}));
  SampleRowsInput in;
  for (int64_t r = 0; r < R; ++r) {
    SampleRowParams p;
    p.logit_row = static_cast<int32_t>(R - 1 - r);
    p.temperature = r % 2 == 0 ? 0.f : 0.9f;
    p.top_k = r == 1 ? 40 : 0;
    p.n_top = static_cast<int32_t>(r * 4);  // 0, 4, ..., 20
    p.seed = 9;
    p.step = r;
    in.rows.push_back(p);
  }
  const auto got = gpu_->sample_rows(dev, in);
  const auto want = kc::sample_rows_f32(raw.data(), R, kVocab, in);
  for (int64_t r = 0; r < R; ++r) {
    ASSERT_EQ(got[r].error, kernels::kSampleOk);
    EXPECT_EQ(got[r].token, want[r].token) << "row " << r;
    EXPECT_NEAR(got[r].logprob, want[r].logprob, 1e-4) << "row " << r;
    ASSERT_EQ(got[r].top.size(), want[r].top.size()) << "row " << r;
    for (size_t j = 0; j < got[r].top.size(); ++j) {
      EXPECT_EQ(got[r].top[j].first, want[r].top[j].first) << "row " << r << " rank " << j;
      EXPECT_NEAR(got[r].top[j].second, want[r].top[j].second, 1e-4) << "row " << r << " rank " << j;
    }
  }
  EXPECT_EQ(got[2].token, 5);  // row 2 samples logit row 3 greedily
}

TEST_F(CudaSampling, NanAndEmptyRowsAreErrorCodes) {
  std::vector<float> raw(3 * kVocab, 0.5f);
  raw[777] = NAN;
  raw[900] = NAN;
  for (int64_t v = 0; v < kVocab; ++v) raw[kVocab + v] = -INFINITY;
  Tensor dev = gpu_->upload(Tensor::view_of(raw.data(), DType::kF32, {3, kVocab}));
  SampleRowsInput in;
  in.rows.resize(4);
  in.rows[0].logit_row = 0;
  in.rows[0].n_top = 3;
  in.rows[1].logit_row = 1;
  in.rows[2].logit_row = 2;  // fine: uniform row, whole vocabulary
  in.rows[3].logit_row = 7;  // outside the logits
  const auto got = gpu_->sample_rows(dev, in);
  EXPECT_EQ(got[0].error, kernels::kSampleNanLogit);
  EXPECT_EQ(got[0].error_token, 777);
  EXPECT_TRUE(got[0].top.empty());
  EXPECT_EQ(got[1].error, kernels::kSampleNoAllowedToken);
  EXPECT_EQ(got[2].error, kernels::kSampleOk);
  EXPECT_GE(got[2].token, 0);
  EXPECT_LT(got[2].token, kVocab);
  EXPECT_EQ(got[2].token, kc::sample_rows_f32(raw.data(), 3, kVocab, {.rows = {in.rows[2]}})[0].token);
  EXPECT_EQ(got[3].error, kernels::kSampleBadRow);
}

}  // namespace
}  // namespace mxserve
